"""Direct depthwise convolution (one input channel per group, one output channel per input channel) in NumPy.

Batched GEMMs are the wrong shape for it: one 1 x (kh * kw) by (kh * kw) x pixels product per channel, after
an im2col copy of kh * kw times the image. This kernel walks the image once, in bands of output rows small
enough to stay in cache:

1. the band's input rows, transposed to channels last and padded: P[y, x, c] (transposing copies in chunks of
   pixels; the zero border rewritten every run, since the arena is shared);
2. per tap (ky, kx): acc[oy, ox, :] += P[s*oy + d*ky, s*ox + d*kx, :] * w[:, ky, kx]: every operand's inner
   axis is the contiguous channel axis, so NumPy's loops are long and vectorized whatever the image width
   (a 7 x 7 image in NCHW gives loops of 7);
3. the bias on the band (still channels last), then the band transposed back to the NCHW output, then the
   residual and the Relu on its rows.

NumPy cannot fuse a tap's multiply and add, so each tap costs two passes over the band: on large images the
im2col copy + one batched GEMM per channel stays faster, and `eligible` keeps this kernel to outputs of at
most `MAX_PIXELS` pixels. Measured at one thread, interleaved, on ShuffleNet's shapes (direct vs im2col):
544 channels at 7 x 7: 140 us vs 405; 272 at 14 x 14: 250 vs 280; 136 at 28 x 28: 595 vs 402; 112 at 56 x 56,
stride 2: 1,100 vs 714. With oneDNN installed, its channels-last depthwise kernel (one pass in compiled code)
runs every one of these instead.
"""

from __future__ import annotations

import numpy as np

from ctxrt.backends.cpu.shared import relu_zeros
from ctxrt.backends.kernel import Kernel, NodeSpec, scratch_view
from ctxrt.errors import UnsupportedOpError

_BAND_BUDGET = 1 << 20  # bytes of a band's padded input and accumulators (4x fewer NumPy calls than 256 KiB)
_CHUNK = 256 << 10  # bytes of pixels per transposing copy
MAX_PIXELS = 256  # output pixels per image up to which the direct kernel beats im2col + batched GEMMs


def eligible(spec: NodeSpec, any_size: bool = False) -> bool:
    """One input and one output channel per group, 2-D, float, constant weights, a small output (any output with
    `any_size`)."""
    n, c = spec.inputs[0].shape[:2]
    m, cg = spec.inputs[1].shape[:2]
    g = int(spec.attr("group", 1))
    return (g == c == m and cg == 1 and len(spec.inputs[0].shape) == 4 and spec.consts[1] is not None
            and np.dtype(spec.outputs[0].dtype).kind == "f"
            and (any_size or int(np.prod(spec.outputs[0].shape[2:])) <= MAX_PIXELS))


def _window(spec: NodeSpec) -> tuple[int, int, int, int, int, int]:
    from ctxrt.backends.cpu.nn import _window as window

    kh, kw = spec.inputs[1].shape[2:]
    strides, dil, pb, _ = window(spec, (kh, kw))
    return strides[0], strides[1], dil[0], dil[1], pb[0], pb[1]


