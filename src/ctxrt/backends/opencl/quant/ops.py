"""Quantized ops on OpenCL (kernels/quant.cl): QuantizeLinear, DequantizeLinear (ONNX opsets 10 to 21 and
com.microsoft's: per tensor or per axis, 8- and 16-bit, int32 into DequantizeLinear), DynamicQuantizeLinear, and
com.microsoft's QLinearAdd, QLinearMul, QLinearConcat, QLinearGlobalAveragePool, QLinearAveragePool,
QLinearSigmoid and QLinearLeakyRelu (with constant parameters: a table made at compile time), ctxrt's
QLinearLookup (a 256-byte table, or the affine map per channel of a BatchNormalization unit: ir/passes/qdq.py), and
MaxPool of 8- and 16-bit integers (`INT_MAXPOOL`: window.py's MaxPool hands integer nodes to it).

Every kernel computes the CPU backend's float32 operations (backends/cpu/quant/) in their order, so both give the
same bytes. Declined (the node runs in a CPU partition): blocked quantization (block_size), 4-bit and float8
types, float16/bfloat16 inputs or outputs, QuantizeLinear of int32 or with `precision`, parameters per channel
where the op takes them per tensor, 3-D pools, dilated QLinearAveragePool, a global pool whose int32 sums could
overflow. Scales and zero points are read by the kernels at run time (constants or computed tensors alike).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from ctxrt.backends.kernel import Launch, NodeSpec, TensorSpec
from ctxrt.backends.opencl.elementwise import MAX_RANK, collapse
from ctxrt.backends.opencl.kernel import ClKernel, Space
from ctxrt.backends.opencl.memory import ClTensor
from ctxrt.backends.opencl.program import ProgramKey
from ctxrt.backends.opencl.reduce import Softmax as FloatSoftmax
from ctxrt.backends.opencl.spatial import Window, decline, window

SOURCE = "quant.cl"
LIMIT = 1 << 31  # the kernels index elements with 32-bit ints
F32 = np.dtype(np.float32)
EIGHT = {np.dtype(np.uint8), np.dtype(np.int8)}
WIDE = EIGHT | {np.dtype(np.uint16), np.dtype(np.int16)}

SPACE_1D = Space(params={"WGS": (32, 64, 128, 256)},
                 defaults={"cpu": {"WGS": 256}, "gpu": {"WGS": 256}, "default": {"WGS": 64}},
                 work_group=lambda p: (p["WGS"],))
SPACE_2D = Space(params={"WX": (1, 4, 8, 16, 32, 64), "WY": (1, 2, 4, 8)},
                 # PoCL vectorises a work-group's work-items along x: a row of outputs per work-group
                 defaults={"cpu": {"WX": 16, "WY": 1}, "gpu": {"WX": 32, "WY": 4}, "default": {"WX": 16, "WY": 4}},
                 work_group=lambda p: (p["WX"], p["WY"]))


def _given(spec: NodeSpec, i: int) -> bool:
    return i < len(spec.inputs) and spec.inputs[i] is not None


def _dt(t: TensorSpec) -> np.dtype:
    return np.dtype(t.dtype)


def _size(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


def _range(dt: np.dtype) -> dict[str, str]:
    info = np.iinfo(dt)
    return {"YLO": f"{float(info.min)!r}f", "YHI": f"{float(info.max)!r}f"}


def _t(t: Any) -> list[Any]:
    """A tensor's two kernel arguments."""
    return [t.mem, np.uint64(t.offset)]


def _opt(t: Any, other: Any) -> list[Any]:
    """An optional tensor's flag and two arguments (another valid buffer where it is missing)."""
    return [np.int32(t is not None), *_t(t if t is not None else other)]


def _in(ins: list[Any], i: int) -> Any:
    return ins[i] if i < len(ins) else None


