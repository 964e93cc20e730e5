"""``TrainConfig``: every setting of a training run in one nested dataclass that validates itself.

Defaults live here (and suit photos); a recipe file (``captioner/recipes/NAME.toml``, sections named like the
fields below) overrides them, command-line flags override the recipe, and the resolved config is saved in the
run folder as ``train_config.toml``. ``validate()`` runs before any data is read. Reading and writing recipe
files is ``captioner.training.recipes``.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from captioner import plugins

from captioner.checkpoints import version1

from captioner.plugins import settings as plugin_settings
from captioner.model.config import ModelConfig
from captioner.decoding.config import DecodingConfig
from captioner.encoders import ENCODERS
from captioner.errors import ConfigError as ModelConfigError
from captioner.training.flag_names import flag_for
from captioner.training.recipes import RECIPES, SettingError, default_recipe, find_recipe, read_recipe, toml_value

__all__ = ["default_recipe", "RECIPES", "SettingError", "TrainConfig", "find_recipe", "check_out_folder"]


@dataclass
class DataConfig:
    dataset: str = "shapes"  # a name under data_root, a dataset_<name>.json, or its folder
    data_root: str = "datasets"
    image_root: str | None = None  # image folder if not beside the JSON
    min_word_count: int = 5
    max_caption_len: int = 30  # training captions are cut to this many words; also the model's max_len
    max_train_images: int | None = None
    max_val_images: int | None = None


@dataclass
class OptimConfig:
    epochs: int = 20
    batch_size: int = 64
    lr: float = 4e-4
    lr_decay: float = 1.0
    encoder_lr: float = 1e-4
    fine_tune_after: int | None = None
    augment: bool = False
    grad_clip: float = 5.0
    lambda_ds: float = 1.0  # the paper's doubly stochastic weight (photos); the scenes' recipes use 0
    entropy_penalty: float = 0.0
    lambda_att: float = 0.0
    att_loss: str = "match"
    time_limit: float | None = None  # minutes
    # what time_limit counts: "wall" seconds, or "cpu": the process's CPU seconds / its torch threads, i.e. the
    # wall time the run would take alone on an idle machine (fair budgets when other work shares the cores)
    time_clock: str = "wall"
    # batches of whole images (shuffled image order, each image's captions together): an image is encoded and,
    # for soft attention, read once per step for all its captions (1.2-1.8x faster cached steps of the shipped
    # model at 5 captions per image; docs/experiments/speed.md)
    group_by_image: bool = False


@dataclass
class HardConfig:
    """Hard attention's REINFORCE objective; used whenever the model's attention is hard."""
    entropy_weight: float = 0.002
    reinforce_weight: float = 0.1
    sample_prob: float = 0.5
    baseline_decay: float = 0.9


@dataclass
class ScstConfig:
    start_epoch: int | None = None  # 1-based; None: no self-critical epochs
    reward: str = "cider"  # or a reward of the data's plug-in (its settings.toml lists them)
    samples: int = 5
    batch_size: int = 32
    lr: float = 1e-4
    # the scenes the self-critical epochs sample and score: the train split of this dataset (named as --dataset
    # names one, under the same data_root and image_root); None: the training split. Cross-entropy can then learn
    # from scenes drawn another way (more repeated objects) while the reward sees the usual ones.
    dataset: str | None = None


@dataclass
class EvalConfig:
    metric: str = "CIDEr-D"
    patience: int = 5
    val_beam_size: int = 1
    test_beam_size: int = 3
    test_splits: str = "test,test_novel"  # comma-separated; "" skips the final scoring
    max_test_images: int | None = None
    meteor: bool = True
    domain_images: int = 2000  # train images the out-of-domain check is fitted on (half as many val); 0: none


@dataclass
class RunConfig:
    out: str = "runs/soft"
    resume: bool = False
    seed: int = 0
    cache: str = "auto"
    cache_dir: str = ".cache/features"
    workers: int = 0
    device: str = "auto"
    amp: str = "off"
    save_every: int = 0
    threads: int | None = None
    progress: bool = True


SECTIONS = {"data": DataConfig, "model": ModelConfig, "decoding": DecodingConfig, "optim": OptimConfig, "hard": HardConfig,
            "scst": ScstConfig, "eval": EvalConfig, "run": RunConfig}
# the core's metrics; plug-ins add theirs (and their SCST rewards) in their settings.toml
METRICS = ("BLEU-1", "BLEU-2", "BLEU-3", "BLEU-4", "ROUGE-L", "CIDEr-D", "BLEU-4 (nltk)",
           *plugin_settings.metrics())
CHOICES = {("optim", "att_loss"): ("match", "mass"), ("optim", "time_clock"): ("wall", "cpu"),
           ("scst", "reward"): ("cider", *plugin_settings.rewards()),
           ("eval", "metric"): METRICS,
           ("run", "cache"): ("auto", "on", "off"), ("run", "amp"): ("off", "bf16", "fp16")}
# (section, field): (low, high, inclusive low) -- what a value may be; None: no bound on that side
RANGES = {("data", "min_word_count"): (1, None), ("data", "max_caption_len"): (1, 1000),
          ("data", "max_train_images"): (1, None), ("data", "max_val_images"): (1, None),
          ("optim", "epochs"): (1, None), ("optim", "batch_size"): (1, 65536), ("optim", "lr"): (1e-12, 10.0),
          ("optim", "lr_decay"): (1e-6, 1.0), ("optim", "encoder_lr"): (0.0, 10.0),
          ("optim", "fine_tune_after"): (0, None), ("optim", "grad_clip"): (0.0, None),
          ("optim", "lambda_ds"): (0.0, None), ("optim", "entropy_penalty"): (0.0, None),
          ("optim", "lambda_att"): (0.0, None),
          ("optim", "time_limit"): (1e-6, None),
          ("hard", "entropy_weight"): (0.0, None), ("hard", "reinforce_weight"): (0.0, None),
          ("hard", "sample_prob"): (0.0, 1.0), ("hard", "baseline_decay"): (0.0, 1.0),
          ("scst", "start_epoch"): (1, None), ("scst", "samples"): (2, 1024),
          ("scst", "batch_size"): (1, 65536), ("scst", "lr"): (1e-12, 10.0),
          ("eval", "patience"): (1, None), ("eval", "val_beam_size"): (1, 100), ("eval", "test_beam_size"): (1, 100),
          ("eval", "max_test_images"): (1, None), ("eval", "domain_images"): (0, None),
          ("run", "workers"): (0, 256), ("run", "save_every"): (0, None),
          ("run", "threads"): (1, 1024)}


@dataclass
class TrainConfig:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=lambda: ModelConfig(encoder_weights="default"))
    decoding: DecodingConfig = field(default_factory=DecodingConfig)  # for validation and test captions
    optim: OptimConfig = field(default_factory=OptimConfig)
    hard: HardConfig = field(default_factory=HardConfig)
    scst: ScstConfig = field(default_factory=ScstConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    run: RunConfig = field(default_factory=RunConfig)
    # the training settings of the model's plug-in (its settings.toml, "train"), e.g. {"lambda_mask": 1.0}
    plugin: dict = field(default_factory=dict)
    given: tuple[str, ...] | None = None  # "section.field" set on the command line; None: a library call
    auto: str | None = None  # what was chosen from the data (no recipe names the dataset): captioner.training.auto_recipe

    # ------------------------------------------------------------------ building
    def to_dict(self) -> dict[str, dict[str, Any]]:
        return {**{name: asdict(getattr(self, name)) for name in SECTIONS}, "plugin": dict(self.plugin)}

    @classmethod
    def from_dict(cls, d: dict, source: str = "the config") -> "TrainConfig":
        return cls().updated(d, source)

    def updated(self, d: dict, source: str = "the config") -> "TrainConfig":
        """A copy with the sections/fields of ``d`` (a nested dict, as in a recipe) replacing this one's."""
        sections = {}
        d = _placed(d, self)
        plugin = {**self.plugin, **d.pop("plugin", {})}
        for name, values in d.items():
            if name not in SECTIONS or not isinstance(values, dict):
                raise SettingError(f"{source}: unknown section [{name}] (expected one of "
                                   f"{', '.join([*SECTIONS, 'plugin'])}).")
            known = {f.name for f in fields(SECTIONS[name])}
            unknown = sorted(set(values) - known)
            if unknown:
                raise SettingError(f"{source}: unknown setting {name}.{unknown[0]}.")
            sections[name] = replace(getattr(self, name), **values)
        unknown = sorted(k for k in plugin if plugin_settings.find(k, ("train",)) is None)
        if unknown:
            raise SettingError(f"{source}: unknown setting plugin.{unknown[0]}.")
        return replace(self, **sections, plugin=plugin)

    @classmethod
    def from_recipe(cls, recipe: str | os.PathLike) -> "TrainConfig":
        path = find_recipe(recipe)
        return cls.from_dict(read_recipe(path, SECTIONS), f"recipe {path}")

    def to_toml(self) -> str:
        """The resolved settings as a recipe file (``--config`` reads it back; None is written "none")."""
        lines = [f"# {self.auto}", ""] if self.auto else []
        for name in SECTIONS:
            lines.append(f"[{name}]")
            for key, value in asdict(getattr(self, name)).items():
                if (name, key) in DERIVED or (name, key) == ("run", "resume"):
                    continue  # derived when the model is built; resuming is a command-line decision
                lines.append(f"{key} = {toml_value(value)}")
            lines.append("")
        if self.plugin:
            lines += ["[plugin]", *(f"{key} = {toml_value(value)}" for key, value in self.plugin.items()), ""]
        return "\n".join(lines)

    # ------------------------------------------------------------------ checking
    def validate(self) -> "TrainConfig":
        """Raise ``ConfigError`` naming the first setting that cannot work; cheap, reads no data. Returns self."""
        try:  # the model's own checks (shared with checkpoints), told in flag names
            model = self.resolved_model().validate()
            self.decoding.validate(model.plugin_module(), model.plugin_config)
        except ModelConfigError as e:
            section, name = e.field.split(".", 1) if "." in e.field else ("model", e.field)
            shown = repr(e.value) if isinstance(e.value, str) else e.value
            raise SettingError(f"{_flag(section, name)} {shown} {e.problem}.") from None
        for name, section in SECTIONS.items():
            if name in ("model", "decoding"):
                continue
            obj = getattr(self, name)
            for f in fields(section):
                value = getattr(obj, f.name)
                _check_type(name, f, value)
                if (name, f.name) in CHOICES and value not in CHOICES[name, f.name]:
                    raise SettingError(f"{_flag(name, f.name)} {value!r} is not one of "
                                      f"{', '.join(CHOICES[name, f.name])}.")
                low, high = RANGES.get((name, f.name), (None, None))
                if value is not None and not isinstance(value, (bool, str)) and (
                        (low is not None and not value >= low) or (high is not None and not value <= high)):
                    bound = f"at least {low}" if high is None else f"between {low} and {high}"
                    raise SettingError(f"{_flag(name, f.name)} {value} is out of range: expected {bound}.")
        m = self.model
        for key, value in self.plugin.items():  # the types its settings.toml declares; the plug-in checks values
            declared = plugin_settings.find(key, ("train",))
            if value is not None and not declared.fits(value):
                raise SettingError(f"{_flag('plugin', key)} {value!r} has the wrong type: expected {declared.type}.")
            if declared.choices and value not in declared.choices:
                raise SettingError(f"{_flag('plugin', key)} {value!r} is not one of {', '.join(declared.choices)}.")
        if self.optim.fine_tune_after is not None and m.fine_tune_from is None:
            raise SettingError("--fine-tune-after needs --fine-tune-from (the first encoder stage to train).")
        if self.optim.augment and self.optim.fine_tune_after is None and self.run.cache == "on":
            raise SettingError("--augment needs images, not cached features: use --cache off or auto.")
        if self.run.cache == "on" and (m.fine_tune_from is not None or m.encoder_weights is None):
            raise SettingError("--cache on needs a frozen pretrained encoder (no --fine-tune-from, weights not 'none').")
        if self.optim.lambda_att and m.attention == "none":
            raise SettingError("--lambda-att needs attention (not --attention none).")
        plugin = model.plugin_module()
        if plugin is None and self.plugin:  # e.g. a scene reward's weights for a model without scene devices
            plugin = plugins.get(plugin_settings.find(sorted(self.plugin)[0], ("train",)).plugin, "plugin")
        if plugin is not None:
            plugin.check_training(self)
        if self.run.amp == "fp16" and self.run.device == "cpu":
            raise SettingError("--amp fp16 needs a CUDA device; on the CPU use --amp bf16 or off.")
        check_out_folder(Path(self.run.out))
        return self

    # ------------------------------------------------------------------ model and objective
    def resolved_model(self) -> ModelConfig:
        """The ModelConfig to build: encoder weights 'default'/'none' resolved."""
        weights = self.model.encoder_weights
        if weights == "default":  # an unknown encoder keeps "default": validate() names the encoder
            entry = ENCODERS.get(self.model.encoder)
            weights = entry.default_weights if entry is not None else weights
        elif weights in ("none", ""):
            weights = None
        return replace(self.model, encoder_weights=weights)

    def resolved_decoding(self) -> DecodingConfig:
        """The DecodingConfig of validation, test and the checkpoint: max_len from the data settings."""
        return replace(self.decoding, max_len=self.data.max_caption_len)


