"""Point and tell: captions steered by image regions the user marks (Cornia et al. 2019, "Show, Control and Tell",
done here without training, through the decoder's attention-score bias).

A region is a box ``[x0, y0, x1, y1]`` in image pixels (or a mask the size of the image). It becomes one weight per
cell of the annotation grid, the share of the cell it covers (``region_weights``), and the attention scores of every
step get ``strength * log(weight)`` added (``region_bias``): alpha_i is then proportional to
``weight_i ** strength * exp(score_i)``, so cells outside the region get no attention at all (-inf), a cell the box
only grazes gets little, and inside it the model still chooses where to look. The same bias works for soft and
hard attention: both draw from the biased alpha.

One region: the caption's phrase looks inside it. An ordered list: the first phrase looks in the first region, and
when a phrase ends the next one looks in the next region. Where a phrase ends is the data's knowledge, not the
core's: the model's plug-in says it as a ``PhraseRule`` (``Plugin.phrase_rule``): the words that close a phrase,
optionally only inside a phrase that an opener word began. With an opener, the words before the first phrase
begins (a frame such as "a picture of") look where the model likes: steered there too, the soft model's first
phrase had looked at its object for three extra steps and often counted it twice. A caption cannot end before every
region has had its phrase, and ends once the last one has (``RegionStop``, a score processor): words after it
would be about no region. A model whose plug-in gives no rule can be steered by one region only.

``RegionGuide`` is the per-row state the decoder keeps while decoding (``State.guide``): like a decoder extension's
state it offers ``index(rows)`` and ``advance(alpha)``, and its bias is added to the extension's, so regions compose
with a plug-in's own attention bias (the scenes' inhibition of return) instead of replacing it.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from captioner.data.grounding import box_coverage
from captioner.errors import CaptionerError, RegionError  # noqa: F401 - RegionError: raised here, defined there

MAX_REGIONS = 8  # per image: more phrases than a caption of max_len words can hold
# The bias' exponent and floor (``region_bias``), chosen on the scenes' val split (docs/regions.md)
DEFAULT_STRENGTH = 4.0
DEFAULT_FLOOR = 0.0


Region = Sequence[float] | np.ndarray  # a box [x0, y0, x1, y1] in pixels, or a mask (H, W) of the image's size
Regions = Region | Sequence[Region]  # one region, or an ordered list of them (one image's)


def _is_one(entry) -> bool:
    """Whether one image's ``regions`` entry is a single region (a box of numbers, or a 2-D mask)."""
    if isinstance(entry, np.ndarray):
        return entry.ndim == 2 or (entry.ndim == 1 and entry.dtype.kind in "iuf")
    return isinstance(entry, (list, tuple)) and len(entry) > 0 and all(
        isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool) for v in entry)


def as_region_list(entry: Regions) -> list[Region]:
    """One image's regions as a list: a single box (or mask) becomes a list of one."""
    if _is_one(entry):
        return [entry]
    if isinstance(entry, np.ndarray) and entry.ndim == 3:
        return list(entry)
    if not isinstance(entry, (list, tuple)) or not entry:
        raise RegionError(f"regions must be a box [x0, y0, x1, y1], a mask, or a non-empty list of them, not "
                          f"{str(entry)[:60]}")
    return list(entry)


def check_region_lists(regions, images: int, single: bool) -> list[list[Region] | None]:
    """``Captioner.caption``'s ``regions`` as one list (or None) per image: for one image its regions, for a list
    of images one entry per image."""
    if single:
        return [as_region_list(regions)]
    if not isinstance(regions, (list, tuple)) or len(regions) != images:
        raise RegionError(f"for {images} images give a list of {images} region entries (None for an image to "
                          "caption without regions)")
    return [None if r is None else as_region_list(r) for r in regions]


def check_box(box: Sequence[float], image_size: tuple[int, int]) -> tuple[float, float, float, float]:
    """The box as four floats clipped to the (W, H) image; a RegionError if it is not four finite numbers with
    x0 < x1 and y0 < y1 that overlap the image."""
    try:
        values = [float(v) for v in box]
    except (TypeError, ValueError):
        raise RegionError(f"a region must be a box of four numbers [x0, y0, x1, y1] in pixels, not {box!r}") from None
    if len(values) != 4 or not all(math.isfinite(v) for v in values):
        raise RegionError(f"a region must be a box of four finite numbers [x0, y0, x1, y1] in pixels, not {box!r}")
    x0, y0, x1, y1 = values
    width, height = image_size
    if not (x0 < x1 and y0 < y1):
        raise RegionError(f"the box {values} is empty: it needs x0 < x1 and y0 < y1")
    x0, x1 = max(x0, 0.0), min(x1, float(width))
    y0, y1 = max(y0, 0.0), min(y1, float(height))
    if not (x0 < x1 and y0 < y1):
        raise RegionError(f"the box {values} lies outside the {width}x{height} image")
    return x0, y0, x1, y1


