"""Reductions: Softmax, LogSoftmax and Hardmax, ReduceX over attribute axes (over no elements too), ArgMax and
ArgMin."""

from __future__ import annotations

from typing import Any

import numpy as np

from ctxrt.backends.cpu.elementwise import BoundKernel, flat
from ctxrt.backends.kernel import Kernel, Launch, NodeSpec, scratch_view
from ctxrt.errors import UnsupportedOpError

SOFTMAX_BLOCK = 65536  # elements per block of rows: its 5 passes run in the L2 cache (256 KiB of float32)


def _axis(spec: NodeSpec, axis: int, rank: int) -> int:
    if not -max(rank, 1) <= axis < max(rank, 1):
        raise UnsupportedOpError(f"{spec.op} node {spec.name!r}: axis {axis} is out of range for rank {rank}")
    return axis % max(rank, 1)


def softmax_view(spec: NodeSpec) -> tuple[int, ...]:
    """The (outer, n, inner) view a Softmax / LogSoftmax normalizes along n; (outer, n) when inner is 1.

    Opset >= 13 normalizes along `axis` (default -1); before 13 the input is coerced to 2-D at `axis`
    (default 1), so n is the product of every dimension from `axis` on."""
    shape = spec.inputs[0].shape
    legacy = spec.opset < 13
    axis = _axis(spec, int(spec.attr("axis", 1 if legacy else -1)), len(shape))
    outer = int(np.prod(shape[:axis]))
    n = int(np.prod(shape[axis:])) if legacy else shape[axis] if shape else 1
    inner = 1 if legacy else int(np.prod(shape[axis + 1:]))
    # A trailing inner dimension of 1 is dropped: reductions along the last axis are faster.
    return (outer, n, inner) if inner > 1 else (outer, n)


