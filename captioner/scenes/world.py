"""The synthetic scenes themselves: the shapes, colours, sizes and backgrounds, the object record, and how a
scene is sampled (1-4 objects, limited overlap, novel colour-shape pairs kept for test_novel) and drawn."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

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

# Colour-shape pairs that never occur in train/val/test and occur in every test_novel image:
# one pair per colour, spread over the shapes.
NOVEL_PAIRS = frozenset((color, SHAPES[(3 * i) % len(SHAPES)]) for i, color in enumerate(COLORS))


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


REPEAT_PROB = 0.25  # chance that an object after the first copies an earlier one (same size, colour and shape)


def sample_objects(rng: random.Random, split: str, repeat_prob: float = REPEAT_PROB) -> list[SceneObject]:
    """1-4 objects; each after the first repeats an earlier one with probability ``repeat_prob``."""
    count = rng.choices([1, 2, 3, 4], weights=[3, 3, 2, 2])[0]
    pairs = [(c, s) for c in COLORS for s in SHAPES]
    allowed = [p for p in pairs if p not in NOVEL_PAIRS]
    objects: list[SceneObject] = []
    # Repeated objects make counts ("two red circles") common enough to learn.
    for i in range(count):
        if objects and rng.random() < repeat_prob:
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
