"""The bundled synthetic-scenes dataset: coloured shapes on varied backgrounds, captioned by a small grammar.

Every image is drawn from its own random generator seeded by ``(seed, split, index)``, so the same seed gives
the same bytes whatever the number of worker processes. Scenes hold 1-4 objects; each object record carries its
shape, colour, size and pixel box, and each sentence carries ``refs``: for every token, the index of the object
the token names, or -1. Identical objects (same size, colour and shape) are named together ("two small red
circles"); their tokens point at the first of them and ``objects[i]["group"]`` ties the group together.

The output is a Karpathy-style ``dataset_shapes.json`` beside an ``images/`` folder, so the same loader reads
these scenes, Flickr8k, Flickr30k and COCO.

Run ``python -m captioner.scenes.shapes --out datasets/shapes [--seed N]``. The scenes (objects, sampling, drawing) are
in captioner.scenes.world, the caption grammar in captioner.scenes.grammar; this module makes the dataset.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from PIL import Image

from captioner.scenes.grammar import (BACKGROUND_WORDS, NUMBER_WORDS, PLURALS, SHAPE_WORDS,  # noqa: F401
                                         SIZE_WORDS, caption_scene)
from captioner.scenes.world import (BACKGROUNDS, COLORS, IMAGE_SIZE, NOVEL_PAIRS, REPEAT_PROB, SHAPES,  # noqa: F401
                                   SIZES, SceneObject, draw_scene, sample_objects)

DEFAULT_SPLITS = {"train": 6000, "val": 1000, "test": 1000, "test_novel": 1000}


def make_image(seed: int, split: str, index: int, captions_per_image: int = 5,
               repeat_prob: float = REPEAT_PROB) -> tuple[Image.Image, dict]:
    """Draw one scene and its captions; deterministic in (seed, split, index, repeat_prob)."""
    rng = random.Random(f"shapes-{seed}-{split}-{index}")
    objects = sample_objects(rng, split, repeat_prob)
    background = rng.choice(BACKGROUNDS)
    image = draw_scene(rng, objects, background)
    keys = [o.key for o in objects]
    group_of = {k: g for g, k in enumerate(dict.fromkeys(keys))}
    sentences = [caption_scene(rng, objects, background) for _ in range(captions_per_image)]
    record = {
        "filename": f"{split}_{index:05d}.jpg",
        "split": split,
        "background": background,
        "objects": [{"shape": o.shape, "color": o.color, "size": o.size, "bbox": o.bbox, "group": group_of[o.key]}
                    for o in objects],
        "sentences": sentences,
    }
    return image, record


def _write_one(args: tuple[int, str, int, str, float]) -> dict:
    seed, split, index, image_dir, repeat_prob = args
    image, record = make_image(seed, split, index, repeat_prob=repeat_prob)
    path = os.path.join(image_dir, record["filename"])
    image.save(path, format="JPEG", quality=92)
    return record


def generate(out: str | Path, seed: int = 0, splits: dict[str, int] | None = None, workers: int | None = None,
             progress: bool = True, train_repeat_prob: float = REPEAT_PROB) -> Path:
    """Write ``out/images/*.jpg`` and ``out/dataset_shapes.json``; returns the JSON path.

    ``train_repeat_prob`` changes how often the train scenes repeat an object; the other splits keep
    ``REPEAT_PROB``, so their bytes (and every figure measured on them) stay those of the same seed."""
    if not 0.0 <= train_repeat_prob <= 1.0:
        raise ValueError(f"train_repeat_prob must be in [0, 1], got {train_repeat_prob}")
    splits = dict(DEFAULT_SPLITS if splits is None else splits)
    out = Path(out)
    image_dir = out / "images"
    image_dir.mkdir(parents=True, exist_ok=True)
    jobs = [(seed, split, i, str(image_dir), train_repeat_prob if split == "train" else REPEAT_PROB)
            for split, n in splits.items() for i in range(n)]
    workers = workers or min(len(jobs) // 200 + 1, os.cpu_count() or 1)
    if workers > 1:
        with ProcessPoolExecutor(workers) as pool:
            iterator = pool.map(_write_one, jobs, chunksize=64)
            records = list(_progress(iterator, len(jobs), progress))
    else:
        records = list(_progress(map(_write_one, jobs), len(jobs), progress))
    sentid = 0
    for imgid, rec in enumerate(records):
        rec["imgid"] = imgid
        rec["filepath"] = "images"
        for s in rec["sentences"]:
            s["imgid"], s["sentid"] = imgid, sentid
            sentid += 1
        rec["sentids"] = [s["sentid"] for s in rec["sentences"]]
    dataset = {"dataset": "shapes", "plugin": "scenes", "seed": seed, "images": records}
    if train_repeat_prob != REPEAT_PROB:
        dataset["train_repeat_prob"] = train_repeat_prob
    json_path = out / "dataset_shapes.json"
    tmp = json_path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(dataset, separators=(",", ":")))
    os.replace(tmp, json_path)
    return json_path


def _progress(iterator, total: int, enabled: bool):
    if not enabled:
        return iterator
    from tqdm import tqdm
    return tqdm(iterator, total=total, desc="drawing scenes", unit="img")


def summary(json_path: str | Path, min_word_count: int = 5) -> str:
    """Per-split image and caption counts and the vocabulary size, as printable text."""
    from captioner.data.karpathy import load_karpathy_json
    from captioner.vocab import Vocabulary

    records = load_karpathy_json(json_path)
    lines = [f"dataset: {json_path}"]
    counts = Counter(r["split"] for r in records)
    for split in sorted(counts, key=lambda s: list(DEFAULT_SPLITS).index(s) if s in DEFAULT_SPLITS else 99):
        n_sent = sum(len(r["sentences"]) for r in records if r["split"] == split)
        lines.append(f"  {split:<11} {counts[split]:>6} images {n_sent:>7} captions")
    train_tokens = [s["tokens"] for r in records if r["split"] == "train" for s in r["sentences"]]
    vocab = Vocabulary.build(train_tokens, min_count=min_word_count)
    lines.append(f"  vocabulary  {len(vocab):>6} words (train, min count {min_word_count}, with 4 special tokens)")
    repeat = json.loads(Path(json_path).read_text()).get("train_repeat_prob", REPEAT_PROB)
    if repeat != REPEAT_PROB:
        lines.append(f"  train scenes repeat an object with probability {repeat} (other splits: {REPEAT_PROB})")
    return "\n".join(lines)


def get_args_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="Generate the synthetic-scenes captioning dataset (Karpathy JSON + JPEGs).")
    p.add_argument("--out", default="datasets/shapes", help="output folder (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="random seed; same seed, same bytes (default: %(default)s)")
    for split, n in DEFAULT_SPLITS.items():
        p.add_argument(f"--{split.replace('_', '-')}", type=int, default=n, metavar="N",
                       help=f"number of {split} images (default: %(default)s)")
    p.add_argument("--train-repeat-prob", type=float, default=REPEAT_PROB, metavar="P",
                   help="chance that a train object after the first repeats an earlier one (more P, more 'two ...' "
                        "phrases to learn counting from); val and test splits keep the default (default: %(default)s)")
    p.add_argument("--workers", type=int, default=None, help="processes to draw with (default: all cores)")
    p.add_argument("--summary-only", action="store_true", help="print the summary of an existing dataset and exit")
    return p


def main(args: argparse.Namespace) -> int:
    json_path = Path(args.out) / "dataset_shapes.json"
    if not args.summary_only:
        splits = {s: getattr(args, s) for s in DEFAULT_SPLITS}
        if not 0.0 <= args.train_repeat_prob <= 1.0:
            print(f"error: --train-repeat-prob must be in [0, 1], got {args.train_repeat_prob}", file=sys.stderr)
            return 2
        if args.train_repeat_prob != REPEAT_PROB and Path(args.out).resolve() == Path("datasets/shapes").resolve():
            print("warning: --train-repeat-prob changes the train split of datasets/shapes, the one the shipped "
                  "recipes train on; give another --out to keep it", file=sys.stderr)
        json_path = generate(args.out, seed=args.seed, splits=splits, workers=args.workers,
                             train_repeat_prob=args.train_repeat_prob)
    from captioner.errors import CaptionerError
    try:
        print(summary(json_path))
    except CaptionerError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(get_args_parser().parse_args()))
