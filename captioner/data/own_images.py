"""Checks of your own pictures before ``prepare own`` writes them: every image is decoded as training will decode it
(undecodable ones are dropped and listed; SVG drawings are rasterized to PNG when asked and a converter is
installed), and duplicate pictures are found, identical by content (SHA-256 of the bytes) or near-identical
(re-saved, resized, mirrored) by a difference hash, so that the split can keep each group in one split.

Near-identical means: the 64-bit dHashes of the two pictures (or of one and the other's mirror image) differ in at
most ``NEAR_BITS`` = 4 bits, *and* their 9x8 grayscale thumbnails differ by at most ``NEAR_MEAN_DIFF`` = 8 grey
levels on average, *or* their 16x16 grayscale thumbnails correlate at ``NEAR_CORRELATION`` = 0.9 or more (both
with some contrast) and their mean colours are of one hue (chromaticity within ``NEAR_CHROMA``). The second test
keeps flat pictures apart: every plain-coloured picture has the dHash 0. Its correlation form catches variants of
one drawing in a lighter or darker fill (an emoji's skin tones), which move the grey levels but not the drawing;
the hue condition keeps a red and a blue square apart, since a caption names the colour.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import combinations
from pathlib import Path, PurePath

import numpy as np
from PIL import Image

from captioner.errors import ImageError
from captioner.images import open_image

SVG_SUFFIXES = (".svg", ".svgz")
CHECK_DRAFT = (256, 256)  # a JPEG is checked decoded at a reduced scale no smaller than this (other formats whole)
HASH_SIZE = 8  # dHash: 8 rows of 8 left-right comparisons on a 9x8 grayscale thumbnail = 64 bits
NEAR_BITS = 4  # near-identical: dHashes within 4 of 64 bits...
NEAR_MEAN_DIFF = 8.0  # ...and thumbnails within 8 grey levels (of 255) on average...
DETAIL_SIZE = 16  # ...or 16x16 grayscale thumbnails that correlate at
NEAR_CORRELATION = 0.9
MIN_CONTRAST = 4.0  # grey levels of standard deviation: below this a picture is flat and has no correlation
NEAR_CHROMA = 0.12  # mean chromaticity (r, g) / (r + g + b): skin tones differ by under 0.1, red and blue by 0.7
BAND_BITS = 13  # 5 bands of 13 bits: two hashes within 4 bits agree exactly on one band at least (pigeonhole)
CONVERTER_HINT = "pip install cairosvg, or Debian's librsvg2-bin (rsvg-convert)"

SvgConverter = Callable[[Path, Path], None]  # (svg file, png file to write)


@dataclass
class Picture:
    """A picture training can read: the file it reads, the SHA-256 of its bytes, its thumbnail and dHashes."""

    path: Path
    sha256: str
    thumb: np.ndarray  # (HASH_SIZE, HASH_SIZE + 1) grayscale, float32
    dhash: int
    dhash_mirrored: int
    detail: np.ndarray | None = None  # (DETAIL_SIZE, DETAIL_SIZE) grayscale, zero mean and unit norm; None: flat
    chroma: tuple[float, float] = (1 / 3, 1 / 3)  # mean colour's (r, g) / (r + g + b)


@dataclass
class ImageCheck:
    """What ``check_images`` found: the readable pictures and, for every other file, why training cannot read it."""

    pictures: dict[str, Picture] = field(default_factory=dict)  # image name -> picture
    unreadable: dict[str, str] = field(default_factory=dict)  # image name -> one-line reason
    svgs_dropped: int = 0
    svgs_rasterized: int = 0


@dataclass
class DuplicateGroups:
    """Pictures that must share a split: ``group_of`` maps each image in a group of two or more to the group's
    first name (sorted); the counts and examples are for the report."""

    group_of: dict[str, str] = field(default_factory=dict)
    identical_images: int = 0  # files in groups of byte-identical files
    identical_groups: int = 0
    near_identical_images: int = 0  # distinct files (by content) in groups joined by the perceptual hash
    near_identical_groups: int = 0
    examples: list[str] = field(default_factory=list)


def is_svg(path: Path) -> bool:
    """An SVG drawing, by its suffix or by an ``<svg`` tag at the start of the file."""
    if path.suffix.lower() in SVG_SUFFIXES:
        return True
    try:
        with open(path, "rb") as f:
            head = f.read(1024).lstrip().lower()
    except OSError:
        return False
    return head.startswith((b"<svg", b"<?xml", b"<!doctype svg")) and b"<svg" in head


def find_svg_converter() -> tuple[str, SvgConverter] | None:
    """The Python package cairosvg if importable, else an ``rsvg-convert`` on PATH; None without either."""
    try:
        import cairosvg  # lazy: optional, and it loads the cairo library
    except (ImportError, OSError):  # OSError: the package is there but the cairo library is not
        cairosvg = None
    if cairosvg is not None:
        return "cairosvg", lambda src, dst: cairosvg.svg2png(url=str(src), write_to=str(dst))
    exe = shutil.which("rsvg-convert")
    if exe is None:
        return None

    def rsvg(src: Path, dst: Path) -> None:
        with open(dst, "wb") as out:
            subprocess.run([exe, "--format", "png", str(src)], stdout=out, stderr=subprocess.PIPE, check=True,
                           timeout=120)

    return "rsvg-convert", rsvg


def rasterized_path(name: str, folder: Path) -> Path:
    """Where the PNG of the SVG ``name`` (relative or absolute) goes: its relative path under ``folder``."""
    pure = PurePath(name)
    parts = [p for p in pure.parts[1 if pure.anchor else 0:] if p not in ("..", ".")]
    return folder.joinpath(*parts).with_suffix(".png")


def rasterize(src: Path, dst: Path, converter: SvgConverter) -> None:
    """SVG -> PNG, written under a temporary name and renamed, so a failed conversion leaves nothing."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(dst.name + ".tmp")
    try:
        converter(src, tmp)
        os.replace(tmp, dst)
    finally:
        tmp.unlink(missing_ok=True)


