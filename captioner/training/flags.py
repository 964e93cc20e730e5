"""Command-line flags <-> ``TrainConfig`` settings: the table that keeps every flag's old name, and
``from_args`` (defaults < recipe < flags given)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from captioner.training.config import DEFAULT_RECIPES, DataConfig, TrainConfig

# Command-line flag (argparse dest) -> (section, field). Flags keep the names they always had.
FLAGS = {
    "dataset": ("data", "dataset"), "data_root": ("data", "data_root"), "image_root": ("data", "image_root"),
    "min_word_count": ("data", "min_word_count"), "max_caption_len": ("data", "max_caption_len"),
    "max_train_images": ("data", "max_train_images"), "max_val_images": ("data", "max_val_images"),
    **{name: ("model", name) for name in (
        "encoder", "encoder_weights", "grid", "fine_tune_from", "attention", "score", "value_projection",
        "channel_attention", "self_attention", "positional", "lookalike", "lookalike_near", "location", "word_query",
        "count_head", "count_mask", "number_last", "singular_nouns", "hard_inference", "embed_dim", "hidden_dim",
        "attention_dim", "dropout", "inhibit_named", "length_penalty", "repeat_penalty", "merge_repeats",
        "plural_spread")},
    "no_gate": ("model", "gate"), "no_deep_output": ("model", "deep_output"),
    **{name: ("optim", name) for name in (
        "epochs", "batch_size", "lr", "lr_decay", "encoder_lr", "fine_tune_after", "augment", "grad_clip",
        "lambda_ds", "entropy_penalty", "lambda_att", "att_loss", "lambda_mask", "lambda_twin", "time_limit",
        "time_clock", "group_by_image")},
    "no_group_by_image": ("optim", "group_by_image"), "no_number_last": ("model", "number_last"),
    "no_location": ("model", "location"),
    **{name: ("hard", name) for name in ("entropy_weight", "reinforce_weight", "sample_prob", "baseline_decay")},
    "scst_from": ("scst", "start_epoch"), "scst_reward": ("scst", "reward"),
    "scst_object_weight": ("scst", "object_weight"), "scst_count_weight": ("scst", "count_weight"),
    "scst_count_over": ("scst", "count_over"), "scst_split_score": ("scst", "split_score"),
    "scst_samples": ("scst", "samples"), "scst_inhibit": ("scst", "inhibit"),
    "scst_batch_size": ("scst", "batch_size"), "scst_lr": ("scst", "lr"), "scst_dataset": ("scst", "dataset"),
    **{name: ("eval", name) for name in ("metric", "patience", "val_beam_size", "test_beam_size", "test_splits",
                                         "max_test_images", "domain_images")},
    "no_meteor": ("eval", "meteor"),
    **{name: ("run", name) for name in ("out", "resume", "seed", "cache", "cache_dir", "workers", "device", "amp",
                                        "save_every", "threads")},
    "no_progress": ("run", "progress"),
}
# optional settings whose flag takes "none" for None (the recipe's value switched off)
NONE_WORD = {"scst_dataset"}
# store_true flags that switch a field off
NEGATED = {"no_gate", "no_deep_output", "no_meteor", "no_progress", "no_group_by_image",
           "no_number_last", "no_location"}


def flag_for(section: str, name: str) -> str:
    """The command-line flag of a setting (for messages), else its recipe name ``section.field``."""
    for dest, where in FLAGS.items():
        if where == (section, name):
            return "--" + dest.replace("_", "-")
    return f"{section}.{name}"


def from_args(args, argv_config: str | None = None) -> TrainConfig:
    """Defaults < recipe (``--config``, or the dataset's default recipe; on ``--resume``, the run's own
    train_config.toml) < the flags given (non-None values)."""
    recipe = getattr(args, "config", None)
    if recipe is None:
        dataset = getattr(args, "dataset", None)
        recipe = DEFAULT_RECIPES.get(dataset if dataset is not None else DataConfig.dataset)
    cfg = TrainConfig.from_recipe(recipe) if recipe else TrainConfig()
    nested = flag_overrides(args)
    if nested.get("model", {}).get("number_last") is False:
        # a recipe's singular nouns and inhibited SCST samples belong to its number_last: --no-number-last switches
        # them off unless they are given too (inhibit_named: below, once the settings are resolved)
        for section, name in (("model", "singular_nouns"), ("scst", "inhibit")):
            if name not in nested.get(section, {}) and getattr(getattr(cfg, section), name):
                nested.setdefault(section, {})[name] = False
    cfg = cfg.updated(nested, "the command line")
    saved = Path(cfg.run.out) / "train_config.toml"
    if cfg.run.resume and getattr(args, "config", None) is None and saved.is_file():
        cfg = TrainConfig.from_recipe(saved).updated(nested, "the command line")  # resume: the run's own settings
    given = tuple(f"{s}.{n}" for s, v in nested.items() for n in v)
    if cfg.model.inhibit_named and not cfg.model.number_last and "model.inhibit_named" not in given:
        # a recipe's inhibition of return belongs to its number_last: --no-number-last switches both off
        cfg = replace(cfg, model=replace(cfg.model, inhibit_named=0.0))
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
