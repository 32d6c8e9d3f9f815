"""N-D convolution (3-D volumes and up): im2col + GEMM in bounded blocks of output positions.

Per image the input is copied into a padded scratch (when pads or windows need it), then for each box of output
positions (boxes.py: a contiguous range of the flattened output) the windows are copied into a column scratch
of at most _COL_BUDGET bytes and multiplied by the (group, M/group, Cg*K) weights straight into the output
block. The epilogue (bias, the fused residual and Relu of the FuseActivation pass) runs on each block while it
is in cache, as nn.py does for 2-D.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ctxrt.backends.cpu import threads
from ctxrt.backends.cpu.image.boxes import box_shape, boxes
from ctxrt.backends.cpu.image.window import PaddedND, windows
from ctxrt.backends.cpu.nn import _SGEMM_MIN, _activation, _gemm_calls, _window, relu_zeros
from ctxrt.backends.kernel import Kernel, Launch, NodeSpec, scratch_view

_COL_BUDGET = 2 << 20  # bytes of im2col columns per GEMM block


class ConvND(Kernel):
    def __init__(self, spec: NodeSpec) -> None:
        n, c, *sp = spec.inputs[0].shape
        m, cg, *k = spec.inputs[1].shape
        self.n, self.c, self.m, self.k = n, c, m, tuple(k)
        self.g = g = int(spec.attr("group", 1))
        self.strides, self.dil, pb, _ = _window(spec, self.k)
        self.osp = tuple(spec.outputs[0].shape[2:])
        self.dt = dt = np.dtype(spec.outputs[0].dtype)
        self.kk, self.p = cg * math.prod(k), math.prod(self.osp)
        w = spec.consts[1]
        self.wmat = None if w is None else np.ascontiguousarray(w).reshape(g, m // g, self.kk)
        self.has_bias = len(spec.inputs) > 2 and spec.inputs[2] is not None
        self.bias = spec.consts[2] if self.has_bias else None
        self.relu = _activation(spec)
        self.residual = bool(spec.attr("residual", 0))
        self.pointwise = all(d == 1 for d in self.k) and all(s == 1 for s in self.strides) and not any(pb) and \
            self.osp == tuple(sp)
        self.pad = PaddedND(c, sp, self.osp, self.k, self.strides, self.dil, pb, dt, 0.0)
        per_position = g * self.kk * dt.itemsize
        self.blocks = [] if self.pointwise else boxes(self.osp, max(1, _COL_BUDGET // per_position))
        cols = max((b - a for _, a, b in self.blocks), default=0) * per_position
        self.scratch = () if self.pointwise else (cols, self.pad.nbytes)
        self.algorithm = "gemm_1x1" if self.pointwise else "im2col_gemm"

    def bind(self, ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        g, mg, kk, p, dt = self.g, self.m // self.g, self.kk, self.p, self.dt
        wm = self.wmat if self.wmat is not None else ins[1].reshape(g, mg, kk)
        bias = None if not self.has_bias else (self.bias if self.bias is not None else ins[2]).reshape(g, mg, 1)
        if bias is not None:
            bias = bias.astype(dt, copy=False)
        plans = []  # per image: (input, padded scratch, [(im2col copy, columns, out, residual)])
        for b in range(self.n):
            out = outs[0][b].reshape(g, mg, p)
            res = ins[3][b].reshape(g, mg, p) if self.residual else None
            if self.pointwise:
                plans.append((None, None, [(None, ins[0][b].reshape(g, kk, p), out, res)]))
                continue
            src = self.pad.view(scratch[1], self.c) if self.pad.needed else ins[0][b]
            win = windows(src, self.k, self.strides, self.dil, self.osp)
            blocks = []
            for index, p0, p1 in self.blocks:
                cols = scratch_view(scratch[0], (g, kk, p1 - p0), dt)
                copy = (cols.reshape(self.c, *self.k, *box_shape(index, self.osp)),
                        win[(slice(None),) * (len(self.k) + 1) + index])
                blocks.append((copy, cols, out[:, :, p0:p1], None if res is None else res[:, :, p0:p1]))
            plans.append((ins[0][b], src if self.pad.needed else None, blocks))
        zeros = {blk[2].shape[-1]: relu_zeros(blk[2].shape, dt) for _, _, blocks in plans for blk in blocks}
        # oneDNN's GEMM on OpenMP's threads where the run holds BLAS to one (a context with oneDNN kernels, nn.py):
        # a long signal's conv on one thread was 2x onnxruntime's (Wav2Vec2's feature extractor)
        # (per group: Wav2Vec2's positional conv, 16 groups of 16 x 2048 x 125, ran 3x slower as 16 oneDNN calls)
        gemms = [[_gemm_calls(wm, cols, out) if math.prod(wm.shape[1:]) * out.shape[-1] >= _SGEMM_MIN else None
                  for _, cols, out, _ in blocks] for _, _, blocks in plans]
        pad, relu = self.pad, self.relu

        def run() -> None:
            held = threads.blas_held()
            for (x, padded, blocks), calls_of in zip(plans, gemms, strict=True):
                if padded is not None:
                    pad.refresh(x, padded)
                for (copy, cols, out, res), calls in zip(blocks, calls_of, strict=True):
                    if copy is not None:
                        np.copyto(*copy)
                    if calls is None or not held:
                        np.matmul(wm, cols, out=out)
                    else:
                        for call in calls:
                            call()
                    if bias is not None:
                        np.add(out, bias, out=out)
                    if res is not None:
                        np.add(out, res, out=out)
                    if relu:
                        np.maximum(out, zeros[out.shape[-1]], out=out)
        return run


def conv(spec: NodeSpec) -> Kernel:
    return ConvND(spec)
