"""Kernels that compute each output channel from one input channel's window, directly (kernels/window.cl):
depthwise Conv (one input channel per group: MobileNet's and ShuffleNet's 3x3 convs, where an implicit GEMM would
have a single row per group), MaxPool and AveragePool, 1-D and 2-D. Depthwise convs take the bias, residual and
Relu epilogue, any stride, padding, dilation and channel multiplier, and read their weights as they are (constant
or not; a float16 model's half weights, the node's `widen`, as half: kernels/halfload.clh). Pools take ceil_mode
(the output shape the frontend resolved) and count_include_pad; MaxPool's Indices output and dilated AveragePools
run in a CPU partition."""

from __future__ import annotations

from typing import Any

import numpy as np

from ctxrt.backends.kernel import Launch, NodeSpec
from ctxrt.backends.opencl.kernel import ClKernel, Space, weight_type
from ctxrt.backends.opencl.quant.ops import INT_MAXPOOL
from ctxrt.backends.opencl.spatial import Window, conv_shape, decline, epilogue, float_type, window

OPS = {"Conv": 0, "MaxPool": 1, "AveragePool": 2}  # OP_CONV, OP_MAX, OP_AVG in window.cl


class WindowKernel(ClKernel):
    source = "window.cl"
    half_inputs = (1,)  # a depthwise Conv's weights
    space = Space(
        params={"VW": (1, 2, 4, 8, 16), "RY": (1, 2, 4, 8), "WX": (1, 2, 4, 8, 16, 32, 64), "WY": (1, 2, 4, 8, 16)},
        # PoCL: vectors of 8 columns x 8 rows per work-item, one work-item per work-group; 4 columns where rows
        # are short (up to 8 outputs) or the stride is 2, 16 where they are long (64 and up). One core of a
        # 2-core EPYC, ShuffleNet's depthwise 3x3 convs: 136 channels at 28x28 0.14 ms, 544 at 7x7 0.06 ms,
        # 112 at 56x56 stride 2 0.18-0.22 ms (one column per work-item, PoCL vectorising across work-items:
        # 1.0, 0.45, 1.4 ms). GPUs: one output per work-item, 32x4 work-groups.
        defaults={"cpu": {"VW": 8, "RY": 8, "WX": 1, "WY": 1}, "cpu:narrow": {"VW": 4, "RY": 8, "WX": 1, "WY": 1},
                  "cpu:wide": {"VW": 16, "RY": 8, "WX": 1, "WY": 1},
                  "gpu": {"VW": 1, "RY": 1, "WX": 32, "WY": 4}, "default": {"VW": 1, "RY": 1, "WX": 16, "WY": 4}},
        work_group=lambda p: (p["WX"], p["WY"]))

    def __init__(self, spec: NodeSpec, backend: Any, params: Any = None) -> None:
        self.op = OPS[spec.op]
        self.has_bias = self.residual = self.relu = False
        if spec.op == "Conv":
            self.g, _, self.mult, wshape = conv_shape(spec)
            kernel = tuple(wshape[2:])
            self.has_bias, self.residual, self.relu = epilogue(spec)
        else:
            self.g, self.mult, kernel = spec.inputs[0].shape[1], 1, tuple(spec.attr("kernel_shape") or ())
            if len(spec.outputs) > 1:
                raise decline(spec, "the Indices output")
            if spec.op == "AveragePool" and max(spec.attr("dilations") or [1]) > 1:
                raise decline(spec, f"dilations={spec.attr('dilations')}")
        self.win: Window = window(spec, kernel)
        super().__init__(spec, backend, params)
        self.T = float_type(self, spec)
        self.wtype = weight_type(spec, 1, self.T)
        self.ends = self._end_pads()

    def variant(self) -> str:
        win = self.win
        return "narrow" if win.ow <= 8 or win.sw > 1 else "wide" if win.ow >= 64 else ""

    def _end_pads(self) -> tuple[int, int]:
        """The padding after the input (eh, ew) an average counts with count_include_pad; the rows and columns
        past it (ceil_mode) are never counted."""
        win, auto = self.win, self.spec.attr("auto_pad", "NOTSET")
        if auto in ("SAME_UPPER", "SAME_LOWER"):
            total = [max(0, (o - 1) * s + k - i) for o, s, k, i in
                     ((win.oh, win.sh, win.kh, win.h), (win.ow, win.sw, win.kw, win.w))]
            return total[0] - win.ph, total[1] - win.pw
        pads = self.spec.attr("pads") if auto == "NOTSET" else None
        if not pads:
            return 0, 0
        return (0, pads[-1]) if len(pads) == 2 else (pads[2], pads[3])

    def defines(self) -> dict[str, Any]:
        win = self.win
        d = {"OP": self.op, "T": self.T, "KH": win.kh, "KW": win.kw, "SH": win.sh, "SW": win.sw, "DH": win.dh,
             **self.params}
        if self.op == OPS["Conv"]:
            d.update(HAS_BIAS=int(self.has_bias), RESIDUAL=int(self.residual), RELU=int(self.relu))
            if self.wtype:
                d["WTYPE"] = self.wtype
        if self.op == OPS["AveragePool"]:
            d["INCLUDE_PAD"] = int(bool(self.spec.attr("count_include_pad", 0)))
        if self.T == "double":
            d["FP64"] = 1
        return d

    def bind(self, ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        win, p = self.win, self.params
        m = self.g * self.mult
        if win.n * win.oh * win.ow * m == 0:
            return lambda: None
        x, y = ins[0], outs[0]
        w = ins[1] if self.op == OPS["Conv"] else x
        b = ins[2] if self.has_bias else x
        r = ins[3] if self.residual else x
        i32 = np.int32
        args = [i32(win.h), i32(win.w), i32(win.oh), i32(win.ow), i32(self.g), i32(self.mult),
                i32(win.ph), i32(win.pw), i32(win.dw), i32(self.ends[0]),
                i32(self.ends[1]), *(a for t in (x, w, b, r, y) for a in (t.mem, np.uint64(t.offset)))]
        gsize = (-(-win.ow // p["VW"]), -(-win.oh // p["RY"]), win.n * m)
        return self.launch(self.kernel("window", *args), gsize, (p["WX"], p["WY"], 1))


def _pool(spec: NodeSpec, backend: Any) -> ClKernel:
    """Float pools here; a MaxPool of integers (a QDQ unit's, left on the integers) is quant/ops.py's."""
    if spec.op == "MaxPool" and np.dtype(spec.inputs[0].dtype).kind in "iu":
        return INT_MAXPOOL(spec, backend)
    return WindowKernel(spec, backend)


KERNELS = {"MaxPool": _pool, "AveragePool": _pool}
