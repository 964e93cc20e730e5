"""The model's shape in one dataclass; the model is built only from it and it is saved in every checkpoint.

``ModelConfig.validate()`` checks every field (type, range, known name) before anything is built: a checkpoint's
config.json comes from someone else, and a wrong number there would otherwise allocate gigabytes or end in a
traceback deep inside torch. Training reuses the same checks for its flags.
"""

from __future__ import annotations

from dataclasses import MISSING, asdict, dataclass, field, fields

from captioner import plugins
from captioner.model.attention import SCORES
from captioner.checks import check_choice, check_fields, check_float, check_int
from captioner.encoders import ENCODERS
from captioner.errors import ConfigError
from captioner.vocab import MAX_VOCAB  # noqa: F401 - re-exported: the limit lives with the vocabulary

# Limits, generous for real models (the paper's largest decoder: LSTM 1800, embedding 512, 10k words), small
# enough that a hostile config.json cannot ask for more memory than a laptop has.
MAX_DIM = 4096  # embed_dim, hidden_dim, attention_dim, encoder_channels
MAX_GRID = 32  # annotation grid side: 1024 locations
MAX_POSITIONAL = 256
MAX_FINE_TUNE_STAGE = 32
MAX_DECODER_PARAMETERS = 150_000_000  # 600 MB of float32: the few largest weight matrices, estimated before building

SHAPE = {"shape": True}  # field metadata: the field changes the weights' shapes or meaning (no resume across it)
ATTENTION_KINDS = ("soft", "hard", "none")
HARD_INFERENCE = ("expected", "argmax")
_BOOLS = ("value_projection", "channel_attention", "self_attention", "location", "word_query", "gate",
          "deep_output")
_INT_RANGES = {"embed_dim": (1, MAX_DIM), "hidden_dim": (1, MAX_DIM), "attention_dim": (1, MAX_DIM),
               "encoder_channels": (1, MAX_DIM), "grid": (1, MAX_GRID), "positional": (0, MAX_POSITIONAL),
               "vocab_size": (0, MAX_VOCAB)}


