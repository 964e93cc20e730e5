"""The model's shape in one dataclass; the model is built only from it and it is saved in every checkpoint.

``ModelConfig.validate()`` checks every field (type, range, known name) before anything is built: a checkpoint's
config.json comes from someone else, and a wrong number there would otherwise allocate gigabytes or end in a
traceback deep inside torch. Training reuses the same checks for its flags.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields

from captioner.errors import ConfigError

# Limits, generous for real models (the paper's largest decoder: LSTM 1800, embedding 512, 10k words), small
# enough that a hostile config.json cannot ask for more memory than a laptop has.
MAX_DIM = 4096  # embed_dim, hidden_dim, attention_dim, encoder_channels
MAX_GRID = 32  # annotation grid side: 1024 locations
MAX_POSITIONAL = 256
MAX_LOOKALIKE = 64
MAX_CAPTION_LEN = 200  # words
MAX_VOCAB = 100_000  # words, special tokens included
MAX_FINE_TUNE_STAGE = 32
MAX_INHIBIT = 1000.0  # inhibit_named, repeat_penalty: a score offset; past ~50 a named location is as good as masked
MAX_LENGTH_PENALTY = 10.0  # length_penalty: an exponent of the caption's length (GNMT-style values are 0-2)
MAX_DECODER_PARAMETERS = 150_000_000  # 600 MB of float32: the few largest weight matrices, estimated before building

SHAPE = {"shape": True}  # field metadata: the field changes the weights' shapes or meaning (no resume across it)
ATTENTION_KINDS = ("soft", "hard", "none")
HARD_INFERENCE = ("expected", "argmax")
_BOOLS = ("value_projection", "channel_attention", "self_attention", "location", "word_query", "gate",
          "deep_output", "count_head", "count_mask", "number_last", "singular_nouns", "merge_repeats")
_INT_RANGES = {"embed_dim": (1, MAX_DIM), "hidden_dim": (1, MAX_DIM), "attention_dim": (1, MAX_DIM),
               "encoder_channels": (1, MAX_DIM), "grid": (1, MAX_GRID), "positional": (0, MAX_POSITIONAL),
               "lookalike": (0, MAX_LOOKALIKE), "lookalike_near": (0, MAX_LOOKALIKE),
               "vocab_size": (0, MAX_VOCAB), "max_len": (1, MAX_CAPTION_LEN)}


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
    # >0: append this many learned channels of each location's look-alikes elsewhere on the grid: "something far
    # from here looks like this", which an average of annotations cannot say (captioner.lookalike, issue 21)
    lookalike: int = field(default=0, metadata=SHAPE)
    # >0: this many more look-alike channels that leave out only the 3x3 cells around each location, not a quarter
    # of the grid's side: a twin closer than that is seen too, at the price of a large object's own cells counting
    lookalike_near: int = field(default=0, metadata=SHAPE)
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
    # the word predictor also sees how widely alpha is spread (its entropy and -log max alpha) beside the context:
    # an average of annotations cannot say whether it covers one object or two, the spread can (a number word)
    count_head: bool = field(default=False, metadata=SHAPE)
    # with the count head: an unnormalised per-location mask "looks like the attended object" whose mass the head
    # reads (two identical objects fill twice the cells of one); supervised by the object boxes in training
    count_mask: bool = field(default=False, metadata=SHAPE)
    # say each noun phrase's number word after its noun ("<num> small red circles two"), put back in the usual order
    # on output: the number is decided once attention is on the object (captioner.phrase_order)
    number_last: bool = field(default=False, metadata=SHAPE)
    # with number_last: every phrase's noun is learnt in the singular ("<num> small red circle two"), so the number
    # word that ends the phrase alone says how many, one step after the noun; the noun takes its plural on output
    singular_nouns: bool = field(default=False, metadata=SHAPE)
    # inhibition of return at inference (a number_last model): attention scores of the locations that earlier
    # phrases' number words looked at are lowered by this times that look (at most 1), so a caption does not go back
    # to an object it has named and name it twice (captioner.decoder.Named; issue 21). 0 = off; training ignores it
    inhibit_named: float = 0.0
    # beam search ranks its hypotheses by log_prob / words ** length_penalty (0: by log_prob, as the paper's code);
    # a decoding setting, training ignores it
    length_penalty: float = 0.0
    # the scenes' decoding rule (captioner.repeat_penalty): a noun that would name a (size, colour, shape) the
    # caption has already named loses this much log-probability; 0 = off; training ignores it
    repeat_penalty: float = 0.0
    # counting by pointing (captioner.phrase_merge): phrases of a caption that name the same (size, colour, shape)
    # are said as one phrase with their sum ("a red circle and a red circle" -> "two red circles"), each merged word
    # keeping the mean of its sources' attention maps; a decoding setting, training and its rewards ignore it
    merge_repeats: bool = False
    # counting with attention (captioner.count_check): a phrase whose number word says two or more while its
    # attention puts less than this share of its mass beyond 2 cells of its peak (one object looked at) is said as
    # one ("two red circles" -> "a red circle"), before merge_repeats; 0 = off; a decoding setting, training ignores it
    plural_spread: float = 0.0
    vocab_size: int = 0  # set from the vocabulary
    max_len: int = 30  # default decoding length limit (words, without markers)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict, prefix: str = "model.") -> "ModelConfig":
        """A validated config from its JSON form; missing fields take their defaults (older checkpoints).
        Raises ConfigError naming the first wrong field (``prefix`` + name)."""
        if not isinstance(d, dict):
            raise ConfigError(prefix.rstrip("."), type(d).__name__, "is not an object of model fields")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError(prefix + str(unknown[0]), d[unknown[0]], "is not a model field")
        cfg = cls.__new__(cls)  # no __init__: nothing runs on unchecked values
        for f in fields(cls):
            setattr(cfg, f.name, d.get(f.name, getattr(cls, f.name)))
        cfg.validate(prefix)
        return cfg

    def validate(self, prefix: str = "model.") -> "ModelConfig":
        """Check every field's type, range and known names; raise ConfigError for the first that is wrong."""
        from captioner.attention import SCORES
        from captioner.encoders import ENCODERS

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
        for name in ("lookalike", "lookalike_near"):
            if getattr(self, name) and self.grid <= 2:
                raise ConfigError(prefix + name, getattr(self, name), f"needs a grid of at least 3 (grid "
                                  f"{self.grid} has no cell far enough from another to be its look-alike)")
        if self.singular_nouns and not self.number_last:
            raise ConfigError(prefix + "singular_nouns", self.singular_nouns, "needs number_last (the number word "
                              "that ends each phrase is what says how many)")
        check_float(prefix + "dropout", self.dropout, 0.0, 1.0, high_open=True)
        check_float(prefix + "inhibit_named", self.inhibit_named, 0.0, MAX_INHIBIT)
        check_float(prefix + "length_penalty", self.length_penalty, 0.0, MAX_LENGTH_PENALTY)
        check_float(prefix + "repeat_penalty", self.repeat_penalty, 0.0, MAX_INHIBIT)
        check_float(prefix + "plural_spread", self.plural_spread, 0.0, 1.0)
        if self.inhibit_named and not self.number_last:
            raise ConfigError(prefix + "inhibit_named", self.inhibit_named, "needs number_last (the number word "
                              "that ends a phrase is what marks its object as named)")
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
        if self.count_head and (self.attention == "none" or not self.deep_output):
            raise ConfigError(prefix + "count_head", True, "needs attention soft or hard and the deep output")
        if self.count_mask and not self.count_head:
            raise ConfigError(prefix + "count_mask", True, "needs count_head (the mask's mass is one of its inputs)")
        estimate = self.decoder_parameter_estimate()
        if estimate > MAX_DECODER_PARAMETERS:
            raise ConfigError(prefix + "hidden_dim", self.hidden_dim,
                              f"with embed_dim {self.embed_dim}, encoder_channels {self.encoder_channels} and "
                              f"vocab_size {self.vocab_size} makes a decoder of about {estimate / 1e6:.0f} million "
                              f"weights (at most {MAX_DECODER_PARAMETERS // 1_000_000} million)")
        return self

    @property
    def annotation_channels(self) -> int:
        """C of the annotations the decoder attends over: the encoder's, the positional and the look-alike ones."""
        return self.encoder_channels + self.positional + self.lookalike + self.lookalike_near

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


def _shown(value: object) -> str:
    """A JSON reader's name for the value's type."""
    names = {type(None): "null", str: "string", float: "float", list: "list", dict: "object", bool: "boolean"}
    return names.get(type(value), type(value).__name__)


def check_int(name: str, value: object, low: int, high: int) -> int:
    """``value`` is an int (not a bool, not 256.0, not "256") within [low, high]."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(name, value, f"is a {_shown(value)}, not an integer from {low} to {high}")
    if value > high:
        raise ConfigError(name, value, f"is too large (at most {high})")
    if value < low:
        raise ConfigError(name, value, f"is too small (at least {low})")
    return value


def check_float(name: str, value: object, low: float, high: float, high_open: bool = False) -> float:
    """``value`` is a finite number (int or float, not a bool or a string) in [low, high] (or [low, high))."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(name, value, f"is not a finite number (expected {low} to {high})")
    if value < low or value > high or (high_open and value == high):
        bracket = ")" if high_open else "]"
        raise ConfigError(name, value, f"is out of range (expected [{low}, {high}{bracket})")
    return float(value)


def check_choice(name: str, value: object, choices: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in choices:
        raise ConfigError(name, value, f"is not one of {', '.join(choices)}")
    return value
