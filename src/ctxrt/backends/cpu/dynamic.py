"""Ops whose output size depends on their input values (ir/dynamic.py): each output is planned at an upper
bound along one axis; the kernel fills its leading part, zeroes the rest, and writes the real size into its
last output (an int64 scalar).

NonZero and Compress allocate nothing: the positions of the selected elements come from a cumulative sum
and one `put` into scratch (unselected elements go to a spare slot past the end). Unique and
NonMaxSuppression sort, and NumPy's sorts return new arrays: they allocate temporaries each run.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ctxrt.backends.cpu.elementwise import BoundKernel
from ctxrt.backends.kernel import Kernel, Launch, NodeSpec, scratch_view
from ctxrt.errors import UnsupportedOpError


def _fail(spec: NodeSpec, what: str) -> UnsupportedOpError:
    return UnsupportedOpError(f"{spec.op} node {spec.name!r}: {what}")


def _select_scratch(n: int) -> tuple[int, ...]:
    """mask (n bools), target slot per element (n), 0..n-1 (n), selected positions (n + 1 spare)."""
    return max(n, 1), 8 * max(n, 1), 8 * max(n, 1), 8 * (n + 1)


class _Selector:
    """Positions of the true elements of a flat bool array, in order, without allocating."""

    def __init__(self, scratch: list[Any], n: int) -> None:
        self.n = n
        self.mask = scratch_view(scratch[0], (n,), np.bool_)
        self.slot = scratch_view(scratch[1], (n,), np.int64)
        self.ramp = scratch_view(scratch[2], (n,), np.int64)
        self.picked = scratch_view(scratch[3], (n + 1,), np.int64)

    def __call__(self) -> int:
        """Reads self.mask; returns how many are true, their positions in self.picked[:count]."""
        mask, slot, ramp, n = self.mask, self.slot, self.ramp, self.n
        if n == 0:
            return 0
        count = int(np.count_nonzero(mask))
        np.copyto(slot, mask)  # a cumsum from bool into int64 would cast through a temporary
        np.add.accumulate(slot, out=slot)  # (np.cumsum grows a cache over its first thousand calls)
        np.subtract(slot, 1, out=slot)
        np.logical_not(mask, out=mask)
        np.copyto(slot, n, where=mask)  # unselected: the spare slot
        ramp.fill(1)
        np.add.accumulate(ramp, out=ramp)
        np.subtract(ramp, 1, out=ramp)
        self.picked.put(slot, ramp)
        return count


def nonzero(spec: NodeSpec) -> Kernel:
    shape = spec.inputs[0].shape or (1,)
    n = int(np.prod(shape))
    strides = [int(np.prod(shape[d + 1:])) for d in range(len(shape))]

    def make(ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        x, y, extent = ins[0].reshape(-1), outs[0].reshape(len(shape), n), outs[1]
        select = _Selector(scratch, n)

        def run() -> None:
            np.not_equal(x, 0, out=select.mask)
            count = select()
            flat = select.picked[:count]
            for d, (stride, dim) in enumerate(zip(strides, shape, strict=True)):
                row = y[d, :count]
                np.floor_divide(flat, stride, out=row)
                np.remainder(row, dim, out=row)
            y[:, count:] = 0
            extent[...] = count
        return run
    return BoundKernel(make, _select_scratch(n))


def compress(spec: NodeSpec) -> Kernel:
    xshape, (clen,) = spec.inputs[0].shape, spec.inputs[1].shape
    axis = spec.attr("axis")
    flat = axis is None
    if flat:
        xshape, axis = (int(np.prod(xshape)),), 0
    m = min(clen, xshape[axis])
    dt = np.dtype(spec.inputs[0].dtype)
    rows = int(np.prod(xshape)) // xshape[axis] if xshape[axis] else 0
    before = (slice(None),) * axis

    def make(ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        x = ins[0].reshape(xshape)
        cond = ins[1].reshape(-1)[:m]
        y = outs[0].reshape(*xshape[:axis], m, *xshape[axis + 1:])
        extent = outs[1]
        select = _Selector(scratch, m)
        packed = scratch_view(scratch[4], (m * rows,), dt)  # the selected slices, contiguous

        def run() -> None:
            np.not_equal(cond, 0, out=select.mask)
            count = select()
            part = packed[:count * rows].reshape(*xshape[:axis], count, *xshape[axis + 1:])
            np.take(x, select.picked[:count], axis=axis, out=part, mode="clip")
            np.copyto(y[(*before, slice(0, count))], part)
            y[(*before, slice(count, None))] = 0
            extent[...] = count
        return run
    return BoundKernel(make, (*_select_scratch(m), max(1, m * rows * dt.itemsize)))


def unique(spec: NodeSpec) -> Kernel:
    axis = spec.attr("axis")
    ordered = bool(spec.attr("sorted", 1))

    def make(ins: list[Any], outs: list[Any], _s: list[Any]) -> Launch:
        x = ins[0]
        y, first, inverse, counts, extent = outs
        ax = 0 if axis is None else axis
        y_moved = np.moveaxis(y, ax, 0)

        def run() -> None:
            values, idx, inv, cnt = np.unique(x if axis is not None else x.reshape(-1), return_index=True,
                                              return_inverse=True, return_counts=True, axis=axis, equal_nan=False)
            if not ordered:  # first-occurrence order
                order = np.argsort(idx, kind="stable")
                rank = np.empty_like(order)
                rank[order] = np.arange(order.size)
                values, idx, cnt, inv = np.take(values, order, axis=ax), idx[order], cnt[order], rank[inv.reshape(-1)]
            count = idx.size
            np.copyto(y_moved[:count], np.moveaxis(values, ax, 0))
            y_moved[count:] = 0
            first[:count], first[count:] = idx, 0
            counts[:count], counts[count:] = cnt, 0
            inverse[...] = inv.reshape(-1)
            extent[...] = count
        return run
    return BoundKernel(make)


def _corners(boxes: np.ndarray, center: int) -> tuple[np.ndarray, ...]:
    """(y_min, x_min, y_max, x_max) of [N, 4] boxes: corners in any order, or centers and sizes."""
    if center:
        xc, yc, w, h = boxes.T
        return yc - h / 2, xc - w / 2, yc + h / 2, xc + w / 2
    y1, x1, y2, x2 = boxes.T
    return np.minimum(y1, y2), np.minimum(x1, x2), np.maximum(y1, y2), np.maximum(x1, x2)


def _suppressed(c: tuple[np.ndarray, ...], top: int, rest: np.ndarray, iou_threshold: np.float32) -> np.ndarray:
    """Which of `rest` the box `top` suppresses: IoU > threshold, as onnxruntime computes it (float32, boxes
    without area or overlap never suppressed)."""
    y0, x0, y1, x1 = c
    iy0, ix0 = np.maximum(y0[top], y0[rest]), np.maximum(x0[top], x0[rest])
    iy1, ix1 = np.minimum(y1[top], y1[rest]), np.minimum(x1[top], x1[rest])
    inter = (ix1 - ix0) * (iy1 - iy0)
    area_top = (x1[top] - x0[top]) * (y1[top] - y0[top])
    area = (x1[rest] - x0[rest]) * (y1[rest] - y0[rest])
    union = area_top + area - inter
    ok = (ix1 > ix0) & (iy1 > iy0) & (inter > 0) & (area_top > 0) & (area > 0) & (union > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        return ok & (inter / np.where(union > 0, union, 1) > iou_threshold)


def non_max_suppression(spec: NodeSpec) -> Kernel:
    limit = spec.consts[2] if len(spec.consts) > 2 else None
    if len(spec.inputs) > 2 and spec.inputs[2] is not None and limit is None:
        raise _fail(spec, "max_output_boxes_per_class must be known at compile time (it sizes the output)")
    per_class = int(np.asarray(limit).reshape(-1)[0]) if limit is not None else 0
    center = int(spec.attr("center_point_box", 0))
    if center not in (0, 1):
        raise _fail(spec, f"center_point_box={center} is not 0 or 1")

    def make(ins: list[Any], outs: list[Any], _s: list[Any]) -> Launch:
        boxes, scores = ins[0], ins[1]
        iou_in = ins[3] if len(ins) > 3 else None
        score_in = ins[4] if len(ins) > 4 else None
        y, extent = outs

        def run() -> None:
            iou = np.float32(iou_in.reshape(-1)[0]) if iou_in is not None else np.float32(0)
            count = 0
            for b in range(scores.shape[0]):
                corners = _corners(boxes[b].astype(np.float32), center)
                for c in range(scores.shape[1]):
                    s = scores[b, c]
                    cand = np.arange(s.size) if score_in is None else np.flatnonzero(s > score_in.reshape(-1)[0])
                    cand = cand[np.argsort(-s[cand], kind="stable")]
                    taken = 0
                    while cand.size and taken < per_class:
                        top = cand[0]
                        y[count] = (b, c, top)
                        count, taken = count + 1, taken + 1
                        rest = cand[1:]
                        cand = rest[~_suppressed(corners, top, rest, iou)]
            y[count:] = 0
            extent[...] = count
        return run
    return BoundKernel(make)


KERNELS = {"NonZero": nonzero, "Compress": compress, "Unique": unique, "NonMaxSuppression": non_max_suppression}
