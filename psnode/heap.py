"""Keep a server's freed heap memory for reuse instead of returning it to the OS (no I/O).

A server answers every round with arrays of a few hundred KiB (row_sparse aggregates: the
concatenated pushes, their sorted copy, the sums).  glibc serves each from a fresh mmap or
from heap top it trims again on free, so every such array costs its page faults and the
kernel's zeroing again: about half of a 2,000-row x 64 float32 round's server time.
:func:`keep_freed_heap` raises glibc's mmap and trim thresholds so these arrays come from heap
memory the process already touched.  The values computed are unchanged; the process keeps up
to its peak heap (less ``trim`` bytes beyond it are returned).  A no-op off glibc.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3


def keep_freed_heap(mmap_threshold: int = 64 << 20, trim: int = 128 << 20) -> bool:
    """Arrays below ``mmap_threshold`` bytes come from the heap, and freed heap top is kept up
    to ``trim`` bytes.  True when glibc took both settings, False where there is no mallopt."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    ok = bool(mallopt(M_MMAP_THRESHOLD, mmap_threshold)) and bool(mallopt(M_TRIM_THRESHOLD, trim))
    if not ok:
        log.debug("mallopt refused the heap settings")
    return ok


__all__ = ["keep_freed_heap"]
