"""Arrays over memory-mapped files: a model's external data (ONNX's `.data` files) read in place.

A compile in memory reads an external tensor as a read-only view of its file, mapped once per file while any view
lives: weights are never copied out of the page cache, untouched ones (an embedding table's unused rows) never
become resident, and what is resident is shared with every process that maps the same file. `region` tells
whether an array is such a view (the weights section then refers to it instead of copying it).
"""

from __future__ import annotations

import os
import weakref
from pathlib import Path

import numpy as np

_FILES: weakref.WeakValueDictionary[tuple[str, int, int], np.memmap] = weakref.WeakValueDictionary()


def file_view(path: Path, offset: int, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    """A read-only array of `dtype` and `shape` at byte `offset` of the file (checked to lie inside it by the
    caller)."""
    st = os.stat(path)
    key = (os.fspath(path), st.st_mtime_ns, st.st_size)
    mm = _FILES.get(key)
    if mm is None:
        mm = _FILES[key] = np.memmap(path, np.uint8, mode="r")
    return np.ndarray(shape, dtype, buffer=mm, offset=offset)


def region(arr: np.ndarray) -> tuple[str, int] | None:
    """(the mapping, byte offset) when `arr` is a C-contiguous view of a mapped file made by `file_view`, else
    None. The mapping is named by file and mapping: a file replaced since is another mapping (the view keeps the
    one it was made from alive, so the name stays unique while it lives)."""
    base = arr
    while isinstance(base, np.ndarray) and not isinstance(base, np.memmap):
        base = base.base
    if not isinstance(base, np.memmap) or not arr.flags.c_contiguous or base.filename is None:
        return None
    return f"{base.filename}#{id(base)}", arr.__array_interface__["data"][0] - base.__array_interface__["data"][0]


def frozen(arr: np.ndarray, alignment: int = 64) -> bool:
    """Whether an array's bytes can be held as they are: C-contiguous, aligned to `alignment`, and read-only down
    to the memory they live in (a weight read from a model file, frontend/external.py): nothing can change them."""
    if arr.ctypes.data % alignment or not arr.flags.c_contiguous:
        return False
    base = arr
    while isinstance(base, np.ndarray):
        if base.flags.writeable:
            return False
        if base.base is None:
            return not isinstance(base, np.memmap)
        base = base.base
    return False
