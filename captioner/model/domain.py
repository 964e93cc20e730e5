"""Is an image like the training images? A Gaussian over pooled encoder features, stored with the checkpoint.

A model trained on synthetic shapes answers a photo of a cat with confident nonsense. Its encoder's features say
the photo is unlike anything it was trained on: we fit a Gaussian to pooled annotations of the training images
(by default the log of each channel's spatial mean and std; Ledoit-Wolf shrunk covariance, so a few thousand images
suffice for a few hundred channels), score an image by its Mahalanobis distance to that Gaussian, and call it out
of domain above a high percentile (99.5) of the distances of held-out in-domain images.

    check = fit_domain(train_features, held_out_features, dataset="shapes")   # (N, D), (M, D) from pool_features
    check = fit_from_model(model, train_images, val_images, dataset="shapes")   # or from PIL images / tensors
    check = fit_from_annotations(train_batches, val_batches, dataset="shapes")  # or batches (B, L, C)
    check.save("runs/x")                                  # runs/x/domain.safetensors, tensors + JSON metadata
    check = DomainCheck.load("runs/x")                    # None when the folder has no domain.safetensors
    check.check(annotations)                              # annotations (B, L, C) -> [(in_domain, score), ...]

The file holds only tensors (``mean``, ``precision``) and a JSON string in the safetensors metadata; loading it
never unpickles anything.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from captioner.errors import CheckpointError
from captioner.files import atomic_write

FILENAME = "domain.safetensors"
FORMAT = "captioner-domain"
FEATURE_KINDS = ("log-mean+std", "mean", "mean+std")  # how pool_features turns annotations (B, L, C) into vectors
LOG_EPS = 0.01  # floor inside the logs of "log-mean+std"
FEW_THRESHOLD_IMAGES = 100  # a 99.5th percentile of fewer held-out distances than this is a rough threshold


def features_from_moments(mean: torch.Tensor, std: torch.Tensor, kind: str = "log-mean+std",
                          log_eps: float = LOG_EPS) -> torch.Tensor:
    """Per-image spatial mean (N, C) and std (N, C) of the annotations -> the vectors the Gaussian is fitted on.

    "log-mean+std" (the default, best measured in bench/domain.py): log of the positive part of the mean and log
    of the std; feature magnitudes span orders and have heavy right tails, and on a log scale a Gaussian fits them,
    so photos stand out in the directions where scenes vary little. "mean": the plain mean-pooled annotation;
    "mean+std": mean and std side by side (the std says how textured the image is)."""
    if kind == "mean":
        return mean
    if kind == "mean+std":
        return torch.cat([mean, std], dim=1)  # (N, 2C)
    if kind == "log-mean+std":
        return torch.log(torch.cat([mean.clamp_min(0), std], dim=1) + log_eps)  # (N, 2C)
    raise ValueError(f"feature kind {kind!r} is not one of {', '.join(FEATURE_KINDS)}")


def pool_features(annotations: torch.Tensor, kind: str = "log-mean+std", log_eps: float = LOG_EPS) -> torch.Tensor:
    """Annotations (B, L, C) -> one vector per image (B, D): see ``features_from_moments``."""
    annotations = annotations.float()
    mean = annotations.mean(dim=1)  # (B, C)
    # The population std by hand: torch.std over the middle dim takes a per-element path that took 11 ms for a batch
    # of 32 (196 x 232) on one thread, against 0.7 ms here (most of the domain check's time in captioning)
    centred = annotations - mean.unsqueeze(1)  # (B, L, C)
    std = centred.mul_(centred).sum(dim=1).div_(annotations.shape[1]).sqrt_()  # (B, C)
    return features_from_moments(mean, std, kind, log_eps)


def ledoit_wolf(features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Mean (D,), shrunk covariance (D, D) and the shrinkage towards a scaled identity (Ledoit & Wolf, 2004)."""
    x = features.double()
    n, d = x.shape
    mean = x.mean(0)  # (D,)
    x = x - mean  # (N, D)
    sample = x.T @ x / n  # (D, D)
    mu = torch.trace(sample) / d
    target = mu * torch.eye(d, dtype=x.dtype)
    delta = ((sample - target) ** 2).sum() / d
    # sum_k ||x_k x_k^T - S||_F^2 = sum_k ||x_k||^4 - n ||S||_F^2
    beta = ((x.pow(2).sum(1) ** 2).sum() - n * (sample ** 2).sum()) / (d * n * n)
    shrinkage = float(min(beta, delta) / delta) if delta > 0 else 1.0
    return mean, (1 - shrinkage) * sample + shrinkage * target, shrinkage


