"""Pure helpers for serving captions (the Gradio app uses them; nothing here imports gradio).

- ``find_checkpoints``: the checkpoint folders the app offers by default.
- ``ModelCache``: each checkpoint loaded once, shared by every request (thread-safe).
- ``OverlayStore``: overlay images written once, atomically, under a content-hash name, so a browser
  never reads a half-written file and the same overlay is never rewritten while it is being served.
- ``caption_with_overlays``: decode an upload safely, caption it, return the text and one overlay per word.
"""

from __future__ import annotations

import hashlib
import io
import os
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from PIL import Image

from captioner.errors import CaptionerError, CheckpointError
from captioner.images import open_image
from captioner.model import Captioner

MAX_BEAM_SIZE = 10


def find_checkpoints(root: str | Path = "checkpoints") -> list[Path]:
    """Every folder directly under ``root`` that holds a config.json, sorted by name."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and (p / "config.json").is_file())


def example_images(folder: str | Path, prefix: str = "test_", count: int = 4) -> list[Path]:
    """The first ``count`` images of a split (by file-name prefix) in ``folder``; [] when it is missing."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    found = sorted(p for p in folder.iterdir() if p.name.startswith(prefix)
                   and p.suffix.lower() in (".jpg", ".jpeg", ".png"))
    return found[:count]


class ModelCache:
    """Loads each checkpoint folder once (on first use) and hands the same eval-mode model to every caller."""

    def __init__(self, device: str = "cpu"):
        self.device = device
        self._models: dict[Path, Captioner] = {}
        self._lock = threading.Lock()

    def get(self, folder: str | Path) -> Captioner:
        from captioner.checkpoint import load

        key = Path(folder).resolve()
        with self._lock:  # one load per folder even when many requests arrive at once
            if key not in self._models:
                self._models[key] = load(key, device=self.device)
            return self._models[key]


class OverlayStore:
    """PNG files named by the SHA-256 of their bytes, written to a temporary name then ``os.replace``d."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)

    def save(self, image: Image.Image) -> Path:
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")
        data = buffer.getvalue()
        path = self.folder / f"{hashlib.sha256(data).hexdigest()[:32]}.png"
        if path.is_file():  # same content already there: never rewrite a file that may be being served
            return path
        fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=".overlay.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return path


@dataclass
class CaptionOutput:
    text: str
    tokens: list[str]
    overlays: list[tuple[str, str]]  # (overlay PNG path, "i: word"), one per word


def check_beam_size(beam_size: object) -> int:
    """A whole number in 1..MAX_BEAM_SIZE (API clients may send anything)."""
    try:
        value = float(beam_size)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        value = float("nan")
    if not value.is_integer() or not 1 <= value <= MAX_BEAM_SIZE:
        raise CaptionerError(f"beam size {beam_size!r} is not a whole number from 1 to {MAX_BEAM_SIZE}.")
    return int(value)


def caption_with_overlays(model: Captioner, image: str | Path | Image.Image, beam_size: int,
                          store: OverlayStore) -> CaptionOutput:
    """Caption one image (a path is decoded with the bomb guard) and write one attention overlay per word."""
    from captioner.viz import word_overlays

    if image is None:
        raise CaptionerError("no image given; upload an image first.")
    picture = image if isinstance(image, Image.Image) else open_image(image)
    result = model.caption([picture], beam_size=check_beam_size(beam_size))[0]
    overlays = [(str(store.save(ov)), label) for ov, label in word_overlays(picture, result.tokens, result.alphas)]
    return CaptionOutput(result.text, result.tokens, overlays)


def highlight(tokens: list[str], index: int) -> list[tuple[str, str | None]]:
    """The caption as (text, label) pairs for a highlighted-text view; word ``index`` (0-based) is "current"."""
    pairs: list[tuple[str, str | None]] = []
    for i, word in enumerate(tokens):
        if i:
            pairs.append((" ", None))
        pairs.append((word, "current" if i == index else None))
    return pairs


__all__ = ["find_checkpoints", "example_images", "ModelCache", "OverlayStore", "CaptionOutput",
           "caption_with_overlays", "highlight", "check_beam_size", "CheckpointError", "MAX_BEAM_SIZE"]
