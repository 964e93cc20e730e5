"""Which checkpoint folders the app offers, under which short names (never server paths), and the models
loaded from them once (``ModelCache``); also the scrubbing of server paths out of messages users see.

Two runtimes: "torch" serves checkpoint folders (config.json) with PyTorch, "onnx" serves folders written by
``captioner-export onnx`` (runtime.json) with ONNX Runtime (``captioner.runtime``; no torch imported)."""

from __future__ import annotations

import re
import tempfile
import importlib.util
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from captioner.errors import CheckpointError

if TYPE_CHECKING:
    from captioner.model.captioner import Captioner
    from captioner.runtime import OnnxCaptioner

RUNTIMES = ("torch", "onnx")
MARKER = {"torch": "config.json", "onnx": "runtime.json"}  # the file that makes a folder servable by each runtime


def default_runtime() -> str:
    """"torch" where PyTorch is installed, else "onnx" (as caption.py's --runtime)."""
    try:
        return "torch" if importlib.util.find_spec("torch") is not None else "onnx"
    except ImportError:  # an import hook that refuses torch (tests do): as good as not installed
        return "onnx"


def is_exported(folder: str | Path) -> bool:
    """The folder was written by ``captioner-export onnx`` (it holds runtime.json)."""
    return (Path(folder) / MARKER["onnx"]).is_file()


def default_checkpoints_dir(cwd: str | Path | None = None, runtime: str = "torch") -> Path:
    """torch: ./checkpoints in the current directory if it exists, else the repository's checkpoints/ beside the
    package. onnx: ./exported (where docs/onnx.md exports to) if it exists, else as for torch."""
    here = Path.cwd() if cwd is None else Path(cwd)
    if runtime == "onnx" and (here / "exported").is_dir():
        return here / "exported"
    if (here / "checkpoints").is_dir():
        return here / "checkpoints"
    import captioner

    return Path(captioner.__file__).resolve().parents[1] / "checkpoints"


def find_checkpoints(root: str | Path = "checkpoints", runtime: str = "torch") -> list[Path]:
    """Every folder directly under ``root`` that the runtime serves (torch: one with a config.json; onnx: one
    written by ``captioner-export onnx``, with a runtime.json), sorted by name."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and (p / MARKER[runtime]).is_file())


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
    """The checkpoint's ``model.attention`` from config.json, or an exported folder's runtime.json (None when
    unreadable; loading reports why)."""
    import json

    name = MARKER["onnx"] if is_exported(folder) else MARKER["torch"]
    try:
        return json.loads((Path(folder) / name).read_text())["model"]["attention"]
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
    """Loads each checkpoint folder once and hands the same eval-mode model to every caller. ``runtime``: "torch"
    (``captioner.load``), "onnx" (``captioner.load_onnx``, for folders written by ``captioner-export onnx``), or
    None: each folder by what it holds (an exported one on ONNX Runtime, any other on PyTorch)."""

    def __init__(self, device: str = "cpu", runtime: str | None = None):
        self.device, self.runtime = device, runtime
        self._models: dict[Path, Captioner | OnnxCaptioner] = {}
        self._lock = threading.Lock()

    def runtime_of(self, folder: str | Path) -> str:
        """The runtime that serves ``folder``."""
        return self.runtime or ("onnx" if is_exported(folder) else "torch")

    def loaded(self, folder: str | Path) -> bool:
        """The folder's model is in memory (``get`` returns it at once)."""
        return Path(folder).resolve() in self._models

    def get(self, folder: str | Path) -> Captioner | OnnxCaptioner:
        key = Path(folder).resolve()
        with self._lock:  # one load per folder even when many requests arrive at once
            if key not in self._models:
                self._models[key] = self._load(key)
            return self._models[key]

    def _load(self, folder: Path) -> Captioner | OnnxCaptioner:
        if self.runtime_of(folder) == "onnx":
            from captioner.runtime import load_onnx

            return load_onnx(folder)
        if is_exported(folder):
            raise CheckpointError(f"{folder} was written by captioner-export onnx: serve it with --runtime onnx.")
        from captioner.checkpoints.loading import load

        return load(folder, device=self.device)
