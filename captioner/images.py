"""Safe image decoding shared by training, batch captioning and the app."""

from __future__ import annotations

import os
import stat
import warnings
from pathlib import Path
from typing import BinaryIO

from PIL import Image, ImageOps

from captioner.errors import ImageError

MAX_IMAGE_PIXELS = 64_000_000  # a 8000x8000 photo passes; a 20000x20000 bomb does not
# Decoding cost grows with the longest side too: a 64,000,000 x 1 PNG is 62 kB and passes the pixel count, yet its
# rows are 64 million pixels long. Photos, scans, panoramas and banners stay far inside this.
MAX_IMAGE_SIDE = 16_384
# Longer than this one way, an image is captioned with a warning (``caption_warning``), not refused: the encoder's
# preprocessing squeezes it into a square, which costs nothing more (a 4000x60 banner decodes in milliseconds) but
# leaves little of its shape. A 360-degree panorama is 2:1, a phone's widest pano ~8:1.
ELONGATED_RATIO = 20.0
SMALL_IMAGE_SIDE = 32  # below this, the encoder sees mostly interpolation (a 1x1 image becomes one flat colour)


def to_rgb(image: Image.Image) -> Image.Image:
    """Any Pillow mode (RGBA, LA, P, L, I;16, I, F, CMYK, YCbCr, ...) to 8-bit RGB; alpha composited on white."""
    if image.mode == "RGB":
        return image
    if image.mode in ("I;16", "I;16B", "I;16L", "I", "F"):
        import numpy as np

        arr = np.asarray(image, dtype=np.float64)
        top = 65535.0 if image.mode.startswith("I;16") or arr.max() > 255 else 255.0
        arr = np.clip(arr / top * 255.0, 0, 255).astype("uint8")
        return Image.fromarray(arr, "L").convert("RGB")
    if image.mode == "P" and "transparency" in image.info:
        image = image.convert("RGBA")
    if image.mode in ("RGBA", "LA", "PA", "RGBa", "La"):
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return image.convert("RGB")


def prepare_image(image: Image.Image) -> Image.Image:
    """EXIF orientation applied, first frame of an animation, converted to RGB."""
    try:
        image.seek(0)
    except (EOFError, AttributeError):
        pass
    image = ImageOps.exif_transpose(image) or image
    return to_rgb(image)


def check_dimensions(width: int, height: int, name: object = "image", max_pixels: int = MAX_IMAGE_PIXELS) -> None:
    """Refuse, from the header's size alone, an image whose decoding or resizing would cost too much."""
    if width < 1 or height < 1:
        raise ImageError(f"{name}: image has no pixels.")
    if width * height > max_pixels:
        raise ImageError(f"{name}: {width}x{height} pixels is over the limit of {max_pixels} "
                         "(possible decompression bomb).")
    if max(width, height) > MAX_IMAGE_SIDE:
        raise ImageError(f"{name}: {width}x{height} has a side over the limit of {MAX_IMAGE_SIDE} pixels.")


def caption_warning(size: tuple[int, int], tokens: list[str], min_side: int = SMALL_IMAGE_SIDE) -> str | None:
    """Why a caption may not describe the image: an empty caption, an image so small it was blown up, or one so
    elongated it was squeezed into the encoder's square."""
    width, height = size
    reasons = []
    if not tokens:
        reasons.append("the model ended the caption at once (its most likely caption is empty)")
    if min(width, height) < min_side:
        reasons.append(f"the image is only {width}x{height} pixels (under {min_side}), upscaled for the encoder, "
                       "so the caption may not describe it")
    ratio = max(width, height) / max(1, min(width, height))
    if ratio > ELONGATED_RATIO:
        reasons.append(f"the image is {width}x{height} ({ratio:.0f}:1), squeezed into the encoder's square input, "
                       "so the caption may not describe it")
    return "; ".join(reasons) + "." if reasons else None


def file_kind(path: str | Path) -> str | None:
    """None for a regular file (or a link to one); otherwise what it is, e.g. "a FIFO (named pipe)".

    Checked before opening: opening a FIFO blocks until someone writes into it, a device may never end.
    """
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "a broken symbolic link" if os.path.islink(path) else "missing"
    except OSError as e:  # a link loop, a permission problem on a parent folder
        return f"unreadable ({(e.strerror or type(e).__name__).lower()})"
    if stat.S_ISREG(mode):
        return None
    kinds = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
             (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))
    return next((what for test, what in kinds if test(mode)), "not a regular file")


def open_image(source: str | Path | BinaryIO, max_pixels: int = MAX_IMAGE_PIXELS,
               draft: tuple[int, int] | None = None) -> Image.Image:
    """Decode a file fully and safely; raises ImageError with a one-line reason on any failure.

    A path must name a regular file; the size limits (pixels, longest side) are checked from the header,
    before any pixel is decoded. ``draft`` (width, height) lets a JPEG decode at a reduced scale no smaller than
    that (Pillow's ``draft``; other formats decode whole): a cheaper check that the file decodes.
    """
    name = getattr(source, "name", source)
    if isinstance(source, (str, Path)):
        kind = file_kind(source)
        if kind == "missing":
            raise ImageError(f"{name}: file not found.")
        if kind is not None:
            raise ImageError(f"{name}: is {kind}, not an image file.")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(source) as img:
                check_dimensions(*img.size, name=name, max_pixels=max_pixels)
                if draft is not None:
                    img.draft("RGB", draft)
                img.load()
                return prepare_image(img)
    except ImageError:
        raise
    except FileNotFoundError:
        raise ImageError(f"{name}: file not found.") from None
    except IsADirectoryError:
        raise ImageError(f"{name}: is a folder, not an image file.") from None
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise ImageError(f"{name}: too many pixels (possible decompression bomb): {e}") from None
    except Image.UnidentifiedImageError:
        raise ImageError(f"{name}: not an image file Pillow can read.") from None
    except (OSError, SyntaxError, ValueError, EOFError) as e:
        raise ImageError(f"{name}: cannot decode image ({str(e).splitlines()[0] if str(e) else type(e).__name__}).") from None


def as_image(item: "Image.Image | str | os.PathLike") -> "Image.Image":
    """A PIL image as it is, or a path opened with ``open_image``: what ``caption()`` takes, on either route."""
    if isinstance(item, Image.Image):
        return item
    if isinstance(item, (str, os.PathLike)):
        return open_image(item)
    raise TypeError(f"caption() takes PIL images or paths (str or Path), not {type(item).__name__}")
