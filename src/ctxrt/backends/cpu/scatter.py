"""Ops that write at indices: ScatterND, ScatterElements, OneHot.

Negative indices count from the end (as onnxruntime); one outside its axis is an InvalidInputError, raised before
anything is written (backends/kernel.py's check_indices). Duplicate indices without a reduction keep the last update,
as onnxruntime's sequential loop does; with one, every update is folded in (ufunc.at, unbuffered).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ctxrt.backends.cpu.elementwise import BoundKernel
from ctxrt.backends.kernel import Kernel, Launch, NodeSpec, check_indices, constant_indices_error, scratch_view
from ctxrt.errors import UnsupportedOpError

_REDUCTIONS: dict[str, np.ufunc | None] = {"none": None, "add": np.add, "mul": np.multiply, "max": np.maximum,
                                           "min": np.minimum}


def _fail(spec: NodeSpec, what: str) -> UnsupportedOpError:
    return UnsupportedOpError(f"{spec.op} node {spec.name!r}: {what} is not supported")


def _reduction(spec: NodeSpec) -> np.ufunc | None:
    name = spec.attr("reduction", "none")
    if name not in _REDUCTIONS:
        raise _fail(spec, f"attribute 'reduction' value {name!r}")
    return _REDUCTIONS[name]


def _write(target: np.ndarray, index: np.ndarray, updates: np.ndarray, reduce: np.ufunc | None) -> None:
    if reduce is None:
        target[index] = updates  # repeated indices: the last update stays
    else:
        reduce.at(target, index, updates)


def scatter_nd(spec: NodeSpec) -> Kernel:
    """data as (rows, inner) with rows over the first q axes; each index tuple picks one row."""
    dshape, ishape = spec.inputs[0].shape, spec.inputs[1].shape
    q = ishape[-1]
    if q > len(dshape):
        raise _fail(spec, f"index tuples of length {q} into data of rank {len(dshape)}")
    reduce = _reduction(spec)
    inner = int(np.prod(dshape[q:]))
    nidx = int(np.prod(ishape[:-1]))
    dims = np.array(dshape[:q], np.int64)
    strides = np.array([int(np.prod(dshape[j + 1:q])) for j in range(q)], np.int64)
    const = spec.consts[1] if len(spec.consts) > 1 else None
    fixed = None if const is None else (np.mod(const.astype(np.int64).reshape(nidx, q), dims) @ strides)
    error = None if const is None else constant_indices_error(spec, np.asarray(const).reshape(nidx, q), dims)

    def make(ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        data, y = ins[0], outs[0]
        y2, upd = y.reshape(-1, inner), ins[2].reshape(nidx, inner)
        same = data.ctypes.data == y.ctypes.data
        if fixed is not None:
            rows = fixed
            refresh = None
        else:
            t = scratch_view(scratch[0], (nidx, q), np.int64)
            rows = scratch_view(scratch[1], (nidx,), np.int64)
            idx = ins[1].reshape(nidx, q)

            def refresh() -> None:
                np.copyto(t, idx, casting="unsafe")
                check_indices(spec, t, dims)
                np.mod(t, dims, out=t)  # negative indices count from the end
                np.matmul(t, strides, out=rows)

        def run() -> None:
            if error is not None:
                raise error
            if refresh is not None:  # (the indices checked before anything is written)
                refresh()
            if not same:
                np.copyto(y, data)
            _write(y2, rows, upd, reduce)
        return run
    return BoundKernel(make, () if fixed is not None else (max(1, nidx * q) * 8, max(1, nidx) * 8))


def scatter_elements(spec: NodeSpec) -> Kernel:
    """Flat offsets: each index position's own offset in data, but along `axis`, where the index supplies it."""
    dshape, ishape = spec.inputs[0].shape, spec.inputs[1].shape
    rank = len(dshape)
    axis = int(spec.attr("axis", 0))
    if not -rank <= axis < rank:
        raise _fail(spec, f"attribute 'axis' value {axis} (rank {rank})")
    axis %= rank
    reduce = _reduction(spec)
    strides = [int(np.prod(dshape[d + 1:])) for d in range(rank)]
    grid = np.indices(ishape, dtype=np.int64)
    base = sum((grid[d] * strides[d] for d in range(rank) if d != axis), np.zeros(ishape, np.int64)).reshape(-1)
    const = spec.consts[1] if len(spec.consts) > 1 else None
    fixed = None if const is None else np.mod(const.astype(np.int64).reshape(-1), dshape[axis]) * strides[axis] + base
    error = None if const is None else constant_indices_error(spec, np.asarray(const), dshape[axis])
    size = base.size

    def make(ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        data, y = ins[0], outs[0]
        yflat, upd = y.reshape(-1), ins[2].reshape(-1)
        same = data.ctypes.data == y.ctypes.data
        off = fixed if fixed is not None else scratch_view(scratch[0], (size,), np.int64)
        idx = ins[1].reshape(-1)

        def run() -> None:
            if error is not None:
                raise error
            if fixed is None:  # (the indices checked before anything is written)
                np.copyto(off, idx, casting="unsafe")
                check_indices(spec, off, dshape[axis])
                np.mod(off, dshape[axis], out=off)
                np.multiply(off, strides[axis], out=off)
                np.add(off, base, out=off)
            if not same:
                np.copyto(y, data)
            _write(yflat, off, upd, reduce)
        return run
    return BoundKernel(make, () if fixed is not None else (max(1, size) * 8,))


def one_hot(spec: NodeSpec) -> Kernel:
    """values[0] everywhere, then values[1] put at each index's position along the new axis (negative: from the
    end); an index out of range puts values[0] at position 0 of its own row instead, which changes nothing.
    O(indices) work besides one fill (a comparison against every position would be O(output))."""
    ishape, oshape = spec.inputs[0].shape, spec.outputs[0].shape
    depth = spec.attr("depth")
    if depth is None:
        raise _fail(spec, "input depth unknown at compile time")
    depth = int(np.asarray(depth).reshape(-1)[0])
    rank = len(oshape)
    axis = int(spec.attr("axis", -1))
    if not -rank <= axis < rank:
        raise _fail(spec, f"attribute 'axis' value {axis} (output rank {rank})")
    axis %= rank
    stride = int(np.prod(oshape[axis + 1:]))
    n = int(np.prod(ishape))
    # flat offset in y of each index position's row start (its position 0 along the new axis)
    grid = np.indices(ishape, dtype=np.int64).reshape(len(ishape), n)
    ostrides = [int(np.prod(oshape[d + 1:])) for d in range(rank)]
    base = sum((grid[d] * ostrides[d if d < axis else d + 1] for d in range(len(ishape))), np.zeros(n, np.int64))
    values = spec.consts[2] if len(spec.consts) > 2 else None
    dt = np.dtype(spec.outputs[0].dtype)

    def make(ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        y = outs[0]
        yflat, src = y.reshape(-1), ins[0].reshape(-1)
        idx = scratch_view(scratch[0], (n,), np.int64)
        ok, bad = scratch_view(scratch[1], (n,), np.bool_), scratch_view(scratch[2], (n,), np.bool_)
        put = scratch_view(scratch[3], (n,), dt)
        vals = ins[2].reshape(-1) if values is None else values.reshape(-1).astype(dt)
        off, on = vals[0:1].reshape(()), vals[1:2].reshape(())

        def run() -> None:
            np.copyto(idx, src, casting="unsafe")  # float indices truncate, as onnxruntime's cast
            np.less(idx, 0, out=bad)
            np.add(idx, depth, out=idx, where=bad)
            np.greater_equal(idx, 0, out=ok)
            np.less(idx, depth, out=bad)
            np.logical_and(ok, bad, out=ok)
            np.logical_not(ok, out=bad)
            np.copyto(put, off)
            np.copyto(put, on, where=ok)
            np.copyto(idx, 0, where=bad)
            np.multiply(idx, stride, out=idx)
            np.add(idx, base, out=idx)
            np.copyto(y, off)
            np.put(yflat, idx, put, mode="clip")
        return run
    m = max(1, n)
    return BoundKernel(make, (m * 8, m, m, m * dt.itemsize))


KERNELS = {"ScatterND": scatter_nd, "ScatterElements": scatter_elements, "OneHot": one_hot}
