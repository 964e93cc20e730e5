"""Cell labels for the look-alike supervision of the synthetic scenes: which object, and which group of identical
objects, covers each grid cell (``cell_objects``; the boxes' coverage is ``captioner.data.grounding``)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from captioner.data.grounding import box_coverage

BACKGROUND, AMBIGUOUS = -1, -2  # cell labels of ``cell_objects`` for no object and a partly covered cell


def cell_objects(objects: Sequence[dict], grid: tuple[int, int], image_size: tuple[int, int],
                 min_share: float = 0.5) -> np.ndarray:
    """(2, h*w) int64: for each grid cell, the group (identical objects share one) and the index of the object
    whose box covers at least ``min_share`` of the cell (the one covering most of it); ``BACKGROUND`` in both rows
    where no box touches the cell, ``AMBIGUOUS`` where boxes cover only part of it. The look-alike supervision's
    labels (``captioner.scenes.training.twin_loss``): two cells of different objects of one group are twins."""
    h, w = grid
    width, height = image_size
    out = np.full((2, h * w), BACKGROUND, dtype=np.int64)
    if not objects:
        return out
    cell_area = (width / w) * (height / h)
    share = np.stack([box_coverage(o["bbox"], grid, image_size).ravel() / cell_area for o in objects])  # (n, L)
    best = share.argmax(0)  # (L,)
    top = share.max(0)  # (L,)
    groups = np.array([o.get("group", i) for i, o in enumerate(objects)], dtype=np.int64)  # (n,)
    covered = top >= min_share
    out[0, covered], out[1, covered] = groups[best[covered]], best[covered]
    partial = (top > 0) & ~covered
    out[:, partial] = AMBIGUOUS
    return out


def cell_labels(objects: list | None, grid: tuple[int, int], image_size: tuple[int, int]) -> torch.Tensor:
    """``cell_objects`` as a tensor, all background without objects: the data loader's ``cell_labels``."""
    if not objects:
        return torch.full((2, grid[0] * grid[1]), BACKGROUND, dtype=torch.long)
    return torch.from_numpy(cell_objects(objects, grid, image_size))
