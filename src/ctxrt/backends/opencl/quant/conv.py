"""QLinearConv and ConvInteger on OpenCL (kernels/qconv.cl): 8-bit inputs and weights, exact integer sums of the
centred products (x - x_zero_point) * (w - w_zero_point), requantized in float32 as the NumPy backend does
(backends/cpu/quant/common.py): the same bits. 1-D and 2-D, any stride, padding, dilation, auto_pad and groups.

Convolutions with one input channel per group (depthwise, KH * KW <= 256) run a direct kernel (`qdw`, as window.py's)
that reads the weights as they are; the others an implicit GEMM (`qconv`, as conv.py's) whose weights are
prepacked at compile time, [M, C, KH, KW] -> [G][KH * KW][C][M / G], still 8-bit (the same bytes in the context
binary), recorded in the node's attributes (`kernel`, `weight_shape`) so a loaded context reads them as they are.

x is centred first (x - x_zero_point as float32, into the node's scratch: 4 bytes per input value), which the
convolution kernels then read as the float ones read their input. Scales and zero points are read from their
tensors at run time. Sums (and sums plus bias) are int32, as onnxruntime's: a sum past 2^31 wraps (the NumPy
backend sums in float64).

Declined (the node runs in a CPU partition): 16-bit inputs, weights or outputs, non-float32 scales, x_scale /
x_zero_point / y_scale / y_zero_point of more than one value, channels_last, run-time weights of a non-depthwise
conv, 3-D and higher convs, tensors past 2^31 elements.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ctxrt.backends.kernel import Launch, NodeSpec
from ctxrt.backends.opencl.conv import conv_grid, window_args
from ctxrt.backends.opencl.kernel import CL_TYPES, ClKernel, Space
from ctxrt.backends.opencl.spatial import Window, decline, window
from ctxrt.backends.opencl.window import WindowKernel

PACKED = "opencl_qconv"  # the `kernel` attribute of a node whose weights are prepacked for qconv
EIGHT = {np.dtype(np.int8), np.dtype(np.uint8)}
F32, I32 = np.dtype(np.float32), np.dtype(np.int32)
BLOCK = 256  # products of centred 8-bit values a float32 sums exactly (qconv.cl)
# input indices: x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point, bias (-1: none)
QLINEAR_INPUTS = (0, 1, 2, 3, 4, 5, 6, 7, 8)
INTEGER_INPUTS = (0, -1, 2, 1, -1, 3, -1, -1, -1)


class _Node:
    """A QLinearConv's or ConvInteger's inputs, types and per-channel parameters, checked."""

    def __init__(self, spec: NodeSpec) -> None:
        self.spec = spec
        self.qlinear = spec.op == "QLinearConv"
        self.idx = QLINEAR_INPUTS if self.qlinear else INTEGER_INPUTS
        x, xs, xz, w, ws, wz, ys, yz, b = self.idx
        if spec.attr("channels_last", 0):
            raise decline(spec, "channels_last=1")
        self.wshape = tuple(spec.attr("weight_shape") or spec.inputs[w].shape)
        self.g = int(spec.attr("group", 1))
        c = spec.inputs[x].shape[1] if len(spec.inputs[x].shape) > 1 else 0
        ws_ = self.wshape
        if len(ws_) < 3 or self.g < 1 or c % self.g or ws_[0] % self.g or ws_[1] * self.g != c:
            raise decline(spec, f"weights {ws_} with input {spec.inputs[x].shape} and group={self.g}")
        self.m = ws_[0]
        self.cg, self.mg = c // self.g, ws_[0] // self.g
        self.xt = self._type(x, EIGHT, "x")
        self.wt = self._type(w, EIGHT, "w")
        yt = np.dtype(spec.outputs[0].dtype)
        if yt not in (EIGHT if self.qlinear else {I32}):
            raise decline(spec, f"output type {yt}")
        self.yt = yt
        self.has_xz = self._scalar(xz, self.xt, "x_zero_point")
        self.wz = self._channels(wz, self.wt, "w_zero_point")
        if self.wz:
            zero = spec.consts[wz] if wz < len(spec.consts) else None
            if zero is not None and not np.any(zero):
                self.wz = 0  # symmetric weights: nothing to subtract
        self.ws_pc = self.has_yz = self.has_bias = False
        if self.qlinear:
            for i, what in ((xs, "x_scale"), (ys, "y_scale")):
                if not self._scalar(i, F32, what):
                    raise decline(spec, f"no {what}")
            kind = self._channels(ws, F32, "w_scale")
            if not kind:
                raise decline(spec, "no w_scale")
            self.ws_pc = kind == 2
            self.has_yz = self._scalar(yz, yt, "y_zero_point")
            if self._given(b):
                if np.dtype(spec.inputs[b].dtype) != I32 or math.prod(spec.inputs[b].shape) != self.m:
                    raise decline(spec, f"bias {spec.inputs[b].dtype} of shape {list(spec.inputs[b].shape)}")
                self.has_bias = True

    def _given(self, i: int) -> bool:
        return 0 <= i < len(self.spec.inputs) and self.spec.inputs[i] is not None

    def _type(self, i: int, allowed: set[np.dtype], what: str) -> np.dtype:
        dt = np.dtype(self.spec.inputs[i].dtype)
        if dt not in allowed:
            raise decline(self.spec, f"{what} of type {dt} (8-bit only)")
        return dt

    def _scalar(self, i: int, dt: np.dtype, what: str) -> bool:
        """Whether the parameter is given; declines one of another type or more than one value."""
        if not self._given(i):
            return False
        t = self.spec.inputs[i]
        if np.dtype(t.dtype) != dt or math.prod(t.shape) != 1:
            raise decline(self.spec, f"{what} {t.dtype} of shape {list(t.shape)} (one {dt} value)")
        return True

    def _channels(self, i: int, dt: np.dtype, what: str) -> int:
        """0: not given, 1: one value, 2: one per output channel."""
        if not self._given(i):
            return 0
        t = self.spec.inputs[i]
        n = math.prod(t.shape)
        if np.dtype(t.dtype) != dt or n not in (1, self.m) or (n > 1 and len(t.shape) != 1):
            raise decline(self.spec, f"{what} {t.dtype} of shape {list(t.shape)} (one value or one per channel)")
        return 1 if n == 1 else 2

    def defines(self) -> dict[str, Any]:
        lo, hi = (np.iinfo(self.yt).min, np.iinfo(self.yt).max) if self.qlinear else (0, 0)
        return {"XT": CL_TYPES[self.xt.name], "WT": CL_TYPES[self.wt.name], "YT": CL_TYPES[self.yt.name],
                "QLINEAR": int(self.qlinear), "HAS_XZ": int(self.has_xz), "WZ": self.wz, "WS_PC": int(self.ws_pc),
                "HAS_YZ": int(self.has_yz), "HAS_BIAS": int(self.has_bias), "YMIN": int(lo), "YMAX": int(hi)}

    def scratch(self) -> tuple[int, ...]:
        """The centred float32 copy of x."""
        return (math.prod(self.spec.inputs[self.idx[0]].shape) * 4,)

    def params(self, ins: list[Any], centred: Any) -> list[Any]:
        """(buffer, offset) of the centred x, w, x_scale, x_zero_point, w_scale, w_zero_point, y_scale,
        y_zero_point, bias (the kernels' order); x's for those not given (never read)."""
        _, xs, xz, w, ws, wz, ys, yz, b = self.idx
        args = [centred.mem, np.uint64(centred.offset)]
        for i in (w, xs, xz, ws, wz, ys, yz, b):
            t = ins[i] if 0 <= i < len(ins) and ins[i] is not None else ins[0]
            args += [t.mem, np.uint64(t.offset)]
        return args

    def centre(self, kernel: ClKernel, ins: list[Any], centred: Any, then: Launch) -> Launch:
        """A launch that centres x into `centred` (float32 x - x_zero_point), then runs `then`."""
        x, xz = ins[self.idx[0]], ins[self.idx[2]] if self._given(self.idx[2]) else ins[self.idx[0]]
        n = math.prod(x.shape)
        wgs = min(64, kernel.backend.info.max_work_group_size)
        first = kernel.launch(kernel.kernel("centre", np.int32(n), x.mem, np.uint64(x.offset), xz.mem,
                                            np.uint64(xz.offset), centred.mem, np.uint64(centred.offset)),
                              (-(-n // 16),), (wgs,))

        def run() -> Any:
            first()
            return then()
        return run


def _fp64(kernel: ClKernel) -> dict[str, int]:
    """FP64 where the device has doubles: the multiplier's division made through double, correctly rounded (as
    the CPU's float32 division; OpenCL's float division may be off by 2.5 ulp, rounding a half-way value apart;
    the program is also built with DIVIDE where the device takes it: `divides`)."""
    return {"FP64": 1} if kernel.backend.info.fp64 and kernel.q.qlinear else {}


_DIVIDES = property(lambda kernel: kernel.q.qlinear)  # ClKernel.divides: QLinearConv's multiplier divides by y_scale


class QConv(ClKernel):
    """The implicit GEMM (qconv in qconv.cl)."""

    source = "qconv.cl"
    space = Space(
        params={"RM": (1, 2, 4, 8, 16), "RN": (1, 2, 4, 8, 16, 32, 64), "WM": (1, 2, 3, 4, 5, 6, 8),
                "WN": (1, 2, 3, 4, 6, 8, 12, 16), "VW": (1, 2, 4, 8, 16)},
        # PoCL: as conv.py's Conv, one work-item per work-group computing WM vectors of 16 channels x WN pixels
        # (float FMAs of the centred 8-bit values, flushed into int32 sums); fewer or narrower vectors by channel
        # count (`variant`). GPUs: 4 x 16 work-items, 4 channels x 4 pixels each.
        defaults={"cpu": {"RM": 1, "RN": 1, "WM": 4, "WN": 4, "VW": 16},
                  "cpu:w5": {"RM": 1, "RN": 1, "WM": 5, "WN": 4, "VW": 16},
                  "cpu:w3": {"RM": 1, "RN": 1, "WM": 3, "WN": 6, "VW": 16},
                  "cpu:w2": {"RM": 1, "RN": 1, "WM": 2, "WN": 8, "VW": 16},
                  "cpu:w1": {"RM": 1, "RN": 1, "WM": 1, "WN": 12, "VW": 16},
                  "cpu:v8": {"RM": 1, "RN": 1, "WM": 2, "WN": 8, "VW": 8},
                  "cpu:v4": {"RM": 1, "RN": 1, "WM": 2, "WN": 8, "VW": 4},
                  "cpu:v1": {"RM": 1, "RN": 1, "WM": 1, "WN": 16, "VW": 1},
                  "gpu": {"RM": 4, "RN": 16, "WM": 1, "WN": 4, "VW": 4},
                  "gpu:v1": {"RM": 4, "RN": 16, "WM": 1, "WN": 4, "VW": 1},
                  "default": {"RM": 4, "RN": 16, "WM": 1, "WN": 4, "VW": 1}},
        constraints=(lambda p, s: p["VW"] <= s["M"],),  # a vector of channels past M starts at M - VW
        work_group=lambda p: (p["RN"], p["RM"]))

    def __init__(self, spec: NodeSpec, backend: Any, params: Any = None) -> None:
        self.q = q = _Node(spec)
        self.win: Window = window(spec, tuple(q.wshape[2:]))
        super().__init__(spec, backend, params)
        self.scratch = q.scratch()
        if spec.attr("kernel") == PACKED:
            return  # the weights input holds the prepacked weights
        wi = q.idx[3]
        w = spec.consts[wi] if wi < len(spec.consts) else None
        if w is None:
            raise decline(spec, "run-time weights (they are prepacked at compile time)")
        win = self.win
        packed = np.asarray(w).reshape(q.g, q.mg, q.cg, win.kh * win.kw).transpose(0, 3, 2, 1)
        self.constants = {wi: np.ascontiguousarray(packed)}
        self.attrs = {"kernel": PACKED, "weight_shape": list(q.wshape)}

    def problem(self) -> dict[str, int]:
        win = self.win
        return {"M": self.q.mg, "P": win.oh * win.ow, "K": self.q.cg * win.kh * win.kw}

    def variant(self) -> str:
        """As conv.py's Conv: narrower vectors below 16 channels, else the number of 16-wide vectors per work-item
        that wastes fewest lanes; GPUs: scalars below 4 channels."""
        mg = self.q.mg
        if self.backend.info.type != "cpu":
            return "v1" if mg < 4 else ""
        if mg < 16:
            return "v8" if mg >= 8 else "v4" if mg >= 4 else "v1"
        vectors = -(-mg // 16)
        wm = min(range(5, 0, -1), key=lambda w: -(-vectors // w) * (w + 1))
        return "" if wm == 4 else f"w{wm}"

    def defines(self) -> dict[str, Any]:
        return {**self.q.defines(), "KH": self.win.kh, "KW": self.win.kw, "PADDED": int(self.win.padded),
                **_fp64(self), **self.params}

    divides = _DIVIDES

    def bind(self, ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        win, p, q = self.win, self.params, self.q
        if win.n * win.oh * win.ow * q.mg * q.g == 0:
            return lambda: None
        y = outs[0]
        args = [*window_args(win, q.cg, q.mg, q.g), *q.params(ins, scratch[0]), y.mem, np.uint64(y.offset)]
        return q.centre(self, ins, scratch[0],
                        self.launch(self.kernel("qconv", *args), *conv_grid(p, win, q.mg, q.g)))


class QDepthwise(ClKernel):
    """One input channel per group, directly (qdw in qconv.cl); the weights read as they are."""

    source = "qconv.cl"
    # window.py's: PoCL vectors of 8 columns x 8 rows per work-item (4 columns for short rows or stride 2, 16 for
    # long rows); GPUs one output per work-item
    space = WindowKernel.space

    def __init__(self, spec: NodeSpec, backend: Any, params: Any = None) -> None:
        self.q = q = _Node(spec)
        self.win: Window = window(spec, tuple(q.wshape[2:]))
        if self.win.kh * self.win.kw > BLOCK:
            raise decline(spec, "depthwise windows of more than 256 taps")
        super().__init__(spec, backend, params)
        self.scratch = q.scratch()

    def variant(self) -> str:
        win = self.win
        return "narrow" if win.ow <= 8 or win.sw > 1 else "wide" if win.ow >= 64 else ""

    def defines(self) -> dict[str, Any]:
        win = self.win
        return {**self.q.defines(), "KH": win.kh, "KW": win.kw, "SH": win.sh, "SW": win.sw, "DH": win.dh,
                **_fp64(self), **self.params}

    divides = _DIVIDES

    def bind(self, ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        win, p, q = self.win, self.params, self.q
        if win.n * win.oh * win.ow * q.m == 0:
            return lambda: None
        y = outs[0]
        i32 = np.int32
        args = [i32(win.h), i32(win.w), i32(win.oh), i32(win.ow), i32(q.g), i32(q.mg), i32(win.ph), i32(win.pw),
                i32(win.dw), *q.params(ins, scratch[0]), y.mem, np.uint64(y.offset)]
        gsize = (-(-win.ow // p["VW"]), -(-win.oh // p["RY"]), win.n * q.m)
        return q.centre(self, ins, scratch[0], self.launch(self.kernel("qdw", *args), gsize, (p["WX"], p["WY"], 1)))


def _qconv(spec: NodeSpec, backend: Any) -> ClKernel:
    """The direct kernel for one input channel per group (small windows), else the implicit GEMM."""
    q = _Node(spec)
    win = math.prod(q.wshape[2:])
    if q.cg == 1 and q.g > 1 and win <= BLOCK and spec.attr("kernel") != PACKED:
        return QDepthwise(spec, backend)
    return QConv(spec, backend)


KERNELS = {"QLinearConv": _qconv, "ConvInteger": _qconv}
