"""Where each caption word should look: attention targets from object boxes (supervised attention).

Liu et al. 2017 ("Attention Correctness in Neural Image Captioning") train the attention of the words that name
an object towards that object's region, with the word-to-box annotations of Flickr30k Entities. Any Karpathy JSON
can carry them: an image record's ``objects``, each with a pixel ``bbox`` (and optionally a ``group``: objects named
together, as in "two dogs"), and each sentence's ``refs`` (for each token, the index of the object it names, or -1;
the bundled synthetic scenes have both). A word's target is the share of each grid cell covered by the boxes of its
object's group, normalised to sum to 1; words that name nothing get an all-zero row and no loss.
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