class QuantKernel(ClKernel):
    """A kernel of quant.cl: `kind` picks it (K_<kind>); the divisions correctly rounded where the device says it
    can (else OpenCL allows 2.5 ulp: a value could round to the other side of a half, one step)."""

    source = SOURCE
    space = SPACE_1D
    kind = ""
    divides = True  # type: ignore[assignment]  # x / scale rounded as NumPy's division (where the device can)

    def __init__(self, spec: NodeSpec, backend: Any, params: Any = None) -> None:
        super().__init__(spec, backend, params)
        big = max((_size(t.shape) for t in [*spec.inputs, *spec.outputs] if t is not None), default=0)
        if big >= LIMIT:
            raise decline(spec, "tensors past 2^31 elements")

    def defines(self) -> dict[str, Any]:
        return {f"K_{self.kind}": 1, **self.params}

    def launch_1d(self, name: str, n: int, *args: Any) -> Launch:
        wgs = self.params["WGS"]
        return self.launch(self.kernel(name, *args), (max(n, 0),), (wgs,))


def _per_axis(spec: NodeSpec, pshape: tuple[int, ...]) -> tuple[int, int]:
    """(post, channels) of parameters of shape `pshape`: (1, 1) per tensor (one value, whatever the axis says, as
    onnx.reference and onnxruntime read it), else per axis: channel of element i = (i / post) % channels."""
    if _size(pshape) == 1:
        return 1, 1
    if int(spec.attr("block_size", 0) or 0):
        raise decline(spec, "blocked quantization (block_size)")
    shape = tuple(spec.inputs[0].shape)
    rank, axis = len(shape), int(spec.attr("axis", 1))
    if not -rank <= axis < rank:
        raise decline(spec, f"axis {axis} of a rank-{rank} tensor")
    axis %= rank
    if tuple(pshape) != (shape[axis],):
        raise decline(spec, f"parameters of shape {list(pshape)} along axis {axis} of {list(shape)}")
    return _size(shape[axis + 1:]), shape[axis]


