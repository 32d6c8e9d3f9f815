"""Element-wise launches over strided views as one native call each, and a program's runs of native launches as
one call from Python (csrc/strided.c; docs/cpu.md, "Native kernels").

A decoder of hidden 128 runs ~150 copies, transposes, slices, additions and selections a token on tensors of a few
KiB: NumPy's dispatch costs 1-2 us each, more than the work. Here a copy (Transpose, Slice, Expand, Concat's parts),
a float32 Add/Sub/Mul/Div/Neg or a Where stands for a `ctxrt_ew` call on the views' strides, and `batch` turns each
run of consecutive launches that have native calls (these, the other native kernels, oneDNN's primitives) into one
`ctxrt_batch` call. Called alone, such a launch runs NumPy's code (one call either way); where the extension is not
built, or a view does not fit (another dtype, an output overlapping an input other than element for element), it
runs NumPy's code in the batch too.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ctxrt.backends.cpu import native, threads

Launch = Callable[[], None]

COPY, WHERE = 0, 6
_ARITH = {np.add: 1, np.subtract: 2, np.multiply: 3, np.divide: 4, np.negative: 5}
_SIZES = (1, 2, 4, 8)


class _Ew:
    """A launch of csrc/strided.c's op on views: NumPy's (`fallback`) when called alone (one call either way), its
    native call (the struct made in C, ~1 us) when a batch first asks (`native_at`)."""

    __slots__ = ("op", "y", "xs", "c", "fallback", "made", "pairs")

    def __init__(self, op: int, y: np.ndarray, xs: Sequence[np.ndarray], c: np.ndarray | None,
                 fallback: Launch) -> None:
        self.op, self.y, self.xs, self.c, self.fallback, self.made, self.pairs = op, y, xs, c, fallback, None, None

    def __call__(self) -> None:
        self.fallback()

    def native_at(self, key: Any = None) -> list[tuple[int, int]] | None:
        if self.made is None:
            xs = self.xs
            self.made = native.ew_args(self.op, self.y, xs[0], xs[1] if len(xs) > 1 else None, self.c) or ()
            self.pairs = [(native.function("ctxrt_ew"), self.made[1])] if self.made else None
        return self.pairs


def _ew(op: int, y: np.ndarray, xs: Sequence[np.ndarray], c: np.ndarray | None, fallback: Launch) -> Launch:
    return fallback if native.library() is None else _Ew(op, y, xs, c, fallback)


TRANSPOSE_MIN = 1 << 14  # elements from which a transposing copy called alone runs natively too


def copy(y: np.ndarray, src: np.ndarray) -> Launch:
    """y = src (a view of an input: transposed, sliced, broadcast), natively where it fits, else NumPy's copyto.
    A large transposing copy (y's rows read across the source's rows) is the native call even alone: csrc/strided.c
    copies it in tiles that keep the source's lines in cache (SegFormer's 128 x 4096 floats: NumPy 1.5 ms, 0.3)."""
    fallback = lambda: np.copyto(y, src)  # noqa: E731
    if src.dtype == y.dtype and y.dtype.itemsize in _SIZES and y.dtype.kind in "biuf":
        launch = _ew(COPY, y, [src], None, fallback)
        if isinstance(launch, _Ew) and y.size >= TRANSPOSE_MIN and _transposing(y, src) and launch.native_at():
            call, address = native.library().ctxrt_ew, launch.made[1]  # (the struct a batch calls, held by it)
            launch.fallback = lambda: call(address)
        return launch
    return fallback


def _transposing(y: np.ndarray, src: np.ndarray) -> bool:
    """Whether y's rows are contiguous and the source's are not, but it is contiguous along another axis of 8 or
    more elements (csrc/strided.c's tiled copy)."""
    size = y.dtype.itemsize
    return y.ndim >= 2 and src.shape == y.shape and y.strides[-1] == size and src.strides[-1] not in (0, size) \
        and y.shape[-1] >= 8 and any(st == size and n >= 8 for st, n in zip(src.strides[:-1], src.shape[:-1],
                                                                                strict=True))


def ufunc(f: np.ufunc, y: np.ndarray, *xs: np.ndarray) -> Launch:
    """f(*xs, out=y) with NumPy's broadcasting: natively for float32 Add, Sub, Mul, Div and Neg."""
    fallback = lambda: f(*xs, out=y)  # noqa: E731
    op = _ARITH.get(f)
    if op is not None and y.dtype == np.float32 and all(x.dtype == np.float32 for x in xs):
        return _ew(op, y, xs, None, fallback)
    return fallback


def where(y: np.ndarray, c: np.ndarray, a: np.ndarray, b: np.ndarray, fallback: Launch) -> Launch:
    """y = c ? a : b, natively where the views fit, else `fallback` (the caller's NumPy launch)."""
    if c.dtype != np.bool_ or not (a.dtype == b.dtype == y.dtype) or y.dtype.itemsize not in _SIZES:
        return fallback
    return _ew(WHERE, y, [a, b], c, fallback)


class _Deferred:
    """A launch that runs `fallback` when called alone and, when a batch first asks, the native calls of the launch
    `make()` returns (a Concat's part copies: made only for a run that is batched)."""

    __slots__ = ("fallback", "make", "made", "pairs")

    def __init__(self, fallback: Launch, make: Callable[[], Launch]) -> None:
        self.fallback, self.make, self.made, self.pairs = fallback, make, None, ()

    def __call__(self) -> None:
        self.fallback()

    def native_at(self, key: Any = None) -> list[tuple[int, int]] | None:
        if self.pairs == ():
            self.made = self.make()  # held: its structs are what the pairs point to
            self.pairs = natives(self.made, key)
        return self.pairs


def deferred(fallback: Launch, make: Callable[[], Launch]) -> Launch:
    """`fallback`, or where the native kernels are built a launch running it alone and `make()`'s native calls in a
    batch."""
    return fallback if native.library() is None else _Deferred(fallback, make)


class _Chain:
    """Launches run in order as one (a Concat's or Split's parts); native where each of them is."""

    __slots__ = ("parts",)

    def __init__(self, parts: list[Any]) -> None:
        self.parts = parts

    def __call__(self) -> None:
        for launch in self.parts:
            launch()

    def native_at(self, key: Any = None) -> list[tuple[int, int]] | None:
        out: list[tuple[int, int]] = []
        for p in self.parts:
            got = natives(p, key)
            if got is None:
                return None
            out.extend(got)
        return out


def chain(launches: Sequence[Launch]) -> Launch:
    """One launch running these in order; native in a batch where every one of them is."""
    parts = list(launches)
    return parts[0] if len(parts) == 1 else _Chain(parts)


def natives(launch: Any, key: Any) -> list[tuple[int, int]] | None:
    """The (function, struct) calls a launch stands for at a run's thread counts `key`, or None (a Python launch)."""
    at = getattr(launch, "native_at", None)
    return at(key) if at is not None else getattr(launch, "native", None)


def structs(launch: Any) -> list[tuple[int, Any]] | None:
    """The native calls of a launch as (function, its struct's bytes), made now and not kept by the launch; None
    where a call's struct is not known here (a launch through Python, a struct per thread count, oneDNN's): a range
    program's list shared by every set of dims copies these bytes into its own structs at each run
    (runtime/slots.py). The structs point into the views' memory (the arena, the IO buffers), which outlives them."""
    cls = launch.__class__
    if cls is _Ew:
        if launch.made:
            return [(native.function("ctxrt_ew"), launch.made[0])]
        xs = launch.xs
        made = native.ew_args(launch.op, launch.y, xs[0], xs[1] if len(xs) > 1 else None, launch.c)
        return None if made is None else [(native.function("ctxrt_ew"), made[0])]
    if cls is _Chain:
        out: list[tuple[int, Any]] = []
        for part in launch.parts:
            got = structs(part)
            if got is None:
                return None
            out.extend(got)
        return out
    if cls is _Deferred:
        return structs(launch.made if launch.pairs != () else launch.make())
    return getattr(launch, "structs", None)


def is_native(launch: Any) -> bool:
    """Whether a launch may stand for native calls (`natives` says at the first batch run)."""
    return getattr(launch, "native", None) is not None or hasattr(launch, "native_at")


MAX_KEPT = 1024  # Batches a cache keeps (a range program's states share most of their runs of launches)


def batch(launches: Sequence[Any], cache: dict[tuple[int, ...], Batch] | None = None) -> list[Any]:
    """The launches with each run of two or more that may be native (`native` lists, or `native_at(key)`) replaced
    by one Batch; `cache` (the graph's) gives the Batch already made for the same launches (a range program's
    states at other dims: only the runs around their own launches are new)."""
    if native.library() is None:
        return list(launches)
    out: list[Any] = []
    run: list[Any] = []
    for launch in [*launches, None]:
        if launch is not None and is_native(launch):
            run.append(launch)
            continue
        if len(run) > 1:
            key = tuple(map(id, run))  # the Batch holds the launches: their ids stay theirs
            made = None if cache is None else cache.get(key)
            if made is None:
                made = Batch(run)
                if cache is not None:
                    if len(cache) >= MAX_KEPT:
                        del cache[next(iter(cache))]
                    cache[key] = made
            out.append(made)
        else:
            out.extend(run)
        run = []
        if launch is not None:
            out.append(launch)
    return out


# .prepare: set by a run whose native calls read feeds in place (runtime/feeds.py), called before a Batch's launches
# run through Python after a native call failed (they read the program's own input buffers)
FALLBACK = threading.local()


class Batch:
    """Launches run in order, each run of native ones by one `ctxrt_batch` call. The calls are listed once per
    (OpenMP threads, idle cores) of a run where a launch depends on them (`keyed`: a oneDNN primitive made for that
    thread count, a GEMV sharing that many cores). Where a native call fails, its launch runs again through Python,
    which raises its error."""

    MAX_TABLES = 16

    def __init__(self, launches: list[Any]) -> None:
        self.launches = launches
        self.keyed = any(getattr(launch, "keyed", False) for launch in launches)
        self.tables: dict[Any, list[Any]] = {}

    def _table(self, key: Any) -> list[Any]:
        """The run as a list of Python launches and (struct ref, struct, owner per call, keep...) native segments."""
        call = native.library().ctxrt_batch
        steps: list[Any] = []
        pairs: list[tuple[int, int]] = []
        owners: list[int] = []

        def flush() -> None:
            if pairs:
                fns = (ctypes.c_void_p * len(pairs))(*[f for f, _ in pairs])
                args = (ctypes.c_void_p * len(pairs))(*[a for _, a in pairs])
                b = native.BatchArgs(n=len(pairs), fns=ctypes.addressof(fns), args=ctypes.addressof(args))
                steps.append((call, ctypes.byref(b), b, list(owners), fns, args))
                pairs.clear()
                owners.clear()
        for k, launch in enumerate(self.launches):
            got = natives(launch, key)
            if got is None:
                flush()
                steps.append(launch)
            else:
                pairs.extend(got)
                owners.extend([k] * len(got))
        flush()
        if len(self.tables) >= self.MAX_TABLES:
            self.tables.clear()
        self.tables[key] = steps
        return steps

    def __call__(self) -> None:
        key = (threads.openmp_now(), threads.idle_now()) if self.keyed else None
        steps = self.tables.get(key)
        if steps is None:
            steps = self._table(key)
        for step in steps:
            if step.__class__ is tuple:
                if step[0](step[1]):
                    k = step[3][step[2].failed]
                    prepare = getattr(FALLBACK, "prepare", None)
                    if prepare is not None:  # feeds read in place (runtime/feeds.py): NumPy reads the buffers
                        prepare()
                    for launch in self.launches[k:]:  # the failed one raises its error; else the rest run
                        launch()
                    return
            else:
                step()
