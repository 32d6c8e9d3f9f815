"""ConvInteger and QLinearConv (1-D, 2-D, 3-D and up; groups, dilations, strides, pads, auto_pad).

(x - x_zero_point) and (w - w_zero_point) go to float64 in scratch and through the float convolution kernels of
the CPU backend (spatial.py: im2col + GEMM in bounded blocks; never Winograd, which is not exact), whose float64
sums of 8-bit products are exact integers: padding the centered input with zeros is padding x with its zero
point, as the spec has it. ConvInteger stores the int32 sums; QLinearConv adds its int32 bias and requantizes in
float32 as onnxruntime does (multiplier x_scale * w_scale / y_scale per output channel).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ctxrt.backends.cpu.image import spatial
from ctxrt.backends.cpu.quant.common import F32, F64, WIDE_INTS, Bound, Requant, fail, given, require, size
from ctxrt.backends.kernel import Kernel, Launch, NodeSpec, TensorSpec, scratch_view

_CONV_ATTRS = ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")


def _float_conv(spec: NodeSpec, x: int, w: int) -> Kernel:
    """The float64 Conv the integer one runs as: the same attributes, no constants, no compile-time choices."""
    attrs = {k: spec.attrs[k] for k in _CONV_ATTRS if spec.attrs.get(k) is not None}
    ins = [TensorSpec(tuple(spec.inputs[x].shape), F64), TensorSpec(tuple(spec.inputs[w].shape), F64)]
    inner = NodeSpec("Conv", spec.name, attrs, ins, [TensorSpec(tuple(spec.outputs[0].shape), F64)], [None, None],
                     spec.opset, {})
    return spatial.conv(inner)


def _per_channel(spec: NodeSpec, i: int, what: str, m: int, rank: int) -> tuple[int, ...] | None:
    """The broadcast shape of a per-tensor or per-output-channel parameter against the weights or the output."""
    if not given(spec, i):
        return None
    n = size(spec.inputs[i])
    if n == 1:
        return ()
    if n != m or len(spec.inputs[i].shape) != 1:
        raise fail(spec, f"{what} of shape {list(spec.inputs[i].shape)}: one value or one per output channel ({m})")
    return (m,) + (1,) * (rank - 1)


class _IntConv:
    """The centered float64 operands, the float convolution and its output; `epilogue(yf, outs, ins)` after."""

    def __init__(self, spec: NodeSpec, x: int, xz: int, w: int, wz: int) -> None:
        require(spec, x, WIDE_INTS, "x")
        require(spec, w, WIDE_INTS, "w")
        if given(spec, xz) and size(spec.inputs[xz]) != 1:
            raise fail(spec, "x_zero_point must be a scalar (per tensor)")
        self.idx = (x, xz, w, wz)
        self.wshape = tuple(spec.inputs[w].shape)
        self.wz_shape = _per_channel(spec, wz, "w_zero_point", self.wshape[0], len(self.wshape))
        self.inner = _float_conv(spec, x, w)
        self.inner_out = tuple(spec.outputs[0].shape)
        self.sizes = (size(spec.inputs[x]) * 8, size(self.wshape) * 8, size(spec.outputs[0]) * 8)

    def bind(self, ins: list[Any], scratch: list[Any]) -> tuple[np.ndarray, Launch]:
        x, xz, w, wz = self.idx
        xf = scratch_view(scratch[0], tuple(ins[x].shape), F64)
        wf = scratch_view(scratch[1], self.wshape, F64)
        yf = scratch_view(scratch[2], self.inner_out, F64)
        xzv = ins[xz].reshape(()) if xz < len(ins) and ins[xz] is not None else None
        wzv = ins[wz].reshape(self.wz_shape) if self.wz_shape is not None else None
        conv = self.inner.bind([xf, wf], [yf], scratch[3:3 + len(self.inner.scratch)])
        xi, wi = ins[x], ins[w].reshape(self.wshape)

        def run() -> None:
            _center(xi, xzv, xf)
            _center(wi, wzv, wf)
            conv()
        return yf, run


def _center(x: np.ndarray, zp: np.ndarray | None, out: np.ndarray) -> None:
    """out = x - zp in out's float type: the integers converted first (a cast inside the subtraction would be
    buffered by NumPy's iterator, an allocation per launch), then the zero point subtracted."""
    np.copyto(out, x, casting="unsafe")
    if zp is not None:
        np.subtract(out, zp, out=out)

def conv_integer(spec: NodeSpec) -> Kernel:
    ic = _IntConv(spec, 0, 2, 1, 3)

    def make(ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        yf, conv = ic.bind(ins, scratch)
        y = outs[0]

        def run() -> None:
            conv()
            np.copyto(y, yf, casting="unsafe")
        return run
    return Bound(make, (*ic.sizes, *ic.inner.scratch), "int_conv_f64")


def qlinear_conv(spec: NodeSpec) -> Kernel:
    """y = saturate(round((conv + B) * x_scale * w_scale / y_scale) + y_zero_point), B int32 per channel."""
    yt = np.dtype(spec.outputs[0].dtype)
    if yt not in WIDE_INTS:
        raise fail(spec, f"output type {yt} is not supported")
    if spec.attr("channels_last", 0):
        raise fail(spec, "channels_last=1 is not supported")
    for i, what in ((1, "x_scale"), (6, "y_scale"), (7, "y_zero_point")):
        if size(spec.inputs[i]) != 1:
            raise fail(spec, f"{what} must be a scalar (per tensor)")
    ic = _IntConv(spec, 0, 2, 3, 5)
    out_shape = ic.inner_out
    m, rank = out_shape[1], len(out_shape)
    channel = (1, m) + (1,) * (rank - 2)  # per output channel against the output
    ws_shape = channel if _per_channel(spec, 4, "w_scale", m, 1) else ()
    has_bias = given(spec, 8)
    if has_bias and size(spec.inputs[8]) != m:
        raise fail(spec, f"bias of shape {list(spec.inputs[8].shape)}: one value per output channel ({m})")
    requant = Requant(yt)

    def make(ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        yf, conv = ic.bind(ins, scratch)
        k = 3 + len(ic.inner.scratch)
        t32 = scratch_view(scratch[k], out_shape, F32)
        mult = scratch_view(scratch[k + 1], ws_shape, F32)
        xs, ws, ys, yz = ins[1].reshape(()), ins[4].reshape(ws_shape), ins[6].reshape(()), ins[7].reshape(())
        bias = ins[8].reshape(channel) if has_bias else None
        y = outs[0]

        def run() -> None:
            conv()
            np.multiply(xs, ws, out=mult)
            np.divide(mult, ys, out=mult)
            if bias is not None:
                np.add(yf, bias, out=yf)
            requant(yf, t32, mult, yz, y)
        return run
    return Bound(make, (*ic.sizes, *ic.inner.scratch, size(out_shape) * 4, max(1, size(ws_shape)) * 4),
                 "int_conv_f64")


KERNELS = {"ConvInteger": conv_integer, "QLinearConv": qlinear_conv}
