"""The one reader of settings in their older, flat form: config.json of version-1 checkpoints, and recipes or
flags that name a plug-in's settings in the model section.

Before plug-ins, ``ModelConfig`` held the synthetic scenes' settings and the decoding settings beside the
architecture. Here they are moved to where they live now: the decoding settings into a ``DecodingConfig``
dictionary, and the scenes' into ``plugin_config`` / ``plugin_settings`` of plug-in ``scenes``. A setting at its
old default is dropped, so a photo model's old config names no plug-in. Weight names move with them:
``decoder.count_head...`` is ``decoder.extension.count_head...`` now.
"""

from __future__ import annotations

from typing import Any

from captioner.config import ModelConfig
from captioner.decoding import DecodingConfig

DATASETS = {"shapes": "scenes"}  # datasets written before their JSON named its plug-in ("plugin")
DECODING_FIELDS = ("max_len", "length_penalty")  # ModelConfig fields that are DecodingConfig fields now
PLUGIN = "scenes"  # the plug-in the flat settings below belong to
PLUGIN_MODEL_FIELDS = ("lookalike", "lookalike_near", "count_head", "count_mask", "number_last", "singular_nouns")
PLUGIN_DECODING_FIELDS = ("inhibit_named", "repeat_penalty", "merge_repeats", "plural_spread")
# their values when off, which their flat flags show as defaults
OFF = {"lookalike": 0, "lookalike_near": 0, "count_head": False, "count_mask": False, "number_last": False,
       "singular_nouns": False, "inhibit_named": 0.0, "repeat_penalty": 0.0, "merge_repeats": False,
       "plural_spread": 0.0}
_EXTENSION_WEIGHTS = ("count_head.", "count_mask.", "count_mask_bias", "lookalike.", "lookalike_near.")


def is_flat(model: dict[str, Any]) -> bool:
    return any(k in model for k in DECODING_FIELDS + PLUGIN_MODEL_FIELDS + PLUGIN_DECODING_FIELDS)


def split(model: dict[str, Any], decoding: dict[str, Any] | None = None,
          drop_defaults: bool = True) -> tuple[dict[str, Any], dict[str, Any]]:
    """(model settings, decoding settings) from a flat model section (and decoding settings given apart, which
    the flat ones update). ``drop_defaults``: leave out plug-in settings that are off (an old checkpoint's); keep
    them to override a recipe's (flags). Neither input is changed."""
    model, decoding = dict(model), dict(decoding or {})
    for name in DECODING_FIELDS:
        if name in model:
            decoding[name] = model.pop(name)
    plugin_config = {k: model.pop(k) for k in PLUGIN_MODEL_FIELDS if k in model}
    plugin_settings = {k: model.pop(k) for k in PLUGIN_DECODING_FIELDS if k in model}
    plugin_config = {**model.get("plugin_config", {}),
                     **{k: v for k, v in plugin_config.items() if v or not drop_defaults}}
    plugin_settings = {**decoding.get("plugin_settings", {}),
                       **{k: v for k, v in plugin_settings.items() if v or not drop_defaults}}
    if plugin_config or plugin_settings:
        model.setdefault("plugin", PLUGIN)
    if plugin_config:
        model["plugin_config"] = plugin_config
    if plugin_settings:
        decoding["plugin_settings"] = plugin_settings
    return model, decoding


def configs(**flat: Any):
    """(ModelConfig, DecodingConfig) from settings in the flat form, e.g. ``configs(grid=3, count_head=True,
    inhibit_named=10.0)``: for tests and scripts that describe a model in one list."""
    model, decoding = split(flat)
    return ModelConfig(**model), DecodingConfig(**decoding)


def dataset_plugin(data: dict) -> str | None:
    """The plug-in a Karpathy JSON's annotations belong to: its "plugin", or the one of an older known dataset."""
    name = data.get("plugin")
    return name if isinstance(name, str) else DATASETS.get(data.get("dataset"))


def weight_name(name: str) -> str:
    """A version-1 checkpoint's tensor name as the decoder names it now."""
    for prefix in _EXTENSION_WEIGHTS:
        if name.startswith("decoder." + prefix):
            return "decoder.extension." + name[len("decoder."):]
    return name
