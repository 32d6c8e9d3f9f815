"""Element-wise logic: comparisons, boolean and bitwise ops, BitShift, NaN/Inf tests, Where, Cast."""

from __future__ import annotations

from typing import Any

import numpy as np

from ctxrt import dtypes
from ctxrt.backends.cpu import strided
from ctxrt.backends.cpu.elementwise import BoundKernel, operands, ufunc_kernel, unary_kernel
from ctxrt.backends.kernel import Kernel, Launch, NodeSpec, scratch_view
from ctxrt.errors import UnsupportedOpError

_BINARY: dict[str, np.ufunc] = {
    "Equal": np.equal, "Less": np.less, "Greater": np.greater, "LessOrEqual": np.less_equal,
    "GreaterOrEqual": np.greater_equal, "And": np.logical_and, "Or": np.logical_or, "Xor": np.logical_xor,
    "BitwiseAnd": np.bitwise_and, "BitwiseOr": np.bitwise_or, "BitwiseXor": np.bitwise_xor,
}
_UNARY: dict[str, np.ufunc] = {"Not": np.logical_not, "IsNaN": np.isnan, "BitwiseNot": np.invert}


def binary(spec: NodeSpec) -> Kernel:
    return ufunc_kernel(_BINARY[spec.op])


def unary(spec: NodeSpec) -> Kernel:
    return unary_kernel(_UNARY[spec.op])


def bit_shift(spec: NodeSpec) -> Kernel:
    """X << Y or X >> Y (attribute `direction`), unsigned and (opset 28) signed integers. NumPy's shifts are ONNX's:
    the right shift of a signed value is arithmetic, bits shifted past the width are dropped, and a shift by a
    negative amount or by the width or more gives 0 (-1 for a right shift of a negative value), where C's would be
    undefined."""
    direction = spec.attr("direction")
    if isinstance(direction, bytes):
        direction = direction.decode()
    if direction not in ("LEFT", "RIGHT"):
        raise UnsupportedOpError(f"BitShift node {spec.name!r}: attribute 'direction' value {direction!r} is not "
                                 "supported")
    for t in spec.inputs:
        if np.dtype(t.dtype).kind not in "iu":
            raise UnsupportedOpError(f"BitShift node {spec.name!r}: dtype {np.dtype(t.dtype)} is not supported")
    return ufunc_kernel(np.left_shift if direction == "LEFT" else np.right_shift)


def is_inf(spec: NodeSpec) -> Kernel:
    neg, pos = spec.attr("detect_negative", 1), spec.attr("detect_positive", 1)

    def make(ins: list[Any], outs: list[Any], _s: list[Any]) -> Launch:
        x, y = ins[0], outs[0]
        if neg and pos:
            return lambda: np.isinf(x, out=y)
        if neg or pos:
            inf = x.dtype.type(-np.inf if neg else np.inf)
            return lambda: np.equal(x, inf, out=y)
        return lambda: y.fill(False)
    return BoundKernel(make)


def cast(spec: NodeSpec) -> Kernel:
    """Cast and CastLike: C casts (floats truncate toward zero, nonzero -> True); bfloat16 too (ml_dtypes' casts,
    rounding to nearest even), the float32 region's edges of a bfloat16 model (ir/passes/half.py)."""
    for t in (spec.inputs[0], spec.outputs[0]):
        if np.dtype(t.dtype).kind not in "biuf" and np.dtype(t.dtype) != dtypes.BFLOAT16:
            raise UnsupportedOpError(f"{spec.op} node {spec.name!r}: dtype {np.dtype(t.dtype)} is not supported")

    def make(ins: list[Any], outs: list[Any], _s: list[Any]) -> Launch:
        x, y = operands(ins[:1], outs[0])[0], outs[0]
        if x is y:
            return lambda: None
        return lambda: np.copyto(y, x, casting="unsafe")
    return BoundKernel(make)


def _where_numpy(y: np.ndarray, c: np.ndarray, a: np.ndarray, b: np.ndarray, scratch: list[Any]) -> Launch:
    if b is y:
        return lambda: np.copyto(y, a, where=c)
    if a is y:  # in place on the true branch: fill in the false branch where the condition fails
        nc = scratch_view(scratch[0], c.shape, np.bool_)

        def run_a() -> None:
            np.logical_not(c, out=nc)
            np.copyto(y, b, where=nc)
        return run_a

    def run() -> None:
        np.copyto(y, b)
        np.copyto(y, a, where=c)
    return run


def where(spec: NodeSpec) -> Kernel:
    def make(ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        y = outs[0]
        c, a, b = operands(ins, y)
        return strided.where(y, c, a, b, _where_numpy(y, c, a, b, scratch))  # one native pass where it fits
    return BoundKernel(make, (max(1, int(np.prod(spec.inputs[0].shape))),))


KERNELS = {
    **{op: binary for op in _BINARY}, **{op: unary for op in _UNARY}, "IsInf": is_inf, "BitShift": bit_shift,
    "Cast": cast, "CastLike": cast, "Where": where,
}
