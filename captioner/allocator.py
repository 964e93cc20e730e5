"""One process-wide malloc setting that keeps freed memory for reuse (page faults in every decoding step otherwise)."""

from __future__ import annotations

import ctypes
import sys

_done = False
MMAP_THRESHOLD = 32 << 20  # bytes; glibc mmaps (and the kernel faults in afresh) any larger block


def keep_freed_memory() -> None:
    """Let glibc's malloc keep freed memory for reuse (Linux; elsewhere nothing happens). Process-wide; runs once.

    Training, beam search and the encoder on CPU call it. A step allocates and frees tensors of a few MB (the
    attention's (B, L, A) sums, their gradients) at every time step. By default glibc gives such blocks back to the
    kernel (mmap above a threshold that moves, heap trimming), and the next step faults the same pages in again: tens
    of thousands of page faults per step and a bimodal step time. A fixed mmap threshold of ``MMAP_THRESHOLD`` (32
    MiB, glibc's ceiling on 64-bit: larger blocks are always mmapped) and a 1 GiB trim threshold keep them in the heap
    (the peak memory is unchanged; freed memory is not handed back until the process ends). See docs/benchmarks.md.
    """
    global _done
    if _done or not sys.platform.startswith("linux"):
        return
    _done = True
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl or another libc: leave it alone
        return
    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # from glibc's malloc.h
    mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
    mallopt(M_TRIM_THRESHOLD, 1 << 30)
