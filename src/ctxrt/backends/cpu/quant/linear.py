"""QuantizeLinear, DequantizeLinear (ONNX opsets 10 to 21+, and com.microsoft's) and DynamicQuantizeLinear.

Scale and zero point apply per tensor, per axis (any axis, negative too) or, from opset 21, in blocks of
`block_size` along an axis (a last block that does not fill the axis is shorter). Every view of x and of the
parameters that line up is made at bind time (`Layout`): a blocked axis is split into its whole blocks and the
remainder, so each part is one broadcast ufunc call.

Quantization rounds half to even and saturates to the output type (uint8, int8, uint16, int16, uint4, int4; the
float8 types round to nearest even, and clip to their largest finite value when `saturate` is 1). A 4-bit weight
reaches DequantizeLinear packed two a byte (ctxrt.dtypes) and is unpacked as the kernel runs, into its output.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
from onnx import helper

from ctxrt import dtypes
from ctxrt.backends.cpu import native
from ctxrt.backends.cpu.quant.common import (
    F32,
    F64,
    INTEGER,
    Bound,
    dtype_of,
    fail,
    given,
    limits,
    quantize_into,
    same_shape_view,
    saturate,
    size,
)
from ctxrt.backends.kernel import Kernel, Launch, NodeSpec, scratch_view

_FLOATS = {np.dtype(t) for t in (np.float32, np.float16)} | {dtypes.BFLOAT16}


class Layout:
    """How a parameter tensor (scale, zero point) lines up with x: per tensor, per axis, or blocked."""

    def __init__(self, spec: NodeSpec, pshape: tuple[int, ...]) -> None:
        shape = tuple(spec.inputs[0].shape)
        self.shape, self.pshape = shape, tuple(pshape)
        block = int(spec.attr("block_size", 0) or 0)
        rank = len(shape)
        axis = int(spec.attr("axis", 1))
        # One value is per tensor whatever the attributes say (as onnx.reference and onnxruntime read it).
        self.mode = "tensor" if size(self.pshape) == 1 else "block" if block > 0 else "axis"
        if self.mode == "tensor":
            return
        if not -rank <= axis < rank:
            raise fail(spec, f"axis {axis} is out of range for rank {rank}")
        axis %= rank
        self.pre, self.n, self.post = size(shape[:axis]), shape[axis], size(shape[axis + 1:])
        if self.mode == "axis":
            if self.pshape != (self.n,):
                raise fail(spec, f"per-axis parameters of shape {list(self.pshape)} for axis {axis} of {list(shape)}")
            return
        if block <= 0:
            raise fail(spec, f"block_size {block} must be positive")
        nb = -(-self.n // block)
        want = shape[:axis] + (nb,) + shape[axis + 1:]
        if self.pshape != want:
            raise fail(spec, f"blocked parameters of shape {list(self.pshape)}: expected {list(want)} for blocks "
                             f"of {block} along axis {axis} of {list(shape)}")
        self.block, self.full, self.rest = block, self.n // block, self.n % block

    def x_parts(self, a: np.ndarray) -> list[np.ndarray]:
        """Views of an x-shaped (contiguous) array, one per part."""
        if self.mode == "tensor":
            return [a]
        x3 = same_shape_view(a, (self.pre, self.n, self.post))
        if self.mode == "axis":
            return [x3]
        parts = []
        if self.full:
            parts.append(same_shape_view(x3[:, :self.full * self.block], (self.pre, self.full, self.block, self.post)))
        if self.rest:
            parts.append(x3[:, self.full * self.block:])
        return parts

    def p_parts(self, p: np.ndarray) -> list[np.ndarray]:
        """Views of a parameter array that broadcast against `x_parts`, part by part."""
        if self.mode == "tensor":
            return [p.reshape(())]
        if self.mode == "axis":
            return [p.reshape(1, self.n, 1)]
        p3 = p.reshape(self.pre, -1, self.post)
        parts = []
        if self.full:
            parts.append(p3[:, :self.full, None, :])
        if self.rest:
            parts.append(p3[:, self.full:self.full + 1])
        return parts


class _Unpack:
    """Reads a 4-bit tensor into a float buffer as a launch runs: from the packed bytes of a weight (two values a
    byte, low nibble first) through a scratch of one byte per pair, or from a one-value-a-byte arena tensor."""

    def __init__(self, dtype: np.dtype, count: int) -> None:
        self.signed, self.count = dtype == dtypes.INT4, count
        self.nbytes = dtypes.packed_nbytes(count)

    def run(self, packed: np.ndarray, out: np.ndarray, u8: np.ndarray) -> None:
        flat, n, u8 = out.reshape(-1), self.count, u8[:packed.size]
        for shift, dst, k in ((0, flat[0::2], (n + 1) // 2), (4, flat[1::2], n // 2)):
            if shift:
                np.right_shift(packed, 4, out=u8)
            else:
                np.bitwise_and(packed, 0x0F, out=u8)
            if self.signed:
                np.bitwise_xor(u8, 0x08, out=u8)  # v ^ 8 - 8 sign-extends a nibble
            np.copyto(dst, u8[:k], casting="unsafe")
        if self.signed:
            np.subtract(flat, 8, out=flat)


def _loader(spec: NodeSpec, i: int, count: int) -> tuple[Any, int]:
    """(load(src, dst_float, scratch_or_None), scratch bytes) for input i: a copy, or an unpack of packed bytes."""
    dt = dtype_of(spec, i)
    if not dtypes.is_4bit(dt):
        return (lambda src, dst, _s: np.copyto(dst, src.reshape(dst.shape), casting="unsafe")), 0
    unpack = _Unpack(dt, count)

    def load(src: np.ndarray, dst: np.ndarray, u8: np.ndarray | None) -> None:
        if src.dtype == np.uint8:  # a weight, packed
            unpack.run(src, dst, u8)
        else:
            np.copyto(dst, src.reshape(dst.shape), casting="unsafe")
    return load, unpack.nbytes


def _output_dtype(spec: NodeSpec) -> np.dtype:
    return np.dtype(spec.outputs[0].dtype)


def quantize(spec: NodeSpec) -> Kernel:
    xt, yt = dtype_of(spec, 0), _output_dtype(spec)
    if xt not in _FLOATS | {np.dtype(np.int32)}:
        raise fail(spec, f"input of type {xt} is not supported")
    float8 = dtypes.is_float8(yt)
    if yt not in INTEGER - {np.dtype(np.int32)} and not float8:
        raise fail(spec, f"output type {yt} is not supported")
    layout = Layout(spec, spec.inputs[1].shape)
    if given(spec, 2) and tuple(spec.inputs[2].shape) != layout.pshape and size(spec.inputs[2]) != size(layout.pshape):
        raise fail(spec, "scale and zero point differ in shape")
    n, pn = size(spec.inputs[0]), size(layout.pshape)
    ct = F64 if xt == np.int32 else F32  # int32 / float32 divides in float64, as onnx.reference does
    precision = int(spec.attr("precision", 0) or 0)
    div_dt = np.dtype(helper.tensor_dtype_to_np_dtype(precision)) if precision else None
    has_zp = given(spec, 2)
    load_zp, zp_u8 = _loader(spec, 2, pn) if has_zp else (None, 0)
    clip = not float8 or bool(spec.attr("saturate", 1))  # float8 without saturate: overflow is inf or NaN
    if float8:
        big = ct.type(ml_dtypes.finfo(yt).max)
        lo, hi = -big, big
    else:
        lo, hi = limits(yt, ct)

    eight = yt in (np.dtype(np.int8), np.dtype(np.uint8)) and xt == F32 and pn == 1 and div_dt is None

    def make(ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        if eight:  # per tensor, float32 to 8 bits: the native kernel, the same operations in one pass
            fast = _native_quantize(ins[0], outs[0], ins[1], ins[2] if has_zp else None)
            if fast is not None:
                return fast
        x, y = ins[0].reshape(layout.shape), outs[0].reshape(layout.shape)
        t = scratch_view(scratch[0], layout.shape, ct)
        zpf = scratch_view(scratch[1], layout.pshape, ct) if has_zp else None
        u8 = scratch_view(scratch[2], (zp_u8,), np.uint8) if zp_u8 else None
        scales = layout.p_parts(ins[1])
        zps = layout.p_parts(zpf) if has_zp else [None] * len(scales)
        parts = list(zip(layout.x_parts(x), scales, layout.x_parts(t), zps, strict=True))

        def run() -> None:
            if has_zp:
                load_zp(ins[2], zpf, u8)
            for xp, sp, tp, _ in parts:
                np.divide(xp, sp, out=tp, dtype=div_dt)
            if not float8:
                np.rint(t, out=t)
            if has_zp:
                for _, _, tp, zp in parts:
                    np.add(tp, zp, out=tp)
            if clip:
                saturate(t, lo, hi)
            np.copyto(y, t, casting="unsafe")
        return run
    return Bound(make, (n * ct.itemsize, pn * ct.itemsize, zp_u8))


def _native_quantize(x: np.ndarray, y: np.ndarray, scale: np.ndarray, zp: np.ndarray | None) -> Launch | None:
    """QuantizeLinear per tensor, float32 to 8 bits, on the native kernel (csrc/qelem.c): divide, round half to
    even, add the zero point, saturate, as `quantize`'s run does; None where it does not apply."""
    return _native_linear("quantize", x, y, y, scale, zp)


