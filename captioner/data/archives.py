"""Files from the web, safely: resumable HTTP downloads with a progress bar, integrity checks, unpacking.

Generic (nothing here knows a dataset); ``captioner.data.sources`` names the archives and prepares them.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import tarfile
import time
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

from captioner.errors import DatasetError

CHUNK = 1 << 20  # bytes read per step of a download


def _total_size(response: http.client.HTTPResponse, offset: int) -> int | None:
    """The whole file's size: from Content-Range on a 206, Content-Length on a 200."""
    content_range = response.headers.get("Content-Range", "")
    if response.status == 206 and "/" in content_range and not content_range.endswith("*"):
        return int(content_range.rsplit("/", 1)[1])
    length = response.headers.get("Content-Length")
    return None if length is None else int(length) + (offset if response.status == 206 else 0)


def fetch(url: str, dest: Path, retries: int = 3, progress: bool = True, timeout: float = 60.0,
          retry_wait: float = 2.0) -> Path:
    """Download ``url`` to ``dest`` through ``dest.part``, resuming what is there; check the size the server gave.

    A dropped connection is retried ``retries`` times from where it stopped; after that the ``.part`` stays for
    the next run (waiting ``retry_wait`` x the attempt number seconds between tries)."""
    part = dest.with_name(dest.name + ".part")
    dest.parent.mkdir(parents=True, exist_ok=True)
    attempt = 0
    while True:
        offset = part.stat().st_size if part.exists() else 0
        request = urllib.request.Request(url, headers={"Range": f"bytes={offset}-"} if offset else {})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                if offset and response.status != 206:  # the server ignored Range: start again
                    offset = 0
                total = _total_size(response, offset)
                with open(part, "ab" if offset else "wb") as out, _bar(progress, total, offset, dest.name) as bar:
                    while chunk := response.read1(CHUNK):  # read1: a short body ends the loop, kept
                        out.write(chunk)
                        bar.update(len(chunk))
            size = part.stat().st_size
            if total is not None and size != total:
                raise http.client.IncompleteRead(b"", total - size)
            os.replace(part, dest)
            return dest
        except urllib.error.HTTPError as e:
            if e.code == 416 and offset:  # nothing after the .part: it is whole (kept) or too long (start again)
                if e.headers.get("Content-Range", "").endswith(f"/{offset}"):
                    os.replace(part, dest)
                    return dest
                part.unlink()
                continue
            raise DatasetError(f"cannot download {url}: HTTP {e.code} {e.reason}.") from None
        except (urllib.error.URLError, http.client.HTTPException, ConnectionError, TimeoutError) as e:
            attempt += 1
            if attempt > retries:
                have = part.stat().st_size if part.exists() else 0
                reason = getattr(e, "reason", None) or type(e).__name__
                raise DatasetError(f"cannot download {url} ({reason}); {have:,} bytes are kept in {part}, run the "
                                   f"same command again to resume.") from None
            time.sleep(retry_wait * attempt)


class _NoBar:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def update(self, n: int) -> None:
        pass


def _bar(enabled: bool, total: int | None, initial: int, name: str):
    if not enabled:
        return _NoBar()
    from tqdm import tqdm
    return tqdm(total=total, initial=initial, unit="B", unit_scale=True, unit_divisor=1024, desc=name)


def md5sum(path: Path) -> str:
    digest = hashlib.md5()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def verify(path: Path, md5: str | None = None) -> None:
    """MD5 when known, then the archive's own integrity (zip CRCs, a readable tar). A bad file is removed."""
    problem = None
    if md5 and (got := md5sum(path)) != md5:
        problem = f"its MD5 is {got}, expected {md5}"
    elif zipfile.is_zipfile(path):
        try:
            with zipfile.ZipFile(path) as z:
                bad = z.testzip()
            problem = f"member {bad} fails its CRC check" if bad else None
        except (zipfile.BadZipFile, OSError, EOFError) as e:
            problem = f"the zip is damaged ({e})"
    elif tarfile.is_tarfile(path):
        try:
            with tarfile.open(path) as t:
                t.getmembers()
        except (tarfile.TarError, OSError, EOFError) as e:
            problem = f"the tar is damaged ({e})"
    else:
        problem = "it is neither a zip nor a tar archive"
    if problem:
        bad_copy = path.with_name(path.name + ".bad")
        os.replace(path, bad_copy)
        raise DatasetError(f"downloaded {path.name} is corrupt: {problem}; it was moved to {bad_copy} and not used, "
                           f"run the same command again to download it afresh.")


def unpack(path: Path, into: Path) -> None:
    """Unpack a zip or tar into ``into``, refusing members that would land outside it; macOS metadata skipped."""
    into.mkdir(parents=True, exist_ok=True)
    root = into.resolve()
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as z:
            for member in z.infolist():
                if member.filename.startswith("__MACOSX/") or Path(member.filename).name.startswith("._"):
                    continue
                target = (root / member.filename).resolve()
                if root not in target.parents and target != root:
                    raise DatasetError(f"{path.name}: member {member.filename} would be written outside {into}.")
                z.extract(member, root)
    else:
        with tarfile.open(path) as t:
            t.extractall(root, filter="data")  # "data": no absolute paths, links out or device files
