"""GridSample (opsets 16, 20, 22): X [N, C, *S] sampled at the normalized points of a grid [N, *O, D] (D = the
spatial rank; the grid's last component addresses S's last axis, x before y before z) into [N, C, *O].

Any spatial rank, modes nearest, linear (bilinear) and cubic (bicubic), padding zeros, border and reflection,
align_corners 0 and 1, with onnx.reference's order of operations: each coordinate denormalized, rounded half to
even for nearest, then, where it falls outside its axis's borders, clamped (border) or reflected (reflection);
each tap of the interpolation then padded by the mode (zeros: a zero, border: the edge pixel, reflection: the
reflected pixel). Every axis is handled on its own.

Cubic with border padding follows onnxruntime (and PyTorch's grid_sample, which the op mirrors) instead: the
coordinate is not clamped, only its four taps are, so a point up to two pixels outside still blends the edge
pixel with its inner neighbours; onnx.reference clamps the coordinate first, giving the edge pixel alone. The two
agree for points inside the image (every grid value in [-1, 1]).

A run: X copied channels-last into scratch (with one zero row after it, which the zeros mode's taps outside the
image read), then for each combination of the axes' taps (1, 2**D or 4**D) one row gather of C values per output
point, weighted and summed; the sum is transposed into the output.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np

from ctxrt.backends.cpu.elementwise import BoundKernel
from ctxrt.backends.kernel import Kernel, Launch, NodeSpec, scratch_view
from ctxrt.errors import UnsupportedOpError

MODES = {"bilinear": "linear", "linear": "linear", "nearest": "nearest", "bicubic": "cubic", "cubic": "cubic"}
PADDINGS = ("zeros", "border", "reflection")
_CUBIC_A = -0.75


def _fail(spec: NodeSpec, what: str) -> UnsupportedOpError:
    return UnsupportedOpError(f"{spec.op} node {spec.name!r}: {what} is not supported")


def _reflect(x: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """x reflected by the borders lo and hi until inside them (onnx.reference's and onnxruntime's GsReflect), in
    float64."""
    x = x.astype(np.float64)
    span = hi - lo
    if span <= 0:
        return np.full_like(x, lo)
    below, above = x < lo, x > hi
    dx = np.where(below, lo - x, np.where(above, x - hi, 0.0))
    n = np.trunc(dx / span)
    r = dx - n * span
    even = n % 2 == 0
    return np.where(below, np.where(even, lo + r, hi - r), np.where(above, np.where(even, hi - r, lo + r), x))


def _cubic_weights(t: np.ndarray) -> list[np.ndarray]:
    """Keys' cubic convolution weights (a = -0.75) of the taps floor(x) - 1 .. floor(x) + 2, t = x - floor(x)."""
    a = _CUBIC_A
    u, v, w = t + 1, 1 - t, 2 - t
    return [((a * u - 5 * a) * u + 8 * a) * u - 4 * a, ((a + 2) * t - (a + 3)) * t * t + 1,
            ((a + 2) * v - (a + 3)) * v * v + 1, ((a * w - 5 * a) * w + 8 * a) * w - 4 * a]


