"""The bundled synthetic-scenes dataset: coloured shapes on varied backgrounds, captioned by a small grammar.

Every image is drawn from its own random generator seeded by ``(seed, split, index)``, so the same seed gives
the same bytes whatever the number of worker processes. Scenes hold 1-4 objects; each object record carries its
shape, colour, size and pixel box, and each sentence carries ``refs``: for every token, the index of the object
the token names, or -1. Identical objects (same size, colour and shape) are named together ("two small red
circles"); their tokens point at the first of them and ``objects[i]["group"]`` ties the group together.

The output is a Karpathy-style ``dataset_shapes.json`` beside an ``images/`` folder, so the same loader reads
these scenes, Flickr8k, Flickr30k and COCO.

Run ``python -m captioner.data.shapes --out datasets/shapes [--seed N]``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

IMAGE_SIZE = 224
SHAPES = ("circle", "square", "triangle", "star", "hexagon", "cross")
COLORS = {
    "red": (215, 35, 35),
    "green": (35, 165, 55),
    "blue": (35, 75, 225),
    "yellow": (245, 215, 30),
    "purple": (135, 50, 185),
    "orange": (250, 135, 20),
    "pink": (245, 120, 190),
    "cyan": (30, 205, 215),
}
SIZES = {"small": (20, 25), "large": (36, 44)}  # circumradius range in pixels
BACKGROUNDS = ("plain", "gradient", "noise", "texture")

# Words the grammar uses for each attribute; the first is the canonical name.
SIZE_WORDS = {"small": ("small", "little"), "large": ("large", "big")}
SHAPE_WORDS = {
    "circle": ("circle", "disc"),
    "square": ("square", "box"),
    "triangle": ("triangle",),
    "star": ("star",),
    "hexagon": ("hexagon",),
    "cross": ("cross",),
}
PLURALS = {"circle": "circles", "disc": "discs", "square": "squares", "box": "boxes", "triangle": "triangles",
           "star": "stars", "hexagon": "hexagons", "cross": "crosses"}
NUMBER_WORDS = {2: "two", 3: "three", 4: "four"}

# Colour-shape pairs that never occur in train/val/test and occur in every test_novel image:
# one pair per colour, spread over the shapes.
NOVEL_PAIRS = frozenset((color, SHAPES[(3 * i) % len(SHAPES)]) for i, color in enumerate(COLORS))

DEFAULT_SPLITS = {"train": 6000, "val": 1000, "test": 1000, "test_novel": 1000}


@dataclass(frozen=True)
class SceneObject:
    shape: str
    color: str
    size: str
    center: tuple[float, float]
    radius: float
    rotation: float

    @property
    def bbox(self) -> list[int]:
        x, y = self.center
        r = self.radius
        return [max(0, math.floor(x - r)), max(0, math.floor(y - r)),
                min(IMAGE_SIZE, math.ceil(x + r)), min(IMAGE_SIZE, math.ceil(y + r))]

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.size, self.color, self.shape)


# ---------------------------------------------------------------------------------------------------- drawing

def _polygon(shape: str, cx: float, cy: float, r: float, rot: float) -> list[tuple[float, float]]:
    def ring(n: int, radius: float, offset: float) -> list[tuple[float, float]]:
        return [(cx + radius * math.cos(offset + 2 * math.pi * k / n), cy + radius * math.sin(offset + 2 * math.pi * k / n))
                for k in range(n)]

    if shape == "square":
        return ring(4, r, rot + math.pi / 4)
    if shape == "triangle":
        return ring(3, r, rot - math.pi / 2)
    if shape == "hexagon":
        return ring(6, r, rot)
    if shape == "star":
        outer, inner = ring(5, r, rot - math.pi / 2), ring(5, r * 0.45, rot - math.pi / 2 + math.pi / 5)
        return [p for pair in zip(outer, inner) for p in pair]
    if shape == "cross":
        a, b = r, r * 0.36  # arm half-length and half-width
        pts = [(b, a), (b, b), (a, b), (a, -b), (b, -b), (b, -a), (-b, -a), (-b, -b), (-a, -b), (-a, b), (-b, b), (-b, a)]
        c, s = math.cos(rot), math.sin(rot)
        return [(cx + x * c - y * s, cy + x * s + y * c) for x, y in pts]
    raise ValueError(f"unknown shape {shape!r}")


def _background(rng: random.Random, kind: str) -> Image.Image:
    def muted() -> tuple[int, int, int]:
        grey = rng.randint(60, 200)
        return tuple(int(np.clip(grey + rng.randint(-30, 30), 0, 255)) for _ in range(3))  # low saturation

    nrng = np.random.default_rng(rng.getrandbits(32))
    size = IMAGE_SIZE
    if kind == "plain":
        return Image.new("RGB", (size, size), muted())
    if kind == "gradient":
        a, b = np.array(muted(), np.float32), np.array(muted(), np.float32)
        t = np.linspace(0, 1, size, dtype=np.float32)
        ramp = t[None, :, None] if rng.random() < 0.5 else t[:, None, None]
        arr = a + (b - a) * np.broadcast_to(ramp, (size, size, 1))
        return Image.fromarray(arr.astype(np.uint8), "RGB")
    if kind == "noise":
        base = np.array(muted(), np.float32)
        arr = base + nrng.normal(0, 22, (size, size, 1)).astype(np.float32) + nrng.normal(0, 8, (size, size, 3))
        return Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8), "RGB").filter(ImageFilter.GaussianBlur(0.6))
    if kind == "texture":
        a, b = muted(), muted()
        img = Image.new("RGB", (size, size), a)
        draw = ImageDraw.Draw(img)
        period = rng.randint(10, 24)
        if rng.random() < 0.5:  # stripes
            vertical = rng.random() < 0.5
            for p in range(0, size, period):
                box = [p, 0, p + period // 2, size] if vertical else [0, p, size, p + period // 2]
                draw.rectangle(box, fill=b)
        else:  # checkerboard
            for i in range(0, size, period):
                for j in range(0, size, period):
                    if (i // period + j // period) % 2:
                        draw.rectangle([i, j, i + period - 1, j + period - 1], fill=b)
        return img
    raise ValueError(f"unknown background {kind!r}")


def _overlap_ok(obj: SceneObject, others: list[SceneObject]) -> bool:
    """Limited overlap: boxes may share at most 10% of the smaller box, and centres stay apart."""
    x0, y0, x1, y1 = obj.bbox
    for o in others:
        a0, b0, a1, b1 = o.bbox
        inter = max(0, min(x1, a1) - max(x0, a0)) * max(0, min(y1, b1) - max(y0, b0))
        smaller = min((x1 - x0) * (y1 - y0), (a1 - a0) * (b1 - b0))
        if inter > 0.1 * smaller:
            return False
    return True


def _sample_objects(rng: random.Random, split: str) -> list[SceneObject]:
    count = rng.choices([1, 2, 3, 4], weights=[3, 3, 2, 2])[0]
    pairs = [(c, s) for c in COLORS for s in SHAPES]
    allowed = [p for p in pairs if p not in NOVEL_PAIRS]
    objects: list[SceneObject] = []
    # Repeated objects make counts ("two red circles") common enough to learn.
    for i in range(count):
        if objects and rng.random() < 0.25:
            proto = rng.choice(objects)
            color, shape, size = proto.color, proto.shape, proto.size
        else:
            if split == "test_novel" and i == 0:
                color, shape = rng.choice(sorted(NOVEL_PAIRS))
            else:
                color, shape = rng.choice(allowed)
            size = rng.choice(list(SIZES))
        for _ in range(200):
            radius = rng.uniform(*SIZES[size])
            margin = radius + 2
            center = (rng.uniform(margin, IMAGE_SIZE - margin), rng.uniform(margin, IMAGE_SIZE - margin))
            candidate = SceneObject(shape, color, size, center, radius, rng.uniform(-0.3, 0.3))
            if _overlap_ok(candidate, objects):
                objects.append(candidate)
                break
    return objects


def draw_scene(rng: random.Random, objects: list[SceneObject], background: str) -> Image.Image:
    img = _background(rng, background)
    draw = ImageDraw.Draw(img)
    for obj in objects:
        fill = tuple(int(np.clip(v + rng.randint(-12, 12), 0, 255)) for v in COLORS[obj.color])
        x, y = obj.center
        if obj.shape == "circle":
            r = obj.radius
            draw.ellipse([x - r, y - r, x + r, y + r], fill=fill)
        else:
            draw.polygon(_polygon(obj.shape, x, y, obj.radius, obj.rotation), fill=fill)
    return img


# ---------------------------------------------------------------------------------------------------- grammar

def _article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def _noun_phrase(rng: random.Random, key: tuple[str, str, str], count: int) -> list[str]:
    size, color, shape = key
    size_word = rng.choice(SIZE_WORDS[size])
    shape_word = rng.choice(SHAPE_WORDS[shape])
    if count == 1:
        return [_article(size_word), size_word, color, shape_word]
    return [NUMBER_WORDS[count], size_word, color, PLURALS[shape_word]]


def _relation(a: SceneObject, b: SceneObject) -> tuple[str, ...]:
    dx, dy = b.center[0] - a.center[0], b.center[1] - a.center[1]
    if abs(dx) >= abs(dy):
        return ("to", "the", "left", "of") if dx > 0 else ("to", "the", "right", "of")
    return ("above",) if dy > 0 else ("below",)


BACKGROUND_WORDS = {"plain": "plain", "gradient": "shaded", "noise": "noisy", "texture": "patterned"}


def caption_scene(rng: random.Random, objects: list[SceneObject], background: str) -> dict:
    """One caption: {"tokens", "raw", "refs"}; every object of the scene is named exactly once."""
    groups: dict[tuple, list[int]] = {}
    for i, obj in enumerate(objects):
        groups.setdefault(obj.key, []).append(i)
    order = list(groups)
    rng.shuffle(order)
    phrases = [(_noun_phrase(rng, key, len(groups[key])), groups[key][0]) for key in order]

    tokens: list[str] = []
    refs: list[int] = []
    commas: list[int] = []  # token positions after which raw text has a comma

    def add(words, ref=-1):
        tokens.extend(words)
        refs.extend([ref] * len(words))

    first_is_plural = len(groups[order[0]]) > 1
    prefix = rng.choice([(), (), ("there", "are" if first_is_plural else "is"), ("an", "image", "of"),
                         ("a", "picture", "of")])
    add(prefix)
    if len(phrases) == 2 and len(objects) == 2 and rng.random() < 0.7:
        (p1, i1), (p2, i2) = phrases
        add(p1, i1)
        add(_relation(objects[i1], objects[i2]))
        add(p2, i2)
    else:
        for k, (words, idx) in enumerate(phrases):
            if k > 0:
                if k == len(phrases) - 1:
                    add(["and"])
                else:
                    commas.append(len(tokens) - 1)
            add(words, idx)
    if rng.random() < 0.15:
        word = BACKGROUND_WORDS[background]
        add(["on", _article(word), word, "background"])
    raw_words = [t + ("," if i in commas else "") for i, t in enumerate(tokens)]
    raw = " ".join(raw_words)
    return {"tokens": tokens, "raw": raw[0].upper() + raw[1:] + ".", "refs": refs}


# ---------------------------------------------------------------------------------------------------- dataset

def make_image(seed: int, split: str, index: int, captions_per_image: int = 5) -> tuple[Image.Image, dict]:
    """Draw one scene and its captions; deterministic in (seed, split, index)."""
    rng = random.Random(f"shapes-{seed}-{split}-{index}")
    objects = _sample_objects(rng, split)
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


def _write_one(args: tuple[int, str, int, str]) -> dict:
    seed, split, index, image_dir = args
    image, record = make_image(seed, split, index)
    path = os.path.join(image_dir, record["filename"])
    image.save(path, format="JPEG", quality=92)
    return record


def generate(out: str | Path, seed: int = 0, splits: dict[str, int] | None = None, workers: int | None = None,
             progress: bool = True) -> Path:
    """Write ``out/images/*.jpg`` and ``out/dataset_shapes.json``; returns the JSON path."""
    splits = dict(DEFAULT_SPLITS if splits is None else splits)
    out = Path(out)
    image_dir = out / "images"
    image_dir.mkdir(parents=True, exist_ok=True)
    jobs = [(seed, split, i, str(image_dir)) for split, n in splits.items() for i in range(n)]
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
    dataset = {"dataset": "shapes", "seed": seed, "images": records}
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
    return "\n".join(lines)


def get_args_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="Generate the synthetic-scenes captioning dataset (Karpathy JSON + JPEGs).")
    p.add_argument("--out", default="datasets/shapes", help="output folder (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="random seed; same seed, same bytes (default: %(default)s)")
    for split, n in DEFAULT_SPLITS.items():
        p.add_argument(f"--{split.replace('_', '-')}", type=int, default=n, metavar="N",
                       help=f"number of {split} images (default: %(default)s)")
    p.add_argument("--workers", type=int, default=None, help="processes to draw with (default: all cores)")
    p.add_argument("--summary-only", action="store_true", help="print the summary of an existing dataset and exit")
    return p


def main(args: argparse.Namespace) -> int:
    json_path = Path(args.out) / "dataset_shapes.json"
    if not args.summary_only:
        splits = {s: getattr(args, s) for s in DEFAULT_SPLITS}
        json_path = generate(args.out, seed=args.seed, splits=splits, workers=args.workers)
    from captioner.errors import CaptionerError
    try:
        print(summary(json_path))
    except CaptionerError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(get_args_parser().parse_args()))
