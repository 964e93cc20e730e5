"""The synthetic scenes as a plug-in (``ModelConfig.plugin = "scenes"``): its settings, and what they build.

Architecture settings (``ModelConfig.plugin_config``): ``lookalike`` and ``lookalike_near`` (look-alike channels),
``count_head`` and ``count_mask`` (``captioner.scenes.extension``), ``number_last`` and ``singular_nouns``
(``captioner.scenes.phrase_order``: how the training captions are written, and put back on output).

Decoding settings (``DecodingConfig.plugin_settings``): ``inhibit_named`` (inhibition of return), ``repeat_penalty``
(``captioner.scenes.repeat_penalty``), ``plural_spread`` (``captioner.scenes.count_attention``) and ``merge_repeats``
(``captioner.scenes.phrase_merge``).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from captioner.checks import check_float, check_int
from captioner.decoding.config import CaptionProcessor
from captioner.errors import ConfigError
from captioner.plugins import Plugin
from captioner.scenes.count_attention import said_as_one
from captioner.scenes.phrase_merge import mean_maps, merge_repeats
from captioner.scenes.phrase_order import NUMBER_WORDS, PLACEHOLDER, plural_table, reference_order
from captioner.scenes.repeat_penalty import RepeatPenalty

# The torch-using modules (extension, grounding, training) are imported where a method needs them: the decoding
# rules (``decoding_rules``) must import without torch, for the ONNX Runtime route (captioner.runtime).

MAX_LOOKALIKE = 64
MAX_OFFSET = 1000.0  # inhibit_named, repeat_penalty: a score offset; past ~50 a named location is as good as masked


@dataclass
class SceneModel:
    """Architecture settings (``ModelConfig.plugin_config``)."""
    # >0: append this many learned channels of each location's look-alikes elsewhere on the grid
    lookalike: int = 0
    # >0: this many more look-alike channels that leave out only the 3x3 cells around each location
    lookalike_near: int = 0
    count_head: bool = False  # the word predictor also sees how widely alpha is spread
    count_mask: bool = False  # with the count head: a per-location mask "looks like the attended object"
    number_last: bool = False  # each noun phrase's number word is said after its noun, put back on output
    singular_nouns: bool = False  # with number_last: nouns are learnt in the singular, plurals put back on output


@dataclass
class SceneDecoding:
    """Decoding settings (``DecodingConfig.plugin_settings``); training ignores them."""
    inhibit_named: float = 0.0  # inhibition of return (a number_last model); 0: off
    repeat_penalty: float = 0.0  # a noun that would name an object the caption has named loses this much; 0: off
    merge_repeats: bool = False  # phrases naming the same object kind are said as one with their sum
    # a plural whose number word's attention puts less than this share beyond 2 cells of its peak is said as one
    plural_spread: float = 0.0


@dataclass
class SceneTraining:
    """Training settings (``TrainConfig.plugin``); what each does: captioner/scenes/settings.toml."""
    lambda_mask: float = 0.0
    lambda_twin: float = 0.0
    object_weight: float = 10.0
    count_weight: float = 10.0
    count_over: str = "named"
    split_score: float = 0.0
    scst_inhibit: bool = False


def _parsed(cls, settings: dict, prefix: str):
    """``settings`` as a ``cls`` (missing ones take their defaults); unknown names and wrong types raise."""
    known = {f.name: f for f in fields(cls)}
    for name, value in settings.items():
        if name not in known:
            raise ConfigError(prefix + str(name), value, "is not a setting of the scenes plug-in")
        if known[name].type == "bool" and not isinstance(value, bool):
            raise ConfigError(prefix + name, value, "is not true or false")
    return cls(**settings)


def model_settings(settings: dict) -> SceneModel:
    return _parsed(SceneModel, settings, "")


def decoding_settings(settings: dict) -> SceneDecoding:
    return _parsed(SceneDecoding, settings, "")


def training_settings(settings: dict) -> SceneTraining:
    return _parsed(SceneTraining, settings, "plugin.")


class ScenesPlugin(Plugin):
    name = "scenes"

    def check_model(self, settings, model, prefix):
        s = _parsed(SceneModel, settings, prefix)
        for name in ("lookalike", "lookalike_near"):
            check_int(prefix + name, getattr(s, name), 0, MAX_LOOKALIKE)
            if getattr(s, name) and model.grid <= 2:
                raise ConfigError(prefix + name, getattr(s, name), f"needs a grid of at least 3 (grid "
                                  f"{model.grid} has no cell far enough from another to be its look-alike)")
        if s.singular_nouns and not s.number_last:
            raise ConfigError(prefix + "singular_nouns", s.singular_nouns, "needs number_last (the number word "
                              "that ends each phrase is what says how many)")
        if s.count_head and (model.attention == "none" or not model.deep_output):
            raise ConfigError(prefix + "count_head", True, "needs attention soft or hard and the deep output")
        if s.count_mask and not s.count_head:
            raise ConfigError(prefix + "count_mask", True, "needs count_head (the mask's mass is one of its inputs)")

    def check_decoding(self, settings, model_settings, prefix):
        s = _parsed(SceneDecoding, settings, prefix)
        check_float(prefix + "inhibit_named", s.inhibit_named, 0.0, MAX_OFFSET)
        check_float(prefix + "repeat_penalty", s.repeat_penalty, 0.0, MAX_OFFSET)
        check_float(prefix + "plural_spread", s.plural_spread, 0.0, 1.0)
        if s.inhibit_named and not model_settings.get("number_last", False):
            raise ConfigError(prefix + "inhibit_named", s.inhibit_named, "needs number_last (the number word "
                              "that ends a phrase is what marks its object as named)")

    def extra_channels(self, settings):
        s = model_settings(settings)
        return s.lookalike + s.lookalike_near

    def decoder_extension(self, model):
        from captioner.scenes.extension import ScenesExtension

        s = model_settings(model.plugin_config)
        if not (s.lookalike or s.lookalike_near or s.count_head or s.number_last):
            return None
        return ScenesExtension(model.encoder_channels, model.annotation_channels, model.grid, model.embed_dim,
                               model.vocab_size, s.lookalike, s.lookalike_near, s.count_head, s.count_mask)

    def processors(self, model):
        d = decoding_settings(model.decoding.plugin_settings)
        stoi = model.vocab.stoi
        extension = model.decoder.extension
        if extension is not None and hasattr(extension, "set_inhibition") and PLACEHOLDER in stoi:  # number_last
            extension.set_inhibition([i for w, i in stoi.items() if w in NUMBER_WORDS], stoi[PLACEHOLDER],
                                     d.inhibit_named)
        return self.decoding_rules(model.cfg.plugin_config, model.decoding.plugin_settings, model.vocab.itos)

    def decoding_rules(self, model_config, decoding_config, itos):
        s, d = model_settings(model_config), decoding_settings(decoding_config)
        scores = []
        if d.repeat_penalty:
            rule = RepeatPenalty(itos, d.repeat_penalty)
            scores = [rule] if rule.active else []
        captions: list[CaptionProcessor] = []
        if s.number_last:
            captions.append(NumberFirst(plural_table(itos) if s.singular_nouns else None))
        if d.plural_spread:
            captions.append(PluralSpread(d.plural_spread))
        if d.merge_repeats:
            captions.append(MergeRepeats())
        return scores, captions

    def phrase_rule(self, model):
        from captioner.scenes import regions

        return regions.phrase_rule(model.vocab.stoi)

    # the training and evaluation side: captioner.scenes.training
    def check_training(self, cfg):
        from captioner.scenes import training

        training.check_training(cfg, model_settings(cfg.model.plugin_config),
                                decoding_settings(cfg.decoding.plugin_settings), training_settings(cfg.plugin))

    def training_captions(self, train, model_settings, min_count):
        from captioner.scenes import training

        return training.training_captions(train, model_settings, min_count)

    def needs_attention_targets(self, settings):
        return ["--lambda-mask"] if training_settings(settings).lambda_mask else []

    def check_training_data(self, settings, train, processes):
        from captioner.scenes import training

        training.check_training_data(training_settings(settings), train, processes)

    def cell_labels(self, settings):
        from captioner.scenes import grounding

        return grounding.cell_labels if training_settings(settings).lambda_twin else None

    def training_losses(self, model, out, batch, attention_targets, settings, device):
        from captioner.scenes import training

        return training.training_losses(model, out, batch, attention_targets, training_settings(settings), device)

    def samples_as_decoded(self, settings):
        return training_settings(settings).scst_inhibit

    def reward(self, scst, settings, train, cider):
        from captioner.scenes import training

        return training.reward(scst, training_settings(settings), train, cider)

    def caption_metrics(self, records, tokens, alphas, image_size, attention):
        from captioner.scenes import training

        return training.caption_metrics(records, tokens, alphas, image_size, attention)

    def region_metrics(self, objects, tokens):
        from captioner.scenes import regions

        return regions.region_metrics(objects, tokens)


class NumberFirst(CaptionProcessor):
    """A ``number_last`` caption in the references' order ("<num> small red circles two" -> "two small red
    circles"); with ``plurals`` (``singular_nouns``) plural phrases get their nouns' plurals back."""

    def __init__(self, plurals: dict[str, str] | None):
        self.plurals = plurals

    def reorder(self, tokens):
        return reference_order(tokens, self.plurals)


class PluralSpread(CaptionProcessor):
    """Counting with attention: a plural whose number word looked at one place is said as one."""

    def __init__(self, min_spread: float):
        self.min_spread = min_spread

    def rewrite(self, tokens, alphas):
        return said_as_one(tokens, alphas, self.min_spread), alphas


class MergeRepeats(CaptionProcessor):
    """Counting by pointing: phrases naming the same object kind are said as one phrase with their sum."""

    def rewrite(self, tokens, alphas: np.ndarray):
        tokens, sources = merge_repeats(tokens)
        if len(sources) != len(alphas):  # a merge drops a whole phrase: an unchanged caption keeps its maps
            alphas = mean_maps(alphas, sources)
        return tokens, alphas

