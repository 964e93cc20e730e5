"""Pictures of captions steered by regions (``captioner.decoding.regions``): numbered boxes on an image, and a panel with
the caption under it, each phrase in the colour of its box (the app's Point and tell tab, docs/regions.md). A region
may also be a mask (H, W) of the picture's size: it is tinted in its colour and numbered at its top-left corner."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from PIL import Image, ImageDraw, ImageFont

# one colour per box, in drawing order (a caption's phrases take their box's colour)
REGION_COLOURS = ("#e6194b", "#3cb44b", "#4363d8", "#f58231", "#911eb4", "#42d4f4", "#f032e6", "#9a6324")


def colour(index: int) -> str:
    return REGION_COLOURS[index % len(REGION_COLOURS)]


def _tint(shown: Image.Image, mask: np.ndarray, fill: str, opacity: float = 0.45) -> Image.Image:
    """``shown`` with the (H, W) 0..1 ``mask`` (of the picture, resized to ``shown``) laid over it in ``fill``."""
    alpha = Image.fromarray((np.clip(mask, 0, 1) * 255 * opacity).astype(np.uint8)).resize(shown.size)
    return Image.composite(Image.new("RGB", shown.size, fill), shown, alpha)


def draw_boxes(picture: Image.Image, boxes: Sequence[Sequence[float] | np.ndarray], scale: float = 1.0,
               corner: Sequence[float] | None = None) -> Image.Image:
    """The picture resized by ``scale`` with every box (in the picture's pixels) outlined in its colour, or mask
    tinted, and numbered from 1; ``corner``: a first corner waiting for its second, marked with a cross."""
    size = (max(1, round(picture.width * scale)), max(1, round(picture.height * scale)))
    shown = picture.convert("RGB")
    shown = shown.resize(size, Image.Resampling.BICUBIC) if scale != 1 else shown.copy()
    pen = ImageDraw.Draw(shown)
    width = max(2, round(max(size) / 200))
    font = ImageFont.load_default(size=max(12, round(max(size) / 30)))
    for number, box in enumerate(boxes, 1):
        if isinstance(box, np.ndarray):  # a painted mask: tint it, number it at its bounding box
            shown = _tint(shown, box, colour(number - 1))
            pen = ImageDraw.Draw(shown)
            rows, cols = np.nonzero(box > 0)
            x0, y0 = round(cols.min() * scale), round(rows.min() * scale)
        else:
            x0, y0, x1, y1 = (round(v * scale) for v in box)
            pen.rectangle((x0, y0, x1, y1), outline=colour(number - 1), width=width)
        left, top, right, bottom = pen.textbbox((0, 0), str(number), font=font)
        pen.rectangle((x0, y0, x0 + right - left + 2 * width, y0 + bottom - top + 2 * width), fill=colour(number - 1))
        pen.text((x0 + width - left, y0 + width - top), str(number), fill="white", font=font)
    if corner is not None:
        x, y = (round(v * scale) for v in corner)
        pen.line((x - 3 * width, y, x + 3 * width, y), fill=colour(len(boxes)), width=width)
        pen.line((x, y - 3 * width, x, y + 3 * width), fill=colour(len(boxes)), width=width)
    return shown


def told_panel(picture: Image.Image, boxes: Sequence[Sequence[float]], tokens: Sequence[str],
               regions: Sequence[int], side: int = 320) -> Image.Image:
    """The picture (long side ``side``) with its numbered boxes and, under it, the caption wrapped to the same
    width with each word in the colour of its box (black: a word of no box)."""
    scale = side / max(picture.size)
    top = draw_boxes(picture, boxes, scale)
    font = ImageFont.load_default(size=max(12, side // 18))
    probe = ImageDraw.Draw(top)
    space = probe.textlength(" ", font=font)
    line_height = round(font.size * 1.35)
    lines: list[list[tuple[str, str, float]]] = [[]]
    x = 0.0
    for word, region in zip(tokens, regions):
        length = probe.textlength(word, font=font)
        if lines[-1] and x + length > top.width - 16:
            lines.append([])
            x = 0.0
        lines[-1].append((word, colour(region) if region >= 0 else "#000000", x))
        x += length + space
    panel = Image.new("RGB", (top.width, top.height + 12 + line_height * len(lines) + 8), "white")
    panel.paste(top, (0, 0))
    pen = ImageDraw.Draw(panel)
    for row, line in enumerate(lines):
        for word, fill, left in line:
            pen.text((8 + left, top.height + 8 + row * line_height), word, fill=fill, font=font)
    return panel
