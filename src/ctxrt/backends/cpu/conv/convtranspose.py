"""ConvTranspose for every spatial rank: a GEMM per block of input positions, then col2im.

Per image and box of input positions (boxes.py), the GEMM (group, M/group * K, Cg) x (group, Cg, positions) writes
a column scratch of at most _COL_BUDGET bytes; col2im then adds, for each kernel tap, the block's columns into the
strided output positions that tap reaches (input i -> output i * stride + tap * dilation - pad_begin), clipped
to the output. When the taps tile the output exactly (kernel == stride, no dilation, pads or output_padding:
U-Net's 2x2 stride-2 up-convolutions) each output is written once, by a copy, and the bias is added after.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np

from ctxrt.backends.cpu.image.boxes import box_shape, boxes
from ctxrt.backends.cpu.image.spatial import check_window, fail
from ctxrt.backends.kernel import Kernel, Launch, NodeSpec, scratch_view
from ctxrt.errors import UnsupportedOpError

_COL_BUDGET = 2 << 20  # bytes of GEMM output columns per block


def begin_pads(spec: NodeSpec, isp: tuple[int, ...], osp: tuple[int, ...], kernel: tuple[int, ...],
               strides: list[int], dil: list[int], out_pad: list[int]) -> list[int]:
    """Padding removed before the first output, per axis. The total follows from the output shape and is split
    as the ONNX spec and onnxruntime do: SAME_UPPER puts the odd one at the end; SAME_LOWER, and an output_shape
    with no auto_pad, at the start (the reference crops the end instead)."""
    auto = spec.attr("auto_pad", "NOTSET")
    if auto == "VALID":
        return [0] * len(isp)
    if auto == "NOTSET" and spec.attr("output_shape") is None:
        return list(spec.attr("pads") or [0] * 2 * len(isp))[:len(isp)]
    totals = [max(0, s * (i - 1) + p + (k - 1) * d + 1 - o)
              for i, o, k, s, d, p in zip(isp, osp, kernel, strides, dil, out_pad, strict=True)]
    return [t // 2 if auto == "SAME_UPPER" else t - t // 2 for t in totals]


def _reach(lo: int, hi: int, t: int, stride: int, dilation: int, pad: int, out: int) -> tuple[int, int]:
    """The inputs i in [lo, hi) whose tap t lands inside the output: 0 <= i*stride + t*dilation - pad < out."""
    shift = t * dilation - pad
    return max(lo, -(shift // stride) if shift < 0 else 0), min(hi, (out - 1 - shift) // stride + 1)


class ConvTranspose(Kernel):
    algorithm = "gemm_col2im"

    def __init__(self, spec: NodeSpec) -> None:
        n, c, *isp = spec.inputs[0].shape
        wc, mg, *k = spec.inputs[1].shape
        nd = check_window(spec, tuple(k))
        if spec.attr("activation") is not None:  # (fused for oneDNN's deconvolution: a binary compiled with it)
            raise UnsupportedOpError(f"ConvTranspose node {spec.name!r}: compiled with oneDNN's fused activation "
                                     f"{spec.attr('activation')!r}, which this kernel does not run; compile it again")
        self.g = g = int(spec.attr("group", 1))
        if wc != c or g < 1 or c % g:
            raise UnsupportedOpError(f"ConvTranspose node {spec.name!r}: weights {spec.inputs[1].shape} do not fit "
                                     f"input {spec.inputs[0].shape} with group={g}")
        self.dt = dt = np.dtype(spec.outputs[0].dtype)
        if dt.kind != "f":
            raise fail(spec, "dtype", str(dt))
        self.n, self.c, self.m, self.k = n, c, mg * g, tuple(k)
        self.isp, self.osp = tuple(isp), tuple(spec.outputs[0].shape[2:])
        self.strides = list(spec.attr("strides") or [1] * nd)
        self.dil = list(spec.attr("dilations") or [1] * nd)
        out_pad = list(spec.attr("output_padding") or [0] * nd)
        self.pb = begin_pads(spec, self.isp, self.osp, self.k, self.strides, self.dil, out_pad)
        self.rows = mg * math.prod(k)  # GEMM rows per group
        w = spec.consts[1]
        self.wt = None if w is None else np.ascontiguousarray(w.reshape(g, c // g, self.rows).transpose(0, 2, 1))
        self.has_bias = len(spec.inputs) > 2 and spec.inputs[2] is not None
        self.bias = spec.consts[2] if self.has_bias else None
        self.exact = (self.k == tuple(self.strides) and set(self.dil) == {1} and not any(self.pb)
                      and self.osp == tuple(i * s for i, s in zip(isp, self.strides, strict=True)))
        per_position = self.m * math.prod(k) * dt.itemsize
        self.blocks = boxes(self.isp, max(1, _COL_BUDGET // per_position))
        self.scratch = (max(b - a for _, a, b in self.blocks) * per_position,)

    def _col2im(self, out: np.ndarray, cols: np.ndarray, index: tuple[slice, ...]) -> list[tuple[Any, Any]]:
        """(output view, column view) per kernel tap that reaches the output from this block."""
        pairs = []
        for t in itertools.product(*(range(k) for k in self.k)):
            dst, src = [slice(None)], [slice(None), *t]
            for a, (box, tt) in enumerate(zip(index, t, strict=True)):
                lo, hi, _ = box.indices(self.isp[a])
                i0, i1 = _reach(lo, hi, tt, self.strides[a], self.dil[a], self.pb[a], self.osp[a])
                if i1 <= i0:
                    break
                o0 = i0 * self.strides[a] + tt * self.dil[a] - self.pb[a]
                dst.append(slice(o0, o0 + (i1 - i0 - 1) * self.strides[a] + 1, self.strides[a]))
                src.append(slice(i0 - lo, i1 - lo))
            else:
                pairs.append((out[tuple(dst)], cols[tuple(src)]))
        return pairs

    def bind(self, ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        g, cg, rows, dt = self.g, self.c // self.g, self.rows, self.dt
        wt = self.wt if self.wt is not None else ins[1].reshape(g, cg, rows).transpose(0, 2, 1)
        bias = None
        if self.has_bias:
            bias = (self.bias if self.bias is not None else ins[2]).reshape(-1, *[1] * len(self.osp))
        plans = []
        for b in range(self.n):
            x = ins[0][b].reshape(g, cg, -1)
            out = outs[0][b]
            blocks = []
            for index, p0, p1 in self.blocks:
                cols = scratch_view(scratch[0], (g, rows, p1 - p0), dt)
                grid = cols.reshape(self.m, *self.k, *box_shape(index, self.isp))
                blocks.append((x[:, :, p0:p1], cols, self._col2im(out, grid, index)))
            plans.append((out, blocks))
        exact = self.exact

        def run() -> None:
            for out, blocks in plans:
                if not exact:
                    if bias is None:
                        out.fill(0)
                    else:
                        np.copyto(out, bias)
                for xb, cols, pairs in blocks:
                    np.matmul(wt, xb, out=cols)
                    for dst, src in pairs:
                        if exact:
                            np.copyto(dst, src)
                        else:
                            np.add(dst, src, out=dst)
                if exact and bias is not None:
                    np.add(out, bias, out=out)
        return run


def conv_transpose(spec: NodeSpec) -> Kernel:
    return ConvTranspose(spec)


KERNELS = {"ConvTranspose": conv_transpose}