def dhash(thumb: np.ndarray) -> int:
    """Difference hash of a (H, H+1) thumbnail: one bit per pixel brighter than its left neighbour."""
    bits = (thumb[:, 1:] > thumb[:, :-1]).ravel()
    return int.from_bytes(np.packbits(bits).tobytes(), "big")


def picture_of(path: Path) -> Picture:
    """Decode ``path`` as training will (``captioner.images.open_image``; a JPEG at reduced scale) and hash it.
    Raises ImageError with a one-line reason."""
    image = open_image(path, draft=CHECK_DRAFT)
    small = image.convert("L").resize((HASH_SIZE + 1, HASH_SIZE), Image.Resampling.BILINEAR)
    thumb = np.asarray(small, dtype=np.uint8)  # whole grey levels: a flat picture gives ties, not noise bits
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    detail = image.convert("L").resize((DETAIL_SIZE, DETAIL_SIZE), Image.Resampling.BILINEAR)
    return Picture(path, digest, thumb.astype(np.float32), dhash(thumb), dhash(thumb[:, ::-1]), _normalised(detail),
                   _chroma(image))


def _chroma(image: Image.Image) -> tuple[float, float]:
    """The chromaticity (r, g) / (r + g + b) of the picture's colours, each pixel weighted by its saturation
    (max - min of r, g, b), so that a white, black or grey background does not dilute the fill's hue."""
    rgb = np.asarray(image.convert("RGB").resize((DETAIL_SIZE, DETAIL_SIZE), Image.Resampling.BILINEAR),
                     dtype=np.float64).reshape(-1, 3)  # (L, 3)
    weight = rgb.max(1) - rgb.min(1)  # (L,)
    if weight.sum() <= 0:
        return 1 / 3, 1 / 3
    chroma = rgb[:, :2] / np.maximum(rgb.sum(1, keepdims=True), 1e-9)  # (L, 2)
    r, g = (chroma * weight[:, None]).sum(0) / weight.sum()
    return float(r), float(g)


def _normalised(image: Image.Image) -> np.ndarray | None:
    """Zero mean, unit norm (so a dot product is the correlation); None for a flat picture."""
    pixels = np.asarray(image, dtype=np.float32)  # (DETAIL_SIZE, DETAIL_SIZE)
    if pixels.std() < MIN_CONTRAST:
        return None
    pixels = pixels - pixels.mean()
    return pixels / np.linalg.norm(pixels)


