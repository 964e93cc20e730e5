"""A long-running server hands freed memory back to the system now and then.

``captioner.allocator.keep_freed_memory`` tells glibc to keep freed blocks (no page faults in every decoding step),
and glibc keeps them per thread arena: a server whose request threads decode uploads, blend overlays and encode
JSON leaves freed memory in each arena, and its resident size creeps up for as long as it runs. ``MemoryTrimmer``
calls ``malloc_trim(0)`` every ``interval_s`` seconds (a few milliseconds each), which returns the free pages of
every arena; the decoding steps in between still reuse their blocks. Elsewhere than glibc it does nothing.
"""

from __future__ import annotations

import ctypes
import threading

TRIM_INTERVAL_S = 10.0


def release_freed_memory() -> bool:
    """Return free heap pages of every malloc arena to the system (glibc's ``malloc_trim(0)``); False elsewhere."""
    try:
        trim = ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return False
    trim.argtypes = [ctypes.c_size_t]
    return bool(trim(0))


class MemoryTrimmer:
    """A daemon thread that calls ``release_freed_memory`` every ``interval_s`` seconds until ``stop()``."""

    def __init__(self, interval_s: float = TRIM_INTERVAL_S):
        self.interval_s = interval_s
        self.trims = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="memory-trimmer", daemon=True)

    def start(self) -> "MemoryTrimmer":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            release_freed_memory()
            self.trims += 1
