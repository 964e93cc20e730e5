"""Safe image decoding shared by training, batch captioning and the app."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import BinaryIO

from PIL import Image, ImageOps

from captioner.errors import ImageError

MAX_IMAGE_PIXELS = 64_000_000  # a 8000x8000 photo passes; a 20000x20000 bomb does not


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


def open_image(source: str | Path | BinaryIO, max_pixels: int = MAX_IMAGE_PIXELS) -> Image.Image:
    """Decode a file fully and safely; raises ImageError with a one-line reason on any failure."""
    name = getattr(source, "name", source)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(source) as img:
                width, height = img.size
                if width * height > max_pixels:
                    raise ImageError(f"{name}: {width}x{height} pixels is over the limit of {max_pixels} "
                                     "(possible decompression bomb).")
                if width < 1 or height < 1:
                    raise ImageError(f"{name}: image has no pixels.")
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