class _Axis:
    """One spatial axis of length `n`: coordinates -> taps (index, weight, inside) by mode and padding."""

    def __init__(self, n: int, mode: str, padding: str, align: bool) -> None:
        self.n, self.mode, self.padding, self.align = n, mode, padding, align
        self.lo, self.hi = (0.0, n - 1.0) if align else (-0.5, n - 0.5)

    def coordinate(self, g: np.ndarray) -> np.ndarray:
        n = self.n
        x = (g + 1) / 2 * (n - 1) if self.align else ((g + 1) * n - 1) / 2
        if self.mode == "nearest":
            x = np.rint(x)
        if self.padding == "reflection" or (self.padding == "border" and self.mode != "cubic"):
            out = (x < self.lo) | (x > self.hi)
            if out.any():
                moved = np.clip(x, 0, n - 1) if self.padding == "border" else _reflect(x, self.lo, self.hi)
                x = np.where(out, moved.astype(x.dtype), x)
        return x

    def pad(self, i: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """Integer tap positions -> positions inside the axis, and for zeros padding which were inside."""
        n = self.n
        if self.padding == "zeros":
            inside = (i >= 0) & (i < n)
            return np.clip(i, 0, n - 1), inside
        if self.padding == "reflection":
            i = np.trunc(_reflect(i, self.lo, self.hi)).astype(np.int64)
        return np.clip(i, 0, n - 1), None  # the clip: border padding; NaN coordinates land on an edge too

    def index(self, x: np.ndarray) -> np.ndarray:
        """Whole-valued coordinates as int64, those far outside (or NaN) moved to a few positions outside (where
        every padding reads what it read there), not overflowing."""
        return np.clip(np.nan_to_num(x, nan=-8.0), -8, self.n + 8).astype(np.int64)

    def taps(self, g: np.ndarray, dt: np.dtype) -> list[tuple[np.ndarray, np.ndarray | None, np.ndarray | None]]:
        """(position, inside or None, weight or None) of each tap of every point."""
        x = self.coordinate(g)
        if self.mode == "nearest":
            i, inside = self.pad(self.index(x))
            return [(i, inside, None)]
        first = np.floor(x)
        t = x - first
        first = self.index(first)
        if self.mode == "linear":
            offsets, weights = (0, 1), [1 - t, t]
        else:
            offsets, weights = (-1, 0, 1, 2), _cubic_weights(t)
        return [(*self.pad(first + o), w.astype(dt)) for o, w in zip(offsets, weights, strict=True)]


def grid_sample(spec: NodeSpec) -> Kernel:
    x_spec, g_spec = spec.inputs[0], spec.inputs[1]
    if g_spec is None:
        raise _fail(spec, "a missing grid")
    mode = MODES.get(str(spec.attr("mode", "linear" if spec.opset >= 20 else "bilinear")))
    padding = str(spec.attr("padding_mode", "zeros"))
    align = bool(spec.attr("align_corners", 0))
    if mode is None:
        raise _fail(spec, f"mode {spec.attr('mode')!r}")
    if padding not in PADDINGS:
        raise _fail(spec, f"padding_mode {padding!r}")
    xs, gs = tuple(x_spec.shape), tuple(g_spec.shape)
    dt, gdt = np.dtype(x_spec.dtype), np.dtype(g_spec.dtype)
    nd = len(xs) - 2
    if nd < 1 or len(gs) != nd + 2 or gs[-1] != nd or gs[0] != xs[0]:
        raise _fail(spec, f"X of shape {list(xs)} with a grid of shape {list(gs)}")
    if gdt.kind != "f":
        raise _fail(spec, f"a grid of {gdt}")
    if mode != "nearest" and dt.kind != "f":
        raise _fail(spec, f"{mode} mode on {dt} (nearest only)")
    n, c, space = xs[0], xs[1], xs[2:]
    points = math.prod(gs[1:-1])
    total = math.prod(space)
    if tuple(spec.outputs[0].shape) != (n, c, *gs[1:-1]):
        raise _fail(spec, f"an output of shape {list(spec.outputs[0].shape)}")
    empty_image = total == 0 and n * c * points > 0
    if empty_image and padding != "zeros":
        raise _fail(spec, f"{padding} padding of an empty image")
    axes = [_Axis(s, mode, padding, align) for s in space]
    strides = [math.prod(space[d + 1:]) for d in range(nd)]
    rows = n * points
    zero_row = n * total  # the zero row after X's channels-last copy
    base = np.repeat(np.arange(n, dtype=np.int64) * total, points)
    weighted = mode != "nearest"
    scratch = (((zero_row + 1) * c * dt.itemsize, rows * c * dt.itemsize, rows * c * dt.itemsize)
               if n * c * points and not empty_image else ())

    def make(ins: list[Any], outs: list[Any], s: list[Any]) -> Launch:
        y = outs[0]
        if not scratch:
            return (lambda: y.fill(0)) if y.size else (lambda: None)
        x, grid = ins[0].reshape(n, c, total), ins[1].reshape(rows, nd)
        xt = scratch_view(s[0], (zero_row + 1, c), dt)
        image = xt[:zero_row].reshape(n, total, c)
        acc, got = scratch_view(s[1], (rows, c), dt), scratch_view(s[2], (rows, c), dt)
        tail = xt[zero_row:]
        result = y.reshape(n, c, points)
        summed = acc.reshape(n, points, c).transpose(0, 2, 1)

        def run() -> None:
            np.copyto(image, x.transpose(0, 2, 1))
            tail.fill(0)
            # X's axis d is addressed by the grid's component nd - 1 - d
            taps = [axes[d].taps(grid[:, nd - 1 - d], dt) for d in range(nd)]
            first = True
            for combo in itertools.product(*taps):
                flat = base.copy()
                inside = None
                weight = None
                for (i, ok, w), stride in zip(combo, strides, strict=True):
                    flat += i * stride if stride != 1 else i
                    if ok is not None:
                        inside = ok if inside is None else inside & ok
                    if w is not None:
                        weight = w if weight is None else weight * w
                if inside is not None:
                    flat = np.where(inside, flat, zero_row)
                if not weighted:
                    np.take(xt, flat, axis=0, out=acc, mode="clip")
                    break
                np.take(xt, flat, axis=0, out=got, mode="clip")
                if first:
                    np.multiply(got, weight[:, None], out=acc)
                    first = False
                else:
                    np.multiply(got, weight[:, None], out=got)
                    np.add(acc, got, out=acc)
            np.copyto(result, summed)
        return run
    return BoundKernel(make, scratch)


KERNELS = {"GridSample": grid_sample}
