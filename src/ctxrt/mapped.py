"""Arrays over memory-mapped files: a model's external data (ONNX's `.data` files) read in place.

A compile in memory reads an external tensor as a read-only view of its file, mapped once per file while any view
lives: weights are never copied out of the page cache, untouched ones (an embedding table's unused rows) never
become resident, and what is resident is shared with every process that maps the same file. `region` tells
whether an array is such a view (the weights section then refers to it instead of copying it).
"""

from __future__ import annotations

import contextlib
import itertools
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
        with open(path, "rb") as f:
            mm = _FILES[key] = np.memmap(f, np.uint8, mode="r")
            remember(mm, mm.ctypes.data, mm.nbytes, os.dup(f.fileno()))
    return np.ndarray(shape, dtype, buffer=mm, offset=offset)


class FileRef:
    """An open descriptor of the file a mapping was made from (the same file, even if its path now names another);
    closed when nothing refers to it."""

    __slots__ = ("fd",)

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __del__(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)


# mapped files by a number of their own: (first address, end address, their descriptor), while the mapping lives
_REGIONS: dict[int, tuple[int, int, FileRef]] = {}
_NEXT = itertools.count()


def remember(mapping: object, address: int, nbytes: int, fd: int) -> None:
    """Note that `nbytes` at `address` map file `fd` from its start, for as long as `mapping` lives (`file_of`)."""
    k = next(_NEXT)
    _REGIONS[k] = (address, address + nbytes, FileRef(fd))
    weakref.finalize(mapping, _REGIONS.pop, k, None)


def file_of(arr: np.ndarray) -> tuple[FileRef, int] | None:
    """(the file, the byte offset in it) whose mapping a C-contiguous array lies in, else None: its bytes can be
    read with `os.preadv` instead of touching the mapping (whose large page-cache folios a touch maps whole, ~0.5-2
    MiB resident for a 3 KB embedding row)."""
    if not arr.flags.c_contiguous:
        return None
    start = arr.ctypes.data
    for first, end, ref in list(_REGIONS.values()):
        if first <= start and start + arr.nbytes <= end:
            return ref, start - first
    return None


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


# id(block) -> (the block, the file version its bytes were read from, the file offset of its first byte)
_READ: dict[int, tuple[weakref.ref[np.ndarray], str, int]] = {}


def read_from(block: np.ndarray, version: str, position: int) -> None:
    """Record that the new read-only array `block` holds bytes read from a file (`version`: its identity and
    version; `position`: the offset its first byte stands for, frontend/external.py), for `read_key`; forgotten
    when the block dies."""
    key = id(block)
    _READ[key] = (weakref.ref(block, lambda _r, key=key: _READ.pop(key, None)), version, position)


def read_key(arr: np.ndarray) -> str | None:
    """A name for a C-contiguous view of a block recorded by `read_from`: where its bytes were read (the same file
    version and region: the same bytes), not their SHA-256 (a weight store's key for them: a 12 MiB model's
    weights hashed in ~8 ms at each compile); None for any other array."""
    base = arr
    while isinstance(base.base, np.ndarray):
        base = base.base
    hit = _READ.get(id(base))
    if hit is None or hit[0]() is not base or not arr.flags.c_contiguous:
        return None
    offset = hit[2] + arr.__array_interface__["data"][0] - base.__array_interface__["data"][0]
    return f"read:{hit[1]}@{offset}:{arr.nbytes}:{arr.dtype.str}:{arr.shape}"


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
