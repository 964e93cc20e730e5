"""How a model writes its captions, apart from what it is: ``DecodingConfig`` and the decoding processors.

``DecodingConfig`` is saved beside the model's config (``decoding.json`` in a checkpoint folder, as transformers'
generation_config.json): beam size, length limit, length penalty, and the settings of the model's plug-in (its
decoding rules). Changing it changes the captions, never the weights; training ignores it except to score
validation and test captions as the checkpoint will write them.

Processors, in the manner of transformers' ``LogitsProcessor``:

- a ``ScoreProcessor`` is called at every step of greedy and beam search with the words so far (R, t) and the
  next word's log-probabilities (R, V) and returns them changed (what it takes away counts in the hypothesis'
  log-probability, as a penalised word should);
- a ``CaptionProcessor`` sees the finished caption: ``reorder`` may put the decoded words in another order
  (returning, for each word of the caption, the position of the decoded word it comes from) and ``rewrite`` may
  change the words and their attention maps (T, h, w) together.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any
from dataclasses import asdict, dataclass, field, fields, replace

import numpy as np

from captioner.checks import check_fields, check_float, check_int
from captioner.errors import ConfigError

MAX_CAPTION_LEN = 200  # words
MAX_BEAM_SIZE = 100
MAX_LENGTH_PENALTY = 10.0  # an exponent of the caption's length (GNMT-style values are 0-2)

# (history (R, t), logp (R, V)) -> logp: torch tensors on the PyTorch route, numpy arrays on ONNX Runtime's
# (captioner.runtime); a processor that works on numpy (np.asarray of a CPU tensor shares its memory) serves both
ScoreProcessor = Callable[[Any, Any], Any]


class CaptionProcessor:
    """A rule applied to a finished caption; both methods default to leaving it as it is."""

    def reorder(self, tokens: list[str]) -> tuple[list[int], list[str]]:
        """(for each word of the result, its position in ``tokens``; the words in their new order)."""
        return list(range(len(tokens))), tokens

    def rewrite(self, tokens: list[str], alphas: np.ndarray) -> tuple[list[str], np.ndarray]:
        """(the caption's words, their attention maps (T, h, w)), both possibly changed."""
        return tokens, alphas


@dataclass
class DecodingConfig:
    beam_size: int = 3  # 1: greedy
    max_len: int = 30  # words, without the markers
    # beam search ranks hypotheses by log_prob / words ** length_penalty (0: by log_prob, as the paper's code)
    length_penalty: float = 0.0
    plugin_settings: dict = field(default_factory=dict)  # the model's plug-in's decoding settings

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict, prefix: str = "decoding.") -> "DecodingConfig":
        """A config from its JSON form (missing fields take their defaults); types and ranges are checked by
        ``validate``, which needs the model's plug-in."""
        return cls(**check_fields(cls, d, prefix, "decoding setting"))

    def validate(self, plugin=None, model_settings: dict | None = None, prefix: str = "decoding.") -> "DecodingConfig":
        """Check every setting (the plug-in's by ``plugin.check_decoding``); raise ConfigError for the first wrong."""
        check_int(prefix + "beam_size", self.beam_size, 1, MAX_BEAM_SIZE)
        check_int(prefix + "max_len", self.max_len, 1, MAX_CAPTION_LEN)
        check_float(prefix + "length_penalty", self.length_penalty, 0.0, MAX_LENGTH_PENALTY)
        if not isinstance(self.plugin_settings, dict):
            raise ConfigError(prefix + "plugin_settings", self.plugin_settings, "is not an object of settings")
        if plugin is not None:
            plugin.check_decoding(self.plugin_settings, model_settings or {}, prefix + "plugin_settings.")
        elif self.plugin_settings:
            name = sorted(self.plugin_settings)[0]
            raise ConfigError(prefix + "plugin_settings." + name, self.plugin_settings[name],
                              "is a plug-in's setting, and the model has no plug-in")
        return self

    def updated(self, **settings) -> "DecodingConfig":
        """A copy with ``settings`` changed: the config's own fields by name, any other name a plug-in setting
        (None keeps a setting as it is)."""
        own = {f.name for f in fields(self)} - {"plugin_settings"}
        given = {k: v for k, v in settings.items() if v is not None}
        plugin_settings = {**self.plugin_settings, **{k: v for k, v in given.items() if k not in own}}
        return replace(self, **{k: v for k, v in given.items() if k in own}, plugin_settings=plugin_settings)


def chain(processors: Sequence[ScoreProcessor]) -> ScoreProcessor | None:
    """One score processor that runs ``processors`` in turn (None when there are none)."""
    if not processors:
        return None
    if len(processors) == 1:
        return processors[0]

    def run(history, logp):
        for processor in processors:
            logp = processor(history, logp)
        return logp

    return run


def natural_order(processors: Sequence[CaptionProcessor], tokens: list[str]) -> tuple[list[int], list[str]]:
    """The ``reorder`` of every processor in turn: (positions among the decoded words, the words)."""
    order = list(range(len(tokens)))
    for processor in processors:
        moved, tokens = processor.reorder(tokens)
        order = [order[i] for i in moved]
    return order, tokens
