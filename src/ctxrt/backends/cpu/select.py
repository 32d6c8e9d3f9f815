"""Ops that select or accumulate along an axis: TopK, Trilu, CumSum."""

from __future__ import annotations

from typing import Any

import numpy as np

from ctxrt.backends.cpu.elementwise import BoundKernel
from ctxrt.backends.kernel import Kernel, Launch, NodeSpec, scratch_view
from ctxrt.errors import UnsupportedOpError


def _fail(spec: NodeSpec, what: str) -> UnsupportedOpError:
    return UnsupportedOpError(f"{spec.op} node {spec.name!r}: {what} is not supported")


def _axis(spec: NodeSpec, axis: int, rank: int) -> int:
    if not -rank <= axis < rank:
        raise _fail(spec, f"attribute 'axis' value {axis} (input rank {rank})")
    return axis % rank


_UNSIGNED = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


class TopK(Kernel):
    """The k largest (smallest) elements along an axis and their int64 indices, sorted, ties to the lower index
    (onnxruntime's order; with sorted=0 too).

    Each element becomes an unsigned key whose integer order is the wanted order (float bits with the sign
    folded, -0 made +0 first; signed ints with the sign bit flipped; complemented for largest). For types up to
    32 bits the key and the element's index are packed into one uint64, so an in-place partition then a sort of
    the first k keys gives values and indices in order with ties resolved; 64-bit types sort (key, index)
    records instead (a slower generic compare). Nothing is allocated: argsort would."""

    def __init__(self, spec: NodeSpec) -> None:
        shape = spec.inputs[0].shape
        self.dt = dt = np.dtype(spec.inputs[0].dtype)
        if dt.kind not in "biuf":
            raise _fail(spec, f"dtype {dt}")
        rank = len(shape)
        self.axis = axis = _axis(spec, int(spec.attr("axis", -1)), rank)
        k = spec.attr("k")
        if k is None:
            raise _fail(spec, "input K unknown at compile time")
        self.k = k = int(np.asarray(k).reshape(-1)[0])
        self.n = n = shape[axis]
        if not 0 <= k <= n:
            raise _fail(spec, f"K = {k} for an axis of {n}")
        self.largest = bool(spec.attr("largest", 1))
        self.moved = shape[:axis] + shape[axis + 1:] + (n,)  # the axis last
        self.perm = tuple(d for d in range(rank) if d != axis) + (axis,)
        self.rows = int(np.prod(self.moved[:-1]))
        self.packed = dt.itemsize <= 4
        inner = int(np.prod(shape[axis + 1:]))
        strides = np.array([int(np.prod(shape[d + 1:])) for d in self.perm[:-1]], np.int64)
        grid = np.indices(self.moved[:-1], dtype=np.int64).reshape(len(self.moved) - 1, self.rows)  # (0, 1) at rank 1
        self.base = (strides @ grid if grid.size else np.zeros(self.rows, np.int64)).reshape(self.moved[:-1] + (1,))
        self.stride = inner
        m, kk = int(np.prod(self.moved)), max(k, 1)
        key_bytes = 8 if self.packed else 16
        self.scratch = (m * key_bytes, m * dt.itemsize, m * 8, self.rows * kk * 8)

    def _keys(self, src: np.ndarray, copy: np.ndarray, kv: np.ndarray, t: np.ndarray) -> list:
        """Steps writing the order-preserving keys of src (x with the axis last) into kv (uint64)."""
        dt, w = self.dt, self.dt.itemsize * 8
        wmask, sign = np.uint64((1 << w) - 1), np.uint64(1 << (w - 1))
        bits = copy.view(_UNSIGNED[dt.itemsize])
        flip = wmask if self.largest else np.uint64(0)
        steps: list = []
        if dt.kind == "f":
            steps.append((np.add, (src, dt.type(0)), copy))  # -0 -> +0: equal values tie on the index
        else:
            steps.append((np.copyto, (copy, src), None))
        steps.append((np.copyto, (kv, bits), None))
        if dt.kind == "f":  # negative: all bits flipped; positive: the sign bit set
            steps += [(np.right_shift, (kv, np.uint64(w - 1)), t), (np.multiply, (t, wmask ^ sign), t),
                      (np.bitwise_xor, (t, sign ^ flip), t), (np.bitwise_xor, (kv, t), kv)]
        elif dt.kind == "i":
            steps.append((np.bitwise_xor, (kv, sign ^ flip), kv))
        elif self.largest:
            steps.append((np.bitwise_xor, (kv, flip), kv))
        return steps

    def bind(self, ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        k, n, dt = self.k, self.n, self.dt
        if k == 0:
            return lambda: None
        x = ins[0]
        src = x.transpose(self.perm)
        copy = scratch_view(scratch[1], self.moved, dt)
        t = scratch_view(scratch[2], self.moved, np.uint64)
        vals = outs[0].transpose(self.perm)
        idx = outs[1].transpose(self.perm).view(np.uint64)
        off = scratch_view(scratch[3], self.moved[:-1] + (k,), np.int64)
        index = np.arange(n, dtype=np.uint64)
        if self.packed:
            keys = scratch_view(scratch[0], self.moved, np.uint64)
            kv = keys
            finish = [(np.left_shift, (keys, np.uint64(32)), keys), (np.bitwise_or, (keys, index), keys)]
            top = keys[..., :k]
            extract = (np.bitwise_and, (top, np.uint64(0xFFFFFFFF)), idx)
        else:
            keys = scratch_view(scratch[0], self.moved, np.dtype([("k", "<u8"), ("i", "<u8")]))
            kv = keys["k"]
            finish = [(np.copyto, (keys["i"], index), None)]
            top = keys[..., :k]
            extract = (np.copyto, (idx, top["i"]), None)
        steps = self._keys(src, copy, kv, t) + finish
        xflat, base, stride = x.reshape(-1), self.base, self.stride
        partial = k < n

        def run() -> None:
            for f, args, out in steps:
                if out is None:
                    f(*args)
                else:
                    f(*args, out=out)
            if partial:
                keys.partition(k - 1, axis=-1)
            top.sort(axis=-1)
            f, args, out = extract
            if out is None:
                f(*args)
            else:
                f(*args, out=out)
            np.multiply(idx, stride, out=off, casting="unsafe")
            np.add(off, base, out=off)
            np.take(xflat, off, out=vals, mode="clip")
        return run


def topk(spec: NodeSpec) -> Kernel:
    return TopK(spec)


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


def cumsum(spec: NodeSpec) -> Kernel:
    shape = spec.inputs[0].shape
    axis = spec.attr("axis")
    if axis is None:
        raise _fail(spec, "input axis unknown at compile time")
    axis = _axis(spec, int(np.asarray(axis).reshape(-1)[0]), len(shape))
    exclusive, reverse = bool(spec.attr("exclusive", 0)), bool(spec.attr("reverse", 0))
    dt = np.dtype(spec.outputs[0].dtype)
    flip = (slice(None),) * axis + (slice(None, None, -1),)
    first = (slice(None),) * axis + (slice(0, 1),)
    head = (slice(None),) * axis + (slice(0, -1),)
    tail = (slice(None),) * axis + (slice(1, None),)

    def make(ins: list[Any], outs: list[Any], _s: list[Any]) -> Launch:
        x, y = ins[0], outs[0]
        if reverse:  # a running sum from the end: the same on reversed views
            x, y = x[flip], y[flip]
        if not exclusive:
            return lambda: np.cumsum(x, axis=axis, dtype=dt, out=y)
        src, dst, start = x[head], y[tail], y[first]  # y[0] = 0, y[i] = x[0] + ... + x[i - 1]

        def run() -> None:
            start.fill(0)
            np.cumsum(src, axis=axis, dtype=dt, out=dst)
        return run
    return BoundKernel(make)


KERNELS = {"TopK": topk, "Trilu": trilu, "CumSum": cumsum}
