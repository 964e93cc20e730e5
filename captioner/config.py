"""The model's shape in one dataclass; the model is built only from it and it is saved in every checkpoint."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields


@dataclass
class ModelConfig:
    encoder: str = "efficientnet_lite0"  # a name in captioner.encoders.ENCODERS
    encoder_weights: str | None = "package"  # "package", a torchvision weights name, a file, or None (random)
    grid: int = 14  # annotation grid side (14: 196 locations, as in the paper)
    encoder_channels: int = 112  # C of the annotations; set from the encoder when the model is built
    fine_tune_from: int | None = None  # first trainable encoder stage; None = frozen encoder
    attention: str = "soft"  # "soft", "hard" (stochastic, REINFORCE) or "none" (mean annotation, no attention)
    score: str = "additive"  # additive | dot | scaled_dot | general | cosine
    value_projection: bool = False  # separate learned values (else the annotations are the values)
    channel_attention: bool = False  # SCA-CNN channel weights before spatial attention
    self_attention: bool = False  # one self-attention layer over the grid before the decoder
    positional: int = 0  # >0: append this many fixed sin/cos channels of each location's (row, col) to a_i
    location: bool = False  # location-aware attention: the score sees alpha_{t-1} and the coverage sum (3x3 conv)
    word_query: bool = False  # the attention query is [h_{t-1}; E y_{t-1}]: it knows the word just emitted
    hard_inference: str = "expected"  # hard attention at inference: "expected" context or the "argmax" location
    embed_dim: int = 256
    hidden_dim: int = 512
    attention_dim: int = 256
    dropout: float = 0.5
    gate: bool = True  # beta = sigmoid(f_beta(h)) scales the context (paper sec. 4.2.1)
    deep_output: bool = True  # p(y) from E y_{t-1} + L_h h + L_z z (paper eq. 7)
    vocab_size: int = 0  # set from the vocabulary
    max_len: int = 30  # default decoding length limit (words, without markers)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ModelConfig":
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown model config fields: {', '.join(sorted(unknown))}")
        return cls(**d)
