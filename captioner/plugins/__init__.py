"""Plug-ins: what one kind of data adds to the core model, registered into a few seams.

The core is Show, Attend and Tell for any captioned image set. A data set with devices of its own (the bundled
synthetic scenes: counting channels, phrase order, decoding rules) ships them as a plug-in, a subclass of
``Plugin`` that overrides what it needs:

- ``decoder_extension``: a ``captioner.plugins.extension.DecoderExtension`` (extra annotation channels, an extra input to
  the word predictor, a bias on the attention scores while decoding);
- ``processors``: ``captioner.decoding.config`` score processors (inside beam search) and caption processors (after it);
- ``phrase_rule``: where a phrase ends (``captioner.decoding.regions.PhraseRule``), for captions steered by regions;
- ``check_model`` / ``check_decoding``: validation of its settings, which a checkpoint stores as
  ``ModelConfig.plugin_config`` and ``DecodingConfig.plugin_settings``;
- training: ``training_captions`` (how the decoder learns to write the captions), ``cell_labels`` (per-cell labels
  for the data loader), ``training_losses`` (its extension's supervision) and ``reward`` (self-critical terms);
- evaluation: ``caption_metrics``, for data whose JSON names the plug-in (``KarpathySplit.plugin``), and
  ``region_metrics``, for captions steered by regions drawn around the data's objects.

A checkpoint names its plug-in (``ModelConfig.plugin``); ``get(name)`` imports ``captioner.<name>`` the first time,
and that module calls ``register``. Only plug-ins inside the captioner package or registered by the caller can be
named, so a checkpoint cannot make the loader import an arbitrary module. A model without a plug-in imports none.
"""

from __future__ import annotations

import importlib
import re
from typing import Any

from captioner.decoding.config import CaptionProcessor, ScoreProcessor
from captioner.errors import ConfigError

# "DecoderExtension" (captioner.plugins.extension) and "PhraseRule" (captioner.decoding.regions) below are type names
# in strings, not imports: both need torch, and the ONNX Runtime route reads this registry without it.

_PLUGINS: dict[str, "Plugin"] = {}
_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}")


class Plugin:
    """The seams a plug-in can fill; every default adds nothing."""

    name = ""

    def check_model(self, settings: dict[str, Any], model, prefix: str) -> None:
        """Raise ConfigError for the first wrong architecture setting (``prefix`` + its name) of ``model``, a
        ModelConfig whose own fields are already checked."""
        if settings:
            raise ConfigError(prefix + sorted(settings)[0], settings[sorted(settings)[0]],
                              f"is not a setting of plug-in {self.name}")

    def check_decoding(self, settings: dict[str, Any], model_settings: dict[str, Any], prefix: str) -> None:
        """Raise ConfigError for the first wrong decoding setting."""
        if settings:
            raise ConfigError(prefix + sorted(settings)[0], settings[sorted(settings)[0]],
                              f"is not a decoding setting of plug-in {self.name}")

    def extra_channels(self, settings: dict[str, Any]) -> int:
        """Annotation channels the decoder extension appends (for size estimates before building)."""
        return 0

    def decoder_extension(self, model) -> "DecoderExtension | None":
        """The decoder's extension for ``model`` (a validated ModelConfig with encoder_channels and vocab_size set)."""
        return None

    def processors(self, model) -> tuple[list["ScoreProcessor"], list["CaptionProcessor"]]:
        """The decoding processors of a built ``Captioner`` (its vocabulary, ``cfg`` and ``decoding``), also
        telling its decoder extension the decoding settings; called again whenever they change."""
        return [], []

    def phrase_rule(self, model) -> "PhraseRule | None":
        """Where a phrase of a built ``Captioner``'s captions ends, in its decoder's word ids: what lets an ordered
        list of regions steer one phrase each (``captioner.decoding.regions``); None: one region only."""
        return None

    def decoding_rules(self, model_settings: dict[str, Any], decoding_settings: dict[str, Any],
                       itos: list[str]) -> tuple[list["ScoreProcessor"], list["CaptionProcessor"]]:
        """The processors of a model with these settings and vocabulary, built without torch (numpy score
        processors): the ONNX Runtime route (``captioner.runtime``) applies them as ``processors`` does. A plug-in
        whose ``processors`` adds something this cannot give leaves this default, and an exported folder says so."""
        return [], []

    # ---------------------------------------------------------------------------------------------- training
    # ``settings``: the run's plug-in training settings (TrainConfig.plugin: its settings.toml's "train" ones)
    def check_training(self, cfg) -> None:
        """Raise a one-line error (``captioner.training.SettingError``) for settings of the whole TrainConfig
        ``cfg`` that cannot work together; cheap, reads no data."""

    def training_captions(self, train, model_settings: dict[str, Any], min_count: int):
        """(the training split with its captions as the decoder learns to write them, extra sentences that the
        vocabulary must count), for a model with these architecture settings."""
        return train, []

    def needs_attention_targets(self, settings: dict[str, Any]) -> list[str]:
        """The flags of its losses that read the batches' attention targets (boxes and per-word refs)."""
        return []

    def check_training_data(self, settings: dict[str, Any], train, processes: int) -> None:
        """Raise a CaptionerError when ``train`` (a KarpathySplit) or the process count cannot serve ``settings``."""

    def cell_labels(self, settings: dict[str, Any]):
        """A function (objects, (h, w), image size) -> (K, h*w) labels per grid cell for the data loader, or None
        when the settings ask for no supervision that reads them."""
        return None

    def training_losses(self, model, out, batch: dict, attention_targets, settings: dict[str, Any],
                        device) -> dict[str, tuple]:
        """{name: (weight, loss tensor)} added to a cross-entropy batch's loss."""
        return {}

    def samples_as_decoded(self, settings: dict[str, Any]) -> bool:
        """Self-critical samples are drawn with the decoder extension's decoding-time state, as it will decode."""
        return False

    def reward(self, scst, settings: dict[str, Any], train, cider):
        """The self-critical reward named by ``scst.reward`` (a ScstConfig) over ``train``, given the core's CIDEr-D
        scorer (None when the reward does not name "cider")."""
        raise ConfigError("scst.reward", scst.reward, f"is not a reward of plug-in {self.name}")

    # -------------------------------------------------------------------------------------------- evaluation
    def caption_metrics(self, records, tokens, alphas, image_size, attention: bool) -> dict[str, float]:
        """Metrics of the captions ``tokens`` (and their maps ``alphas``) of data records it annotates."""
        return {}

    def region_metrics(self, objects, tokens) -> dict[str, float]:
        """Metrics of captions steered by regions drawn around data objects: per caption, the annotated objects
        (dicts with a ``bbox``) its regions were drawn around, in order, and its words."""
        return {}


def register(plugin: Plugin) -> Plugin:
    """Make ``plugin`` available under ``plugin.name`` (a plug-in module calls this when imported)."""
    if not isinstance(plugin.name, str) or not _NAME.fullmatch(plugin.name):
        raise ValueError(f"a plug-in name is lower-case letters, digits and _, not {plugin.name!r}")
    _PLUGINS[plugin.name] = plugin
    return plugin


def get(name: str, field: str = "model.plugin") -> Plugin:
    """The plug-in called ``name``, importing ``captioner.<name>`` if it has not registered yet."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ConfigError(field, name, "is not a plug-in name (lower-case letters, digits and _)")
    if name not in _PLUGINS:
        try:
            importlib.import_module(f"captioner.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"captioner.{name}":
                raise
        if name not in _PLUGINS:
            raise ConfigError(field, name, "is not a plug-in of this captioner installation")
    return _PLUGINS[name]
