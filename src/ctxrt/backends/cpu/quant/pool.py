"""QLinearGlobalAveragePool and QLinearAveragePool (com.microsoft), channels-first or channels-last.

The global pool sums the integers exactly and requantizes the sum once, as onnxruntime does:
y = saturate(round((sum(x) - count x_zp) * x_scale / (y_scale count)) + y_zp). AveragePool dequantizes into
float32 scratch, runs the CPU backend's float AveragePool kernel there (every attribute it has: pads, auto_pad,
ceil_mode, count_include_pad, dilations, 1-D to 3-D), and quantizes its output.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ctxrt.backends.cpu import native
from ctxrt.backends.cpu.image import spatial
from ctxrt.backends.cpu.quant.common import (
    EIGHT_BIT,
    F32,
    F64,
    Bound,
    Requant,
    fail,
    given,
    limits,
    require,
    saturate,
    size,
)
from ctxrt.backends.kernel import Kernel, Launch, NodeSpec, TensorSpec, scratch_view


def _scalars(spec: NodeSpec) -> None:
    for i in range(1, 5):
        if given(spec, i) and size(spec.inputs[i]) != 1:
            raise fail(spec, f"input {i} (a scale or zero point) must be a scalar (per tensor)")


def _param(ins: list[Any], spec: NodeSpec, i: int) -> np.ndarray | None:
    return ins[i].reshape(()) if given(spec, i) else None


def global_avgpool(spec: NodeSpec) -> Kernel:
    yt = require(spec, 0, EIGHT_BIT, "X")
    _scalars(spec)
    shape = tuple(spec.inputs[0].shape)
    if len(shape) < 3:
        raise fail(spec, f"input of shape {list(shape)} has no spatial axes")
    last = bool(spec.attr("channels_last", 0))
    n, c = shape[0], shape[-1] if last else shape[1]
    count = size(shape) // (n * c)
    exact32 = count * 255 < 2**31  # the sums fit int32
    requant = Requant(yt)

    def make(ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        x, y = ins[0], outs[0]
        if last:  # (N, S, C) summed over S
            src, axis, acc_shape = x.reshape(n, count, c), 1, (n, c)
        else:
            src, axis, acc_shape = x.reshape(n * c, count), 1, (n * c,)
        acc = scratch_view(scratch[0], acc_shape, F64)
        t32 = scratch_view(scratch[1], acc_shape, F32)
        mult = scratch_view(scratch[2], (), F32)
        shift = scratch_view(scratch[3], (), F64)
        ints = scratch_view(scratch[4], acc_shape, np.dtype(np.int32)) if exact32 else None
        xs, xz, ys, yz = (_param(ins, spec, i) for i in range(1, 5))
        out = y.reshape(acc_shape)
        width = F32.type(count)

        lib = native.library()
        if ints is not None and lib is not None and src.flags.c_contiguous and out.flags.c_contiguous:
            # one native call: the sums and the requantization, the NumPy path's operations (csrc/qelem.c)
            args = native.Sum8Args(outer=n if last else n * c, count=count, inner=c if last else 1,
                                   x=src.ctypes.data, y=ints.ctypes.data, is_signed=int(src.dtype == np.int8),
                                   q=out.ctypes.data, q_signed=int(out.dtype == np.int8))
            if native.read_params(args.src, [xs, xz, ys, yz]):  # the kernel reads them each run
                return native.launch("ctxrt_sum8", args, (src, ints, out, xs, xz, ys, yz))

        def run() -> None:
            if ints is not None:  # summed as integers (converting each value to float64 was ~5x slower)
                np.add.reduce(src, axis=axis, dtype=np.int32, out=ints)
                np.copyto(acc, ints)
            else:
                np.add.reduce(src, axis=axis, dtype=F64, out=acc)  # exact: at most 2^53 / 255 values
            if xz is not None:
                np.multiply(xz, count, out=shift, dtype=F64)
                np.subtract(acc, shift, out=acc)
            np.multiply(ys, width, out=mult)
            np.divide(xs, mult, out=mult)
            requant(acc, t32, mult, yz, out)
        return run
    acc_bytes = n * c
    return Bound(make, (acc_bytes * 8, acc_bytes * 4, 4, 8, acc_bytes * 4 if exact32 else 0))


def avgpool(spec: NodeSpec) -> Kernel:
    yt = require(spec, 0, EIGHT_BIT, "X")
    _scalars(spec)
    last = bool(spec.attr("channels_last", 0))
    xs_shape, ys_shape = tuple(spec.inputs[0].shape), tuple(spec.outputs[0].shape)

    def first(shape: tuple[int, ...]) -> tuple[int, ...]:  # channels-last -> channels-first order
        return (shape[0], shape[-1], *shape[1:-1]) if last else shape

    attrs = {k: v for k, v in spec.attrs.items() if k != "channels_last"}
    xin, yout = TensorSpec(first(xs_shape), F32), TensorSpec(first(ys_shape), F32)
    inner = spatial.avgpool(NodeSpec("AveragePool", spec.name, attrs, [xin], [yout], [None], spec.opset, {}))
    perm = (0, len(xs_shape) - 1, *range(1, len(xs_shape) - 1))  # channels-last dims in channels-first order
    lo, hi = limits(yt)

    def make(ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        x, y = ins[0], outs[0]
        xf = scratch_view(scratch[0], xin.shape, F32)
        yf = scratch_view(scratch[1], yout.shape, F32)
        pool = inner.bind([xf], [yf], scratch[2:])
        src = x.transpose(perm) if last else x
        dst = y.transpose(perm) if last else y
        xs, xz, ys, yz = (_param(ins, spec, i) for i in range(1, 5))

        def run() -> None:
            if xz is None:
                np.copyto(xf, src, casting="unsafe")
            else:
                np.subtract(src, xz, out=xf, dtype=F32)
            np.multiply(xf, xs, out=xf)
            pool()
            np.divide(yf, ys, out=yf)
            np.rint(yf, out=yf)
            if yz is not None:
                np.add(yf, yz, out=yf)
            saturate(yf, lo, hi)
            np.copyto(dst, yf, casting="unsafe")
        return run
    return Bound(make, (size(xs_shape) * 4, size(ys_shape) * 4, *inner.scratch))


KERNELS = {"QLinearGlobalAveragePool": global_avgpool, "QLinearAveragePool": avgpool}