def check_images(paths: dict[str, Path], rasterize_to: Path | None = None,
                 converter: SvgConverter | None = None) -> ImageCheck:
    """Decode every file of ``paths`` (image name -> existing file). An SVG is rasterized to
    ``rasterize_to``/<name>.png when both ``rasterize_to`` and ``converter`` are given, else it is unreadable."""
    found = ImageCheck()
    for name, path in paths.items():
        if is_svg(path):
            if rasterize_to is None or converter is None:
                found.unreadable[name] = f"{path}: an SVG drawing, which training cannot read"
                found.svgs_dropped += 1
                continue
            png = rasterized_path(name, rasterize_to)
            try:
                rasterize(path, png, converter)
            except Exception as e:  # noqa: BLE001 - any converter failure drops this one file, with its reason
                first = str(e).splitlines()[0] if str(e) else type(e).__name__
                found.unreadable[name] = f"{path}: an SVG the converter could not rasterize ({first})"
                continue
            found.svgs_rasterized += 1
            path = png
        try:
            found.pictures[name] = picture_of(path)
        except ImageError as e:
            found.unreadable[name] = _with_path(str(e), path)
    return found


def _with_path(message: str, path: Path) -> str:
    """An ImageError's message (it names a file by its name alone) with the file's whole path instead."""
    return f"{path}: {message.removeprefix(f'{path.name}: ').removeprefix(f'{path}: ')}"


def near_identical(a: Picture, b: Picture) -> bool:
    """Within ``NEAR_BITS`` of dHash, and within ``NEAR_MEAN_DIFF`` of thumbnail or correlated at
    ``NEAR_CORRELATION``; as they are or with ``b`` mirrored."""
    b_detail = b.detail
    for b_hash, b_thumb, mirrored in ((b.dhash, b.thumb, False), (b.dhash_mirrored, b.thumb[:, ::-1], True)):
        if (a.dhash ^ b_hash).bit_count() > NEAR_BITS:
            continue
        if np.abs(a.thumb - b_thumb).mean() <= NEAR_MEAN_DIFF:
            return True
        same_hue = max(abs(a.chroma[0] - b.chroma[0]), abs(a.chroma[1] - b.chroma[1])) <= NEAR_CHROMA
        if same_hue and a.detail is not None and b_detail is not None:
            other = b_detail[:, ::-1] if mirrored else b_detail
            if float((a.detail * other).sum()) >= NEAR_CORRELATION:
                return True
    return False


def _bands(h: int) -> list[tuple[int, int]]:
    return [(k, (h >> (k * BAND_BITS)) & ((1 << BAND_BITS) - 1)) for k in range(-(-HASH_SIZE ** 2 // BAND_BITS))]


def duplicate_groups(pictures: dict[str, Picture], examples: int = 3) -> DuplicateGroups:
    """Group identical files (same SHA-256) and near-identical pictures (see the module's docstring); candidates
    come from hash bands, so the cost grows with the number of similar pictures, not with its square."""
    names = sorted(pictures)
    parent = {n: n for n in names}

    def find(n: str) -> str:
        while parent[n] != n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n

    def union(a: str, b: str) -> None:
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)

    by_sha: dict[str, list[str]] = {}
    for n in names:
        by_sha.setdefault(pictures[n].sha256, []).append(n)
    for same in by_sha.values():
        for other in same[1:]:
            union(same[0], other)
    buckets: dict[tuple[int, int], list[str]] = {}
    for same in by_sha.values():  # one picture per content
        pic = pictures[same[0]]
        for key in {*_bands(pic.dhash), *_bands(pic.dhash_mirrored)}:
            buckets.setdefault(key, []).append(same[0])
    for members in buckets.values():
        for a, b in combinations(members, 2):
            if find(a) != find(b) and near_identical(pictures[a], pictures[b]):
                union(a, b)
    out = DuplicateGroups()
    members_of: dict[str, list[str]] = {}
    for n in names:
        members_of.setdefault(find(n), []).append(n)
    for root, members in members_of.items():
        if len(members) < 2:
            continue
        out.group_of.update({n: root for n in members})
        contents = {pictures[n].sha256: n for n in reversed(members)}  # content -> its first name
        if len(contents) > 1:
            out.near_identical_images += len(contents)
            out.near_identical_groups += 1
            if len(out.examples) < examples:
                out.examples.append(" ~ ".join(sorted(contents.values())))
    for same in by_sha.values():
        if len(same) > 1:
            out.identical_images += len(same)
            out.identical_groups += 1
            if len(out.examples) < examples:
                out.examples.append(" = ".join(same))
    return out
