"""What the OpenCL Conv and pool kernels share: the node's 2-D window (1-D nodes become 2-D with H = 1, auto_pad
resolved), a Conv's groups, epilogue and dtype. What the kernels cannot do (3-D and higher windows, attributes that
do not fit the rank, mixed dtypes) is declined, so the node runs in a CPU partition (whose checks name a bad
attribute)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ctxrt.backends.kernel import NodeSpec
from ctxrt.backends.opencl.kernel import WIDEN, ClKernel
from ctxrt.errors import UnsupportedOpError

LIMIT = 1 << 31  # the kernels index elements with 32-bit ints


@dataclass(frozen=True)
class Window:
    n: int
    c: int  # input channels
    h: int
    w: int
    oh: int
    ow: int
    kh: int
    kw: int
    sh: int
    sw: int
    ph: int  # padding before, per axis (padding after is implied by the output size)
    pw: int
    dh: int
    dw: int

    @property
    def padded(self) -> bool:
        """Whether some tap of some window lies outside the input (in the padding, or past the end where the
        output shape was rounded up)."""
        last_y = (self.oh - 1) * self.sh - self.ph + (self.kh - 1) * self.dh
        last_x = (self.ow - 1) * self.sw - self.pw + (self.kw - 1) * self.dw
        return self.ph > 0 or self.pw > 0 or last_y >= self.h or last_x >= self.w


def decline(spec: NodeSpec, why: str) -> UnsupportedOpError:
    return UnsupportedOpError(f"{spec.op} node {spec.name!r}: no OpenCL kernel for {why}")


def window(spec: NodeSpec, kernel: tuple[int, ...]) -> Window:
    """The node's window over its input (rank 3 or 4), kernel being the spatial window size."""
    x, y = spec.inputs[0].shape, spec.outputs[0].shape
    nd = len(x) - 2
    if nd not in (1, 2) or len(y) != len(x) or len(kernel) != nd:
        raise decline(spec, f"input of rank {len(x)} (1-D and 2-D windows only)")
    if max(math.prod(t.shape) for t in [*spec.inputs, *spec.outputs] if t is not None) >= LIMIT:
        raise decline(spec, "tensors past 2^31 elements")
    values = {}
    for key, default in (("strides", 1), ("dilations", 1)):
        v = list(spec.attr(key) or [default] * nd)
        if len(v) != nd or min(v) < 1:
            raise decline(spec, f"{key}={v}")
        values[key] = v
    strides, dil = values["strides"], values["dilations"]
    auto = spec.attr("auto_pad", "NOTSET")
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        total = [max(0, (o - 1) * s + (k - 1) * d + 1 - i)
                 for o, s, k, d, i in zip(y[2:], strides, kernel, dil, x[2:], strict=True)]
        begin = [t // 2 if auto == "SAME_UPPER" else t - t // 2 for t in total]
    elif auto in ("VALID", "NOTSET"):
        pads = list(spec.attr("pads") or [0] * (2 * nd)) if auto == "NOTSET" else [0] * (2 * nd)
        if len(pads) != 2 * nd or min(pads) < 0:
            raise decline(spec, f"pads={pads}")
        begin = pads[:nd]
    else:
        raise decline(spec, f"auto_pad={auto!r}")
    if nd == 1:  # (N, C, L) as (N, C, 1, L)
        kernel, strides, dil, begin = (1, *kernel), [1, *strides], [1, *dil], [0, *begin]
        x, y = (*x[:2], 1, x[2]), (*y[:2], 1, y[2])
    return Window(x[0], x[1], x[2], x[3], y[2], y[3], kernel[0], kernel[1], strides[0], strides[1], begin[0],
                  begin[1], dil[0], dil[1])


def conv_shape(spec: NodeSpec) -> tuple[int, int, int, tuple[int, ...]]:
    """(groups, input channels per group, output channels per group, the ONNX weight shape), checked against the
    input; a recorded `weight_shape` is the shape of weights prepacked at compile time."""
    wshape = tuple(spec.attr("weight_shape") or spec.inputs[1].shape)
    g = int(spec.attr("group", 1))
    c = spec.inputs[0].shape[1]
    if len(wshape) < 3 or g < 1 or c % g or wshape[0] % g or wshape[1] * g != c:
        raise decline(spec, f"weights {wshape} with input {spec.inputs[0].shape} and group={g}")
    return g, c // g, wshape[0] // g, wshape


def epilogue(spec: NodeSpec) -> tuple[bool, bool, bool]:
    """(bias, residual, relu): what the kernel adds to each output."""
    act = spec.attr("activation")
    if act not in (None, "Relu"):
        raise decline(spec, f"fused activation {act!r}")
    has_bias = len(spec.inputs) > 2 and spec.inputs[2] is not None
    residual = bool(spec.attr("residual", 0))
    if residual and (len(spec.inputs) < 4 or spec.inputs[3] is None):
        raise decline(spec, "residual=1 without a 4th input")
    return has_bias, residual, act == "Relu"


def float_type(kernel: ClKernel, spec: NodeSpec) -> str:
    """The OpenCL type of a float node whose tensors all have one dtype, but for the half constants it reads as
    stored (the node's `widen`: kernel.py's `weight_type`)."""
    halves = set(spec.attr(WIDEN) or ())
    dts = {np.dtype(t.dtype) for i, t in enumerate(spec.inputs) if t is not None and i not in halves}
    dts |= {np.dtype(t.dtype) for t in spec.outputs if t is not None}
    if len(dts) != 1 or next(iter(dts)).kind != "f":
        raise decline(spec, f"dtypes {sorted(map(str, dts))} (one float dtype)")
    return kernel.cl_type(next(iter(dts)))
