"""Conv on OpenCL: an implicit GEMM (kernels/conv.cl) with the bias, residual and Relu epilogue the FuseActivation
pass leaves on the node, for any stride, padding, dilation and group count; 1x1 convolutions are the same kernel
with the window loops and masks compiled away. Convolutions with one input channel per group (depthwise) run the
direct kernel of window.py instead.

The weights are prepacked at compile time, [M, C, KH, KW] -> [G][KH * KW][C][M / G] (output channels
contiguous: the kernel loads them as vectors), stored in the context binary in place of the originals (the same
bytes) and recorded in the node's attributes (`kernel`, `weight_shape`), so a loaded context reads them as they
are. Run-time (non-constant) weights are declined: such a node runs in a CPU partition.

A float16 (or bfloat16) model's weights, which ir/passes/half.py leaves half (the node's `widen`), are prepacked
as they are, half, and read as float (WTYPE: kernels/halfload.clh); everything else is float32.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ctxrt.backends.kernel import Launch, NodeSpec
from ctxrt.backends.opencl.kernel import ClKernel, Space, weight_type
from ctxrt.backends.opencl.spatial import Window, conv_shape, decline, epilogue, float_type, window
from ctxrt.backends.opencl.window import WindowKernel

PACKED = "opencl_conv"  # the `kernel` attribute of a node whose weights are prepacked for conv.cl


class Conv(ClKernel):
    source = "conv.cl"
    half_inputs = (1,)
    space = Space(
        params={"RM": (1, 2, 4, 8, 16), "RN": (1, 2, 4, 8, 16, 32, 64), "WM": (1, 2, 3, 4, 5, 6, 8),
                "WN": (1, 2, 3, 4, 6, 8, 12, 16), "VW": (1, 2, 4, 8, 16), "LOCAL": (0, 1), "TK": (8, 16, 32)},
        # PoCL: one work-item per work-group computing 64 channels (4 vectors of 16: AVX-512 lanes) x 4 pixels,
        # the loops unrolled (16 accumulators in registers): 150-200 GFLOP/s on ResNet-50's convs on a 2-core
        # EPYC (32 accumulators: spills, 2x slower; not unrolled: 40-70). Other channel counts M (outputs per
        # group) take the variant of `variant()`: w1..w5 vectors of 16 per work-item, v8 v4 v1 narrower vectors
        # below 16 channels. GPUs: 64 x 64 tiles staged in local memory, 4 channels x 4 pixels per work-item.
        defaults={"cpu": {"RM": 1, "RN": 1, "WM": 4, "WN": 4, "VW": 16, "LOCAL": 0, "TK": 8},
                  "cpu:w5": {"RM": 1, "RN": 1, "WM": 5, "WN": 4, "VW": 16, "LOCAL": 0, "TK": 8},
                  "cpu:w3": {"RM": 1, "RN": 1, "WM": 3, "WN": 6, "VW": 16, "LOCAL": 0, "TK": 8},
                  "cpu:w2": {"RM": 1, "RN": 1, "WM": 2, "WN": 8, "VW": 16, "LOCAL": 0, "TK": 8},
                  "cpu:w1": {"RM": 1, "RN": 1, "WM": 1, "WN": 12, "VW": 16, "LOCAL": 0, "TK": 8},
                  "cpu:v8": {"RM": 1, "RN": 1, "WM": 2, "WN": 8, "VW": 8, "LOCAL": 0, "TK": 8},
                  "cpu:v4": {"RM": 1, "RN": 1, "WM": 2, "WN": 8, "VW": 4, "LOCAL": 0, "TK": 8},
                  "cpu:v1": {"RM": 1, "RN": 1, "WM": 1, "WN": 16, "VW": 1, "LOCAL": 0, "TK": 8},
                  "gpu": {"RM": 16, "RN": 16, "WM": 1, "WN": 4, "VW": 4, "LOCAL": 1, "TK": 16},
                  "default": {"RM": 8, "RN": 16, "WM": 2, "WN": 2, "VW": 1, "LOCAL": 1, "TK": 16}},
        constraints=(lambda p, s: p["LOCAL"] == 1 or p["TK"] == 8,  # TK unused without local memory
                     # without local memory a vector of channels past M starts at M - VW
                     lambda p, s: p["LOCAL"] == 1 or p["VW"] <= s["M"]),
        work_group=lambda p: (p["RN"], p["RM"]),
        local_memory=lambda p, s: p["LOCAL"] * p["TK"] * (p["RM"] * p["WM"] * p["VW"] + p["RN"] * p["WN"])
        * s.get("itemsize", 4))

    def __init__(self, spec: NodeSpec, backend: Any, params: Any = None) -> None:
        self.g, self.cg, self.mg, wshape = conv_shape(spec)
        self.win: Window = window(spec, tuple(wshape[2:]))
        super().__init__(spec, backend, params)
        self.T = float_type(self, spec)
        self.wtype = weight_type(spec, 1, self.T)
        self.has_bias, self.residual, self.relu = epilogue(spec)
        if spec.attr("kernel") == PACKED:
            return  # input 1 holds the prepacked weights
        w = spec.consts[1] if len(spec.consts) > 1 else None
        if w is None:
            raise decline(spec, "run-time weights (they are prepacked at compile time)")
        win = self.win
        packed = w.reshape(self.g, self.mg, self.cg, win.kh * win.kw).transpose(0, 3, 2, 1)
        self.constants = {1: np.ascontiguousarray(packed)}
        self.attrs = {"kernel": PACKED, "weight_shape": list(wshape)}

    def problem(self) -> dict[str, int]:
        win = self.win
        return {"M": self.mg, "P": win.oh * win.ow, "K": self.cg * win.kh * win.kw,
                "itemsize": np.dtype(self.spec.outputs[0].dtype).itemsize}

    def variant(self) -> str:
        """Defaults that waste few lanes on M channels: below 16 narrower vectors (v8, v4, v1); else the number of
        16-wide vectors per work-item (w1..w5, "" for 4) that minimises the vectors computed plus one per tile
        (the input values a tile loads): 64 and 128 channels take 4 vectors, 68 take 5, 34 take 3, 1000 take 5."""
        if self.mg < 16:
            return "v8" if self.mg >= 8 else "v4" if self.mg >= 4 else "v1"
        vectors = -(-self.mg // 16)
        wm = min(range(5, 0, -1), key=lambda w: -(-vectors // w) * (w + 1))
        return "" if wm == 4 else f"w{wm}"

    def defines(self) -> dict[str, Any]:
        d = {"T": self.T, "KH": self.win.kh, "KW": self.win.kw, "PADDED": int(self.win.padded),
             "HAS_BIAS": int(self.has_bias), "RESIDUAL": int(self.residual), "RELU": int(self.relu), **self.params}
        if self.wtype:
            d["WTYPE"] = self.wtype
        if self.T == "double":
            d["FP64"] = 1
        return d

    def bind(self, ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        win, p = self.win, self.params
        if win.n * win.oh * win.ow * self.mg * self.g == 0:
            return lambda: None
        x, w, y = ins[0], ins[1], outs[0]
        b = ins[2] if self.has_bias else x
        r = ins[3] if self.residual else x
        args = [*window_args(win, self.cg, self.mg, self.g),
                *(a for t in (x, w, b, r, y) for a in (t.mem, np.uint64(t.offset)))]
        return self.launch(self.kernel("conv", *args), *conv_grid(p, win, self.mg, self.g))


def window_args(win: Window, cg: int, mg: int, g: int) -> list[np.int32]:
    """The window's arguments of an implicit-GEMM conv kernel (conv.cl, qconv.cl), before its buffers."""
    return [np.int32(v) for v in (cg, win.h, win.w, win.oh, win.ow, mg, g, win.sh, win.sw, win.ph, win.pw, win.dh,
                                  win.dw)]


def conv_grid(p: dict[str, int], win: Window, mg: int, g: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(global, local) sizes of an implicit-GEMM conv: RN x RM work items a group, each WN pixels by WM x VW
    output channels."""
    rn, rm = p["RN"], p["RM"]
    return ((-(-win.oh * win.ow // (rn * p["WN"])) * rn, -(-mg // (rm * p["WM"] * p["VW"])) * rm, win.n * g),
            (rn, rm, 1))


def _conv(spec: NodeSpec, backend: Any) -> ClKernel:
    """The direct kernel for one input channel per group (not for a single group: that is a GEMM of K = KH*KW)."""
    g, cg, _, _ = conv_shape(spec)
    if cg == 1 and g > 1 and spec.attr("kernel") != PACKED:
        return WindowKernel(spec, backend)
    return Conv(spec, backend)


KERNELS = {"Conv": _conv}