def check_out_folder(out: Path) -> None:
    """The run folder must be creatable and writable: checked first, so no epoch is trained in vain."""
    probe = out
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        raise SettingError(f"--out {out}: {probe} is a file, not a folder.")
    try:  # a real write, not os.access: root passes access checks where writes still fail (/proc, read-only mounts)
        tempfile.TemporaryDirectory(dir=probe, prefix=".write-test-").cleanup()
    except OSError as e:
        raise SettingError(f"--out {out}: cannot write in {probe} ({e.strerror or e}).") from None


# set when the model is built (max_len: from the data section)
DERIVED = (("model", "encoder_channels"), ("model", "vocab_size"), ("decoding", "max_len"))


def _flag(section: str, name: str) -> str:
    return flag_for(section, name)


def _check_type(section: str, f, value) -> None:
    kind = str(f.type)
    ok = True
    if value is None:
        ok = "None" in kind
    elif kind.startswith("bool"):
        ok = isinstance(value, bool)
    elif kind.startswith("int"):
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif kind.startswith("float"):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif kind.startswith("str"):
        ok = isinstance(value, str)
    if not ok:
        raise SettingError(f"{_flag(section, f.name)} {value!r} has the wrong type: expected {kind}.")


def _placed(d: dict, cfg: "TrainConfig") -> dict:
    """``d`` (a recipe's or the flags' nested settings) with plug-in settings given flat put where they live: the
    model's and decoding ones into ``plugin_config``/``plugin_settings`` (merged with ``cfg``'s), the training ones
    into the ``plugin`` section; also in [optim] and [scst], where recipes written before plug-ins kept them."""
    d = {k: dict(v) if isinstance(v, dict) else v for k, v in d.items()}
    train = dict(d.get("plugin", {}))
    for section, renamed in (("optim", {}), ("scst", {"inhibit": "scst_inhibit"})):
        for key in list(d.get(section, {})):
            name = renamed.get(key, key)
            declared = plugin_settings.find(name, ("train",))
            if declared is not None:
                value = d[section].pop(key)
                if value != declared.default:  # a default says nothing, and a photo recipe names no plug-in
                    train[name] = value
    if isinstance(d.get("model"), dict) and any(plugin_settings.find(k) or k in version1.DECODING_FIELDS for k in d["model"]):
        model = {"plugin_config": cfg.model.plugin_config, **d["model"]}
        decoding = {"plugin_settings": cfg.decoding.plugin_settings, **d.get("decoding", {})}
        for key in version1.DECODING_FIELDS:  # decoding settings of the model section before DecodingConfig
            if key in model:
                decoding[key] = model.pop(key)
        model, decoding, train = plugin_settings.place(model, decoding, train)
        d["model"], d["decoding"] = model, decoding
    if train:
        d["plugin"] = train
    return d