@dataclass
class DomainCheck:
    """A Gaussian over pooled annotations and the distance above which an image is out of domain."""

    mean: torch.Tensor  # (D,)
    precision: torch.Tensor  # (D, D): inverse of the shrunk covariance
    threshold: float  # Mahalanobis distance; above it, out of domain
    feature: str = "log-mean+std"  # how annotations are pooled (FEATURE_KINDS)
    percentile: float = 99.5  # of the held-out in-domain distances that gave the threshold
    dataset: str = ""  # the training data's name, for messages ("synthetic shapes")
    info: dict = field(default_factory=dict)  # JSON-safe extras: counts, shrinkage, encoder

    def distances(self, features: torch.Tensor) -> torch.Tensor:
        """Pooled features (N, D) -> Mahalanobis distances (N,)."""
        if features.dim() != 2 or features.shape[1] != self.mean.shape[0]:
            raise ValueError(f"the domain check expects ({self.mean.shape[0]},)-vectors of kind {self.feature!r}, "
                             f"got shape {tuple(features.shape)}: another encoder's annotations?")
        diff = features.double() - self.mean.double()  # (N, D)
        return ((diff @ self.precision.double()) * diff).sum(1).clamp_min(0).sqrt().float()  # (N,)

    def score(self, annotations: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Annotations (B, L, C) -> (distances (B,), in_domain (B,) bool)."""
        if annotations.dim() != 3:
            raise ValueError(f"annotations must be (B, L, C), got shape {tuple(annotations.shape)}")
        scores = self.distances(pool_features(annotations.detach().cpu(), self.feature,
                                              float(self.info.get("log_eps", LOG_EPS))))
        return scores, scores <= self.threshold

    def check(self, annotations: torch.Tensor) -> list[tuple[bool, float]]:
        """Annotations (B, L, C) -> one (in_domain, score) per image, plain Python values."""
        scores, inside = self.score(annotations)
        return [(bool(i), float(s)) for i, s in zip(inside, scores)]

    @property
    def threshold_images(self) -> int | None:
        """How many held-out images set the threshold (0: the training images themselves); None for files written
        before the count was stored."""
        n = self.info.get("held_out_images")
        return int(n) if isinstance(n, (int, float)) and not isinstance(n, bool) else None

    @property
    def rough_threshold(self) -> bool:
        """Whether fewer than ``FEW_THRESHOLD_IMAGES`` held-out images set the threshold (False when unknown)."""
        n = self.threshold_images
        return n is not None and 0 < n < FEW_THRESHOLD_IMAGES

    def threshold_note(self) -> str | None:
        """"out-of-domain threshold set on N val images" (with "(few: the check is rough)" under
        ``FEW_THRESHOLD_IMAGES``); None when the file does not say."""
        n = self.threshold_images
        if n is None:
            return None
        if not n:  # fit_domain without held-out images: the training images' own distances
            n = int(self.info.get("train_images", 0))
            where = f"{n} training images"
        else:
            where = f"{n} val images"
        rough = " (few: the check is rough)" if n < FEW_THRESHOLD_IMAGES else ""
        return f"out-of-domain threshold set on {where}{rough}"

    def metadata(self) -> dict:
        return {"format": FORMAT, "version": 1, "threshold": self.threshold, "feature": self.feature,
                "percentile": self.percentile, "dataset": self.dataset, "info": self.info}

    def save(self, folder: str | Path) -> Path:
        """Write ``folder/domain.safetensors`` atomically; returns its path."""
        from safetensors.torch import save


        path = Path(folder) / FILENAME
        path.parent.mkdir(parents=True, exist_ok=True)
        tensors = {"mean": self.mean.float().contiguous(), "precision": self.precision.float().contiguous()}
        atomic_write(path, save(tensors, metadata={"domain": json.dumps(self.metadata())}))
        return path

    @classmethod
    def load(cls, folder: str | Path) -> DomainCheck | None:
        """The check stored in a checkpoint folder, or None when it has none (older checkpoints)."""
        from safetensors import SafetensorError, safe_open

        path = Path(folder) / FILENAME
        if not path.is_file():
            return None
        try:
            with safe_open(str(path), framework="pt") as f:
                meta = json.loads((f.metadata() or {}).get("domain", "null"))
                tensors = {k: f.get_tensor(k) for k in f.keys()}
        except (SafetensorError, OSError, ValueError) as e:
            raise CheckpointError(f"{path} is not a valid domain file ({e}).") from None
        if not isinstance(meta, dict) or meta.get("format") != FORMAT or set(tensors) != {"mean", "precision"}:
            raise CheckpointError(f"{path} is not a captioner domain file (expected tensors mean and precision "
                                  f"and '{FORMAT}' metadata).")
        d = tensors["mean"].shape[0]
        if tensors["precision"].shape != (d, d) or meta.get("feature") not in FEATURE_KINDS:
            raise CheckpointError(f"{path}: its tensors or feature kind do not fit together.")
        return cls(tensors["mean"], tensors["precision"], float(meta["threshold"]), meta["feature"],
                   float(meta.get("percentile", 99.5)), str(meta.get("dataset", "")), dict(meta.get("info", {})))


def fit_domain(features: torch.Tensor, held_out: torch.Tensor | None = None, percentile: float = 99.5,
               feature: str = "log-mean+std", dataset: str = "", info: dict | None = None) -> DomainCheck:
    """Fit on pooled training features (N, D); the threshold is the ``percentile`` of the distances of
    ``held_out`` (M, D) in-domain images (of the training images themselves when None: lower, so stricter)."""
    if features.dim() != 2 or features.shape[0] < 2:
        raise ValueError(f"features must be (N, D) with N >= 2, got shape {tuple(features.shape)}")
    if not 0 < percentile <= 100:
        raise ValueError(f"percentile must be in (0, 100], got {percentile}")
    mean, covariance, shrinkage = ledoit_wolf(features)
    precision = torch.linalg.inv(covariance)  # (D, D)
    check = DomainCheck(mean.float(), precision.float(), 0.0, feature, percentile, dataset,
                        {"train_images": int(features.shape[0]), "shrinkage": shrinkage, "log_eps": LOG_EPS,
                         **(info or {})})
    reference = features if held_out is None else held_out
    check.threshold = float(torch.quantile(check.distances(reference).double(), percentile / 100))
    check.info["held_out_images"] = int(reference.shape[0]) if held_out is not None else 0
    return check


def fit_from_annotations(train: Iterable[torch.Tensor], held_out: Iterable[torch.Tensor], dataset: str,
                         percentile: float = 99.5, feature: str = "log-mean+std", info: dict | None = None
                         ) -> DomainCheck:
    """Fit from batches of annotations (B, L, C) already computed (e.g. a training run's feature cache)."""
    def pooled(batches: Iterable[torch.Tensor]) -> torch.Tensor:
        parts = [pool_features(b.detach().cpu(), feature) for b in batches]  # each (B, D)
        if not parts:
            raise ValueError("no annotations to fit the domain check on")
        return torch.cat(parts)

    return fit_domain(pooled(train), pooled(held_out), percentile, feature, dataset, info)


@torch.inference_mode()
def encode_pooled(model, images: Iterable, feature: str = "log-mean+std", batch_size: int = 32) -> torch.Tensor:
    """Pooled features (N, D) of PIL images or preprocessed tensors (3, H, W) through ``model``'s encoder
    (a ``Captioner``: its ``transform`` and ``encode``)."""
    pooled, batch = [], []

    def flush() -> None:
        if batch:
            inputs = torch.stack(batch).to(model.device)  # (B, 3, H, W)
            pooled.append(pool_features(model.encode(inputs), feature).cpu())  # (B, D)
            batch.clear()

    for image in images:
        batch.append(image if isinstance(image, torch.Tensor) else model.transform(image))
        if len(batch) == batch_size:
            flush()
    flush()
    if not pooled:
        raise ValueError("no images to encode")
    return torch.cat(pooled)


def fit_from_model(model, train_images: Sequence, held_out_images: Sequence, dataset: str,
                   percentile: float = 99.5, feature: str = "log-mean+std", batch_size: int = 32) -> DomainCheck:
    """Encode training and held-out in-domain images (PIL or (3, H, W) tensors) with ``model`` and fit."""
    train = encode_pooled(model, train_images, feature, batch_size)
    held_out = encode_pooled(model, held_out_images, feature, batch_size)
    return fit_domain(train, held_out, percentile, feature, dataset, {"encoder": model.cfg.encoder})
