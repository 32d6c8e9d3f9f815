"""The weights of one model, shared by every context an InferenceSession compiles from it.

Each shape variant of a model reads the same initializers, and kernels' compile-time constants (transposed,
Winograd-transformed or oneDNN-reordered weights) that depend only on those come out byte for byte the same
in every variant. A `WeightStore` holds each distinct content once, keyed by the SHA-256 of its bytes, for as
long as a context uses it (a reference per context, dropped when the context is freed):

- compiled in memory, a context's weights are copied into the store (`intern`) unless it holds them already;
  those read in place from the model's external data file (ctxrt.mapped) stay there, named by file and offset;
- with a compile cache folder, each weight of at least `EXTERNAL_MIN_BYTES` is written once as
  `<sha256>.bin` (`save`) and a cached context binary only names it (format version 2, docs/format.md);
  loading one maps each blob once per store (`lease`: size and CRC-32 checked);
- on a backend that cannot read host memory in place (OpenCL), each content is uploaded once (`device`).
"""

from __future__ import annotations

import mmap
import os
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ctxrt import dtypes
from ctxrt.backends import Backend
from ctxrt.errors import FormatError
from ctxrt.format import layout
from ctxrt.format.atomic import atomic_write
from ctxrt.format.weights import ExternalWeight, WeightEntry, content_key, raw_bytes
from ctxrt.mapped import frozen, read_key, region

EXTERNAL_MIN_BYTES = 4096  # smaller weights stay inside a cached context binary: a file each would cost more

Weights = tuple[dict[str, WeightEntry], list[np.ndarray], list[str]]  # name -> entry, segments, their keys


class _Entry:
    __slots__ = ("array", "refs", "device")

    def __init__(self, array: np.ndarray) -> None:
        self.array = array  # read-only uint8: an aligned copy or a mapped blob
        self.refs = 0  # contexts using it
        self.device: Any = None  # a device buffer holding it, for backends that cannot read host memory in place


