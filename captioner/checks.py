"""Checks of single config values, shared by every config (model, decoding, preprocessing, plug-ins).

Each raises ``ConfigError`` naming the field, the value and what was expected: a checkpoint's JSON comes from
someone else, and a wrong value there must stop with one clear sentence, not a traceback deep inside torch.
"""

from __future__ import annotations

import math
from dataclasses import fields

from captioner.errors import ConfigError


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


def check_fields(cls, d: object, prefix: str, what: str) -> dict:
    """``d`` is a JSON object whose names are all fields of dataclass ``cls``; ``what`` names them in the error
    ("model field")."""
    if not isinstance(d, dict):
        raise ConfigError(prefix.rstrip("."), type(d).__name__, f"is not an object of {what}s")
    unknown = sorted(set(d) - {f.name for f in fields(cls)})
    if unknown:
        raise ConfigError(prefix + str(unknown[0]), d[unknown[0]], f"is not a {what}")
    return d
