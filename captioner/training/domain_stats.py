"""The out-of-domain check a finished run stores beside its best checkpoint (``domain.safetensors``).

At the end of ``fit`` the best checkpoint is loaded and its encoder's annotations of at most
``eval.domain_images`` training images (from the feature cache when the run used one, else from the image files)
give the Gaussian; at most half as many val images give the threshold (their 99.5th percentile distance). See
``captioner.model.domain`` for the statistics; ``captioner.load`` attaches the file as ``model.domain``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from captioner.checkpoints.loading import load
from captioner.data.karpathy import KarpathySplit
from captioner.model.domain import DomainCheck, encode_pooled, fit_domain, fit_from_annotations

PERCENTILE = 99.5  # of the val images' distances: the threshold
SHOWN_NAMES = {"shapes": "synthetic shapes"}  # the generated scenes, named as the app's notice says it


def dataset_name(json_path: Path) -> str:
    """The training data's name for messages: "synthetic shapes" for the scenes, else the Karpathy JSON's
    ``dataset`` field (its file name without ``dataset_`` when the field is missing)."""
    name = ""
    try:
        data = json.loads(Path(json_path).read_text())
        name = data.get("dataset", "") if isinstance(data, dict) else ""
    except (OSError, ValueError):
        pass  # the run read it moments ago; a name from the file name will do
    if not isinstance(name, str) or not name.strip():
        name = Path(json_path).stem.removeprefix("dataset_")
    return SHOWN_NAMES.get(name, name)


def _batches(load_input: Callable[[int], torch.Tensor], count: int, size: int = 64) -> Iterator[torch.Tensor]:
    for start in range(0, count, size):
        yield torch.stack([load_input(i) for i in range(start, min(count, start + size))])  # (B, L, C)


def fit_run_domain(out: Path, train: KarpathySplit, val: KarpathySplit, images: int, use_cache: bool,
                   input_loader: Callable, device: str) -> DomainCheck | None:
    """Fit the check for the best checkpoint in ``out`` on the first ``images`` train and ``images // 2`` val
    images, save it as ``out/domain.safetensors`` and print one line; None (and a warning) when it cannot be fitted.

    ``input_loader(model, split, use_cache)`` gives index -> cached annotations (L, C) or an image tensor (3, H, W),
    as training read them; the cache is only used when the best checkpoint's encoder is the one it was built with
    (the caller passes ``use_cache`` False once the encoder was fine-tuned)."""
    n_train, n_val = min(images, len(train)), min(max(1, images // 2), len(val))
    if n_train < 2:
        print(f"warning: out-of-domain check not fitted: it needs at least 2 training images, the run has "
              f"{len(train)}.", file=sys.stderr, flush=True)
        return None
    model = load(out, device=device)
    name = dataset_name(train.json_path)
    info = {"encoder": model.cfg.encoder, "fit": f"first {n_train} train images of {train.json_path}; "
                                                 f"threshold on {n_val} val images"}
    train_input, val_input = input_loader(model, train, use_cache), input_loader(model, val, use_cache)
    try:
        if use_cache:
            check = fit_from_annotations(_batches(train_input, n_train), _batches(val_input, n_val), name,
                                         PERCENTILE, info=info)
        else:  # images one batch at a time: thousands of (3, H, W) tensors would not fit in memory at once
            train_feats = encode_pooled(model, map(train_input, range(n_train)))  # (N, D)
            val_feats = encode_pooled(model, map(val_input, range(n_val)))  # (M, D)
            check = fit_domain(train_feats, val_feats, PERCENTILE, dataset=name, info=info)
    except (ValueError, RuntimeError) as e:  # e.g. identical features: a singular covariance
        print(f"warning: out-of-domain check not fitted ({str(e).splitlines()[0]}).", file=sys.stderr, flush=True)
        return None
    path = check.save(out)
    print(f"out-of-domain check: {path} ({name!r}, {n_train} train images; threshold {check.threshold:.2f} = "
          f"{PERCENTILE}th percentile of {n_val} val images)", flush=True)
    return check