def region_weights(region: Region, grid: tuple[int, int], image_size: tuple[int, int]) -> np.ndarray:
    """(h*w,) float32 in [0, 1]: the share of each grid cell (row-major, like the annotations) that the region
    covers. A box is clipped to the (W, H) image; a mask (H, W) (bool or 0..1) is averaged over each cell."""
    h, w = grid
    if isinstance(region, np.ndarray) and region.ndim == 2:
        if region.shape != (image_size[1], image_size[0]):
            raise RegionError(f"a region mask must be the image's size {image_size[1]}x{image_size[0]} (rows x "
                              f"columns), not {region.shape[0]}x{region.shape[1]}")
        mask = torch.from_numpy(np.clip(region.astype(np.float32), 0.0, 1.0))[None, None]  # (1, 1, H, W)
        weights = torch.nn.functional.adaptive_avg_pool2d(mask, (h, w)).reshape(-1).numpy()  # (L,)
    else:
        box = check_box(region, image_size)
        cell_area = (image_size[0] / w) * (image_size[1] / h)
        weights = (box_coverage(box, grid, image_size) / cell_area).reshape(-1)  # (L,)
    weights = np.clip(weights, 0.0, 1.0).astype(np.float32)
    if not weights.any():
        raise RegionError("the region covers no part of the image")
    return weights


def regions_weights(regions: Sequence[Region], grid: tuple[int, int], image_size: tuple[int, int]) -> torch.Tensor:
    """(R, h*w): ``region_weights`` of each region, in order; a RegionError for none or more than MAX_REGIONS."""
    if not 1 <= len(regions) <= MAX_REGIONS:
        raise RegionError(f"give between 1 and {MAX_REGIONS} regions per image, not {len(regions)}")
    return torch.from_numpy(np.stack([region_weights(r, grid, image_size) for r in regions]))


def region_bias(weights: torch.Tensor, strength: float = 1.0, floor: float = 0.0) -> torch.Tensor:
    """Score offsets ``strength * log(max(weight, floor))`` (..., L): -inf outside the region when ``floor`` is 0
    (attention never leaves it), else at most ``strength * log(floor)`` below a fully covered cell."""
    clamped = weights.clamp_min(floor) if floor > 0 else weights
    return clamped.log() * strength  # log 0 = -inf: no attention there


