"""Command-line flag names <-> ``TrainConfig`` settings: the table that keeps every flag's old name.

Apart from ``captioner.training.flags`` (which reads flags into a TrainConfig) so that the config's own messages can
name flags without importing the module that builds on it.
"""

from __future__ import annotations

from captioner.plugins import settings as plugin_settings

# Command-line flag (argparse dest) -> (section, field). Flags keep the names they always had.
FLAGS = {
    "dataset": ("data", "dataset"), "data_root": ("data", "data_root"), "image_root": ("data", "image_root"),
    "min_word_count": ("data", "min_word_count"), "max_caption_len": ("data", "max_caption_len"),
    "max_train_images": ("data", "max_train_images"), "max_val_images": ("data", "max_val_images"),
    **{name: ("model", name) for name in (
        "encoder", "encoder_weights", "grid", "fine_tune_from", "attention", "score", "value_projection",
        "channel_attention", "self_attention", "positional", "location", "word_query", "hard_inference",
        "embed_dim", "hidden_dim", "attention_dim", "dropout")},
    "length_penalty": ("decoding", "length_penalty"),
    "no_gate": ("model", "gate"), "no_deep_output": ("model", "deep_output"),
    **{name: ("optim", name) for name in (
        "epochs", "batch_size", "lr", "lr_decay", "encoder_lr", "fine_tune_after", "augment", "grad_clip",
        "lambda_ds", "entropy_penalty", "lambda_att", "att_loss", "time_limit",
        "time_clock", "group_by_image")},
    "no_group_by_image": ("optim", "group_by_image"), "no_location": ("model", "location"),
    **{name: ("hard", name) for name in ("entropy_weight", "reinforce_weight", "sample_prob", "baseline_decay")},
    "scst_from": ("scst", "start_epoch"), "scst_reward": ("scst", "reward"),
    "scst_samples": ("scst", "samples"),
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
NEGATED = {"no_gate", "no_deep_output", "no_meteor", "no_progress", "no_group_by_image", "no_location"}
# A plug-in's settings have flags too, declared in its settings.toml (captioner.plugins.settings).


def flag_for(section: str, name: str) -> str:
    """The command-line flag of a setting (for messages), else its recipe name ``section.field``. A plug-in's
    setting (``model.plugin_config.X``, ``decoding.plugin_settings.X``, ``plugin.X``) has its declared flag."""
    short = name.rsplit(".", 1)[-1]
    declared = plugin_settings.find(short) if "." in name or section == "plugin" else None
    if declared is not None:
        return "--" + declared.flag.replace("_", "-")
    for dest, where in FLAGS.items():
        if where == (section, name):
            return "--" + dest.replace("_", "-")
    return f"{section}.{name}"
