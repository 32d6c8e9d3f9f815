"""Resize (opsets 10-19) and Upsample: separable resampling, one resized axis at a time.

Every mode of the spec is separable (onnx.reference computes it that way too), so at build time each resized
axis gets a table: for each output position, the input positions it reads (clamped to the input, as the spec's
edge padding does) and their weights. A run is then, per axis, np.take gathers along that axis and a weighted
sum into the next buffer (the output for the last axis), over blocks of the leading unresized axes so the
intermediates stay small. tf_crop_and_resize's extrapolated positions are filled at the end.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from ctxrt.backends.cpu import native
from ctxrt.backends.kernel import Kernel, Launch, NodeSpec, scratch_view
from ctxrt.errors import UnsupportedOpError

_BUDGET = 1 << 20  # bytes of intermediates per block of leading rows

# x_original from the output coordinate y, as the spec writes it (lengths are the integer ones).
Coord = Callable[[np.ndarray, float, int, int, tuple[float, float]], np.ndarray]
COORDS: dict[str, Coord] = {
    "half_pixel": lambda y, s, n, m, roi: (y + 0.5) / s - 0.5,
    "half_pixel_symmetric": lambda y, s, n, m, roi: n / 2 * (1 - m / (s * n)) + (y + 0.5) / s - 0.5,
    "pytorch_half_pixel": lambda y, s, n, m, roi: (y + 0.5) / s - 0.5 if m > 1 else 0 * y,
    "align_corners": lambda y, s, n, m, roi: y * (n - 1) / (m - 1) if m > 1 else 0 * y,
    "asymmetric": lambda y, s, n, m, roi: y / s,
    "tf_half_pixel_for_nn": lambda y, s, n, m, roi: (y + 0.5) / s,
    "tf_crop_and_resize": lambda y, s, n, m, roi: _crop(y, n, m, *np.float32(roi)),
}


def _crop(y: np.ndarray, n: int, m: int, lo: np.float32, hi: np.float32) -> np.ndarray:
    """tf_crop_and_resize's coordinates with the roi's float32 products rounded as onnx.reference and onnxruntime
    round them: lo (n - 1) = 0.1 x 5 is exactly 0.5 there, a nearest tie, and 0.50000000745 in float64."""
    start = float(lo * np.float32(n - 1))
    if m == 1:
        return 0 * y + start + float((hi - lo) * np.float32(n - 1) / np.float32(2))
    return start + y * float(hi - lo) * (n - 1) / (m - 1)
# Which of the two neighbours (floor, floor + 1) nearest picks, from the fraction r in (0, 1).
NEAREST: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "round_prefer_floor": lambda r: r > 0.5, "round_prefer_ceil": lambda r: r >= 0.5,
    "floor": lambda r: r < 0, "ceil": lambda r: r >= 0,
}


def _cubic(x: np.ndarray, a: float) -> np.ndarray:
    """Keys' cubic convolution kernel with coefficient a at distances x."""
    x = np.abs(x)
    near = ((a + 2) * x - (a + 3)) * x * x + 1
    far = ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
    return np.where(x <= 1, near, np.where(x < 2, far, 0.0))


def _filter(mode: str, ratio: np.ndarray, scale: float, a: float, antialias: bool) -> np.ndarray:
    """(out, taps) weights of the taps at offsets start..start+taps-1 from floor(x), as onnx.reference: the filter
    stretched by 1/scale when antialiasing a downsample."""
    support = 1 if mode == "linear" else 2
    s = min(scale, 1.0) if antialias else 1.0
    start = math.floor(-support / s) + 1
    dist = (np.arange(start, 2 - start)[None, :] - ratio[:, None]) * s
    w = np.clip(1 - np.abs(dist), 0, 1) if mode == "linear" else _cubic(dist, a)
    return w / w.sum(axis=1, keepdims=True) if antialias else w


