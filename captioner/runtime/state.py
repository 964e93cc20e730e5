"""The decoder state of the ONNX Runtime route: numpy arrays, indexed as ``captioner.model.decoder.State`` is.

Per row (one hypothesis): h, c and the row state the step graph carries (location-aware attention's history, the
decoder extension's fields). Per image: the tensors ``decoder_init`` computed once (annotations, keys, values);
``group`` consecutive rows share one image, as in PyTorch's beam search.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

PER_IMAGE = ("annotations_in", "keys", "values")


@dataclass
class RowState:
    rows: dict[str, np.ndarray]  # "h", "c" and the row state, each (B, ...)
    images: dict[str, np.ndarray]  # PER_IMAGE, each (B / group, L, ...)
    group: int = 1

    def index(self, idx: np.ndarray) -> "RowState":
        """Any rows (group 1 only: each row its own image)."""
        if self.group != 1:
            raise ValueError("RowState.index needs one row per image; use regroup for grouped beams")
        return RowState({k: v[idx] for k, v in self.rows.items()}, {k: v[idx] for k, v in self.images.items()})

    def reorder_beams(self, idx: np.ndarray) -> "RowState":
        return RowState({k: v[idx] for k, v in self.rows.items()}, self.images, self.group)

    def regroup(self, rows: np.ndarray, images: np.ndarray | None, group: int) -> "RowState":
        per_image = self.images if images is None else {k: v[images] for k, v in self.images.items()}
        return RowState({k: v[rows] for k, v in self.rows.items()}, per_image, group)