class Linear(QuantKernel):
    """QuantizeLinear (float32 -> 8/16-bit) and DequantizeLinear (8/16-bit, int32 -> float32)."""

    def __init__(self, spec: NodeSpec, backend: Any, params: Any = None) -> None:
        super().__init__(spec, backend, params)
        self.quant = spec.op == "QuantizeLinear"
        self.kind = "QUANTIZE" if self.quant else "DEQUANTIZE"
        if not (_given(spec, 0) and _given(spec, 1)):
            raise decline(spec, "a missing input")
        xt, yt, st = _dt(spec.inputs[0]), _dt(spec.outputs[0]), _dt(spec.inputs[1])
        if st != F32:
            raise decline(spec, f"a scale of type {st}")
        if self.quant:
            if xt != F32 or yt not in WIDE or spec.attr("precision"):
                raise decline(spec, f"{xt} to {yt}")
            zt = yt
        else:
            if xt not in WIDE | {np.dtype(np.int32)} or yt != F32:
                raise decline(spec, f"{xt} to {yt}")
            zt = xt
        pshape = tuple(spec.inputs[1].shape)
        if _given(spec, 2) and (_dt(spec.inputs[2]) != zt or _size(spec.inputs[2].shape) != _size(pshape)):
            raise decline(spec, f"a zero point of type {_dt(spec.inputs[2])}, shape {spec.inputs[2].shape}")
        self.post, self.nch = _per_axis(spec, pshape)
        self.n = _size(spec.inputs[0].shape)
        self.types = {"TX": self.cl_type(xt), "TY": self.cl_type(yt), "TZ": self.cl_type(zt)}
        self.range = _range(yt) if self.quant else {}

    def defines(self) -> dict[str, Any]:
        return {**super().defines(), **self.types, **self.range}

    def bind(self, ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        x, s, y = ins[0], ins[1], outs[0]
        args = [np.uint32(self.n), np.uint32(self.post), np.uint32(self.nch), *_t(x), *_t(s),
                *_opt(_in(ins, 2), s), *_t(y)]
        return self.launch_1d("quantize" if self.quant else "dequantize", self.n, *args)


class DynamicQuantize(QuantKernel):
    """DynamicQuantizeLinear: float32 -> uint8, y_scale, y_zero_point (three launches; scratch: each work-group's
    min and max)."""

    kind = "DYNAMIC"
    MAX_GROUPS = 64

    def __init__(self, spec: NodeSpec, backend: Any, params: Any = None) -> None:
        super().__init__(spec, backend, params)
        if _dt(spec.inputs[0]) != F32 or len(spec.outputs) != 3 or _dt(spec.outputs[0]) != np.uint8:
            raise decline(spec, f"input {_dt(spec.inputs[0])}")
        self.n = _size(spec.inputs[0].shape)
        # (not from WGS: every candidate of a tuner binds to the scratch planned for the default)
        self.groups = max(1, min(self.MAX_GROUPS, -(-self.n // 16384)))
        self.scratch = (self.groups * 8,)

    def defines(self) -> dict[str, Any]:
        return {**super().defines(), **_range(np.dtype(np.uint8))}

    def bind(self, ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        x, (y, ys, yz), part = ins[0], outs, scratch[0]
        wgs = self.params["WGS"]
        n = np.uint32(self.n)
        reduce = self.launch(self.kernel("minmax", n, *_t(x), *_t(part)), (self.groups * wgs,), (wgs,))
        params = self.launch(self.kernel("dynamic_params", np.uint32(self.groups), *_t(part), *_t(ys), *_t(yz)),
                             (1,), (1,))
        apply = self.launch_1d("dynamic_quantize", self.n, n, *_t(x), *_t(ys), *_t(yz), *_t(y))

        def run() -> Any:
            reduce()
            params()
            return apply()
        return run


class Binary(QuantKernel):
    """QLinearAdd and QLinearMul (per tensor parameters; A and B broadcast as NumPy does)."""

    kind = "BINARY"

    def __init__(self, spec: NodeSpec, backend: Any, params: Any = None) -> None:
        super().__init__(spec, backend, params)
        if len(spec.inputs) < 7 or not all(_given(spec, i) for i in (0, 1, 3, 4, 6)):
            raise decline(spec, "missing inputs")
        at = _dt(spec.inputs[0])
        if at not in WIDE or _dt(spec.inputs[3]) != at or _dt(spec.outputs[0]) != at:
            raise decline(spec, f"operands {at}, {_dt(spec.inputs[3])} -> {_dt(spec.outputs[0])}")
        for i in (1, 2, 4, 5, 6, 7):
            if _given(spec, i) and _size(spec.inputs[i].shape) != 1:
                raise decline(spec, f"input {i} per channel (the op takes scales and zero points per tensor)")
        for i in (1, 4, 6):
            if _dt(spec.inputs[i]) != F32:
                raise decline(spec, f"a scale of type {_dt(spec.inputs[i])}")
        for i in (2, 5, 7):
            if _given(spec, i) and _dt(spec.inputs[i]) != at:
                raise decline(spec, f"a zero point of type {_dt(spec.inputs[i])}")
        out = tuple(spec.outputs[0].shape)
        self.n = _size(out)
        dims, strides = collapse(out, [tuple(spec.inputs[0].shape), tuple(spec.inputs[3].shape)])
        if len(dims) > MAX_RANK:
            raise decline(spec, f"rank {len(dims)} after collapsing")
        contiguous = collapse(out, [out])[1][0]
        self.modes = [0 if st == contiguous else 1 if not any(st) else 2 for st in strides]
        self.dims, self.strides = dims, strides
        self.t = self.cl_type(at)
        self.mul = spec.op == "QLinearMul"

    def defines(self) -> dict[str, Any]:
        return {**super().defines(), "TX": self.t, "TY": self.t, **_range(_dt(self.spec.outputs[0])),
                "MUL": int(self.mul), "MA": self.modes[0], "MB": self.modes[1], "RANK": max(1, len(self.dims))}

    def bind(self, ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        make = self.backend.cl.cltypes.make_int8

        def vec(values: list[int]) -> Any:
            v = [0] * MAX_RANK
            for d, size in enumerate(reversed(values)):
                v[d] = size
            return make(*v)
        a, b = ins[0], ins[3]
        args = [np.uint32(self.n), vec(self.dims), vec(self.strides[0]), vec(self.strides[1]),
                *_t(a), *_t(ins[1]), *_opt(_in(ins, 2), a), *_t(b), *_t(ins[4]), *_opt(_in(ins, 5), a),
                *_t(ins[6]), *_opt(_in(ins, 7), a), *_t(outs[0])]
        return self.launch_1d("qbinary", self.n, *args)


class Lookup(QuantKernel):
    """ctxrt's QLinearLookup: a [1, 256] byte table, or (input 2) the affine map [2, C] per channel along axis."""

    def __init__(self, spec: NodeSpec, backend: Any, params: Any = None) -> None:
        super().__init__(spec, backend, params)
        x, y = spec.inputs[0], spec.outputs[0]
        xt, yt = _dt(x), _dt(y)
        if xt not in EIGHT or yt not in EIGHT or tuple(x.shape) != tuple(y.shape):
            raise decline(spec, "other than 8-bit input and output of one shape")
        self.n = _size(x.shape)
        self.affine = _given(spec, 2)
        self.types = {"TX": self.cl_type(xt), "TY": self.cl_type(yt), **_range(yt)}
        if not self.affine:
            self.kind = "LOOKUP"
            if not _given(spec, 1) or _dt(spec.inputs[1]) != np.uint8 or tuple(spec.inputs[1].shape) != (1, 256):
                raise decline(spec, "a table other than [1, 256] bytes")
            return
        self.kind = "AFFINE"
        p = spec.inputs[2]
        if _dt(p) != F32 or len(p.shape) != 2 or p.shape[0] != 2:
            raise decline(spec, f"an affine map of shape {list(p.shape)}, {_dt(p)}")
        shape, self.count = tuple(x.shape), p.shape[1]
        if not shape:
            raise decline(spec, "a scalar")
        axis = int(spec.attr("axis", -1)) % len(shape)
        if self.count > 1 and shape[axis] != self.count:
            raise decline(spec, f"{self.count} channels' affine maps for {shape[axis]} channels")
        self.post = _size(shape[axis + 1:])

    def defines(self) -> dict[str, Any]:
        return {**super().defines(), **(self.types if self.affine else {})}

    def bind(self, ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        x, y = ins[0], outs[0]
        if not self.affine:
            return self.launch_1d("lookup", self.n, np.uint32(self.n), *_t(x), *_t(ins[1]), *_t(y))
        return self.launch_1d("affine", self.n, np.uint32(self.n), np.uint32(self.post), np.uint32(self.count),
                              *_t(x), *_t(ins[2]), *_t(y))


class UnaryTable(QuantKernel):
    """com.microsoft's QLinearSigmoid and QLinearLeakyRelu with constant parameters: the CPU kernel run once, at
    compile time, on the 256 values a byte can hold (its own float32 operations: the same bytes), then one lookup
    per value. The table replaces input 1 (a kernel-private constant), the other parameters go; run-time
    parameters decline."""

    kind = "LOOKUP"
    LUT = "lut"

    def __init__(self, spec: NodeSpec, backend: Any, params: Any = None) -> None:
        super().__init__(spec, backend, params)
        x, y = spec.inputs[0], spec.outputs[0]
        xt = _dt(x)
        if xt not in EIGHT or _dt(y) != xt or tuple(x.shape) != tuple(y.shape):
            raise decline(spec, "other than 8-bit input and output of one type and shape")
        self.n = _size(x.shape)
        if spec.attr("kernel") == self.LUT:  # input 1 holds the table
            if not _given(spec, 1) or _dt(spec.inputs[1]) != np.uint8 or _size(spec.inputs[1].shape) != 256:
                raise decline(spec, "a table other than 256 bytes")
            return
        consts = [spec.consts[i] if i < len(spec.consts) else None for i in range(len(spec.inputs))]
        if len(spec.inputs) < 4 or any(_given(spec, i) and (consts[i] is None or consts[i].size != 1)
                                       for i in range(1, len(spec.inputs))):
            raise decline(spec, "run-time or per-channel parameters (its table is made at compile time)")
        self.constants = {1: _table(spec, consts).reshape(1, 256),
                          **{i: None for i in range(2, len(spec.inputs)) if _given(spec, i)}}
        self.attrs = {"kernel": self.LUT}

    def bind(self, ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        return self.launch_1d("lookup", self.n, np.uint32(self.n), *_t(ins[0]), *_t(ins[1]), *_t(outs[0]))


def _table(spec: NodeSpec, consts: list[Any]) -> np.ndarray:
    """The CPU kernel's outputs for the 256 bytes (as bytes)."""
    from ctxrt.backends.cpu.quant import elementwise as cpu

    xt = _dt(spec.inputs[0])
    make = {"QLinearSigmoid": cpu.qlinear_sigmoid, "QLinearLeakyRelu": cpu.qlinear_leaky_relu}[spec.op]
    one = dataclasses.replace(spec, inputs=[TensorSpec((256,), xt), *spec.inputs[1:]],
                              outputs=[TensorSpec((256,), xt)])
    kernel = make(one)
    y = np.zeros(256, xt)
    ins = [np.arange(256, dtype=np.uint8).view(xt), *(None if c is None else np.asarray(c) for c in consts[1:])]
    kernel.bind(ins, [y], [np.zeros(n, np.uint8) for n in kernel.scratch])()
    return y.view(np.uint8)


class Concat(QuantKernel):
    """QLinearConcat (com.microsoft, and the pass's one-part requantization): Y_scale, Y_zp, then (X, scale, zp)
    per part; a launch per part."""

    kind = "CONCAT"

    def __init__(self, spec: NodeSpec, backend: Any, params: Any = None) -> None:
        super().__init__(spec, backend, params)
        yt = _dt(spec.outputs[0])
        if yt not in EIGHT or len(spec.inputs) < 5 or (len(spec.inputs) - 2) % 3:
            raise decline(spec, f"output {yt} with {len(spec.inputs)} inputs")
        for i in range(len(spec.inputs)):
            if (i < 2 or (i - 2) % 3) and _given(spec, i) and _size(spec.inputs[i].shape) != 1:
                raise decline(spec, f"input {i} per channel (scales and zero points are per tensor)")
        parts = list(range(2, len(spec.inputs), 3))
        if not _given(spec, 0) or _dt(spec.inputs[0]) != F32 or \
                any(not _given(spec, i) or not _given(spec, i + 1) or _dt(spec.inputs[i]) != yt or
                    _dt(spec.inputs[i + 1]) != F32 or (_given(spec, i + 2) and _dt(spec.inputs[i + 2]) != yt)
                    for i in parts) or (_given(spec, 1) and _dt(spec.inputs[1]) != yt):
            raise decline(spec, "inputs of other types than the output's (scales float32)")
        out = tuple(spec.outputs[0].shape)
        if not out:
            raise decline(spec, "a scalar")
        axis = int(spec.attr("axis", 0))
        if not -len(out) <= axis < len(out):
            raise decline(spec, f"axis {axis}")
        axis %= len(out)
        self.outer, post = _size(out[:axis]), _size(out[axis + 1:])
        self.total = out[axis] * post
        self.parts, start = [], 0
        for i in parts:
            width = spec.inputs[i].shape[axis] * post
            self.parts.append((i, start, width))
            start += width
        if start != self.total:
            raise decline(spec, "parts that do not fill the output")
        self.types = {"TX": self.cl_type(yt), "TY": self.cl_type(yt), **_range(yt)}

    def defines(self) -> dict[str, Any]:
        return {**super().defines(), **self.types}

    def bind(self, ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        y, ys, yz = outs[0], ins[0], _in(ins, 1)
        launches = []
        for i, start, width in self.parts:
            x = ins[i]
            args = [np.uint32(self.outer), np.uint32(width), np.uint32(self.total), np.uint32(start), *_t(x),
                    *_t(ins[i + 1]), *_opt(_in(ins, i + 2), x), *_t(ys), *_opt(yz, x), *_t(y)]
            if self.outer * width:
                launches.append(self.launch_1d("requant", self.outer * width, *args))
        if len(launches) == 1:
            return launches[0]

        def run() -> Any:
            event = None
            for launch in launches:
                event = launch()
            return event
        return run


def _pool_params(spec: NodeSpec) -> None:
    if len(spec.inputs) < 4 or not all(_given(spec, i) for i in (0, 1, 3)):
        raise decline(spec, "missing inputs")
    xt = _dt(spec.inputs[0])
    if xt not in EIGHT or _dt(spec.outputs[0]) != xt:
        raise decline(spec, f"{xt} to {_dt(spec.outputs[0])}")
    for i in (1, 2, 3, 4):
        if _given(spec, i) and _size(spec.inputs[i].shape) != 1:
            raise decline(spec, f"input {i} per channel (scales and zero points are per tensor)")
        if _given(spec, i) and _dt(spec.inputs[i]) != (F32 if i in (1, 3) else xt):
            raise decline(spec, f"input {i} of type {_dt(spec.inputs[i])}")


class GlobalAvgPool(QuantKernel):
    """QLinearGlobalAveragePool (channels first, or channels_last): int32 sums, one requantization each."""

    kind = "GAP"

    def __init__(self, spec: NodeSpec, backend: Any, params: Any = None) -> None:
        super().__init__(spec, backend, params)
        _pool_params(spec)
        shape = tuple(spec.inputs[0].shape)
        if len(shape) < 3:
            raise decline(spec, f"an input of rank {len(shape)}")
        last = bool(spec.attr("channels_last", 0))
        n, c = shape[0], shape[-1] if last else shape[1]
        self.count = _size(shape) // max(1, n * c)
        if self.count * 255 >= 2**31:
            raise decline(spec, f"{self.count} values a sum (int32 sums)")
        self.outs, self.inner = n * c, c if last else 1
        xt = _dt(spec.inputs[0])
        self.types = {"TX": self.cl_type(xt), "TY": self.cl_type(xt), **_range(xt)}

    def defines(self) -> dict[str, Any]:
        return {**super().defines(), **self.types}

    def bind(self, ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        x = ins[0]
        args = [np.uint32(self.outs), np.uint32(self.count), np.uint32(self.inner), *_t(x), *_t(ins[1]),
                *_opt(_in(ins, 2), x), *_t(ins[3]), *_opt(_in(ins, 4), x), *_t(outs[0])]
        return self.launch_1d("qgap", self.outs, *args)


def _strides(shape: tuple[int, ...], last: bool) -> list[int]:
    """Element strides (batch, channel, y, x) of a 4-D tensor given channels first (N, C, H, W), stored channels
    first or last (N, H, W, C)."""
    n, c, h, w = shape
    return [h * w * c, 1, w * c, c] if last else [c * h * w, h * w, w, 1]


class Pool(QuantKernel):
    """QLinearAveragePool (channels first or last) and MaxPool of integers: 1-D and 2-D windows, one output per
    work-item."""

    kind = "POOL"
    space = SPACE_2D

    def __init__(self, spec: NodeSpec, backend: Any, params: Any = None) -> None:
        super().__init__(spec, backend, params)
        self.avg = spec.op == "QLinearAveragePool"
        self.last = self.avg and bool(spec.attr("channels_last", 0))
        if self.avg:
            _pool_params(spec)
            if max(spec.attr("dilations") or [1]) > 1:
                raise decline(spec, f"dilations={spec.attr('dilations')}")
            if int(spec.attr("count_include_pad", 0)) not in (0, 1):
                raise decline(spec, f"count_include_pad={spec.attr('count_include_pad')}")
        else:
            if len(spec.outputs) > 1 and spec.outputs[1] is not None:
                raise decline(spec, "the Indices output")
            if _dt(spec.inputs[0]) not in WIDE or _dt(spec.outputs[0]) != _dt(spec.inputs[0]):
                raise decline(spec, f"dtype {_dt(spec.inputs[0])}")
        kernel = tuple(spec.attr("kernel_shape") or ())
        first = spec
        if self.last:  # the window as channels first: (N, C, spatial...)
            def cf(t: TensorSpec) -> TensorSpec:
                s = tuple(t.shape)
                return TensorSpec((s[0], s[-1], *s[1:-1]), t.dtype) if len(s) >= 3 else t
            first = dataclasses.replace(spec, inputs=[cf(spec.inputs[0]), *spec.inputs[1:]],
                                        outputs=[cf(spec.outputs[0])])
        self.win: Window = window(first, kernel)
        self.ends = _end_pads(first, kernel)
        xt = _dt(spec.inputs[0])
        self.types = {"TX": self.cl_type(xt), "TY": self.cl_type(xt), **_range(xt)}

    def defines(self) -> dict[str, Any]:
        d = {**super().defines(), **self.types, "AVG": int(self.avg)}
        if self.avg:
            d["INCLUDE_PAD"] = int(bool(self.spec.attr("count_include_pad", 0)))
        return d

    def bind(self, ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        win, p, cl = self.win, self.params, self.backend.cl
        if win.n * win.c * win.oh * win.ow == 0:
            return lambda: None
        geo = [win.h, win.w, win.oh, win.ow, win.kh, win.kw, win.sh, win.sw, win.ph, win.pw, win.dh, win.dw,
               win.c, self.ends[0], self.ends[1], 0]
        sx = _strides((win.n, win.c, win.h, win.w), self.last)
        sy = _strides((win.n, win.c, win.oh, win.ow), self.last)
        x = ins[0]
        if self.avg:
            params = [*_t(ins[1]), *_opt(_in(ins, 2), x), *_t(ins[3]), *_opt(_in(ins, 4), x)]
        else:
            params = [*_t(x), *_opt(None, x), *_t(x), *_opt(None, x)]
        args = [cl.cltypes.make_int16(*geo), cl.cltypes.make_int4(*sx), cl.cltypes.make_int4(*sy), *_t(x), *params,
                *_t(outs[0])]
        return self.launch(self.kernel("pool", *args), (win.ow, win.oh, win.n * win.c), (p["WX"], p["WY"], 1))


def _end_pads(spec: NodeSpec, kernel: tuple[int, ...]) -> tuple[int, int]:
    """The padding after the input (H, W) that count_include_pad counts, as the CPU's pools resolve it
    (backends/cpu/nn.py _window); 1-D: (0, its end pad)."""
    x, y = spec.inputs[0].shape[2:], spec.outputs[0].shape[2:]
    nd = len(x)
    strides = list(spec.attr("strides") or [1] * nd)
    dil = list(spec.attr("dilations") or [1] * nd)
    auto = spec.attr("auto_pad", "NOTSET")
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        total = [max(0, (o - 1) * s + (k - 1) * d + 1 - i) for o, s, k, d, i in zip(y, strides, kernel, dil, x,
                                                                                        strict=True)]
        ends = [t - t // 2 if auto == "SAME_UPPER" else t // 2 for t in total]
    elif auto == "VALID":
        ends = [0] * nd
    else:
        ends = list(spec.attr("pads") or [0] * (2 * nd))[nd:]
    return (0, ends[0]) if nd == 1 else (ends[0], ends[1])


class Softmax(QuantKernel):
    """QLinearSoftmax (com.microsoft; the `opset` attribute picks Softmax-1's coerced 2-D or Softmax-13's axis) as
    the CPU computes it: x dequantized into float32 scratch, the float Softmax (rows.cl) in place, quantized into y;
    within a step of the CPU (the exponentials' last bits)."""

    def __init__(self, spec: NodeSpec, backend: Any, params: Any = None) -> None:
        super().__init__(spec, backend, params)
        x, y = spec.inputs[0], spec.outputs[0]
        if _dt(x) not in EIGHT or _dt(y) != _dt(x) or not all(_given(spec, i) for i in (1, 3)):
            raise decline(spec, f"{_dt(x)} to {_dt(y)}")
        shape, f32 = tuple(x.shape), TensorSpec(tuple(x.shape), F32)
        params = [spec.inputs[i] if _given(spec, i) else None for i in range(1, 5)]
        if any(t is not None and _size(t.shape) != 1 for t in params):
            raise decline(spec, "parameters of more than one value")
        attrs = {} if spec.attr("axis") is None else {"axis": int(spec.attr("axis"))}
        opset = int(spec.attr("opset", 13))
        self.parts = (
            Linear(NodeSpec("DequantizeLinear", spec.name, {}, [x, params[0], params[1]], [f32], [None] * 3, 13, {}),
                   backend),
            FloatSoftmax(NodeSpec("Softmax", spec.name, attrs, [f32], [f32], [None], opset, {}), backend),
            Linear(NodeSpec("QuantizeLinear", spec.name, {}, [f32, params[2], params[3]], [y], [None] * 3, 13, {}),
                   backend))
        self.shape = shape
        self.scratch = (_size(shape) * 4,)

    @property
    def programs(self) -> tuple[ProgramKey, ...]:  # type: ignore[override]
        return tuple(dict.fromkeys(key for part in self.parts for key in part.programs))

    def bind(self, ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        t = ClTensor(scratch[0].buffer, scratch[0].offset, self.shape, F32)
        deq, soft, quant = self.parts
        launches = (deq.bind([ins[0], ins[1], _in(ins, 2)], [t], []), soft.bind([t], [t], []),
                    quant.bind([t, ins[3], _in(ins, 4)], [outs[0]], []))

        def run() -> Any:
            for launch in launches[:-1]:
                launch()
            return launches[-1]()
        return run


def _make(cls: type[ClKernel]) -> Callable[[NodeSpec, Any], ClKernel]:
    def factory(spec: NodeSpec, backend: Any) -> ClKernel:
        return cls(spec, backend)
    return factory


# MaxPool of integers (a QDQ unit's MaxPool the pass leaves on the integers): window.py's MaxPool factory hands a
# node whose input is an integer type to this one (registered once, as MaxPool, there).
INT_MAXPOOL = _make(Pool)

KERNELS: dict[str, Callable[[NodeSpec, Any], ClKernel]] = {
    "QuantizeLinear": _make(Linear), "DequantizeLinear": _make(Linear), "DynamicQuantizeLinear": _make(DynamicQuantize),
    "QLinearAdd": _make(Binary), "QLinearMul": _make(Binary), "QLinearLookup": _make(Lookup),
    "QLinearSigmoid": _make(UnaryTable), "QLinearLeakyRelu": _make(UnaryTable),
    "QLinearConcat": _make(Concat), "QLinearGlobalAveragePool": _make(GlobalAvgPool),
    "QLinearAveragePool": _make(Pool), "QLinearSoftmax": _make(Softmax),
}