class AxisTable:
    """Input positions (out, taps) and weights (or None for a single tap) of one resized axis, and the output
    ranges that tf_crop_and_resize sets to the extrapolation value."""

    def __init__(self, spec: NodeSpec, p: dict[str, Any], n: int, m: int, scale: float,
                 roi: tuple[float, float]) -> None:
        y = np.arange(m, dtype=np.float64)
        x = COORDS[p["coord"]](y, scale, n, m, roi)
        floor = np.floor(x)
        ratio = np.where(x == floor, 1.0, x - floor)  # an exact position takes the right neighbour at 1
        self.outside = _runs((x < 0) | (x > n - 1)) if p["coord"] == "tf_crop_and_resize" else []
        if p["mode"] == "nearest":
            if p["nearest"] == "legacy":  # Resize-10 and Upsample (onnxruntime): truncate, ceil when shrinking
                pick = np.ceil(x) if scale < 1 else np.trunc(x)
            else:
                pick = np.where((ratio == 1) | NEAREST[p["nearest"]](ratio), floor + (ratio < 1), floor)
            self.index = np.clip(pick, 0, n - 1).astype(np.intp)[:, None]
            self.weights = None
            return
        w = _filter(p["mode"], ratio, scale, p["cubic_a"], p["antialias"])
        taps = w.shape[1]
        # the taps-nearest positions to x, ties to the smaller, as the reference's edge-padded neighbourhood
        half = taps // 2
        first = np.where(ratio == 1, floor - half, floor - half + 1)
        index = first[:, None] + np.arange(taps)
        if p["exclude_outside"]:
            w = np.where((index < 0) | (index > n - 1), 0.0, w)
            total = w.sum(axis=1, keepdims=True)
            w = w / np.where(total == 0, 1.0, total)
        self.index = np.clip(index, 0, n - 1).astype(np.intp)
        self.weights = w


def _runs(mask: np.ndarray) -> list[tuple[int, int]]:
    edges = np.flatnonzero(np.diff(np.concatenate([[0], mask.astype(np.int8), [0]])))
    return list(zip(edges[0::2].tolist(), edges[1::2].tolist(), strict=True))


def _fail(spec: NodeSpec, attr: str, value: Any) -> UnsupportedOpError:
    return UnsupportedOpError(f"{spec.op} node {spec.name!r}: attribute {attr}={value!r} is not supported")


def _choice(spec: NodeSpec, attr: str, default: str, allowed: Any) -> str:
    value = spec.attr(attr, default)
    if value not in allowed:
        raise _fail(spec, attr, value)
    return value


def _params(spec: NodeSpec) -> dict[str, Any]:
    legacy = spec.op == "Upsample" or spec.opset < 11  # no coordinate or nearest mode: asymmetric, truncation
    p = {"mode": _choice(spec, "mode", "nearest", ("nearest", "linear") if legacy else ("nearest", "linear", "cubic")),
         "coord": "asymmetric" if legacy else _choice(spec, "coordinate_transformation_mode", "half_pixel", COORDS),
         "nearest": "legacy" if legacy else _choice(spec, "nearest_mode", "round_prefer_floor", NEAREST),
         "policy": _choice(spec, "keep_aspect_ratio_policy", "stretch", ("stretch", "not_larger", "not_smaller")),
         "cubic_a": float(np.float32(spec.attr("cubic_coeff_a", -0.75))),
         "exclude_outside": bool(spec.attr("exclude_outside", 0)),
         "antialias": bool(spec.attr("antialias", 0)) and spec.attr("mode", "nearest") != "nearest",
         "extrapolation": float(np.float32(spec.attr("extrapolation_value", 0.0)))}
    if p["coord"] == "tf_half_pixel_for_nn" and spec.opset >= 13:
        raise _fail(spec, "coordinate_transformation_mode", p["coord"])
    return p