@dataclass
class ModelConfig:
    encoder: str = field(default="efficientnet_lite0", metadata=SHAPE)  # a name in captioner.encoders.ENCODERS
    # "package", a torchvision weights name, a file, or None (random)
    encoder_weights: str | None = field(default="package", metadata=SHAPE)
    grid: int = field(default=14, metadata=SHAPE)  # annotation grid side (14: 196 locations, as in the paper)
    encoder_channels: int = 112  # C of the annotations; set from the encoder when the model is built
    fine_tune_from: int | None = None  # first trainable encoder stage; None = frozen encoder
    # "soft", "hard" (stochastic, REINFORCE) or "none" (mean annotation, no attention)
    attention: str = field(default="soft", metadata=SHAPE)
    score: str = field(default="additive", metadata=SHAPE)  # additive | dot | scaled_dot | general | cosine
    # separate learned values (else the annotations are the values)
    value_projection: bool = field(default=False, metadata=SHAPE)
    channel_attention: bool = field(default=False, metadata=SHAPE)  # SCA-CNN channel weights before spatial attention
    # one self-attention layer over the grid before the decoder
    self_attention: bool = field(default=False, metadata=SHAPE)
    # >0: append this many fixed sin/cos channels of each location's (row, col) to a_i
    positional: int = field(default=0, metadata=SHAPE)
    # location-aware attention: the score sees alpha_{t-1} and the coverage sum (3x3 conv)
    location: bool = field(default=False, metadata=SHAPE)
    # the attention query is [h_{t-1}; E y_{t-1}]: it knows the word just emitted
    word_query: bool = field(default=False, metadata=SHAPE)
    hard_inference: str = "expected"  # hard attention at inference: "expected" context or the "argmax" location
    embed_dim: int = field(default=256, metadata=SHAPE)
    hidden_dim: int = field(default=512, metadata=SHAPE)
    attention_dim: int = field(default=256, metadata=SHAPE)
    dropout: float = 0.5
    gate: bool = field(default=True, metadata=SHAPE)  # beta = sigmoid(f_beta(h)) scales the context (paper sec. 4.2.1)
    deep_output: bool = field(default=True, metadata=SHAPE)  # p(y) from E y_{t-1} + L_h h + L_z z (paper eq. 7)
    # the plug-in that adds devices of one kind of data (captioner.plugins), and its architecture settings
    plugin: str | None = field(default=None, metadata=SHAPE)
    plugin_config: dict = field(default_factory=dict, metadata=SHAPE)
    vocab_size: int = 0  # set from the vocabulary

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict, prefix: str = "model.") -> "ModelConfig":
        """A validated config from its JSON form; missing fields take their defaults (older checkpoints).
        Raises ConfigError naming the first wrong field (``prefix`` + name)."""
        check_fields(cls, d, prefix, "model field")
        cfg = cls.__new__(cls)  # no __init__: nothing runs on unchecked values
        for f in fields(cls):
            default = f.default_factory() if f.default is MISSING else f.default
            setattr(cfg, f.name, d.get(f.name, default))
        cfg.validate(prefix)
        return cfg

    def validate(self, prefix: str = "model.") -> "ModelConfig":
        """Check every field's type, range and known names; raise ConfigError for the first that is wrong."""
        for name in _BOOLS:
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(prefix + name, getattr(self, name), "is not true or false")
        for name, (low, high) in _INT_RANGES.items():
            check_int(prefix + name, getattr(self, name), low, high)
        if self.fine_tune_from is not None:
            check_int(prefix + "fine_tune_from", self.fine_tune_from, 0, MAX_FINE_TUNE_STAGE)
        if self.positional % 4:
            raise ConfigError(prefix + "positional", self.positional, "is not a multiple of 4 (sin and cos of row "
                              "and column)")
        check_float(prefix + "dropout", self.dropout, 0.0, 1.0, high_open=True)
        check_choice(prefix + "encoder", self.encoder, tuple(ENCODERS))
        grids = ENCODERS[self.encoder].grids
        if grids and self.grid not in grids:
            raise ConfigError(prefix + "grid", self.grid, f"is not a grid encoder {self.encoder} offers "
                              f"({' or '.join(map(str, grids))})")
        check_choice(prefix + "attention", self.attention, ATTENTION_KINDS)
        check_choice(prefix + "score", self.score, SCORES)
        check_choice(prefix + "hard_inference", self.hard_inference, HARD_INFERENCE)
        weights = self.encoder_weights
        if weights is not None and (not isinstance(weights, str) or not 0 < len(weights) <= 4096 or "\0" in weights):
            raise ConfigError(prefix + "encoder_weights", weights, 'is not "package", a torchvision weights name, '
                              "a file path or null")
        if self.location and self.attention == "none":
            raise ConfigError(prefix + "location", True, "needs attention soft or hard, not none")
        if not isinstance(self.plugin_config, dict):
            raise ConfigError(prefix + "plugin_config", self.plugin_config, "is not an object of settings")
        if self.plugin is not None:
            self.plugin_module().check_model(self.plugin_config, self, prefix + "plugin_config.")
        elif self.plugin_config:
            raise ConfigError(prefix + "plugin_config", self.plugin_config, "needs a plugin")
        estimate = self.decoder_parameter_estimate()
        if estimate > MAX_DECODER_PARAMETERS:
            raise ConfigError(prefix + "hidden_dim", self.hidden_dim,
                              f"with embed_dim {self.embed_dim}, encoder_channels {self.encoder_channels} and "
                              f"vocab_size {self.vocab_size} makes a decoder of about {estimate / 1e6:.0f} million "
                              f"weights (at most {MAX_DECODER_PARAMETERS // 1_000_000} million)")
        return self

    def plugin_module(self) -> plugins.Plugin | None:
        """The plug-in this config names (imported on first use), else None."""
        return None if self.plugin is None else plugins.get(self.plugin, "model.plugin")

    @property
    def annotation_channels(self) -> int:
        """C of the annotations the decoder attends over: the encoder's, the positional and the plug-in's."""
        plugin = self.plugin_module()
        return self.encoder_channels + self.positional + (plugin.extra_channels(self.plugin_config) if plugin else 0)

    def decoder_parameter_estimate(self) -> int:
        """The decoder's largest weight matrices (a lower bound of its size), from the config alone."""
        C, H, E, A, V = (self.annotation_channels, self.hidden_dim, self.embed_dim,
                         self.attention_dim, self.vocab_size)
        lstm = 4 * H * (E + C + H)
        output = V * E + E * (H + C) if self.deep_output else V * H
        attention = A * (C + H + E) if self.attention != "none" else 0
        self_attention = 8 * C * C + self.grid * self.grid * C if self.self_attention else 0
        return V * E + lstm + output + attention + 2 * C * H + self_attention


def shape_fields() -> tuple[str, ...]:
    """ModelConfig fields marked ``SHAPE``: the ones a resumed or overwritten run must keep."""
    return tuple(f.name for f in fields(ModelConfig) if f.metadata.get("shape"))