class Softmax(Kernel):
    """Softmax / LogSoftmax of a (outer, n, inner) view along n (`softmax_view`), in blocks of outer rows.
    Correct in place."""

    def __init__(self, spec: NodeSpec, log: bool) -> None:
        self.dtype = np.dtype(spec.outputs[0].dtype)
        if self.dtype.kind != "f":
            raise UnsupportedOpError(f"{spec.op} node {spec.name!r}: dtype {self.dtype} is not supported")
        self.view = softmax_view(spec)
        outer, n, inner = (*self.view, 1)[:3]
        self.rows = max(1, min(outer, SOFTMAX_BLOCK // max(1, n * inner)))
        self.log = log
        stats = self.rows * inner * self.dtype.itemsize
        self.scratch = (stats, self.rows * n * inner * self.dtype.itemsize) if log else (stats,)

    def bind(self, ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        x, y = ins[0].reshape(self.view), outs[0].reshape(self.view)
        stat_shape = (self.rows, 1) + self.view[2:]
        m = scratch_view(scratch[0], stat_shape, self.dtype)
        e = scratch_view(scratch[1], (self.rows,) + self.view[1:], self.dtype) if self.log else None
        blocks = []
        for r in range(0, self.view[0], self.rows):
            k = min(self.rows, self.view[0] - r)
            blocks.append((x[r:r + k], y[r:r + k], m[:k], None if e is None else e[:k]))

        ones = np.ones((self.view[1], 1), self.dtype) if len(self.view) == 2 else None

        def softmax() -> None:
            for xb, yb, mb, _ in blocks:
                np.maximum.reduce(xb, axis=1, keepdims=True, out=mb)
                np.subtract(xb, mb, out=yb)  # max subtraction: exp never overflows
                np.exp(yb, out=yb)
                if ones is not None:  # row sums as a GEMV (4x faster than add.reduce on short rows)
                    np.matmul(yb, ones, out=mb)
                    np.reciprocal(mb, out=mb)
                    np.multiply(yb, mb, out=yb)
                else:
                    np.add.reduce(yb, axis=1, keepdims=True, out=mb)
                    np.divide(yb, mb, out=yb)

        def log_softmax() -> None:
            for xb, yb, mb, eb in blocks:
                np.maximum.reduce(xb, axis=1, keepdims=True, out=mb)
                np.subtract(xb, mb, out=yb)
                np.exp(yb, out=eb)
                np.add.reduce(eb, axis=1, keepdims=True, out=mb)
                np.log(mb, out=mb)
                np.subtract(yb, mb, out=yb)
        return log_softmax if self.log else softmax


def softmax(spec: NodeSpec) -> Kernel:
    return Softmax(spec, spec.op == "LogSoftmax")


def hardmax(spec: NodeSpec) -> Kernel:
    """1 at the first maximum of each row of Softmax's (outer, n, inner) view (`softmax_view`: along `axis` from
    opset 13, the input coerced to 2-D before), 0 elsewhere. The indices are found before the output is written:
    correct in place."""
    dt = np.dtype(spec.outputs[0].dtype)
    if dt.kind != "f":
        raise UnsupportedOpError(f"{spec.op} node {spec.name!r}: dtype {dt} is not supported")
    outer, n, inner = (*softmax_view(spec), 1)[:3]
    if outer * n * inner == 0:
        return BoundKernel(lambda ins, outs, _s: lambda: None)
    base = (np.arange(outer, dtype=np.int64)[:, None] * (n * inner) + np.arange(inner, dtype=np.int64)[None, :])
    one = dt.type(1)

    def make(ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        x = ins[0].reshape(outer, n, inner)
        y = flat(outs[0])  # the 1s are set at flat indices
        at = scratch_view(scratch[0], (outer, inner), np.int64)

        def run() -> None:
            np.argmax(x, axis=1, out=at)  # the first maximum: ties go to the lowest index
            np.multiply(at, inner, out=at)
            np.add(at, base, out=at)
            y.fill(0)
            y[at] = one
        return run
    return BoundKernel(make, (outer * inner * 8,))


_REDUCE: dict[str, tuple[np.ufunc, np.ufunc | None]] = {  # (reduction, element-wise map applied first)
    "ReduceSum": (np.add, None), "ReduceMean": (np.add, None), "ReduceMax": (np.maximum, None),
    "ReduceMin": (np.minimum, None), "ReduceProd": (np.multiply, None), "ReduceL1": (np.add, np.abs),
    "ReduceL2": (np.add, np.square), "ReduceSumSquare": (np.add, np.square), "ReduceLogSum": (np.add, None),
}


def _empty_set(op: str, dt: np.dtype) -> Any:
    """The reduction of no elements (ONNX 18+): the identity of the combination, log(0) = -inf for the
    logarithms; the mean, which ONNX leaves undefined, is 0 as onnxruntime's."""
    if op in ("ReduceMax", "ReduceMin"):
        low = op == "ReduceMax"
        if dt.kind == "b":
            return not low
        if dt.kind == "f":
            return -np.inf if low else np.inf
        info = np.iinfo(dt)
        return info.min if low else info.max
    return {"ReduceProd": 1, "ReduceLogSum": -np.inf, "ReduceLogSumExp": -np.inf}.get(op, 0)


def _reduce_axes(spec: NodeSpec) -> tuple[int, ...]:
    """Reduced axes, sorted; () for the identity (empty axes with noop_with_empty_axes)."""
    rank = len(spec.inputs[0].shape)
    axes = spec.attr("axes")
    if axes is None and len(spec.inputs) > 1 and spec.inputs[1] is not None:  # ops without a canonical form
        if spec.consts[1] is None:
            raise UnsupportedOpError(f"{spec.op} node {spec.name!r}: axes must be known at compile time")
        axes = spec.consts[1].reshape(-1).tolist()
    axes = [axes] if isinstance(axes, int) else list(axes or [])
    if not axes:
        return () if spec.attr("noop_with_empty_axes", 0) else tuple(range(rank))
    return tuple(sorted({_axis(spec, int(a), rank) for a in axes}))


def reduction(spec: NodeSpec) -> Kernel:
    dt = np.dtype(spec.outputs[0].dtype)
    axes = _reduce_axes(spec)
    count = int(np.prod([spec.inputs[0].shape[a] for a in axes]))
    if count == 0:  # over no elements: every output is the empty set's value
        value = _empty_set(spec.op, dt)
        fill = dt.type(value if dt.kind == "f" or np.isfinite(value) else 0)  # integers have no -inf
        return BoundKernel(lambda ins, outs, _s: lambda: outs[0].fill(fill))
    if spec.op == "ReduceLogSumExp":
        return _log_sum_exp(spec)
    f, pre = _REDUCE[spec.op]
    keep = bool(spec.attr("keepdims", 1))
    mean = spec.op == "ReduceMean" and count != 1
    scale = dt.type(1 / count) if mean and dt.kind == "f" else None
    post = np.sqrt if spec.op == "ReduceL2" else np.log if spec.op == "ReduceLogSum" else None

    def make(ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        x, y = ins[0], outs[0]
        src = scratch_view(scratch[0], x.shape, x.dtype) if pre else x

        def run() -> None:
            if pre is not None:
                pre(x, out=src)
            f.reduce(src, axis=axes, keepdims=keep, out=y)
            if scale is not None:
                np.multiply(y, scale, out=y)
            elif mean:  # integer mean: truncated like onnx.reference's astype
                np.divide(y, count, out=y, casting="unsafe")
            if post is not None:
                post(y, out=y)
        return run
    return BoundKernel(make, (spec.inputs[0].nbytes,) if pre else ())


def _log_sum_exp(spec: NodeSpec) -> Kernel:
    dt = np.dtype(spec.outputs[0].dtype)
    axes = _reduce_axes(spec)
    keep = bool(spec.attr("keepdims", 1))
    shape = spec.inputs[0].shape
    kept = tuple(1 if d in axes else n for d, n in enumerate(shape))

    def make(ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        x, y = ins[0], outs[0]
        m = scratch_view(scratch[0], kept, dt)
        t = scratch_view(scratch[1], x.shape, dt)
        yk = y.reshape(kept)

        def run() -> None:
            np.maximum.reduce(x, axis=axes, keepdims=True, out=m)
            np.subtract(x, m, out=t)
            np.exp(t, out=t)
            np.add.reduce(t, axis=axes, keepdims=keep, out=y)
            np.log(y, out=y)
            np.add(yk, m, out=yk)
        return run
    return BoundKernel(make, (int(np.prod(kept)) * dt.itemsize, spec.inputs[0].nbytes))


def arg(spec: NodeSpec) -> Kernel:
    shape = spec.inputs[0].shape
    rank = len(shape)
    axis = _axis(spec, int(spec.attr("axis", 0)), rank)
    last = bool(spec.attr("select_last_index", 0))
    f = np.argmax if spec.op == "ArgMax" else np.argmin
    reduced = shape[:axis] + shape[axis + 1:]
    if axis == rank - 1 and not last:
        return BoundKernel(lambda ins, outs, _s: lambda: f(ins[0], axis=axis, out=outs[0].reshape(reduced)))
    # np.argmax copies any input whose axis is not last and contiguous: here the copy (axis moved last,
    # reversed for the last extreme index) goes to scratch instead.
    moved = reduced + (shape[axis],)
    top = np.int64(shape[axis] - 1)

    def make(ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        src = np.moveaxis(ins[0], axis, -1)[..., ::-1] if last else np.moveaxis(ins[0], axis, -1)
        t = scratch_view(scratch[0], moved, ins[0].dtype)
        y = outs[0].reshape(reduced)

        def run() -> None:
            np.copyto(t, src)
            f(t, axis=-1, out=y)
            if last:  # the first extreme of the reversed axis, counted from the end
                np.subtract(top, y, out=y)
        return run
    return BoundKernel(make, (spec.inputs[0].nbytes,))


KERNELS = {
    "Softmax": softmax, "LogSoftmax": softmax, **{op: reduction for op in _REDUCE}, "ReduceLogSumExp": reduction,
    "ArgMax": arg, "ArgMin": arg, "Hardmax": hardmax,
}
