"""Batch captioning of image files: decode in DataLoader workers, encode in batches, batched beam search.

``caption_paths(model, paths)`` yields one dict per input path, in input order:
``{"path", "caption", "tokens", "log_prob"}`` (+ ``"alphas"`` (T, h, w) nested lists with ``with_alphas``,
+ ``"attention"``: the figure's path with ``attention_dir``), or ``{"path", "error"}`` for a file that cannot be
decoded. One bad file never stops the run.
"""

from __future__ import annotations

import glob
import hashlib
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from captioner.errors import CaptionerError
from captioner.images import open_image

IMAGE_EXTENSIONS = frozenset({".jpg", ".jpeg", ".png", ".gif", ".bmp", ".webp", ".tif", ".tiff", ".ppm", ".pgm",
                              ".pbm", ".pnm", ".jfif"})


class InputError(CaptionerError):
    """A command-line input that is neither a file, a folder nor a glob pattern matching something."""


def expand_inputs(inputs: Iterable[str | Path]) -> list[Path]:
    """Files as given; folders searched recursively for image extensions (sorted); glob patterns expanded.

    The same file reached twice (say, by a folder and a pattern) is kept once, at its first place.
    """
    found: list[Path] = []
    for item in inputs:
        path = Path(item)
        if path.is_dir():
            found += sorted(p for p in path.rglob("*") if p.suffix.lower() in IMAGE_EXTENSIONS and p.is_file())
        elif path.exists():
            found.append(path)
        elif glob.has_magic(str(item)):
            matches = sorted(glob.glob(str(item), recursive=True))
            if not matches:
                raise InputError(f"the pattern {item} matches no file.")
            for m in map(Path, matches):
                if m.is_dir():
                    found += sorted(p for p in m.rglob("*") if p.suffix.lower() in IMAGE_EXTENSIONS and p.is_file())
                else:
                    found.append(m)
        else:
            raise InputError(f"{item} is not a file, a folder or a glob pattern matching anything.")
    seen: set[str] = set()
    unique = []
    for p in found:
        key = path_key(p)
        if key not in seen:
            seen.add(key)
            unique.append(p)
    return unique


def path_key(path: str | Path) -> str:
    """The identity of a file across runs started from anywhere (used by resume)."""
    return os.path.normcase(os.path.abspath(path))


def _reason(path: str, message: str) -> str:
    """``open_image`` messages start with the file name; the record already has the path."""
    prefix = f"{path}: "
    return message[len(prefix):] if message.startswith(prefix) else message


class ImageFiles(Dataset):
    """Item i -> (i, image tensor (3, H, W) or None, error reason or None). Never raises for a bad file."""

    def __init__(self, paths: Sequence[str | Path], transform: Callable):
        self.paths = [str(p) for p in paths]
        self.transform = transform

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> tuple[int, torch.Tensor | None, str | None]:
        path = self.paths[i]
        try:
            if os.path.isfile(path) and os.path.getsize(path) == 0:
                return i, None, "file is empty (0 bytes)."
            return i, self.transform(open_image(path)), None
        except CaptionerError as e:
            return i, None, _reason(path, str(e))
        except Exception as e:  # noqa: BLE001 - a batch run records any per-file failure and goes on
            text = str(e).splitlines()[0] if str(e) else ""
            return i, None, f"cannot decode image ({type(e).__name__}{': ' + text if text else ''})."


def collate(items: list[tuple[int, torch.Tensor | None, str | None]]):
    """-> (indices of decoded images, their tensors stacked (B, 3, H, W) or None, {index: error})."""
    good = [(i, x) for i, x, _ in items if x is not None]
    errors = {i: err for i, x, err in items if x is None}
    images = torch.stack([x for _, x in good]) if good else None
    return [i for i, _ in good], images, errors


def figure_name(path: str | Path) -> str:
    """A stable, collision-free PNG name: the file's stem plus a short hash of its absolute path."""
    digest = hashlib.sha1(path_key(path).encode()).hexdigest()[:8]
    return f"{Path(path).stem}.{digest}.png"


def save_attention_figure(path: str, tokens: list[str], alphas: np.ndarray, attention_dir: Path) -> Path:
    """The paper-style figure for one image, written atomically into ``attention_dir``."""
    from captioner.viz import attention_figure

    out = attention_dir / figure_name(path)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    attention_figure(open_image(path), tokens, alphas).save(tmp, format="PNG")
    os.replace(tmp, out)
    return out


def caption_paths(model, paths: Sequence[str | Path], beam_size: int = 3, batch_size: int = 16,
                  max_len: int | None = None, workers: int = 0, attention_dir: str | Path | None = None,
                  with_alphas: bool = False, length_penalty: float = 0.0) -> Iterator[dict]:
    """Caption image files with a ``Captioner``; yields one result dict per path, in order (see module doc)."""
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")
    attention_dir = Path(attention_dir) if attention_dir is not None else None
    if attention_dir is not None:
        attention_dir.mkdir(parents=True, exist_ok=True)
    dataset = ImageFiles(paths, model.preprocessing.transform())
    device = model.device
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=False, num_workers=workers, collate_fn=collate,
                        pin_memory=device.type == "cuda", persistent_workers=False)
    model.eval()
    for indices, images, errors in loader:
        results: dict[int, dict] = {i: {"path": dataset.paths[i], "error": err} for i, err in errors.items()}
        if images is not None:
            with torch.inference_mode():
                annotations = model.encode(images.to(device, non_blocking=True))  # (B, L, C)
                hyps = model.decode(annotations, beam_size, max_len, length_penalty)
            for i, hyp in zip(indices, hyps):
                res = model.to_result(hyp)
                record = {"path": dataset.paths[i], "caption": res.text, "tokens": res.tokens,
                          "log_prob": res.log_prob}
                if with_alphas:
                    record["alphas"] = np.round(res.alphas.astype(np.float64), 6).tolist()  # (T, h, w)
                if attention_dir is not None:
                    try:
                        record["attention"] = str(save_attention_figure(dataset.paths[i], res.tokens, res.alphas,
                                                                        attention_dir))
                    except (CaptionerError, OSError) as e:
                        record["attention_error"] = str(e).splitlines()[0]
                results[i] = record
        for i in sorted(results):
            yield results[i]
