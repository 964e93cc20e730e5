"""Batch captioning of image files: decode in DataLoader workers, encode in batches, batched beam search.

``caption_paths(model, paths)`` yields one dict per input path, in input order:
``{"path", "caption", "tokens", "log_prob", "in_domain", "domain_score"}`` (the last two None when the checkpoint
has no domain check; see ``captioner.model.domain``) (+ ``"alphas"`` (T, h, w) nested lists with ``with_alphas``,
+ ``"attention"``: the figure's path with ``attention_dir``, + ``"warning"`` when the caption is empty or the image
is tiny or elongated, ``captioner.images.caption_warning``; + ``"regions"``, each word's region, for an image steered
by ``regions``), or ``{"path", "error"}`` for a file that cannot be decoded or is not a regular file (a FIFO, a broken
link). One bad file never stops the run.

torch is imported where the PyTorch route needs it: the ONNX Runtime route (an ``OnnxCaptioner``, captioner.runtime)
captions through the same function where torch is not installed.
"""

from __future__ import annotations

import glob
import hashlib
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np

from captioner.errors import CaptionerError
from captioner.images import caption_warning, file_kind, open_image

IMAGE_EXTENSIONS = frozenset({".jpg", ".jpeg", ".png", ".gif", ".bmp", ".webp", ".tif", ".tiff", ".ppm", ".pgm",
                              ".pbm", ".pnm", ".jfif"})




class InputError(CaptionerError):
    """A command-line input that is neither a file, a folder nor a glob pattern matching something."""


def _image_entries(folder: Path) -> list[Path]:
    """Every entry under ``folder`` with an image extension that is not a folder, sorted.

    FIFOs, sockets, devices and broken symbolic links are kept, not skipped: they are reported as records with
    an error instead of vanishing from the output (opening them is refused later, before any read).
    """
    return sorted(p for p in folder.rglob("*") if p.suffix.lower() in IMAGE_EXTENSIONS and not p.is_dir())


def expand_inputs(inputs: Iterable[str | Path]) -> list[Path]:
    """Files as given; folders searched recursively for image extensions (sorted); glob patterns expanded.

    The same file reached twice (say, by a folder and a pattern) is kept once, at its first place. A named
    FIFO or broken symbolic link is kept too (it gets an error record, it is never opened).
    """
    found: list[Path] = []
    for item in inputs:
        path = Path(item)
        if path.is_dir():
            found += _image_entries(path)
        elif os.path.lexists(path):
            found.append(path)
        elif glob.has_magic(str(item)):
            matches = sorted(glob.glob(str(item), recursive=True))
            if not matches:
                raise InputError(f"the pattern {item} matches no file.")
            for m in map(Path, matches):
                found += _image_entries(m) if m.is_dir() else [m]
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


def shard(items: Sequence, rank: int, world: int) -> list:
    """Rank ``rank``'s contiguous share of ``items`` (sizes differ by at most one); concatenating the shares of
    ranks 0..world-1 gives back ``items`` in order."""
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"rank {rank} is not in a world of {world}")
    n = len(items)
    start, end = rank * n // world, (rank + 1) * n // world
    return list(items[start:end])


def path_key(path: str | Path) -> str:
    """The identity of a file across runs started from anywhere (used by resume)."""
    return os.path.normcase(os.path.abspath(path))


def _reason(path: str, message: str) -> str:
    """``open_image`` messages start with the file name; the record already has the path."""
    prefix = f"{path}: "
    return message[len(prefix):] if message.startswith(prefix) else message


class ImageFiles:  # a map-style dataset (DataLoader takes any object with __getitem__ and __len__)
    """Item i -> (i, image tensor (3, H, W) or None, error reason or None, decoded (width, height) or None);
    the tensor is what ``transform`` makes of the image (``caption_paths``: uint8, resized).

    Never raises for a bad file; only regular files are opened (``open_image`` refuses FIFOs and the like).
    """

    def __init__(self, paths: Sequence[str | Path], transform: Callable):
        self.paths = [str(p) for p in paths]
        self.transform = transform

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> tuple[int, torch.Tensor | None, str | None, tuple[int, int] | None]:
        path = self.paths[i]
        try:
            if file_kind(path) is None and os.path.getsize(path) == 0:
                return i, None, "file is empty (0 bytes).", None
            image = open_image(path)
            return i, self.transform(image), None, image.size
        except CaptionerError as e:
            return i, None, _reason(path, str(e)), None
        except Exception as e:  # noqa: BLE001 - a batch run records any per-file failure and goes on
            text = str(e).splitlines()[0] if str(e) else ""
            return i, None, f"cannot decode image ({type(e).__name__}{': ' + text if text else ''}).", None


