"""Handing back to the system the heap memory a compile freed.

A range compile builds and drops several probe programs (IR, constants, oneDNN primitives): tens of MiB that glibc's
allocator keeps mapped once freed, so a session's resident memory would stay at the compile's peak for its whole
life (the 4-layer GPT-2-style decoder of bench/bench_shapes.py: 69 MiB beyond the model before, 32 after).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

_LIBC: list[object] = []


def trim() -> bool:
    """Return freed heap pages to the system (glibc's malloc_trim); False where there is no such call."""
    if not sys.platform.startswith("linux"):
        return False
    if not _LIBC:
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            _LIBC.append(libc.malloc_trim)
        except (OSError, AttributeError):  # musl and others: nothing to call
            _LIBC.append(None)
    fn = _LIBC[0]
    if fn is None:
        return False
    fn(ctypes.c_size_t(0))
    return True
