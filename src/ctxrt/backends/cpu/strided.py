"""Element-wise launches over strided views as one native call each, and a program's runs of native launches as
one call from Python (csrc/strided.c; docs/cpu.md, "Native kernels").

A decoder of hidden 128 runs ~150 copies, transposes, slices, additions and selections a token on tensors of a few
KiB: NumPy's dispatch costs 1-2 us each, more than the work. Here a copy (Transpose, Slice, Expand, Concat's parts),
a float32 Add/Sub/Mul/Div/Neg or a Where is a `ctxrt_ew` call on the views' strides, made at bind time; and
`batch` turns each run of consecutive launches that have a `native` list (these, the other native kernels, oneDNN's
primitives) into one `ctxrt_batch` call. Where the extension is not built, or a view does not fit (another dtype,
an output overlapping an input other than element for element), the launch is NumPy's, as before.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ctxrt.backends.cpu import native, threads

Launch = Callable[[], None]

COPY, WHERE = 0, 6
_ARITH = {np.add: 1, np.subtract: 2, np.multiply: 3, np.divide: 4, np.negative: 5}
_SIZES = (1, 2, 4, 8)


def _strides(y: np.ndarray, xs: Sequence[np.ndarray]) -> tuple[list[int], list[list[int]]] | None:
    """y's shape with its size-1 dims dropped and contiguous runs merged, and each array's strides over it in
    elements (0 where an input broadcasts); None where a view does not fit the native loop."""
    arrays = [y]
    for x in xs:
        try:
            v = np.broadcast_to(x, y.shape)
        except ValueError:
            return None
        if np.may_share_memory(v, y) and (v.ctypes.data != y.ctypes.data or any(
                s != t for s, t, n in zip(v.strides, y.strides, y.shape, strict=True) if n > 1)):
            return None  # overlapping the output other than element for element: NumPy buffers it
        arrays.append(v)
    for a in arrays:
        size = a.dtype.itemsize
        if a.ctypes.data % size or any(s % size for s in a.strides):
            return None
    dims: list[tuple[int, list[int]]] = []
    for i, n in enumerate(y.shape):
        if n == 1:
            continue
        st = [a.strides[i] // a.dtype.itemsize for a in arrays]
        if dims and all(p == s * n for p, s in zip(dims[-1][1], st, strict=True)):
            dims[-1] = (dims[-1][0] * n, st)
        else:
            dims.append((n, st))
    if len(dims) > native.EW_RANK:
        return None
    if not dims:
        dims = [(1, [0] * len(arrays))]
    return [n for n, _ in dims], [[st[j] for _, st in dims] for j in range(len(arrays))]


def _ew(op: int, y: np.ndarray, xs: Sequence[np.ndarray], c: np.ndarray | None = None) -> Launch | None:
    """The native launch of csrc/strided.c's op on these views, or None."""
    if native.library() is None:
        return None
    if y.size == 0:
        return _empty
    plan = _strides(y, [*xs, *([] if c is None else [c])])
    if plan is None:
        return None
    shape, strides = plan  # [y, *xs, c]
    pad = [1] * (native.EW_RANK - len(shape))
    zeros = [0] * native.EW_RANK
    args = native.EwArgs(op=op, rank=len(shape), size=y.dtype.itemsize, y=y.ctypes.data, a=xs[0].ctypes.data,
                         b=xs[1].ctypes.data if len(xs) > 1 else None, c=None if c is None else c.ctypes.data)
    args.shape[:] = shape + pad
    args.ys[:] = strides[0] + [0] * len(pad)
    args.as_[:] = strides[1] + [0] * len(pad)
    args.bs[:] = strides[2] + [0] * len(pad) if len(xs) > 1 else zeros
    args.cs[:] = strides[-1] + [0] * len(pad) if c is not None else zeros
    return native.launch("ctxrt_ew", args, (y, *xs, c))


def _empty() -> None:
    pass


_empty.native = []  # type: ignore[attr-defined]


