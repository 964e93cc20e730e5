"""Model and decoding configs described in one flat list of settings, as version-1 checkpoints held them: the
tests' shorthand for a model with plug-in settings (``configs(grid=3, count_head=True, inhibit_named=10.0)``)."""

from __future__ import annotations

from typing import Any

from captioner.checkpoints.version1 import split
from captioner.decoding.config import DecodingConfig
from captioner.model.config import ModelConfig


def configs(**flat: Any):
    """(ModelConfig, DecodingConfig) from settings in the flat form (see the module docstring)."""
    model, decoding = split(flat)
    return ModelConfig(**model), DecodingConfig(**decoding)
