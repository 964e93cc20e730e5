"""How well regions steer the captions (``captioner.decoding.regions``), on data whose images carry object boxes:
``python -m captioner.evaluate --checkpoint DIR --split test --regions one`` (or ``ordered``).

Cases come from the records' ``objects`` (each with a pixel ``bbox`` and optionally a ``group`` of identical
objects, as ``captioner.data.grounding`` reads them):

- ``one``: every image with objects, one box around one of them (chosen at random, seeded by the image's place);
- ``ordered``: every image with 2 or 3 objects, no two of one group (distinct objects), a box around each, in a
  random order (seeded likewise).

The core measures where attention went: ``region_mass``, the mean over words of the share of each word's
attention inside the region it was written in (words before the first phrase, no region's, left out; a cell counts
by the share of it the box covers), and
``region_phrases_85``, the share of phrases (a caption's words of one region) with at least 85% of their attention
inside. Whether the right objects were named, in order, is the data's knowledge: the data's plug-in measures it
(``Plugin.region_metrics``; the scenes': ``regions_named``).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import numpy as np

from captioner import plugins
from captioner.data.karpathy import KarpathySplit
from captioner.decoding.regions import mass_inside, regions_weights

MODES = ("one", "ordered")
PHRASE_BAR = 0.85


def region_cases(records: Sequence[dict], mode: str, seed: int = 0) -> list[tuple[int, list[dict]]]:
    """(record index, the objects to draw boxes around, in order) for every record the mode uses."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
    cases = []
    for i, record in enumerate(records):
        objects = [o for o in record.get("objects") or [] if "bbox" in o]
        rng = random.Random(f"{seed}/{i}")
        if mode == "one" and objects:
            cases.append((i, [rng.choice(objects)]))
        elif mode == "ordered" and 2 <= len(objects) <= 3:
            groups = [o.get("group", j) for j, o in enumerate(objects)]
            if len(set(groups)) == len(objects):
                order = list(objects)
                rng.shuffle(order)
                cases.append((i, order))
    return cases


def phrase_masses(masses: Sequence[float], word_regions: Sequence[int]) -> list[float]:
    """The mean attention share inside its region of each region's words (a region without words: none);
    ``masses`` are those of the words of a region (``mass_inside``), in order."""
    by_region: dict[int, list[float]] = {}
    for mass, region in zip(masses, [r for r in word_regions if r >= 0]):
        by_region.setdefault(region, []).append(mass)
    return [float(np.mean(v)) for _, v in sorted(by_region.items())]


def evaluate_regions(model, data: KarpathySplit, mode: str, batch_size: int = 32, max_images: int | None = None,
                     beam_size: int | None = None, region_strength: float | None = None,
                     seed: int = 0, max_len: int | None = None) -> tuple[dict, list[dict]]:
    """Caption every case of ``mode`` with its boxes as regions (``beam_size``, ``max_len``: None, the model's);
    returns (metrics, per-case records)."""
    from PIL import Image

    cases = region_cases(data.records, mode, seed)
    if max_images is not None:
        cases = cases[:max_images]
    model.eval()
    rows, masses, phrases = [], [], []
    for start in range(0, len(cases), batch_size):
        chunk = cases[start:start + batch_size]
        paths = [data.image_path(i) for i, _ in chunk]
        boxes = [[o["bbox"] for o in objects] for _, objects in chunk]
        results = model.caption(paths, beam_size=beam_size, max_len=max_len, batch_size=batch_size, regions=boxes,
                                region_strength=region_strength)
        for (i, objects), path, result in zip(chunk, paths, results):
            with Image.open(path) as im:
                size = im.size
            weights = regions_weights([o["bbox"] for o in objects], model.grid, size).numpy()  # (R, L)
            word_mass = mass_inside(result.alphas, result.regions, weights)
            masses.extend(word_mass)
            phrases.extend(phrase_masses(word_mass, result.regions))
            rows.append({"filename": data.records[i]["filename"], "boxes": [o["bbox"] for o in objects],
                         "caption": result.text, "tokens": result.tokens,
                         "regions": result.regions, "mass": word_mass})
    # (0 over no phrase word: a caption that never began a phrase has no attention inside a region)
    metrics: dict = {"cases": len(rows), "region_words": len(masses),
                     "region_mass": float(np.mean(masses)) if masses else 0.0,
                     "region_phrases_85": float(np.mean([m >= PHRASE_BAR for m in phrases])) if phrases else 0.0,
                     "region_phrase_mass": float(np.mean(phrases)) if phrases else 0.0}
    if data.plugin is not None and rows:
        tokens = [r["tokens"] for r in rows]
        metrics.update(plugins.get(data.plugin, "dataset plugin").region_metrics(
            [objects for _, objects in cases], tokens))
    return metrics, rows