def collate(items: list[tuple[int, torch.Tensor | None, str | None, tuple[int, int] | None]]):
    """-> (indices of decoded images, their tensors stacked (B, 3, H, W) or None, {index: error},
    {index: decoded (width, height)})."""
    import torch

    good = [(i, x) for i, x, _, _ in items if x is not None]
    errors = {i: err for i, x, err, _ in items if x is None}
    sizes = {i: size for i, x, _, size in items if x is not None}
    images = torch.stack([x for _, x in good]) if good else None
    return [i for i, _ in good], images, errors, sizes


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
                  with_alphas: bool = False, length_penalty: float | None = None,
                  regions: Mapping[str, list] | None = None) -> Iterator[dict]:
    """Caption image files with a ``Captioner``; yields one result dict per path, in order (see module doc).
    ``regions``: boxes steering the captions of some images (``captioner.decoding.regions``), by their ``path_key``; a
    box that does not fit its image makes that image's record an error."""
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")
    attention_dir = Path(attention_dir) if attention_dir is not None else None
    if attention_dir is not None:
        attention_dir.mkdir(parents=True, exist_ok=True)
    if getattr(model, "runtime", "torch") == "onnx":  # ONNX Runtime: decoded here, normalised by the runtime
        if regions:
            raise CaptionerError("regions steer captions on the PyTorch route only; drop --runtime onnx (or the "
                                 "regions) to use them.")
        yield from _caption_paths_onnx(model, [str(p) for p in paths], beam_size, batch_size, max_len, attention_dir,
                                       with_alphas, length_penalty)
        return
    from torch.utils.data import DataLoader

    from captioner.decoding.regions import RegionError, regions_weights

    # Workers decode and resize to uint8; the batch is normalised here at once (the same floats as transform()).
    dataset = ImageFiles(paths, model.preprocessing.resize())
    device = model.device
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=False, num_workers=workers, collate_fn=collate,
                        pin_memory=device.type == "cuda", persistent_workers=False)
    model.eval()
    for indices, images, errors, sizes in loader:
        results: dict[int, dict] = {i: {"path": dataset.paths[i], "error": err} for i, err in errors.items()}
        weights = None
        if images is not None and regions:
            weights, fit = [], []
            for row, i in enumerate(indices):
                boxes = regions.get(path_key(dataset.paths[i]))
                try:
                    weights.append(None if boxes is None else regions_weights(boxes, model.grid, sizes[i]))
                    fit.append(row)
                except RegionError as e:
                    results[i] = {"path": dataset.paths[i], "error": f"--regions: {e}"}
            indices = [indices[row] for row in fit]
            images = images[fit] if fit else None
        if images is not None:
            images = model.preprocessing.normalize(images.to(device, non_blocking=True))  # (B, 3, H, W) float32
            captions = model.caption_tensors(images, beam_size, max_len, length_penalty, weights)
            for i, res in zip(indices, captions):
                results[i] = _record(dataset.paths[i], res, sizes[i], with_alphas, attention_dir)
        for i in sorted(results):
            yield results[i]


def _caption_paths_onnx(model, paths: list[str], beam_size: int, batch_size: int, max_len: int | None,
                        attention_dir: Path | None, with_alphas: bool, length_penalty: float | None) -> Iterator[dict]:
    """``caption_paths`` for an ``OnnxCaptioner``: images decoded in this process (``ImageFiles``), a batch at a time."""
    dataset = ImageFiles(paths, model.transform)
    for start in range(0, len(paths), batch_size):
        items = [dataset[i] for i in range(start, min(len(paths), start + batch_size))]
        good = [(i, x) for i, x, _, _ in items if x is not None]
        results: dict[int, dict] = {i: {"path": paths[i], "error": err} for i, x, err, _ in items if x is None}
        sizes = {i: size for i, x, _, size in items if x is not None}
        if good:
            captions = model.caption_arrays(np.stack([x for _, x in good]), beam_size, max_len, length_penalty)
            for (i, _), res in zip(good, captions):
                results[i] = _record(paths[i], res, sizes[i], with_alphas, attention_dir)
        for i in sorted(results):
            yield results[i]


def _record(path: str, res, size: tuple[int, int], with_alphas: bool, attention_dir: Path | None) -> dict:
    """One captioned image's output record (see the module doc)."""
    record = {"path": path, "caption": res.text, "tokens": res.tokens, "log_prob": res.log_prob,
              "in_domain": res.in_domain, "domain_score": res.domain_score}
    if getattr(res, "regions", None) is not None:
        record["regions"] = res.regions
    warning = caption_warning(size, res.tokens)
    if warning:
        record["warning"] = warning
    if with_alphas:
        record["alphas"] = np.round(res.alphas.astype(np.float64), 6).tolist()  # (T, h, w)
    if attention_dir is not None:
        try:
            record["attention"] = str(save_attention_figure(path, res.tokens, res.alphas, attention_dir))
        except (CaptionerError, OSError) as e:
            record["attention_error"] = str(e).splitlines()[0]
    return record
