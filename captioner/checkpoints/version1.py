"""The one reader of version-1 checkpoints, whose config.json holds every setting in one flat model section.
Before plug-ins, ``ModelConfig`` held the synthetic scenes' settings and the decoding settings beside the
architecture. Here they are moved to where they live now: the decoding settings into a ``DecodingConfig``
dictionary, and the scenes' into ``plugin_config`` / ``plugin_settings`` of plug-in ``scenes``. A setting at its
old default is dropped, so a photo model's old config names no plug-in. Weight names move with them:
``decoder.count_head...`` is ``decoder.extension.count_head...`` now.
"""

from __future__ import annotations

from typing import Any

from captioner.plugins import settings as plugin_settings

DECODING_FIELDS = ("max_len", "length_penalty")  # ModelConfig fields that are DecodingConfig fields now
_EXTENSION_WEIGHTS = ("count_head.", "count_mask.", "count_mask_bias", "lookalike.", "lookalike_near.")


def split(model: dict[str, Any], decoding: dict[str, Any] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(model settings, decoding settings) of a version-1 config.json's flat model section; plug-in settings at
    their default (off) are left out, so an old photo model names no plug-in. The input is not changed."""
    model, decoding = dict(model), dict(decoding or {})
    for name in DECODING_FIELDS:
        if name in model:
            decoding[name] = model.pop(name)
    model, decoding, _ = plugin_settings.place(model, decoding, {}, drop_defaults=True)
    return model, decoding


def is_flat(model: dict[str, Any]) -> bool:
    return any(k in DECODING_FIELDS or plugin_settings.find(k, ("model", "decoding")) for k in model)


def weight_name(name: str) -> str:
    """A version-1 checkpoint's tensor name as the decoder names it now."""
    for prefix in _EXTENSION_WEIGHTS:
        if name.startswith("decoder." + prefix):
            return "decoder.extension." + name[len("decoder."):]
    return name
