"""N-D pooling: MaxPool, AveragePool and LpPool for any spatial rank, MaxPool's Indices, the global pools.

Windows are reduced separably, one axis at a time from the last (sum(k) - nd passes instead of prod(k) - 1),
over blocks of channels so the padded copy and the partial reductions stay within _BUDGET bytes of scratch.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np

from ctxrt.backends.cpu.elementwise import BoundKernel
from ctxrt.backends.cpu.image.window import PaddedND, tap
from ctxrt.backends.cpu.nn import _window
from ctxrt.backends.kernel import Kernel, Launch, NodeSpec, scratch_view
from ctxrt.errors import UnsupportedOpError

_BUDGET = 1 << 20  # bytes of scratch per block of channels


def _lowest(dt: np.dtype) -> Any:
    return dt.type(-np.inf) if dt.kind == "f" else np.iinfo(dt).min


def _float_only(spec: NodeSpec) -> np.dtype:
    dt = np.dtype(spec.inputs[0].dtype)
    if dt.kind != "f":
        raise UnsupportedOpError(f"{spec.op} node {spec.name!r}: dtype {dt} is not supported")
    return dt


def _lp_power(spec: NodeSpec) -> int:
    p = int(spec.attr("p", 2))
    if p < 1:
        raise UnsupportedOpError(f"{spec.op} node {spec.name!r}: attribute p={p} is not supported")
    return p


class _Geometry:
    def __init__(self, spec: NodeSpec) -> None:
        self.kernel = tuple(int(k) for k in spec.attr("kernel_shape"))
        self.strides, self.dil, self.pb, self.pe = _window(spec, self.kernel)
        self.n, self.c, *sp = spec.inputs[0].shape
        self.sp, self.osp = tuple(sp), tuple(spec.outputs[0].shape[2:])
        self.dt = np.dtype(spec.outputs[0].dtype)

    def padded(self, channels: int, fill: Any, always: bool = False) -> PaddedND:
        return PaddedND(channels, self.sp, self.osp, self.kernel, self.strides, self.dil, self.pb, self.dt, fill,
                        always)

    def channel_block(self, per_channel_bytes: int) -> int:
        return max(1, min(self.c, _BUDGET // max(1, per_channel_bytes)))

    def avg_divisor(self, include_pad: bool) -> np.ndarray:
        """1 / (taps inside the input, or inside input + explicit pads), per output position: separable."""
        inv = np.ones((), np.float64)
        for s, o, k, st, d, b, e in zip(self.sp, self.osp, self.kernel, self.strides, self.dil, self.pb, self.pe,
                                        strict=True):
            lo, hi = (-b, s + e) if include_pad else (0, s)
            pos = (np.arange(o) * st - b)[:, None] + np.arange(k) * d
            count = np.maximum(((pos >= lo) & (pos < hi)).sum(axis=1), 1)
            inv = np.multiply.outer(inv, 1.0 / count)
        return inv.astype(self.dt)


class SeparablePool(Kernel):
    """max / sum over windows, one axis per pass; AveragePool scales by the divisor, LpPool sums |x|^p."""

    def __init__(self, spec: NodeSpec) -> None:
        geo = self.geo = _Geometry(spec)
        dt = geo.dt
        self.op = spec.op
        if spec.op != "MaxPool":
            _float_only(spec)
        self.combine = np.fmax if spec.op == "MaxPool" else np.add  # a NaN skipped, as onnxruntime's MLAS skips it
        fill = _lowest(dt) if spec.op == "MaxPool" else 0.0
        self.p = _lp_power(spec) if spec.op == "LpPool" else None
        self.inv = geo.avg_divisor(bool(spec.attr("count_include_pad", 0))) if spec.op == "AveragePool" else None
        probe = geo.padded(1, fill, always=self.p is not None)
        # Axes with a 1-wide kernel are a strided view; the others are reduced from the last axis to the first.
        self.trim = (slice(None), *(slice(None) if k > 1 else tap(0, o, st, 1)
                                    for k, o, st in zip(geo.kernel, geo.osp, geo.strides, strict=True)))
        cur = [o if k == 1 else p for k, o, p in zip(geo.kernel, geo.osp, probe.psp, strict=True)]
        self.stages = []
        for a in reversed(range(len(cur))):
            if geo.kernel[a] > 1:
                cur[a] = geo.osp[a]
                self.stages.append((a, tuple(cur)))
        temps = [math.prod(shape) for _, shape in self.stages[:-1]]
        self.temp = [max(temps[0::2], default=0), max(temps[1::2], default=0)]
        per_channel = (math.prod(probe.psp) * probe.needed + sum(self.temp)) * dt.itemsize
        self.cb = geo.channel_block(per_channel)
        self.pad = geo.padded(self.cb, fill, always=self.p is not None)
        self.scratch = (self.pad.nbytes, *(self.cb * t * dt.itemsize for t in self.temp))

    def bind(self, ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        geo, dt = self.geo, self.geo.dt
        plan = []
        for b in range(geo.n):
            for c0 in range(0, geo.c, self.cb):
                k = min(self.cb, geo.c - c0)
                x = ins[0][b, c0:c0 + k]
                padded = self.pad.view(scratch[0], k) if self.pad.needed else None
                src = (padded if padded is not None else x)[self.trim]
                steps = []
                for j, (a, shape) in enumerate(self.stages):
                    last = j == len(self.stages) - 1
                    dst = outs[0][b, c0:c0 + k] if last else scratch_view(scratch[1 + j % 2], (k, *shape), dt)
                    taps = [src[(slice(None),) * (a + 1) + (tap(t, geo.osp[a], geo.strides[a], geo.dil[a]),)]
                            for t in range(geo.kernel[a])]
                    steps.append((dst, taps))
                    src = dst
                plan.append((x, padded, steps, src, outs[0][b, c0:c0 + k]))
        combine, pad, p, inv = self.combine, self.pad, self.p, self.inv

        def run() -> None:
            for x, padded, steps, last, out in plan:
                if padded is not None:
                    inner = pad.refresh(x, padded)
                    if p is not None:
                        _power(inner, p)
                for dst, taps in steps:
                    np.copyto(dst, taps[0])
                    for t in taps[1:]:
                        combine(dst, t, out=dst)
                if not steps:  # every kernel axis 1-wide: the windows are the trimmed view itself
                    np.copyto(out, last)
                if inv is not None:
                    np.multiply(out, inv, out=out)
                if p is not None:
                    _root(out, p)
        return run


def _power(a: np.ndarray, p: int) -> None:
    np.abs(a, out=a)
    if p == 2:
        np.square(a, out=a)
    elif p > 2:
        np.power(a, p, out=a)


def _root(a: np.ndarray, p: int) -> None:
    if p == 2:
        np.sqrt(a, out=a)
    elif p > 2:
        np.power(a, 1.0 / p, out=a)


def pool(spec: NodeSpec) -> Kernel:
    return SeparablePool(spec)


class MaxPoolIndices(Kernel):
    """MaxPool with its Indices output: every tap compared in turn (the first maximum wins, as in onnxruntime and
    the reference), the winning tap's number kept; the flat input index is then base(output) + offset(tap), both
    linear in the coordinates (row-major, or column-major over the spatial axes with storage_order=1)."""

    def __init__(self, spec: NodeSpec) -> None:
        geo = self.geo = _Geometry(spec)
        order = int(spec.attr("storage_order", 0))
        dims = geo.sp[::-1] if order == 0 else geo.sp
        st = list(itertools.accumulate((1, *dims[:-1]), lambda a, d: a * d))
        strides = st[::-1] if order == 0 else st
        self.taps = list(itertools.product(*(range(k) for k in geo.kernel)))
        self.tap_offset = np.array([sum(t * d * s for t, d, s in zip(tp, geo.dil, strides, strict=True))
                                    for tp in self.taps], np.int64)
        base = np.zeros((), np.int64)
        for o, s, b, stride in zip(geo.osp, geo.strides, geo.pb, strides, strict=True):
            base = np.add.outer(base, (np.arange(o, dtype=np.int64) * s - b) * stride)
        self.base = base
        self.step = math.prod(geo.sp)
        npos = math.prod(geo.osp)
        probe = geo.padded(1, _lowest(geo.dt))
        self.cb = geo.channel_block(math.prod(probe.psp) * probe.needed * geo.dt.itemsize + npos * 9)
        self.pad = geo.padded(self.cb, _lowest(geo.dt))
        self.scratch = (self.pad.nbytes, self.cb * npos, self.cb * npos * np.dtype(np.intp).itemsize)

    def bind(self, ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        geo = self.geo
        plan = []
        for b in range(geo.n):
            for c0 in range(0, geo.c, self.cb):
                k = min(self.cb, geo.c - c0)
                x = ins[0][b, c0:c0 + k]
                padded = self.pad.view(scratch[0], k) if self.pad.needed else None
                src = padded if padded is not None else x
                views = [src[(slice(None), *(tap(t, o, s, d) for t, o, s, d in
                                             zip(tp, geo.osp, geo.strides, geo.dil, strict=True)))]
                         for tp in self.taps]
                mask = scratch_view(scratch[1], (k, *geo.osp), np.bool_)
                won = scratch_view(scratch[2], (k, *geo.osp), np.intp)
                chan = ((b * geo.c + c0 + np.arange(k, dtype=np.int64)) * self.step).reshape(-1, *[1] * len(geo.osp))
                plan.append((x, padded, views, outs[0][b, c0:c0 + k], outs[1][b, c0:c0 + k], mask, won, chan))
        pad, offset, base = self.pad, self.tap_offset, self.base

        def run() -> None:
            for x, padded, views, best, index, mask, won, chan in plan:
                if padded is not None:
                    pad.refresh(x, padded)
                np.copyto(best, views[0])
                won.fill(0)
                for t, v in enumerate(views[1:], 1):
                    np.greater(v, best, out=mask)
                    np.copyto(best, v, where=mask)
                    np.copyto(won, t, where=mask)
                np.take(offset, won, out=index, mode="clip")
                np.add(index, base, out=index)
                np.add(index, chan, out=index)
        return run


def maxpool_with_indices(spec: NodeSpec) -> Kernel:
    return MaxPoolIndices(spec)


def global_pool(spec: NodeSpec) -> Kernel:
    """GlobalMaxPool / GlobalLpPool over a contiguous (N*C, spatial) view, LpPool in blocks of rows."""
    dt = _float_only(spec)
    shape = spec.inputs[0].shape
    rows, cols = math.prod(shape[:2]), math.prod(shape[2:])
    if spec.op == "GlobalMaxPool":
        def make_max(i: list[Any], o: list[Any], s: list[Any]) -> Launch:
            x, y = i[0].reshape(rows, cols), o[0].reshape(rows)
            return lambda: np.maximum.reduce(x, axis=1, out=y)
        return BoundKernel(make_max)
    p = _lp_power(spec)
    rb = max(1, min(rows, _BUDGET // max(1, cols * dt.itemsize)))

    def make_lp(i: list[Any], o: list[Any], s: list[Any]) -> Launch:
        x, y = i[0].reshape(rows, cols), o[0].reshape(rows)
        blocks = [(x[r0:r0 + rb], scratch_view(s[0], (min(rb, rows - r0), cols), dt), y[r0:r0 + rb])
                  for r0 in range(0, rows, rb)]

        def run() -> None:
            for xb, t, yb in blocks:
                np.copyto(t, xb)
                _power(t, p)
                np.add.reduce(t, axis=1, out=yb)
            _root(y, p)
        return run
    return BoundKernel(make_lp, (rb * cols * dt.itemsize,))
