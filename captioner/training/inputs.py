"""What the loops read: the train/val splits, features from the cache or images, and the SCST reward."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from captioner.training.augment import augmented_transform
from captioner.data.cache import FeatureCache
from captioner.data.karpathy import ImageFileLoader, KarpathySplit, resolve_dataset_path
from captioner import plugins
from captioner.errors import CaptionerError
from captioner.model.captioner import Captioner
from captioner.training.scst import CiderD


def _dataset_path(dataset: str, data) -> str:
    return dataset if Path(dataset).exists() else str(resolve_dataset_path(dataset, data.data_root))


def load_splits(data) -> tuple[KarpathySplit, KarpathySplit]:
    """(train, val) of ``data`` (a ``DataConfig``), each cut to its ``max_*_images``."""
    train = KarpathySplit.load(_dataset_path(data.dataset, data), "train", data.image_root)
    val = KarpathySplit.load(train.json_path, "val", data.image_root)
    if data.max_train_images is not None:
        train.records = train.records[:data.max_train_images]
    if data.max_val_images is not None:
        val.records = val.records[:data.max_val_images]
    return train, val


def load_scst_split(cfg, train: KarpathySplit) -> KarpathySplit:
    """The split the self-critical epochs sample from: ``train``, or the train split of ``cfg.scst.dataset`` (cut
    to ``max_train_images`` like the training split), its images beside its own JSON: ``--image-root`` names the
    training dataset's folder, and two datasets of scenes share file names."""
    if cfg.scst.dataset is None:
        return train
    path = Path(resolve_dataset_path(_dataset_path(cfg.scst.dataset, cfg.data))).resolve()
    trained = Path(train.json_path).resolve()
    if path == trained or path == trained.parent:  # the training dataset itself (its JSON, or its folder)
        return train
    split = KarpathySplit.load(path, "train")
    if cfg.data.max_train_images is not None:
        split.records = split.records[:cfg.data.max_train_images]
    return split


def input_loader(model: Captioner, split: KarpathySplit, use_cache: bool, cfg) -> Callable:
    """Index -> model input: cached annotations (frozen encoder) or a preprocessed image."""
    if use_cache:
        cache = FeatureCache.open_or_build(model, split, cfg.run.cache_dir, progress=cfg.run.progress)
        if cfg.run.progress:
            print(cache.describe(), flush=True)
        return cache
    return ImageFileLoader(split.image_paths, model.preprocessing.transform())


def train_input_loader(model: Captioner, split: KarpathySplit, use_cache: bool, cfg) -> Callable:
    """Like ``input_loader``, with --augment applied when training reads images."""
    if cfg.optim.augment and not use_cache:
        return ImageFileLoader(split.image_paths, augmented_transform(model.preprocessing))
    return input_loader(model, split, use_cache, cfg)


def make_reward(scst, train: KarpathySplit, settings: dict | None = None):
    """The self-critical reward named by ``scst.reward`` (a ``ScstConfig``), built from the train split;
    ``settings``: the run's plug-in training settings (weights of the plug-in's reward terms)."""
    cider = CiderD([train.references(i) for i in range(len(train))]) if "cider" in scst.reward else None
    if scst.reward == "cider":
        return cider
    if train.plugin is None:  # the other terms score a caption against the data's own annotations
        raise CaptionerError(f"--scst-reward {scst.reward} needs annotations that {train.json_path} lacks (its "
                             "JSON names no plug-in, such as the synthetic scenes' objects).")
    return plugins.get(train.plugin, "dataset plugin").reward(scst, settings or {}, train, cider)