def copy(y: np.ndarray, src: np.ndarray) -> Launch:
    """y = src (a view of an input: transposed, sliced, broadcast), natively where it fits, else NumPy's copyto."""
    if src.dtype == y.dtype and y.dtype.itemsize in _SIZES and y.dtype.kind in "biuf":
        fast = _ew(COPY, y, [src])
        if fast is not None:
            return fast
    return lambda: np.copyto(y, src)


def ufunc(f: np.ufunc, y: np.ndarray, *xs: np.ndarray) -> Launch:
    """f(*xs, out=y) with NumPy's broadcasting: natively for float32 Add, Sub, Mul, Div and Neg."""
    op = _ARITH.get(f)
    if op is not None and y.dtype == np.float32 and all(x.dtype == np.float32 for x in xs):
        fast = _ew(op, y, xs)
        if fast is not None:
            return fast
    return lambda: f(*xs, out=y)


def where(y: np.ndarray, c: np.ndarray, a: np.ndarray, b: np.ndarray) -> Launch | None:
    """y = c ? a : b natively, or None where the views do not fit (the caller runs NumPy's)."""
    if c.dtype != np.bool_ or not (a.dtype == b.dtype == y.dtype) or y.dtype.itemsize not in _SIZES:
        return None
    return _ew(WHERE, y, [a, b], c)


def chain(launches: Sequence[Launch]) -> Launch:
    """One launch running these in order (a Concat's parts); native when all of them are."""
    parts = list(launches)

    def run() -> None:
        for launch in parts:
            launch()
    if all(getattr(p, "native", None) is not None for p in parts):
        run.native = [pair for p in parts for pair in p.native]  # type: ignore[attr-defined]
    return run


def is_native(launch: Any) -> bool:
    return getattr(launch, "native", None) is not None or hasattr(launch, "native_at")


def batch(launches: Sequence[Any]) -> list[Any]:
    """The launches with each run of two or more native ones (`native` lists, or `native_at(key)` for one whose
    call depends on the run's thread counts) replaced by one Batch."""
    if native.library() is None:
        return list(launches)
    out: list[Any] = []
    run: list[Any] = []
    for launch in [*launches, None]:
        if launch is not None and is_native(launch):
            run.append(launch)
            continue
        if len(run) > 1:
            out.append(Batch(run))
        else:
            out.extend(run)
        run = []
        if launch is not None:
            out.append(launch)
    return out


class Batch:
    """Native launches run in order by one `ctxrt_batch` call. The (function, struct) table is made once per
    (OpenMP threads, idle cores) of a run: a oneDNN primitive made for that thread count, a GEMV sharing that many
    cores. Where a launch fails, it runs again through Python, which raises its error."""

    MAX_TABLES = 16

    def __init__(self, launches: list[Any]) -> None:
        self.launches = launches
        self.dynamic = any(hasattr(launch, "native_at") for launch in launches)
        self.tables: dict[Any, tuple[Any, ...]] = {}
        self.call = native.library().ctxrt_batch

    def _table(self, key: Any) -> tuple[Any, ...]:
        pairs: list[tuple[int, int]] = []
        owners: list[int] = []
        for k, launch in enumerate(self.launches):
            got = launch.native_at(key) if hasattr(launch, "native_at") else launch.native
            pairs.extend(got)
            owners.extend([k] * len(got))
        n = len(pairs)
        fns = (ctypes.c_void_p * max(n, 1))(*[f for f, _ in pairs])
        args = (ctypes.c_void_p * max(n, 1))(*[a for _, a in pairs])
        b = native.BatchArgs(n=n, fns=ctypes.addressof(fns), args=ctypes.addressof(args))
        if len(self.tables) >= self.MAX_TABLES:
            self.tables.clear()
        table = self.tables[key] = (ctypes.byref(b), b, owners, fns, args)
        return table

    def __call__(self) -> None:
        key = (threads.openmp_now(), threads.idle_now()) if self.dynamic else None
        table = self.tables.get(key) or self._table(key)
        if self.call(table[0]):
            k = table[2][table[1].failed]
            for launch in self.launches[k:]:  # the failed one raises its error; else the rest run as launches
                launch()
