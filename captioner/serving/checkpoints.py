"""Which checkpoint folders the app offers, under which short names (never server paths), and the models
loaded from them once (``ModelCache``); also the scrubbing of server paths out of messages users see."""

from __future__ import annotations

import re
import tempfile
import threading
from pathlib import Path

from captioner.model import Captioner


def default_checkpoints_dir(cwd: str | Path | None = None) -> Path:
    """./checkpoints in the current directory if it exists, else the repository's checkpoints/ beside the package."""
    here = Path.cwd() if cwd is None else Path(cwd)
    if (here / "checkpoints").is_dir():
        return here / "checkpoints"
    import captioner

    return Path(captioner.__file__).resolve().parents[1] / "checkpoints"


def find_checkpoints(root: str | Path = "checkpoints") -> list[Path]:
    """Every folder directly under ``root`` that holds a config.json, sorted by name."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and (p / "config.json").is_file())


def short_names(folders: list[Path], given: list[str] | None = None) -> dict[str, Path]:
    """{short name: folder}: the folder's name; where two share a name, the path as given (when relative) or
    the name with its parent's (``runs/a`` and ``other/a`` stay apart). Order follows ``folders``."""
    given = given or [str(f) for f in folders]
    counts: dict[str, int] = {}
    for f in folders:
        counts[f.name] = counts.get(f.name, 0) + 1
    names: dict[str, Path] = {}
    for folder, as_given in zip(folders, given):
        name = folder.name
        if counts[name] > 1:
            name = as_given if not Path(as_given).is_absolute() else f"{folder.parent.name}/{folder.name}"
        base, k = name, 2
        while name in names:  # still a clash (the same folder twice, or parents alike): number it
            name, k = f"{base}-{k}", k + 1
        names[name] = folder
    return names


def attention_kind(folder: str | Path) -> str | None:
    """The checkpoint's ``model.attention`` from config.json (None when unreadable; loading reports why)."""
    import json

    try:
        return json.loads((Path(folder) / "config.json").read_text())["model"]["attention"]
    except Exception:  # noqa: BLE001 - only an ordering hint; load() gives the real error
        return None


def soft_first(folders: list[Path]) -> list[Path]:
    """The same folders, the first soft-attention checkpoint moved to the front (the app's default)."""
    for i, folder in enumerate(folders):
        if attention_kind(folder) == "soft":
            return [folder] + folders[:i] + folders[i + 1:]
    return list(folders)


def example_images(folder: str | Path, prefix: str = "test_", count: int = 4) -> list[Path]:
    """The first ``count`` images of a split (by file-name prefix) in ``folder``; [] when it is missing."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    found = sorted(p for p in folder.iterdir() if p.name.startswith(prefix) and p.is_file()
                   and p.suffix.lower() in (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif"))
    return found[:count]


def scrub_paths(message: str, replacements: dict[str, str]) -> str:
    """``message`` with each server path replaced by what a user may see (longest first, resolved forms too)."""
    pairs: dict[str, str] = {}
    for path, shown in replacements.items():
        if path:
            pairs[str(path)] = shown
            pairs[str(Path(path).resolve())] = shown
    for path in sorted(pairs, key=len, reverse=True):
        message = message.replace(path, pairs[path])
    # Anything else that still looks like an absolute path into the temp folder: keep only its file name.
    temp = re.escape(tempfile.gettempdir().rstrip("/"))
    return re.sub(temp + r"/[^\s'\":,]*?([^/\s'\":,]+)(?=[\s'\":,]|$)", r"\1", message)


class ModelCache:
    """Loads each checkpoint folder once and hands the same eval-mode model to every caller."""

    def __init__(self, device: str = "cpu"):
        self.device = device
        self._models: dict[Path, Captioner] = {}
        self._lock = threading.Lock()

    def loaded(self, folder: str | Path) -> bool:
        """The folder's model is in memory (``get`` returns it at once)."""
        return Path(folder).resolve() in self._models

    def get(self, folder: str | Path) -> Captioner:
        from captioner.loading import load

        key = Path(folder).resolve()
        with self._lock:  # one load per folder even when many requests arrive at once
            if key not in self._models:
                self._models[key] = load(key, device=self.device)
            return self._models[key]