def _scales(spec: NodeSpec, p: dict[str, Any]) -> tuple[list[float], list[tuple[float, float]]]:
    """Per-axis scale and roi (onnx.reference's rules: sizes give scales, keep_aspect_ratio_policy unifies them), in
    the order the tensors are stored: channels last where the layout pass says so (`channels_last`: the
    attributes name the logical NCHW axes)."""
    shape, out = spec.inputs[0].shape, spec.outputs[0].shape
    last = bool(spec.attr("channels_last", 0)) and len(shape) > 2
    if last:  # stored (N, H, W, C): the logical (N, C, H, W) the attributes follow
        shape = (shape[0], shape[-1], *shape[1:-1])
    r = len(shape)
    # The frontend moved constant inputs to attributes by position: Resize-10's input 1 is its scales.
    scales = spec.attr("scales") if spec.op == "Upsample" or spec.opset >= 11 else spec.attr("roi")
    roi = spec.attr("roi") if spec.op == "Resize" and spec.opset >= 11 else None
    sizes = spec.attr("sizes")
    axes = [a % r for a in spec.attr("axes") or range(r)]
    full = [1.0] * r
    if sizes:
        ratios = {a: sizes[i] / shape[a] for i, a in enumerate(axes)}
        if p["policy"] != "stretch":
            common = (min if p["policy"] == "not_larger" else max)(ratios.values())
            ratios = dict.fromkeys(axes, common)
        for a, s in ratios.items():
            full[a] = s
    elif scales:
        for i, a in enumerate(axes):
            full[a] = float(scales[i])
    else:
        raise UnsupportedOpError(f"{spec.op} node {spec.name!r}: neither scales nor sizes is given (as constants)")
    rois = [(0.0, 1.0)] * r
    if roi:
        k = len(axes)
        for i, a in enumerate(axes):
            rois[a] = (float(roi[i]), float(roi[k + i]))
    elif p["coord"] == "tf_crop_and_resize":
        raise _fail(spec, "roi", roi)
    if any(s <= 0 for s in full) or len(out) != r:
        raise _fail(spec, "scales", full)
    if last:  # back to the stored order
        full, rois = [full[0], *full[2:], full[1]], [rois[0], *rois[2:], rois[1]]
    return full, rois


