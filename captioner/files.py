"""Files written so that a crash never leaves a half-written one: ``atomic_write``."""

from __future__ import annotations

import os
import secrets
from pathlib import Path


def atomic_write(path: str | Path, data: bytes | str) -> None:
    """Write ``data`` to a temporary file beside ``path``, then rename it into place.

    The file gets the mode a plain ``open()`` would give (0666 less the umask, usually 0644): the temporary name
    is created with ``os.open(..., 0o666)`` rather than ``mkstemp``, whose 0600 would make outputs private.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        tmp = path.parent / f".{path.name}.{secrets.token_hex(4)}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
            break
        except FileExistsError:  # another writer's temporary name: draw again
            continue
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
