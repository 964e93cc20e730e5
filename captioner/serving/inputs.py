"""What a request may ask for, checked before any work: the beam size, the upload size whatever the route
(file, data: URL), and the picture decoded with the bomb guard of ``captioner.images``."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
from PIL import Image

from captioner.errors import CaptionerError, ImageError, RegionError
from captioner.images import open_image

MAX_BEAM_SIZE = 10
MAX_UPLOAD_BYTES = 20 * 1024 * 1024  # one image, whatever the route (upload, data: URL, file path)
MAX_REGIONS_TEXT = 10_000  # characters of a request's regions (eight boxes need a few hundred)


def check_beam_size(beam_size: object) -> int:
    """A whole number in 1..MAX_BEAM_SIZE (API clients may send anything)."""
    try:
        value = float(beam_size)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        value = float("nan")
    if not value.is_integer() or not 1 <= value <= MAX_BEAM_SIZE:
        raise CaptionerError(f"beam size {beam_size!r} is not a whole number from 1 to {MAX_BEAM_SIZE}.")
    return int(value)


def check_upload_size(path: str | Path, limit: int = MAX_UPLOAD_BYTES) -> None:
    """Refuse a file over ``limit`` bytes before it is decoded (the limit holds whatever route brought it)."""
    try:
        size = os.stat(path).st_size
    except OSError:
        return  # open_image reports a missing file in its own words
    if size > limit:
        raise ImageError(f"{Path(path).name}: the file is {size / 2**20:.1f} MB; the limit is "
                         f"{limit / 2**20:.0f} MB.")


def data_url_bytes(url: str) -> int:
    """The decoded size of a ``data:`` URL's payload, estimated from its length (no decoding)."""
    payload = url.split(",", 1)[1] if "," in url else ""
    if ";base64" in url.split(",", 1)[0]:
        return len(payload) * 3 // 4
    return len(payload)


def load_picture(image: str | Path | Image.Image | None) -> Image.Image:
    if image is None:
        raise CaptionerError("no image given; upload an image or pick an example.")
    if isinstance(image, Image.Image):
        return image
    check_upload_size(image)
    return open_image(image)


def parse_regions(regions: object) -> list | None:
    """The regions of a request: None or "" (none), boxes as a list, or that list as JSON text:
    ``[x0, y0, x1, y1]`` or ``[[x0, y0, x1, y1], ...]`` in the image's pixels, in order. In Python (the app's
    Point and tell tab, never JSON) a region may also be a mask: an (H, W) array of the image's size, 0..1. A
    RegionError otherwise (each region is checked against the image later)."""
    if regions is None or (isinstance(regions, str) and not regions.strip()):
        return None
    if isinstance(regions, np.ndarray) and regions.ndim == 2:
        return [regions]  # one mask, from the app's brush (JSON brings boxes only)
    if isinstance(regions, str):
        if len(regions) > MAX_REGIONS_TEXT:
            raise RegionError(f"the regions are {len(regions)} characters long; at most {MAX_REGIONS_TEXT}.")
        try:
            regions = json.loads(regions)
        except json.JSONDecodeError:
            raise RegionError("regions must be JSON: a box [x0, y0, x1, y1] or a list of boxes.") from None
    if not isinstance(regions, (list, tuple)):
        raise RegionError("regions must be a box [x0, y0, x1, y1] or a list of boxes.")
    return list(regions) or None
