"""Where each caption word should look: attention targets from object boxes (supervised attention).

Liu et al. 2017 ("Attention Correctness in Neural Image Captioning") train the attention of the words that name
an object towards that object's region. Our synthetic scenes carry what this needs: every sentence has ``refs``
(for each token, the index of the object it names, or -1) and every object has a pixel ``bbox`` and a ``group``
(identical objects named together, "two red circles"). A word's target is the share of each grid cell covered by
the boxes of its object's group, normalised to sum to 1; words that name nothing get an all-zero row and no loss.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def box_coverage(box: Sequence[float], grid: tuple[int, int], image_size: tuple[int, int]) -> np.ndarray:
    """Area of each cell of an (h, w) grid over a (W, H) image covered by the box [x0, y0, x1, y1], in pixels^2."""
    h, w = grid
    width, height = image_size
    x0, y0, x1, y1 = box
    xs = np.linspace(0.0, width, w + 1)  # (w + 1,) cell edges
    ys = np.linspace(0.0, height, h + 1)  # (h + 1,)
    over_x = np.clip(np.minimum(xs[1:], x1) - np.maximum(xs[:-1], x0), 0.0, None)  # (w,)
    over_y = np.clip(np.minimum(ys[1:], y1) - np.maximum(ys[:-1], y0), 0.0, None)  # (h,)
    return np.outer(over_y, over_x)  # (h, w)


def object_targets(objects: Sequence[dict], grid: tuple[int, int], image_size: tuple[int, int]) -> np.ndarray:
    """One target distribution per object: (n_objects, h*w), the union of the boxes of the object's group."""
    cover = [box_coverage(o["bbox"], grid, image_size).ravel() for o in objects]  # each (L,)
    out = np.zeros((len(objects), grid[0] * grid[1]), dtype=np.float32)
    for i, o in enumerate(objects):
        group = o.get("group", i)
        members = [j for j, p in enumerate(objects) if p.get("group", j) == group]
        total = np.sum([cover[j] for j in members], axis=0)  # (L,)
        if total.sum() > 0:
            out[i] = total / total.sum()
    return out


def sentence_targets(refs: Sequence[int], per_object: np.ndarray, max_len: int | None = None) -> np.ndarray:
    """(T, L) targets for a sentence's tokens (T = len(refs), cut to ``max_len``); rows of refs = -1 are zero."""
    refs = list(refs)[:max_len] if max_len is not None else list(refs)
    out = np.zeros((len(refs), per_object.shape[1]), dtype=np.float32)
    for t, r in enumerate(refs):
        if 0 <= r < len(per_object):
            out[t] = per_object[r]
    return out


BACKGROUND, AMBIGUOUS = -1, -2  # cell labels of ``cell_objects`` for no object and a partly covered cell


def cell_objects(objects: Sequence[dict], grid: tuple[int, int], image_size: tuple[int, int],
                 min_share: float = 0.5) -> np.ndarray:
    """(2, h*w) int64: for each grid cell, the group (identical objects share one) and the index of the object
    whose box covers at least ``min_share`` of the cell (the one covering most of it); ``BACKGROUND`` in both rows
    where no box touches the cell, ``AMBIGUOUS`` where boxes cover only part of it. The look-alike supervision's
    labels (``captioner.losses.twin_loss``): two cells of different objects of one group are twins."""
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
