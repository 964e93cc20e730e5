"""Attention overlays (image blended with the upsampled attention map) and the paper-style per-word figure."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from captioner.images import to_rgb


# The overlays' colour ramp: low attention dark indigo, through blue, cyan, green, yellow and orange, to dark red
# at the map's peak (the look of a rainbow map such as turbo, with no dark band in the middle). Its own seven
# colours, linearly between them: a 256-level table is all the overlays need, and taking it from matplotlib cost
# the app's light install (docs/onnx.md) 81 MB.
RAMP = np.array([[0.00, 48, 18, 59], [0.15, 64, 98, 220], [0.33, 32, 196, 212], [0.50, 98, 240, 88],
                 [0.67, 224, 218, 52], [0.83, 246, 124, 28], [1.00, 122, 4, 3]], dtype=np.float64)  # (at, R, G, B)


def _colormap(values: np.ndarray) -> np.ndarray:
    """values in [0, 1] (any shape) -> RGB uint8 (..., 3) on the ``RAMP``."""
    v = np.clip(np.asarray(values, dtype=np.float64), 0.0, 1.0)
    channels = [np.interp(v, RAMP[:, 0], RAMP[:, 1 + c]) for c in range(3)]
    return np.rint(np.stack(channels, axis=-1)).astype(np.uint8)


@functools.lru_cache(maxsize=1)
def _turbo_table() -> np.ndarray:
    """_colormap of the 256 levels i / 255 (what overlay's uint8 heat takes), as float32 (256, 3); the browser's
    overlays use the same table (captioner.app.attention)."""
    return _colormap(np.arange(256, dtype=np.float32) / 255.0).astype(np.float32)


@functools.lru_cache(maxsize=4)
def _blend_table(strength: float) -> np.ndarray:
    """Every blend overlay() can produce: (3 channels, 256 heat levels, 256 pixel values) uint8, computed with the
    same float32 operations as a per-pixel blend, so looking a pixel up gives exactly its value."""
    weight = strength * (np.arange(256, dtype=np.float32) / 255.0) ** 0.8  # (256,) by heat level
    colour = _turbo_table().T  # (3, 256) by heat level
    base = np.arange(256, dtype=np.float32)  # pixel values
    blended = base[None, None, :] * (1 - weight)[None, :, None] + colour[:, :, None] * weight[None, :, None]
    return np.clip(blended, 0, 255).astype(np.uint8)  # (3, 256, 256)


def overlay(image: Image.Image, alpha: np.ndarray, strength: float = 0.55, smooth: bool = True) -> Image.Image:
    """Blend ``image`` with one attention map ``alpha`` (h, w), upsampled to the whole image
    (preprocessing resizes the whole image, so the grid covers it exactly)."""
    image = to_rgb(image)
    a = np.asarray(alpha, dtype=np.float32)
    a = a / a.max() if a.max() > 0 else a
    heat = Image.fromarray((a * 255).astype(np.uint8), "L").resize(
        image.size, Image.Resampling.BICUBIC if smooth else Image.Resampling.NEAREST)
    level = np.asarray(heat)  # (H, W) uint8
    base = np.asarray(image)  # (H, W, 3) uint8
    # colour = turbo(level), weight = strength * level ** 0.8, pixel * (1 - weight) + colour * weight: looked up in a
    # table of all 256 x 256 combinations per channel (the same values, several times faster than the float maths)
    table = _blend_table(float(strength))
    blended = np.stack([table[c][level, base[..., c]] for c in range(3)], axis=-1)  # (H, W, 3)
    return Image.fromarray(blended, "RGB")


def word_overlays(image: Image.Image, tokens: Sequence[str], alphas: np.ndarray,
                  size: int = 224) -> list[tuple[Image.Image, str]]:
    """One (overlay, "i: word") per generated word, the image scaled so its long side is ``size``."""
    image = to_rgb(image)
    scale = size / max(image.size)
    shown = image.resize((max(1, round(image.width * scale)), max(1, round(image.height * scale))),
                         Image.Resampling.BICUBIC)
    return [(overlay(shown, alphas[i]), f"{i + 1}: {word}") for i, word in enumerate(tokens)]


def attention_figure(image: Image.Image, tokens: Sequence[str], alphas: np.ndarray, columns: int = 5,
                     panel: int = 160) -> Image.Image:
    """The paper's figure: the image, then one overlay per word with the word under its panel."""
    items = [(to_rgb(image), "")] + [(ov, word) for (ov, _), word in
                                      zip(word_overlays(image, tokens, alphas, panel), tokens)]
    rows = math.ceil(len(items) / columns)
    label_h = 22
    sheet = Image.new("RGB", (columns * (panel + 6) + 6, rows * (panel + label_h + 6) + 6), "white")
    draw = ImageDraw.Draw(sheet)
    font = ImageFont.load_default(size=15)
    for k, (img, word) in enumerate(items):
        r, c = divmod(k, columns)
        x, y = 6 + c * (panel + 6), 6 + r * (panel + label_h + 6)
        thumb = img.copy()
        thumb.thumbnail((panel, panel))
        sheet.paste(thumb, (x + (panel - thumb.width) // 2, y + (panel - thumb.height) // 2))
        if word:
            w = draw.textlength(word, font=font)
            draw.text((x + (panel - w) / 2, y + panel + 3), word, fill="black", font=font)
    return sheet
