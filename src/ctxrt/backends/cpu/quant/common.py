"""What the quantized kernels share: integer ranges, parameter views, requantization, a launch built at bind time.

Scales and zero points are read from their tensors as each launch runs (a constant one is a weight, a computed one
an arena tensor: the same view either way), through views made at bind time, so nothing is looked up per run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ctxrt import dtypes
from ctxrt.backends.kernel import Kernel, Launch, NodeSpec, TensorSpec
from ctxrt.errors import UnsupportedOpError

F32, F64 = np.dtype(np.float32), np.dtype(np.float64)
INTEGER = {np.dtype(t) for t in (np.int8, np.uint8, np.int16, np.uint16, np.int32)} | set(dtypes.FOUR_BIT)
EIGHT_BIT = {np.dtype(np.int8), np.dtype(np.uint8)}
# the integer products (float64 sums: exact) and QLinearAdd/Mul take 16-bit operands too (QDQ units, ir/passes/qdq.py)
WIDE_INTS = EIGHT_BIT | {np.dtype(np.int16), np.dtype(np.uint16)}


class Bound(Kernel):
    """A kernel whose launch `make(ins, outs, scratch)` builds once, at bind time (views, blocks)."""

    def __init__(self, make: Callable[[list[Any], list[Any], list[Any]], Launch], scratch: tuple[int, ...] = (),
                 algorithm: str = "default") -> None:
        self.make, self.scratch, self.algorithm = make, tuple(int(s) for s in scratch), algorithm

    def bind(self, ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        return self.make(ins, outs, scratch)


def fail(spec: NodeSpec, what: str) -> UnsupportedOpError:
    return UnsupportedOpError(f"{spec.op} node {spec.name!r}: {what}")


def given(spec: NodeSpec, i: int) -> bool:
    return i < len(spec.inputs) and spec.inputs[i] is not None


def dtype_of(spec: NodeSpec, i: int) -> np.dtype:
    return np.dtype(spec.inputs[i].dtype)


def require(spec: NodeSpec, i: int, allowed: set[np.dtype], what: str) -> np.dtype:
    dt = dtype_of(spec, i)
    if dt not in allowed:
        raise fail(spec, f"{what} of type {dt} is not supported")
    return dt


def limits(dt: np.dtype, compute: np.dtype = F32) -> tuple[Any, Any]:
    """(min, max) of an integer type as scalars of the float type computed in (NumPy's clip converts Python
    floats to new arrays at every call)."""
    lo, hi = dtypes.int_range(dt)
    return compute.type(lo), compute.type(hi)


def size(t: TensorSpec | tuple[int, ...]) -> int:
    shape = t.shape if isinstance(t, TensorSpec) else t
    return int(np.prod(shape, dtype=np.int64))


def scalar_param(spec: NodeSpec, i: int, what: str) -> None:
    """Refuse a parameter that the op allows only per tensor, unless it holds one value."""
    if given(spec, i) and size(spec.inputs[i]) != 1:
        raise fail(spec, f"{what} must be a scalar (per-tensor), got shape {list(spec.inputs[i].shape)}")


def flat_param(x: Any | None) -> Any | None:
    """A parameter tensor as a 0-d view (one value) or a 1-D view, for broadcasting."""
    if x is None:
        return None
    return x.reshape(()) if x.size == 1 else x.reshape(-1)


def same_shape_view(a: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """A view of `a` with another shape; never a copy (a copy would detach the launch from its buffer)."""
    v = a.view()
    v.shape = shape
    return v


class Requant:
    """y = saturate(round_half_even(acc * multiplier) + zero_point), in float32 as onnxruntime computes it: the
    accumulator (exact integers, in float64) is rounded to float32, scaled by the float32 multiplier, rounded to
    even, offset and clipped."""

    def __init__(self, out_dtype: np.dtype) -> None:
        self.lo, self.hi = limits(out_dtype)

    def __call__(self, acc: np.ndarray, t32: np.ndarray, mult: Any, zp: Any, out: np.ndarray) -> None:
        np.copyto(t32, acc, casting="unsafe")
        np.multiply(t32, mult, out=t32)
        np.rint(t32, out=t32)
        if zp is not None:
            np.add(t32, zp, out=t32)
        saturate(t32, self.lo, self.hi)
        np.copyto(out, t32, casting="unsafe")


def quantize_into(t: np.ndarray, zp: Any, lo: Any, hi: Any, out: np.ndarray) -> None:
    """out = saturate(round_half_even(t) + zp); t (float, already divided by the scale) is overwritten."""
    np.rint(t, out=t)
    if zp is not None:
        np.add(t, zp, out=t)
    saturate(t, lo, hi)
    np.copyto(out, t, casting="unsafe")


def saturate(t: np.ndarray, lo: Any, hi: Any) -> None:
    """t clipped to [lo, hi] in place (NaN stays NaN), by the ufuncs themselves: np.clip's Python wrapper
    allocates at every call."""
    np.maximum(t, lo, out=t)
    np.minimum(t, hi, out=t)


def dequantize_into(x: Any, zp: Any, scale: Any, out: np.ndarray) -> None:
    """out = (x - zp) * scale in out's float type (the subtraction in that type: exact for 8/16-bit integers)."""
    if zp is not None:
        np.subtract(x, zp, out=out, dtype=out.dtype)
    else:
        np.copyto(out, x, casting="unsafe")
    np.multiply(out, scale, out=out)


def centred_span(spec: NodeSpec, i: int, zp: int | None = None) -> int:
    """The largest |x - zero point| of input i's integer type (a float A, DynamicQuantizeMatMul's: uint8's): with
    a constant zero point (or none: 0) the distance from it to the type's ends (int8 weights centred on 0: 128),
    else the type's whole width."""
    dt = np.dtype(spec.inputs[i].dtype)
    if dt.kind == "f":
        return 255
    lo, hi = dtypes.int_range(dt)
    if zp is not None and given(spec, zp):
        z = spec.consts[zp] if zp < len(spec.consts) else None
        if z is None:
            return hi - lo  # computed at run time: anywhere in the range
        values = np.asarray(z).astype(np.int64).reshape(-1)
        return int(max(np.abs(values - lo).max(), np.abs(hi - values).max())) if values.size else hi - lo
    return max(abs(lo), abs(hi))  # no zero point: 0