@dataclass(frozen=True)
class PhraseRule:
    """Where a phrase ends, in the decoder's word ids (a plug-in's ``phrase_rule``): after a word of ``closers``,
    only inside a phrase begun by ``opener`` when one is given."""
    closers: frozenset[int]
    opener: int | None = None

    def table(self, vocab_size: int, device: torch.device | None = None) -> torch.Tensor:
        """(V,) bool: which word ids close a phrase."""
        closes = torch.zeros(vocab_size, dtype=torch.bool, device=device)
        closes[sorted(self.closers)] = True
        return closes

    def step(self, closes: torch.Tensor, words: torch.Tensor, ended: torch.Tensor,
             open_: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(phrases ended, a phrase is open) per row once ``words`` (B,) are emitted."""
        closed = closes[words] & (open_ if self.opener is not None else True)  # (B,)
        if self.opener is not None:
            open_ = (open_ | (words == self.opener)) & ~closed
        return ended + closed.long(), open_

    def phrases_ended(self, history: torch.Tensor, vocab_size: int) -> torch.Tensor:
        """history (R, t) word ids -> (R,) how many phrases they have ended."""
        closes = self.table(vocab_size, history.device)
        ended = torch.zeros(history.shape[0], dtype=torch.long, device=history.device)
        open_ = torch.zeros(history.shape[0], dtype=torch.bool, device=history.device)
        for t in range(history.shape[1]):
            ended, open_ = self.step(closes, history[:, t], ended, open_)
        return ended

    def word_regions(self, words: Sequence[int], regions: int) -> list[int]:
        """The region each word was written in: the phrases ended before it, at most the last region; -1 for a
        word before the first phrase began (a rule with an opener: those words are not steered)."""
        out, count, open_ = [], 0, False
        closes = set(self.closers)
        for word in words:
            framing = self.opener is not None and count == 0 and not open_
            out.append(-1 if framing else min(count, regions - 1))
            closed = word in closes and (open_ or self.opener is None)
            if self.opener is not None:
                open_ = (open_ or word == self.opener) and not closed
            count += int(closed)
        return out


class RegionGuide:
    """The regions' per-row state while decoding (``State.guide``): each row's region biases (B, R, L), its last
    region index (B,), and where its caption is (phrases ended, a phrase open)."""

    def __init__(self, biases: torch.Tensor, last: torch.Tensor, closes: torch.Tensor | None, rule: PhraseRule | None,
                 ended: torch.Tensor | None = None, open_: torch.Tensor | None = None,
                 within: torch.Tensor | None = None):
        self.biases, self.last, self.closes, self.rule = biases, last, closes, rule  # (B, R, L), (B,), (V,)
        rows = biases.shape[0]
        # (B, L): the share of each cell inside any of the row's regions (``DecoderExtension.annotations``)
        self.within = within
        self.ended = ended if ended is not None else torch.zeros(rows, dtype=torch.long, device=biases.device)
        self.open = open_ if open_ is not None else torch.zeros(rows, dtype=torch.bool, device=biases.device)

    @classmethod
    def start(cls, weights: Sequence[torch.Tensor], rule: PhraseRule | None, vocab_size: int,
              strength: float = 1.0, floor: float = 0.0, device: torch.device | None = None) -> "RegionGuide":
        """One row per image from each image's region weights (R_i, L); images with fewer regions repeat their
        last (never reached: ``last`` stops there)."""
        if not strength > 0 or not math.isfinite(strength):
            raise RegionError(f"the region strength must be a number above 0, not {strength!r}")
        if rule is None and any(w.shape[0] > 1 for w in weights):
            raise RegionError("this model's plug-in does not say where a phrase ends, so it can be steered by one "
                              "region per image only")
        R = max(w.shape[0] for w in weights)
        padded = torch.stack([torch.cat([w, w[-1:].expand(R - w.shape[0], -1)]) for w in weights])  # (B, R, L)
        biases = region_bias(padded.to(device), strength, floor)  # (B, R, L)
        last = torch.tensor([w.shape[0] - 1 for w in weights], dtype=torch.long, device=device)  # (B,)
        return cls(biases, last, None if rule is None else rule.table(vocab_size, device), rule,
                   within=padded.amax(1).to(device))

    def index(self, rows: torch.Tensor) -> "RegionGuide":
        return RegionGuide(self.biases[rows], self.last[rows], self.closes, self.rule, self.ended[rows],
                           self.open[rows], None if self.within is None else self.within[rows])

    def advance(self, alpha: torch.Tensor) -> "RegionGuide":
        """Regions move on with words, not with where attention went."""
        return self

    def after(self, words: torch.Tensor) -> tuple["RegionGuide", torch.Tensor]:
        """(the state once ``words`` (B,) are emitted, the next step's score offsets (B, L))."""
        ended, open_ = self.ended, self.open
        if self.rule is not None:
            ended, open_ = self.rule.step(self.closes, words, ended, open_)
        region = torch.minimum(ended, self.last)  # (B,)
        bias = self.biases[torch.arange(region.shape[0], device=region.device), region]  # (B, L)
        if self.rule is not None and self.rule.opener is not None:  # no phrase begun yet: the frame is not steered
            bias = bias.masked_fill(((ended == 0) & ~open_)[:, None], 0.0)
        return RegionGuide(self.biases, self.last, self.closes, self.rule, ended, open_, self.within), bias


class RegionStop:
    """A score processor for captions of ``regions`` regions: no <end> before every region has had its phrase,
    and nothing but <end>, at no cost, once they all have (any further word would be about no region: a plain model's
    "on a plain background", or, at a length penalty that favours long captions, a loop of filler words)."""

    def __init__(self, rule: PhraseRule, regions: int, end: int):
        self.rule, self.regions, self.end = rule, regions, end

    def __call__(self, history: torch.Tensor, logp: torch.Tensor) -> torch.Tensor:
        early = self.rule.phrases_ended(history, logp.shape[-1]) < self.regions  # (R,)
        out = torch.full_like(logp, float("-inf"))
        out[early] = logp[early]
        # A forced <end> costs nothing: charged its log-probability, beam search preferred phrases after which the
        # model itself would stop ("two small green triangles") to the right one after which it would go on to
        # the next object ("a small green triangle [and ...]").
        out[:, self.end] = torch.where(early, float("-inf"), 0.0)
        return out


def mass_inside(alphas: np.ndarray, word_regions: Sequence[int], weights: np.ndarray) -> list[float]:
    """For every word of a region (-1: none, left out), the share of its attention inside it: alphas (T, h, w) or
    (T, L), weights (R, L); a cell counts by the share of it the region covers (its attention taken as spread
    evenly over it)."""
    flat = np.asarray(alphas).reshape(len(word_regions), -1)  # (T, L)
    return [float(flat[t] @ weights[r]) for t, r in enumerate(word_regions) if r >= 0]


def result_regions(rule: PhraseRule | None, words: Sequence[int], keep: Sequence[int], alphas: np.ndarray,
                   weights: torch.Tensor) -> list[int]:
    """Each caption word's region: replayed from the decoded ``words`` by the rule and put in the caption's order
    (``keep``, the decoded position of each caption word); when a caption processor changed the number of words
    (merging phrases), each word's region is the one holding most of its attention (alphas (T, h, w))."""
    count = weights.shape[0]
    decoded = rule.word_regions(words, count) if rule is not None else [0] * len(words)
    where = [decoded[k] for k in keep]
    if len(where) != len(alphas):
        flat = np.asarray(alphas).reshape(len(alphas), -1)  # (T, L)
        where = (flat @ weights.numpy().T).argmax(1).tolist() if len(alphas) else []  # (T,)
    return where


def read_regions_file(path: str | Path) -> dict[str, list[list[float]]]:
    """The boxes per image of a JSON or CSV file (``caption.py --regions``), keys as the file writes them:

    - JSON: ``{"image.png": [[x0, y0, x1, y1], ...], ...}`` (one box alone may be given without the outer list);
    - CSV (``.csv``): a header ``path,x0,y0,x1,y1`` and one row per box; an image's boxes in row order.

    A RegionError names the file and what is wrong with it; whether the boxes fit their images is checked when
    each image is read."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise RegionError(f"cannot read the regions file {path} ({type(e).__name__})") from None
    out: dict[str, list[list[float]]] = {}
    if path.suffix.lower() == ".csv":
        rows = list(csv.DictReader(io.StringIO(text)))
        fields = ("path", "x0", "y0", "x1", "y1")
        if not rows or any(f not in rows[0] for f in fields):
            raise RegionError(f"the regions file {path} needs a header path,x0,y0,x1,y1 and a row per box")
        for n, row in enumerate(rows, 2):
            box = _numbers([row[f] for f in fields[1:]], f"{path} line {n}")
            out.setdefault(row["path"], []).append(box)
        return out
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise RegionError(f"the regions file {path} is not JSON (line {e.lineno}) nor a .csv file") from None
    if not isinstance(data, dict) or not data:
        raise RegionError(f"the regions file {path} must map image paths to boxes: "
                          '{"image.png": [[x0, y0, x1, y1], ...]}')
    for key, entry in data.items():
        boxes = as_region_list(entry) if isinstance(entry, list) else None
        if not boxes:
            raise RegionError(f"{path}: {key} must have a box [x0, y0, x1, y1] or a list of them")
        out[key] = [_numbers(box, f"{path}: {key}") for box in boxes]
        if len(out[key]) > MAX_REGIONS:
            raise RegionError(f"{path}: {key} has {len(out[key])} boxes; at most {MAX_REGIONS} per image")
    return out


def _numbers(box, where: str) -> list[float]:
    """Four finite numbers with x0 < x1, y0 < y1 (whether they fit the image is checked with the image)."""
    try:
        values = [float(v) for v in box] if isinstance(box, (list, tuple)) else None
    except (TypeError, ValueError):
        values = None
    if values is None or len(values) != 4 or not all(math.isfinite(v) for v in values) \
            or not (values[0] < values[2] and values[1] < values[3]):
        raise RegionError(f"{where}: {box!r} is not a box [x0, y0, x1, y1] with x0 < x1 and y0 < y1")
    return values
