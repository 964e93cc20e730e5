"""Command-line flags -> ``TrainConfig``: ``from_args`` (defaults < recipe < flags given)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from captioner.plugins import settings as plugin_settings
from captioner.errors import CaptionerError
from captioner.training import auto_recipe
from captioner.training.config import DataConfig, TrainConfig, default_recipe
from captioner.training.flag_names import FLAGS, NEGATED, NONE_WORD
from captioner.data.karpathy import resolve_dataset_path


def from_args(args, argv_config: str | None = None) -> TrainConfig:
    """Defaults < recipe (``--config``, or the dataset's default recipe; with neither, settings chosen from the
    data: ``auto_recipe``; on ``--resume``, the run's own train_config.toml) < the flags given (non-None values)."""
    recipe = getattr(args, "config", None)
    if recipe is None:
        dataset = getattr(args, "dataset", None)
        recipe = default_recipe(dataset if dataset is not None else DataConfig.dataset)
    cfg = TrainConfig.from_recipe(recipe) if recipe else TrainConfig()
    nested = flag_overrides(args)
    if not recipe:
        cfg = _from_the_data(cfg, nested)
    _switch_off_dependents(cfg, nested)
    cfg = cfg.updated(nested, "the command line")
    saved = Path(cfg.run.out) / "train_config.toml"
    if cfg.run.resume and getattr(args, "config", None) is None and saved.is_file():
        cfg = TrainConfig.from_recipe(saved).updated(nested, "the command line")  # resume: the run's own settings
    given = tuple(f"{s}.{n}" for s, v in nested.items() for n in v)
    return replace(cfg, given=given)


def _from_the_data(cfg: TrainConfig, nested: dict) -> TrainConfig:
    """``cfg`` with the settings ``auto_recipe`` chooses for the dataset the flags name, and the line saying so in
    ``cfg.auto``; unchanged for a plug-in's data (the synthetic scenes by path) and when the dataset cannot be
    read yet (training then names the problem)."""
    data = cfg.updated({"data": nested.get("data", {})}).data
    try:
        path = Path(data.dataset)
        path = path if path.exists() else resolve_dataset_path(data.dataset, data.data_root)
        shape = auto_recipe.data_shape(path)
    except (CaptionerError, OSError, ValueError, KeyError, TypeError):
        return cfg
    if not shape.captions or shape.plugin is not None:  # nothing to count, or a plug-in's data (its recipes)
        return cfg
    settings = auto_recipe.auto_settings(shape)
    return replace(cfg.updated(settings, "the settings from the data"), auto=auto_recipe.describe(shape, settings))


def _where(setting) -> str:
    """The section of ``flag_overrides``' result a plug-in setting goes to (flat names in "model" are placed by
    ``TrainConfig.updated``)."""
    return "plugin" if setting.where == "train" else "model"


def _switch_off_dependents(cfg: TrainConfig, nested: dict) -> None:
    """A plug-in setting that needs another (``with`` in its settings.toml: the scenes' singular nouns, inhibition
    and inhibited SCST samples need number_last): switching that one off on the command line switches off the
    recipe's value of this one too, unless it is given as well."""
    current = {**cfg.model.plugin_config, **cfg.decoding.plugin_settings, **cfg.plugin}
    for s in plugin_settings.settings():
        needed = plugin_settings.find(s.requires) if s.requires else None
        if needed is None or nested.get(_where(needed), {}).get(needed.name, True) is not False:
            continue
        if s.name not in nested.get(_where(s), {}) and current.get(s.name, s.default) != s.default:
            nested.setdefault(_where(s), {})[s.name] = s.default


def flag_overrides(args) -> dict[str, dict[str, Any]]:
    """The settings the flags in ``args`` set (argparse dests with non-None values), nested like a recipe."""
    nested: dict[str, dict] = {}
    for dest, value in vars(args).items():
        if dest not in FLAGS or value is None or (dest in NEGATED and not value):
            continue
        section, name = FLAGS[dest]
        if dest in NONE_WORD and value == "none":  # switches off a recipe's setting, as "none" in a recipe file
            value = None
        nested.setdefault(section, {})[name] = False if dest in NEGATED else value
    for name, value in plugin_settings.given(args, ("model", "decoding", "train")).items():
        nested.setdefault(_where(plugin_settings.find(name)), {})[name] = value
    return nested