def _native_dequantize(x: np.ndarray, y: np.ndarray, scale: np.ndarray, zp: np.ndarray | None) -> Launch | None:
    """DequantizeLinear per tensor, 8 bits to float32, on the native kernel (csrc/qelem.c): (x - zero point) *
    scale in float32, as `dequantize`'s run computes it; None where it does not apply."""
    return _native_linear("dequantize", x, y, x, scale, zp)


def _native_linear(kind: str, x: np.ndarray, y: np.ndarray, q: np.ndarray, scale: np.ndarray,
                   zp: np.ndarray | None) -> Launch | None:
    """The launch of csrc/qelem.c's ctxrt_quantize or ctxrt_dequantize (`kind`), `q` the 8-bit side."""
    lib = native.library()
    if lib is None or not (x.flags.c_contiguous and y.flags.c_contiguous) or x.size != y.size:
        return None
    if zp is not None and (zp.size != 1 or zp.dtype != q.dtype):
        return None
    args = native.Linear8Args(n=y.size, x=x.ctypes.data, y=y.ctypes.data, is_signed=int(q.dtype == np.int8))
    if not native.read_params(args.src, [scale, zp]):  # may be run-time inputs: the kernel reads them each run
        return None
    return native.launch(f"ctxrt_{kind}", args, (x, y, scale, zp))


