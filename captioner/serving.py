"""Pure helpers for serving captions (the Gradio app uses them; nothing here imports gradio).

- ``find_checkpoints`` / ``default_checkpoints_dir`` / ``short_names``: which checkpoint folders are offered, and
  the short names (never server paths) users see and send.
- ``ModelCache``: each checkpoint loaded once, shared by every request (thread-safe).
- ``OverlayStore``: overlay images written once, atomically, under a content-hash name, so a browser never reads
  a half-written file; pruned by age and total size so the folder stays bounded.
- ``caption_with_overlays`` / ``explain``: decode an upload safely, caption it, and return the text with one
  overlay per word, or everything the explorer shows (word probabilities, the gate, entropies, n-best).
- ``BodySizeLimit``: an ASGI middleware refusing request bodies over a size, whatever the route.
"""

from __future__ import annotations

import hashlib
import io
import math
import os
import re
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image

from captioner.errors import CaptionerError, CheckpointError, ImageError
from captioner.images import open_image
from captioner.model import Captioner

MAX_BEAM_SIZE = 10
MAX_UPLOAD_BYTES = 20 * 1024 * 1024  # one image, whatever the route (upload, data: URL, file path)
# Overlay store bounds: files older than this are removed, and the oldest go first past the size/count limits.
OVERLAY_MAX_AGE_S = 3600
OVERLAY_MAX_BYTES = 200 * 1024 * 1024
OVERLAY_MAX_FILES = 5000


# ---- which checkpoints, under which names ----------------------------------------------------------------------

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


# ---- models -------------------------------------------------------------------------------------------------------

class ModelCache:
    """Loads each checkpoint folder once and hands the same eval-mode model to every caller."""

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


# ---- overlays on disk -----------------------------------------------------------------------------------------------

class OverlayStore:
    """PNG files named by the SHA-256 of their bytes, written to a temporary name then ``os.replace``d.

    ``prune()`` (run after every caption) keeps the folder within ``max_age_s``, ``max_bytes`` and ``max_files``:
    files past the age go, then the oldest until both size limits hold. Files younger than ``keep_s`` are kept
    so a page still loading the overlays of a fresh caption finds them.
    """

    def __init__(self, folder: str | Path, max_age_s: float = OVERLAY_MAX_AGE_S, max_bytes: int = OVERLAY_MAX_BYTES,
                 max_files: int = OVERLAY_MAX_FILES, keep_s: float = 60.0):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.max_age_s, self.max_bytes, self.max_files, self.keep_s = max_age_s, max_bytes, max_files, keep_s
        self._lock = threading.Lock()

    def save(self, image: Image.Image) -> Path:
        buffer = io.BytesIO()
        image.save(buffer, format="PNG", compress_level=1)  # level 1: several times faster, slightly larger
        data = buffer.getvalue()
        path = self.folder / f"{hashlib.sha256(data).hexdigest()[:32]}.png"
        if path.is_file():  # same content already there: never rewrite a file that may be being served
            try:
                os.utime(path)  # in use again: young for the pruning
            except OSError:
                pass
            return path
        fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=".overlay.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.chmod(tmp, 0o644)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return path

    def prune(self, now: float | None = None) -> int:
        """Remove old files past the bounds; returns how many were removed."""
        now = time.time() if now is None else now
        with self._lock:
            entries = []
            for p in self.folder.iterdir():
                try:
                    st = p.stat()
                except OSError:
                    continue
                if p.is_file():
                    entries.append((st.st_mtime, st.st_size, p))
            entries.sort()  # oldest first
            total, count, removed = sum(e[1] for e in entries), len(entries), 0
            for mtime, size, p in entries:
                age = now - mtime
                if age < self.keep_s:
                    break
                if age > self.max_age_s or total > self.max_bytes or count > self.max_files:
                    p.unlink(missing_ok=True)
                    total, count, removed = total - size, count - 1, removed + 1
            return removed

    def usage(self) -> tuple[int, int]:
        """(files, bytes) in the folder now."""
        files = [p for p in self.folder.iterdir() if p.is_file()]
        return len(files), sum(p.stat().st_size for p in files)


# ---- inputs ---------------------------------------------------------------------------------------------------------

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


