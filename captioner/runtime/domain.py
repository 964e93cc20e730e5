"""``captioner.model.domain``'s out-of-domain check on numpy: pooled features and their Mahalanobis distance."""

from __future__ import annotations

from pathlib import Path

import numpy as np

LOG_EPS = 0.01


class NumpyDomainCheck:
    def __init__(self, folder: Path, meta: dict):
        with np.load(folder / meta["file"], allow_pickle=False) as data:
            self.mean, self.precision = data["mean"].astype(np.float64), data["precision"].astype(np.float64)
        self.threshold, self.feature = float(meta["threshold"]), meta["feature"]
        self.dataset, self.info = meta.get("dataset", ""), meta.get("info", {})
        self.log_eps = float(self.info.get("log_eps", LOG_EPS))

    def pool(self, annotations: np.ndarray) -> np.ndarray:
        """Annotations (B, L, C) -> features (B, D), as ``captioner.model.domain.pool_features``."""
        a = annotations.astype(np.float32)
        mean = a.mean(1)  # (B, C)
        centred = a - mean[:, None]
        std = np.sqrt((centred * centred).sum(1) / a.shape[1])  # (B, C) population std
        if self.feature == "mean":
            return mean
        if self.feature == "mean+std":
            return np.concatenate([mean, std], 1)
        return np.log(np.concatenate([np.maximum(mean, 0), std], 1) + np.float32(self.log_eps))  # (B, 2C)

    def check(self, annotations: np.ndarray) -> list[tuple[bool, float]]:
        """Annotations (B, L, C) -> one (in_domain, score) per image."""
        diff = self.pool(annotations).astype(np.float64) - self.mean  # (B, D)
        scores = np.sqrt(np.clip(((diff @ self.precision) * diff).sum(1), 0, None)).astype(np.float32)  # (B,)
        return [(bool(s <= np.float32(self.threshold)), float(s)) for s in scores]
