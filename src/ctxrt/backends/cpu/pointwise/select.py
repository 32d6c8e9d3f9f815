"""Ops that select or accumulate along an axis: TopK (topk.py), Trilu, CumSum, CumProd."""

from __future__ import annotations

from typing import Any

import numpy as np

from ctxrt.backends.cpu.elementwise import BoundKernel
from ctxrt.backends.cpu.topk import topk
from ctxrt.backends.kernel import Kernel, Launch, NodeSpec, scratch_view
from ctxrt.errors import UnsupportedOpError


def _fail(spec: NodeSpec, what: str) -> UnsupportedOpError:
    return UnsupportedOpError(f"{spec.op} node {spec.name!r}: {what} is not supported")


def _axis(spec: NodeSpec, axis: int, rank: int) -> int:
    if not -rank <= axis < rank:
        raise _fail(spec, f"attribute 'axis' value {axis} (input rank {rank})")
    return axis % rank


def trilu(spec: NodeSpec) -> Kernel:
    """Zero the elements above (lower) or below (upper) the k-th diagonal of the last two axes. k is a
    constant (mask made once) or a run-time input (mask from a table of column - row each run)."""
    shape = spec.inputs[0].shape
    if len(shape) < 2:
        raise _fail(spec, f"input of rank {len(shape)}")
    rows, cols = shape[-2:]
    upper = bool(spec.attr("upper", 1))
    diag = np.arange(cols)[None, :] - np.arange(rows)[:, None]  # j - i
    keep_cmp = np.less if upper else np.greater  # elements to zero: j - i < k (upper), j - i > k (lower)
    zero = np.dtype(spec.outputs[0].dtype).type(0)
    has_k = len(spec.inputs) > 1 and spec.inputs[1] is not None
    kconst = spec.consts[1] if has_k else np.zeros((), np.int64)

    def make(ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        x, y = ins[0], outs[0]
        if kconst is not None:
            mask = keep_cmp(diag, int(np.asarray(kconst).reshape(-1)[0]))
            refresh = None
        else:
            mask = scratch_view(scratch[0], (rows, cols), np.bool_)
            kv, d = ins[1].reshape(()), diag.astype(ins[1].dtype)

            def refresh() -> None:
                keep_cmp(d, kv, out=mask)
        same = x.ctypes.data == y.ctypes.data

        def run() -> None:
            if refresh is not None:
                refresh()
            if not same:
                np.copyto(y, x)
            np.copyto(y, zero, where=mask)
        return run
    return BoundKernel(make, () if kconst is not None else (rows * cols,))


def cumulative(spec: NodeSpec) -> Kernel:
    """CumSum and CumProd along a compile-time axis: `exclusive` (each element left out of its own result, the
    first one the identity, 0 or 1), `reverse` (accumulated from the end)."""
    shape = spec.inputs[0].shape
    axis = spec.attr("axis")
    if axis is None:
        raise _fail(spec, "input axis unknown at compile time")
    axis = _axis(spec, int(np.asarray(axis).reshape(-1)[0]), len(shape))
    exclusive, reverse = bool(spec.attr("exclusive", 0)), bool(spec.attr("reverse", 0))
    dt = np.dtype(spec.outputs[0].dtype)
    accumulate, identity = (np.cumprod, 1) if spec.op == "CumProd" else (np.cumsum, 0)
    flip = (slice(None),) * axis + (slice(None, None, -1),)
    first = (slice(None),) * axis + (slice(0, 1),)
    head = (slice(None),) * axis + (slice(0, -1),)
    tail = (slice(None),) * axis + (slice(1, None),)

    def make(ins: list[Any], outs: list[Any], _s: list[Any]) -> Launch:
        x, y = ins[0], outs[0]
        if reverse:  # a running sum (product) from the end: the same on reversed views
            x, y = x[flip], y[flip]
        if not exclusive:
            return lambda: accumulate(x, axis=axis, dtype=dt, out=y)
        src, dst, start = x[head], y[tail], y[first]  # y[0] = identity, y[i] = x[0] + ... + x[i - 1]

        def run() -> None:
            start.fill(identity)
            accumulate(src, axis=axis, dtype=dt, out=dst)
        return run
    return BoundKernel(make)


KERNELS = {"TopK": topk, "Trilu": trilu, "CumSum": cumulative, "CumProd": cumulative}