class Resize(Kernel):
    def __init__(self, spec: NodeSpec) -> None:
        p = _params(spec)
        self.dt = dt = np.dtype(spec.outputs[0].dtype)
        if p["mode"] != "nearest" and dt.kind != "f":
            raise UnsupportedOpError(f"{spec.op} node {spec.name!r}: mode={p['mode']!r} on {dt} is not supported")
        self.in_shape, self.out_shape = tuple(spec.inputs[0].shape), tuple(spec.outputs[0].shape)
        scales, rois = _scales(spec, p)
        self.fill = dt.type(p["extrapolation"]) if p["coord"] == "tf_crop_and_resize" else None
        tables = {}
        for a, (n, m, s, roi) in enumerate(zip(self.in_shape, self.out_shape, scales, rois, strict=True)):
            identity = math.isclose(s, 1.0) and n == m and (self.fill is None or roi == (0.0, 1.0))
            if not identity and m > 0:
                tables[a] = AxisTable(spec, p, n, m, s, roi)
        self.tables = tables
        self.order = min(itertools.permutations(tables), key=self._cost)
        self.lead = min(tables, default=len(self.in_shape))
        self.rows = math.prod(self.in_shape[:self.lead])
        cur, sizes = list(self.in_shape[self.lead:]), []
        for a in self.order:
            cur[a - self.lead] = self.out_shape[a]
            sizes.append(math.prod(cur))
        tmp = max((sz for a, sz in zip(self.order, sizes, strict=True) if tables[a].weights is not None), default=0)
        pingpong = [max(sizes[:-1][0::2], default=0), max(sizes[:-1][1::2], default=0)]
        per_row = (tmp + sum(pingpong)) * dt.itemsize
        self.rb = max(1, min(self.rows, _BUDGET // max(1, per_row)))
        self.scratch = (self.rb * tmp * dt.itemsize, *(self.rb * n * dt.itemsize for n in pingpong))
        self.algorithm = p["mode"]
        # one native pass where the resized axes are two adjacent ones (an image's H and W) followed by at least 8
        # values (channels last: a vector of channels per pixel; planar images, one value a pixel, stay NumPy's:
        # its gathers along the last axis beat scalar blends, 0.20 against 0.50 ms at 4 x 16 x 32 x 48)
        # (the choice is recorded, `native_pass`: a binary loaded where the extension is missing keeps its plan)
        a = self.lead
        fits = dt == np.float32 and a + 1 < len(self.in_shape) and not set(tables) - {a, a + 1} \
            and math.prod(self.in_shape[a + 2:]) >= 8 and not any(t.outside for t in tables.values())
        compiled = spec.attr("native_pass")
        self.native = fits and bool(native.library() is not None if compiled is None else compiled)
        self.attrs = {"native_pass": int(self.native)}
        self.numpy_scratch = self.scratch
        if self.native:  # its scratch: an output row's input rows blended
            row = math.prod(self.in_shape[a + 1:]) * dt.itemsize
            self.scratch, self.algorithm = (row,), f"native:{p['mode']}"
            self.native_axes = [self._native_axis(ax) for ax in (a, a + 1)]  # made once, bound by every launch

    def _cost(self, order: tuple[int, ...]) -> int:
        """Values moved by the gathers in this axis order. A gather along the last axis moves single values, the
        others whole rows (taken as 4x cheaper): shrinking axes go first, growing ones last-axis first
        (nearest 2x on 64 x 80 x 80: 1.12 -> 0.67 ms)."""
        shape, cost = list(self.in_shape), 0
        for a in order:
            shape[a] = self.out_shape[a]
            cost += math.prod(shape) * self.tables[a].index.shape[1] * (4 if a == len(shape) - 1 else 1)
        return cost

    def bind(self, ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        if not self.tables:
            x, y = ins[0], outs[0]
            return lambda: np.copyto(y, x)
        if self.native:
            run = self._native(ins[0], outs[0], scratch[0])
            if run is not None:
                return run
            # (compiled where the extension was, run where it is not: NumPy's passes on scratch of its own)
            scratch = [np.empty(n, np.uint8) for n in self.numpy_scratch]
            self.private_bytes = sum(b.nbytes for b in scratch)
        lead, dt = self.lead, self.dt
        x = ins[0].reshape(self.rows, *self.in_shape[lead:])
        y = outs[0].reshape(self.rows, *self.out_shape[lead:])
        plan = []
        for r0 in range(0, self.rows, self.rb):
            k = min(self.rb, self.rows - r0)
            src, cur = x[r0:r0 + k], [k, *self.in_shape[lead:]]
            for j, a in enumerate(self.order):
                table, ax = self.tables[a], a - lead + 1
                cur[ax] = self.out_shape[a]
                last = j == len(self.order) - 1
                dst = y[r0:r0 + k] if last else scratch_view(scratch[1 + j % 2], tuple(cur), dt)
                tmp = scratch_view(scratch[0], tuple(cur), dt) if table.weights is not None else None
                bshape = (-1,) + (1,) * (len(cur) - ax - 1)
                taps = [(np.ascontiguousarray(table.index[:, t]),
                         None if table.weights is None else table.weights[:, t].astype(dt).reshape(bshape))
                        for t in range(table.index.shape[1])]
                plan.append((src, dst, tmp, ax, taps))
                src = dst
        fills = [y[(slice(None),) * (a - lead + 1) + (slice(s0, s1),)]
                 for a, t in self.tables.items() for s0, s1 in t.outside]
        fill = self.fill

        def run() -> None:
            for src, dst, tmp, ax, taps in plan:
                index, w = taps[0]
                np.take(src, index, axis=ax, out=dst, mode="clip")
                if w is None:
                    continue
                np.multiply(dst, w, out=dst)
                for index, w in taps[1:]:
                    np.take(src, index, axis=ax, out=tmp, mode="clip")
                    np.multiply(tmp, w, out=tmp)
                    np.add(dst, tmp, out=dst)
            for view in fills:
                view.fill(fill)
        return run


    def _native_axis(self, ax: int) -> tuple[np.ndarray, np.ndarray]:
        """(int64 input positions, float32 weights), [out, taps], of one of the native pass's axes (one tap of
        weight 1 where the axis is not resized)."""
        t = self.tables.get(ax)
        if t is None:
            n = self.in_shape[ax]
            return np.arange(n, dtype=np.int64)[:, None], np.ones((n, 1), np.float32)
        w = np.ones(t.index.shape, np.float32) if t.weights is None else t.weights.astype(np.float32)
        return np.ascontiguousarray(t.index, np.int64), np.ascontiguousarray(w)

    def _native(self, x: np.ndarray, y: np.ndarray, scratch: np.ndarray) -> Launch | None:
        """One pass of csrc/gemv.c's ctxrt_resize2d (`self.native`: the resized axes two adjacent ones, an image's
        H and W, channels last or not, of float32 tensors, nothing extrapolated); None where the extension is
        missing."""
        a = self.lead
        if native.library() is None or not x.flags.c_contiguous or not y.flags.c_contiguous:
            return None
        inner = math.prod(self.in_shape[a + 2:])
        return native.resize2d(x.reshape(self.rows, self.in_shape[a], self.in_shape[a + 1], inner),
                               y.reshape(self.rows, self.out_shape[a], self.out_shape[a + 1], inner),
                               *self.native_axes, scratch_view(scratch, (self.in_shape[a + 1] * inner,), np.float32))


def resize(spec: NodeSpec) -> Kernel:
    return Resize(spec)


KERNELS = {"Resize": resize, "Upsample": resize}