# ---- captioning -----------------------------------------------------------------------------------------------------

@dataclass
class CaptionOutput:
    text: str
    tokens: list[str]
    overlays: list[tuple[str, str]]  # (overlay PNG path, "i: word"), one per word
    truncated: bool = False


@dataclass
class Explanation:
    """Everything the explorer shows for one image (``to_json`` gives the /explain answer)."""
    text: str
    tokens: list[str]
    alphas: np.ndarray  # (T, h, w)
    word_probs: list[float]
    betas: list[float] | None  # gate per word; None for a model without it
    entropies: list[float]  # nats, per word
    nbest: list[dict] = field(default_factory=list)  # [{text, log_prob}], best first
    log_prob: float = 0.0
    truncated: bool = False
    in_domain: bool | None = None
    domain_score: float | None = None

    def to_json(self, checkpoint: str, with_alphas: bool = False) -> dict:
        out = {"text": self.text, "tokens": self.tokens, "word_probs": self.word_probs, "betas": self.betas,
               "entropies": self.entropies, "nbest": self.nbest, "log_prob": self.log_prob,
               "truncated": self.truncated, "in_domain": self.in_domain, "domain_score": self.domain_score,
               "checkpoint": checkpoint}
        if with_alphas:
            out["alphas"] = np.round(self.alphas.astype(np.float64), 6).tolist()
        return out


def _decode(model: Captioner, picture: Image.Image, beam_size: int):
    """(annotations (1, L, C), hypotheses best first): the same decoding as ``model.caption``."""
    import torch

    from captioner.beam import beam_search_nbest

    with torch.inference_mode():
        annotations = model.encode(model.transform(picture).unsqueeze(0).to(model.device))  # (1, L, C)
        if beam_size <= 1:
            hyps = model.decode(annotations, 1)
        else:
            v = model.vocab
            hyps = beam_search_nbest(model.decoder, annotations.float(), v.start_index, v.end_index, beam_size,
                                     model.cfg.max_len)[0]
    return annotations, hyps


def _check_finite(hyps, model: Captioner) -> None:
    if not hyps or any(not math.isfinite(h.log_prob) for h in hyps):
        raise CheckpointError("the model's outputs are not finite numbers (NaN or infinite weights?); "
                              "this checkpoint cannot caption.")


def _teacher_forced(model: Captioner, annotations, words: list[int]):
    """One pass over the chosen words: p(word), beta and attention entropy per word (sec. 4.2.1 gate)."""
    import torch

    dec, v = model.decoder, model.vocab
    probs, betas, entropies = [], [], []
    with torch.inference_mode():
        state = dec.init_state(annotations.float())
        prev = torch.tensor([v.start_index], device=annotations.device)
        for w in words:
            if dec.f_beta is not None:
                betas.append(float(torch.sigmoid(dec.f_beta(state.h))[0, 0]))
            logits, state, alpha, _ = dec.step(prev, state)  # (1, V), alpha (1, L)
            probs.append(float(logits.double().softmax(-1)[0, w]))
            a = alpha[0].double().clamp_min(1e-12)
            entropies.append(float(-(a * a.log()).sum()))
            prev = torch.tensor([w], device=annotations.device)
    return probs, (betas if dec.f_beta is not None else None), entropies


def smoke_test(model: Captioner) -> None:
    """Caption one blank image greedily: a model whose outputs are not finite (NaN weights) fails here, at start-up."""
    _, hyps = _decode(model, Image.new("RGB", (64, 64), "gray"), 1)
    _check_finite(hyps, model)


def explain(model: Captioner, image: str | Path | Image.Image | None, beam_size: int) -> tuple[Explanation, Image.Image]:
    """Caption one image and measure each word: returns the explanation and the decoded picture."""
    picture = load_picture(image)
    beam_size = check_beam_size(beam_size)
    annotations, hyps = _decode(model, picture, beam_size)
    _check_finite(hyps, model)
    best = hyps[0]
    result = model.to_result(best)
    probs, betas, entropies = _teacher_forced(model, annotations, best.words)
    nbest = [{"text": " ".join(model.vocab.itos[i] for i in h.words), "log_prob": float(h.log_prob)} for h in hyps]
    in_domain = getattr(result, "in_domain", None)
    score = getattr(result, "domain_score", None)
    check = getattr(model, "domain", None) or getattr(model, "domain_check", None)  # captioner.domain.DomainCheck
    if in_domain is None and check is not None and hasattr(check, "check"):
        in_domain, score = check.check(annotations)[0]
    return Explanation(result.text, result.tokens, result.alphas, probs, betas, entropies, nbest,
                       float(best.log_prob), not best.ended, in_domain,
                       None if score is None else float(score)), picture