class DepthwiseConv(Kernel):
    algorithm = "direct_depthwise"

    def __init__(self, spec: NodeSpec) -> None:
        act = spec.attr("activation")
        if act not in (None, "Relu"):
            raise UnsupportedOpError(f"Conv {spec.name!r}: fused activation {act!r} is not supported")
        self.n, self.c, self.h, self.w = spec.inputs[0].shape
        self.kh, self.kw = spec.inputs[1].shape[2:]
        self.oh, self.ow = spec.outputs[0].shape[2:]
        self.sh, self.sw, self.dh, self.dw, self.top, self.left = _window(spec)
        self.dt = dt = np.dtype(spec.outputs[0].dtype)
        w = spec.consts[1].reshape(self.c, self.kh * self.kw)
        self.taps = [np.ascontiguousarray(w[:, t]) for t in range(self.kh * self.kw)]  # contiguous (C,) rows
        self.bias = spec.consts[2] if len(spec.consts) > 2 else None
        self.has_bias = len(spec.inputs) > 2 and spec.inputs[2] is not None
        self.residual, self.relu = bool(spec.attr("residual", 0)), act == "Relu"
        # Input columns a band reads: every output column's window, padded.
        self.wp = max(self.w + self.left, (self.ow - 1) * self.sw + (self.kw - 1) * self.dw + 1)
        row_in = self.wp * self.c * dt.itemsize
        row_out = 2 * self.ow * self.c * dt.itemsize
        self.rows = rows = max(1, min(self.oh, (_BAND_BUDGET - (self.kh - 1) * self.dh * row_in)
                                      // max(1, self.sh * row_in + row_out)))
        self.rows_in = (rows - 1) * self.sh + (self.kh - 1) * self.dh + 1
        self.scratch = (self.rows_in * row_in, rows * row_out)

    def _band(self, r0: int, r1: int, scratch) -> dict:
        c, dt, sh, sw, dh, dw = self.c, self.dt, self.sh, self.sw, self.dh, self.dw
        rows_in = (r1 - r0 - 1) * sh + (self.kh - 1) * dh + 1
        y0 = r0 * sh - self.top  # input row of the band's first padded row
        p = scratch_view(scratch[0], (rows_in, self.wp, c), dt)
        acc = scratch_view(scratch[1], (r1 - r0, self.ow, c), dt)
        tmp = scratch_view(scratch[1][acc.nbytes:], (r1 - r0, self.ow, c), dt)
        i0, i1 = max(0, y0), min(self.h, y0 + rows_in)
        inner = p[i0 - y0:i1 - y0, self.left:self.left + self.w] if i1 > i0 else None
        borders = [p[:max(0, i0 - y0)], p[max(0, i1 - y0):]]
        if i1 > i0:
            borders += [p[i0 - y0:i1 - y0, :self.left], p[i0 - y0:i1 - y0, self.left + self.w:]]
        taps = [p[dh * ky:dh * ky + (r1 - r0 - 1) * sh + 1:sh, dw * kx:dw * kx + (self.ow - 1) * sw + 1:sw]
                for ky in range(self.kh) for kx in range(self.kw)]
        return dict(rows=(i0, i1), inner=inner, borders=[b for b in borders if b.size], taps=taps, acc=acc,
                    tmp=tmp)

    def bind(self, ins, outs, scratch):
        c, dt = self.c, self.dt
        bias = None
        if self.has_bias:
            bias = (self.bias if self.bias is not None else ins[2]).reshape(c)
        px = max(1, _CHUNK // (c * dt.itemsize))  # pixels per transposing copy
        steps = []
        for b in range(self.n):
            x, out = ins[0][b], outs[0][b]
            res = ins[3][b] if self.residual else None
            for r0 in range(0, self.oh, self.rows):
                r1 = min(self.oh, r0 + self.rows)
                d = self._band(r0, r1, scratch)
                copies_in = []
                if d["inner"] is not None:
                    i0, i1 = d["rows"]
                    src, dst = x[:, i0:i1], d["inner"]  # (C, R, W) -> (R, W, C), by rows of pixels
                    copies_in = [(dst[r, j:j + px], src[:, r, j:j + px].T) for r in range(i1 - i0)
                                 for j in range(0, self.w, px)]
                flat_out = out[:, r0:r1].reshape(c, -1)
                acc = d["acc"].reshape(-1, c)
                copies_out = [(flat_out[:, j:j + px], acc[j:j + px].T) for j in range(0, acc.shape[0], px)]
                steps.append((copies_in, d["borders"], d["taps"], d["acc"], d["tmp"], copies_out, flat_out,
                              res[:, r0:r1].reshape(c, -1) if res is not None else None,
                              relu_zeros(flat_out.shape, dt) if self.relu else None))
        taps = self.taps

        def run():
            for copies_in, borders, views, acc, tmp, copies_out, flat_out, res, zeros in steps:
                for dst in borders:
                    dst.fill(0)
                for dst, src in copies_in:
                    np.copyto(dst, src)
                np.multiply(views[0], taps[0], out=acc)
                for view, tap in zip(views[1:], taps[1:], strict=True):
                    np.multiply(view, tap, out=tmp)
                    np.add(acc, tmp, out=acc)
                if bias is not None:
                    np.add(acc, bias, out=acc)
                for dst, src in copies_out:
                    np.copyto(dst, src)
                if res is not None:
                    np.add(flat_out, res, out=flat_out)
                if zeros is not None:
                    np.maximum(flat_out, zeros, out=flat_out)
        return run


def conv(spec: NodeSpec) -> Kernel:
    return DepthwiseConv(spec)