def dequantize(spec: NodeSpec) -> Kernel:
    xt, yt = dtype_of(spec, 0), _output_dtype(spec)
    if xt not in INTEGER and not dtypes.is_float8(xt):
        raise fail(spec, f"input of type {xt} is not supported")
    if yt not in _FLOATS:
        raise fail(spec, f"output type {yt} is not supported")
    layout = Layout(spec, spec.inputs[1].shape)
    n, pn = size(spec.inputs[0]), size(layout.pshape)
    has_zp = given(spec, 2) and not dtypes.is_float8(xt)  # a float8 zero point is 0
    load_x, x_u8 = _loader(spec, 0, n)
    load_zp, zp_u8 = _loader(spec, 2, pn) if has_zp else (None, 0)
    direct = yt == F32  # computed in the output itself, else in float32 scratch (as onnx.reference)
    eight = xt in (np.dtype(np.int8), np.dtype(np.uint8)) and direct and pn == 1

    def make(ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        if eight:  # per tensor, 8 bits to float32: the native kernel, the same operations in one pass
            fast = _native_dequantize(ins[0], outs[0], ins[1], ins[2] if has_zp else None)
            if fast is not None:
                return fast
        y = outs[0].reshape(layout.shape)
        t = y if direct else scratch_view(scratch[0], layout.shape, F32)
        zpf = scratch_view(scratch[1], layout.pshape, F32) if has_zp else None
        u8 = scratch_view(scratch[2], (max(x_u8, zp_u8),), np.uint8) if x_u8 or zp_u8 else None
        scales = layout.p_parts(ins[1])
        zps = layout.p_parts(zpf) if has_zp else [None] * len(scales)
        parts = list(zip(layout.x_parts(t), scales, zps, strict=True))
        x = ins[0]

        def run() -> None:
            load_x(x, t, u8)
            if has_zp:
                load_zp(ins[2], zpf, u8[:zp_u8] if zp_u8 else None)
            for tp, sp, zp in parts:
                if zp is not None:
                    np.subtract(tp, zp, out=tp)
                np.multiply(tp, sp, out=tp)
            if not direct:
                np.copyto(y, t, casting="unsafe")
        return run
    return Bound(make, (0 if direct else n * 4, pn * 4 if has_zp else 0, max(x_u8, zp_u8)))


def dynamic_quantize(spec: NodeSpec) -> Kernel:
    """y, y_scale, y_zero_point = uint8 quantization of x over [min(x, 0), max(x, 0)]; a range of 0 (x all
    zeros) gives scale 1, as onnxruntime (onnx.reference gives 1/255)."""
    if dtype_of(spec, 0) != F32:
        raise fail(spec, f"input of type {dtype_of(spec, 0)} is not supported")
    shape = tuple(spec.inputs[0].shape)
    f = np.float32

    def make(ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        x, (y, ys, yz) = ins[0], outs
        t = scratch_view(scratch[0], shape, F32)
        flat = x.reshape(-1)
        if native.library() is not None and x.flags.c_contiguous and y.flags.c_contiguous and \
                ys.dtype == F32 and yz.dtype == np.uint8:  # the whole op in one native call (csrc/qelem.c)
            args = native.DynQuantArgs(n=y.size, x=x.ctypes.data, y=y.ctypes.data, scale=ys.ctypes.data,
                                       zp=yz.ctypes.data)
            return native.launch("ctxrt_dynquant", args, (x, y, ys, yz))

        def run() -> None:
            hi = f(max(f(0), np.maximum.reduce(flat))) if flat.size else f(0)
            lo = f(min(f(0), np.minimum.reduce(flat))) if flat.size else f(0)
            scale = f(1) if hi == lo else f(hi - lo) / f(255)
            zp = np.rint(min(f(255), max(f(0), f(0) - lo / scale)))
            ys[...] = scale
            yz[...] = zp
            np.divide(x, scale, out=t)
            quantize_into(t, zp, f(0), f(255), y)
        return run
    return Bound(make, (size(shape) * 4,))


KERNELS = {"QuantizeLinear": quantize, "DequantizeLinear": dequantize, "DynamicQuantizeLinear": dynamic_quantize}