def caption_with_overlays(model: Captioner, image: str | Path | Image.Image | None, beam_size: int,
                          store: OverlayStore) -> CaptionOutput:
    """Caption one image (a path is size-checked and decoded with the bomb guard); one overlay per word."""
    from captioner.viz import word_overlays

    picture = load_picture(image)
    _, hyps = _decode(model, picture, check_beam_size(beam_size))
    _check_finite(hyps, model)
    result = model.to_result(hyps[0])
    overlays = [(str(store.save(ov)), label) for ov, label in word_overlays(picture, result.tokens, result.alphas)]
    store.prune()
    return CaptionOutput(result.text, result.tokens, overlays, not hyps[0].ended)


def highlight(tokens: list[str], index: int) -> list[tuple[str, str | None]]:
    """The caption as (text, label) pairs for a highlighted-text view; word ``index`` (0-based) is "current"."""
    pairs: list[tuple[str, str | None]] = []
    for i, word in enumerate(tokens):
        if i:
            pairs.append((" ", None))
        pairs.append((word, "current" if i == index else None))
    return pairs


# ---- request size, whatever the route -------------------------------------------------------------------------------

class BodySizeLimit:
    """ASGI middleware: a request whose body is over ``max_bytes`` gets 413 (by Content-Length, or while streaming)."""

    def __init__(self, app, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_bytes):
            return await self._refuse(send)
        seen, started, refused = 0, False, False

        async def limited_receive():
            nonlocal seen, refused
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    refused = True
                    if not started:
                        await self._refuse(send)
                    return {"type": "http.disconnect"}
            return message

        async def tracking_send(message):
            nonlocal started
            if refused:
                return  # the 413 was sent already
            started = started or message["type"] == "http.response.start"
            await send(message)

        return await self.app(scope, limited_receive, tracking_send)

    async def _refuse(self, send) -> None:
        body = (f'{{"detail": "request body over the limit of {self.max_bytes // 2**20} MB"}}').encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


def folder_bytes(folder: str | Path) -> int:
    """Total size of the regular files under ``folder`` (0 when it is missing)."""
    total = 0
    for root, _, names in os.walk(folder):
        for name in names:
            try:
                total += os.stat(os.path.join(root, name), follow_symlinks=False).st_size
            except OSError:
                pass
    return total


class UploadQuota:
    """ASGI middleware: an upload (a POST to a path ending in ``/upload``) is refused with 507 while ``folder``
    already holds ``max_bytes``, so uploads that never reach the model cannot fill the disk before the cache
    cleanup removes them."""

    def __init__(self, app, folder: str | Path, max_bytes: int):
        self.app, self.folder, self.max_bytes = app, Path(folder), max_bytes

    async def __call__(self, scope, receive, send):
        if (scope["type"] == "http" and scope.get("method") == "POST" and scope.get("path", "").endswith("/upload")
                and folder_bytes(self.folder) >= self.max_bytes):
            body = b'{"detail": "the server holds too many uploads; try again later"}'
            await send({"type": "http.response.start", "status": 507,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
            return
        await self.app(scope, receive, send)


__all__ = ["UploadQuota", "folder_bytes", "find_checkpoints", "default_checkpoints_dir", "short_names", "soft_first", "attention_kind",
           "example_images", "scrub_paths", "ModelCache", "OverlayStore", "CaptionOutput", "Explanation",
           "caption_with_overlays", "explain", "smoke_test", "highlight", "check_beam_size", "check_upload_size",
           "data_url_bytes", "load_picture", "BodySizeLimit", "CheckpointError", "MAX_BEAM_SIZE",
           "MAX_UPLOAD_BYTES"]
