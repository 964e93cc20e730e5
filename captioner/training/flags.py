"""Command-line flags -> ``TrainConfig``: ``from_args`` (defaults < recipe < flags given)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from captioner.training.config import DataConfig, TrainConfig, default_recipe
from captioner.training.flag_names import FLAGS, NEGATED, NONE_WORD, flag_for  # noqa: F401 (flag_for: re-exported)

def from_args(args, argv_config: str | None = None) -> TrainConfig:
    """Defaults < recipe (``--config``, or the dataset's default recipe; on ``--resume``, the run's own
    train_config.toml) < the flags given (non-None values)."""
    recipe = getattr(args, "config", None)
    if recipe is None:
        dataset = getattr(args, "dataset", None)
        recipe = default_recipe(dataset if dataset is not None else DataConfig.dataset)
    cfg = TrainConfig.from_recipe(recipe) if recipe else TrainConfig()
    nested = flag_overrides(args)
    if nested.get("model", {}).get("number_last") is False:
        # a recipe's singular nouns and inhibited SCST samples belong to its number_last: --no-number-last switches
        # them off unless they are given too (inhibit_named: below, once the settings are resolved)
        recipe = {"model": cfg.model.plugin_config, "scst": vars(cfg.scst)}
        for section, name in (("model", "singular_nouns"), ("scst", "inhibit")):
            if name not in nested.get(section, {}) and recipe[section].get(name):
                nested.setdefault(section, {})[name] = False
    cfg = cfg.updated(nested, "the command line")
    saved = Path(cfg.run.out) / "train_config.toml"
    if cfg.run.resume and getattr(args, "config", None) is None and saved.is_file():
        cfg = TrainConfig.from_recipe(saved).updated(nested, "the command line")  # resume: the run's own settings
    given = tuple(f"{s}.{n}" for s, v in nested.items() for n in v)
    if (cfg.decoding.plugin_settings.get("inhibit_named") and not cfg.model.plugin_config.get("number_last")
            and "model.inhibit_named" not in given):
        # a recipe's inhibition of return belongs to its number_last: --no-number-last switches both off
        cfg = cfg.updated({"model": {"inhibit_named": 0.0}})
    return replace(cfg, given=given)


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
    return nested
