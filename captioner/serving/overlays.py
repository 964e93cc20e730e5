"""Overlay images on disk: written once, atomically, under a content-hash name (a browser never reads a
half-written file), and pruned by age, total size and count so the folder stays bounded."""

from __future__ import annotations

import hashlib
import io
import os
import tempfile
import threading
import time
from pathlib import Path

from PIL import Image

# Overlay store bounds: files older than this are removed, and the oldest go first past the size/count limits.
OVERLAY_MAX_AGE_S = 3600
OVERLAY_MAX_BYTES = 200 * 1024 * 1024
OVERLAY_MAX_FILES = 5000


class OverlayStore:
    """PNG or JPEG files named by the SHA-256 of their bytes, written to a temporary name then ``os.replace``d.

    ``prune()`` (run after every caption) keeps the folder within ``max_age_s``, ``max_bytes`` and ``max_files``:
    files past the age go, then the oldest until both size limits hold. Files younger than ``keep_s`` are kept
    so a page still loading the overlays of a fresh caption finds them. The folder is listed only when the
    running count of files and bytes (the last listing plus what ``save`` wrote since) passes a limit, or once
    every ``scan_interval_s`` (for the age limit and for files written by others), not on every caption.
    """

    def __init__(self, folder: str | Path, max_age_s: float = OVERLAY_MAX_AGE_S, max_bytes: int = OVERLAY_MAX_BYTES,
                 max_files: int = OVERLAY_MAX_FILES, keep_s: float = 60.0, scan_interval_s: float = 60.0):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.max_age_s, self.max_bytes, self.max_files, self.keep_s = max_age_s, max_bytes, max_files, keep_s
        self.scan_interval_s = scan_interval_s
        self._lock = threading.Lock()
        self._files, self._bytes, self._scanned_at = 0, 0, float("-inf")  # running totals; -inf: list at first

    def save(self, image: Image.Image, format: str = "PNG") -> Path:
        """The image as a PNG (exact), or with ``format="JPEG"`` (quality 90: about ten times faster to encode and
        a quarter of the bytes, which suits the per-word attention thumbnails); returns the file's path."""
        buffer = io.BytesIO()
        if format.upper() == "JPEG":
            image.convert("RGB").save(buffer, format="JPEG", quality=90)
            suffix = ".jpg"
        else:
            image.save(buffer, format="PNG", compress_level=1)  # level 1: several times faster, slightly larger
            suffix = ".png"
        return self.save_bytes(buffer.getvalue(), suffix)

    def save_bytes(self, data: bytes, suffix: str, prefix: str = "") -> Path:
        """``data`` as ``<prefix><content hash><suffix>`` (written once, atomically); returns the file's path."""
        path = self.folder / f"{prefix}{hashlib.sha256(data).hexdigest()[:32]}{suffix}"
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
        with self._lock:
            self._files, self._bytes = self._files + 1, self._bytes + len(data)
        return path

    def prune(self, now: float | None = None, force: bool = False) -> int:
        """Remove old files past the bounds; returns how many were removed. Lists the folder only when the running
        totals pass a limit, ``scan_interval_s`` has passed since the last listing, or ``force``."""
        now = time.time() if now is None else now
        with self._lock:
            due = now - self._scanned_at >= self.scan_interval_s
            if not (force or due or self._files > self.max_files or self._bytes > self.max_bytes):
                return 0
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
            self._files, self._bytes, self._scanned_at = count, total, now
            return removed

    def usage(self) -> tuple[int, int]:
        """(files, bytes) in the folder now."""
        files = [p for p in self.folder.iterdir() if p.is_file()]
        return len(files), sum(p.stat().st_size for p in files)