class WeightStore:
    """Distinct weight contents of one model, each held once while a context uses it. `folder`: where the
    compile cache keeps them as files (None: in memory only)."""

    def __init__(self, backend: Backend, folder: str | os.PathLike | None = None) -> None:
        self.backend = backend
        self.folder = None if folder is None else Path(folder)
        self._entries: dict[str, _Entry] = {}
        self._checked: dict[str, tuple[int, int]] = {}  # blob key -> (size, mtime_ns) when its CRC matched
        self._lock = threading.Lock()
        self.stats: Counter[str] = Counter()

    # -- what contexts read --------------------------------------------------------------------------
    def intern(self, weights: Mapping[str, np.ndarray]) -> Weights:
        """A compile's weights as the store holds them, one segment per distinct content, a reference taken on
        each: contents the store holds already are not copied again."""
        table, segments, keys, index = {}, [], [], {}
        try:
            for name, value in weights.items():
                arr, raw = raw_bytes(value, name)
                where = None if dtypes.is_4bit(arr.dtype) else region(arr)
                if where is None:
                    key = read_key(arr) or content_key(raw)  # (read from a model file: named by where it was read)
                    make = (lambda raw=raw: raw) if frozen(raw, layout.WEIGHT_ALIGNMENT) else \
                        (lambda raw=raw: _aligned_copy(raw))
                else:  # a view of a model's external data file: used in place, named by where it lies
                    key, make = f"mapped:{where[0]}:{where[1]}:{arr.dtype}:{arr.shape}", lambda raw=raw: raw
                if key not in index:
                    index[key] = len(segments)
                    segments.append(self._take(key, make))
                    keys.append(key)
                table[name] = WeightEntry(0, int(raw.nbytes), dtypes.name(arr.dtype), tuple(arr.shape), index[key])
        except BaseException:
            self.release(keys)
            raise
        return table, segments, keys

    def lease(self, external: Mapping[str, ExternalWeight], first_segment: int,
              unchecked: list[Callable[[], None]] | None = None) -> Weights:
        """The weights a loaded context binary keeps outside its file: held ones shared, the others mapped from
        the folder's blobs (size and CRC-32 checked; with `unchecked`, the CRC-32 checks of those mapped now are
        appended to it, each raising FormatError, for the caller to run before it uses them); segments numbered
        from `first_segment`."""
        table, segments, keys, index = {}, [], [], {}
        try:
            for name, w in external.items():
                if w.key not in index:
                    index[w.key] = first_segment + len(segments)
                    segments.append(self._take(w.key, lambda w=w: self._map_blob(w, unchecked)))
                    keys.append(w.key)
                table[name] = WeightEntry(0, w.nbytes, w.dtype, w.shape, index[w.key])
        except BaseException:
            self.release(keys)
            raise
        return table, segments, keys

    def _take(self, key: str, make: Callable[[], np.ndarray]) -> np.ndarray:
        with self._lock:
            e = self._entries.get(key)
            if e is None:
                e = self._entries[key] = _Entry(make())
                self.stats["weights_stored"] += 1
            else:
                self.stats["weights_shared"] += 1
            e.refs += 1
            return e.array

    def release(self, keys: Iterable[str]) -> None:
        """Drop a context's references; a content no context uses any more is let go (its device copy too)."""
        with self._lock:
            for key in keys:
                e = self._entries[key]
                e.refs -= 1
                if e.refs == 0:
                    del self._entries[key]
                    if e.device is not None:
                        e.device.release()
                    self.stats["weights_released"] += 1

    def device(self, key: str) -> Any:
        """The content in a device buffer of the store's backend, uploaded on first need and shared."""
        with self._lock:
            e = self._entries[key]
            if e.device is None:
                be, n = self.backend, int(e.array.nbytes)
                buf = be.alloc_device(max(n, 1))
                if n:
                    be.copy_in(be.view(buf, 0, (n,), np.uint8), e.array)
                e.device = buf
                self.stats["weights_uploaded_bytes"] += n
            return e.device

    @property
    def nbytes(self) -> int:
        """Host bytes of the contents held now."""
        with self._lock:
            return sum(int(e.array.nbytes) for e in self._entries.values())

    @property
    def device_bytes(self) -> int:
        """Bytes of the device copies held now."""
        with self._lock:
            return sum(int(e.device.nbytes) for e in self._entries.values() if e.device is not None)

    # -- the compile cache's files -------------------------------------------------------------------
    def save(self, weights: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], dict[str, ExternalWeight]]:
        """A compile's weights split for a cached context binary: (those kept inside it, the others named by
        content and written to the folder once each, as `<sha256>.bin`: skipped when a valid blob is there)."""
        if self.folder is None:
            raise FormatError("this weight store has no folder to save weights in")
        self.folder.mkdir(parents=True, exist_ok=True)
        inside: dict[str, np.ndarray] = {}
        outside: dict[str, ExternalWeight] = {}
        for name, value in weights.items():
            arr, raw = raw_bytes(value, name)
            if raw.nbytes < EXTERNAL_MIN_BYTES:
                inside[name] = arr
                continue
            key = content_key(raw)
            w = outside[name] = ExternalWeight(key, int(raw.nbytes), dtypes.name(arr.dtype), tuple(arr.shape),
                                               layout.crc32(raw))
            with self._lock:
                held = key in self._entries
            if held or self._blob_ok(w):
                continue
            path = self._blob(key)
            with atomic_write(path) as f:
                f.write(raw.data)
            self._checked[key] = _stamp(path)
            self.stats["weights_written_bytes"] += w.nbytes
        return inside, outside

    def _blob(self, key: str) -> Path:
        assert self.folder is not None
        return self.folder / f"{key}.bin"

    def _blob_ok(self, w: ExternalWeight) -> bool:
        """The blob is there, of the right size and CRC-32 (checked once per store while the file is unchanged)."""
        path = self._blob(w.key)
        try:
            stamp = _stamp(path)
        except OSError:
            return False
        if stamp[0] != w.nbytes:
            return False
        if self._checked.get(w.key) == stamp:
            return True
        try:
            with open(path, "rb") as f:
                ok = layout.crc32(f.read()) == w.crc
        except OSError:
            return False
        if ok:
            self._checked[w.key] = stamp
        return ok

    def _map_blob(self, w: ExternalWeight, unchecked: list[Callable[[], None]] | None = None) -> np.ndarray:
        if self.folder is None:
            raise FormatError(f"the context binary reads weight {w.key[:16]}... from outside its file, and no "
                              "folder of weights was given")
        path = self._blob(w.key)
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size != w.nbytes:
                    raise FormatError(f"{path}: a cached weight of {w.nbytes} bytes has {size}")
                if size == 0:
                    return _read_only(np.zeros(0, np.uint8))
                mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except OSError as e:
            raise FormatError(f"{path}: cannot read a cached weight: {e}") from e
        array = np.frombuffer(mm, np.uint8)
        if self._checked.get(w.key) != _stamp(path):
            def check(array: np.ndarray = array, w: ExternalWeight = w, path: Path = path) -> None:
                if layout.crc32(array) != w.crc:
                    raise FormatError(f"{path}: the cached weight is damaged (CRC-32 mismatch)")
                self._checked[w.key] = _stamp(path)
            if unchecked is None:
                check()
            else:
                unchecked.append(check)
        return array


def _stamp(path: Path) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns


def _read_only(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


def _aligned_copy(raw: np.ndarray) -> np.ndarray:
    """A read-only copy starting at a multiple of the weights' alignment (64 bytes), as in a weights section."""
    n, align = int(raw.nbytes), layout.WEIGHT_ALIGNMENT
    buf = np.empty(n + align, np.uint8)
    start = -buf.ctypes.data % align
    out = buf[start:start + n]
    out[...] = raw
    return _read_only(out)


__all__ = ["EXTERNAL_MIN_BYTES", "WeightStore"]
