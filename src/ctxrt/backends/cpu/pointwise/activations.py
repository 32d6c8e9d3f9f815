"""Activation functions beyond the plain element-wise ones: HardSwish, PRelu, the ELU family, Mish, Softsign,
ThresholdedRelu, Shrink and Swish (x * sigmoid(alpha x), also what the FuseSilu pass makes of torch's SiLU).

Each runs over cache-sized blocks with its temporaries in declared scratch, and stays correct when its output
is its input's memory (compiler/build.py runs them in place). Negative and positive parts are computed as
max(x, 0) and a function of min(x, 0) so no mask is needed and NaN propagates as in the reference.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ctxrt.backends.cpu.elementwise import CHUNK, Blocked, _float, _zeros
from ctxrt.backends.cpu.image.boxes import box_shape, boxes
from ctxrt.backends.kernel import Kernel, Launch, NodeSpec, scratch_view
from ctxrt.errors import UnsupportedOpError


def _consts(spec: NodeSpec, **defaults: float) -> tuple[np.dtype, list[Any]]:
    """The tensor dtype and the float attributes in it. ONNX float attributes are float32, defaults too: a
    float64 LeakyRelu's default alpha is float32(0.01) in onnxruntime and the reference."""
    dt = _float(spec)
    return dt, [dt.type(np.float32(spec.attr(k, v))) for k, v in defaults.items()]


def _zero(dt: np.dtype) -> np.ndarray:
    return _zeros((CHUNK,), dt)  # max/min against an array run vectorized, against a scalar they do not


def hard_swish(spec: NodeSpec) -> Kernel:
    """x * clip(alpha x + beta, 0, 1). alpha/beta are not ONNX attributes of HardSwish (1/6, 1/2); the
    FuseSilu pass sets them when it folds a HardSigmoid(x) * x with other constants."""
    dt, (alpha, beta) = _consts(spec, alpha=1 / 6, beta=0.5)
    zeros, one = _zero(dt), dt.type(1)

    def block(x: np.ndarray, y: np.ndarray, t: np.ndarray) -> None:
        np.multiply(x, alpha, out=t)
        np.add(t, beta, out=t)
        np.maximum(t, zeros[:t.size], out=t)
        np.minimum(t, one, out=t)
        np.multiply(x, t, out=y)
    return Blocked(spec, block, (dt,))


def _exp_family(spec: NodeSpec, pre: Any, post: Any, gain: Any) -> Kernel:
    """gain * max(x, 0) + post * expm1(pre * min(x, 0)): Elu, Selu and Celu."""
    dt = _float(spec)
    zeros = _zero(dt)

    def block(x: np.ndarray, y: np.ndarray, t: np.ndarray) -> None:
        z = zeros[:t.size]
        np.minimum(x, z, out=t)
        if pre is not None:
            np.multiply(t, pre, out=t)
        np.expm1(t, out=t)
        np.multiply(t, post, out=t)
        np.maximum(x, z, out=y)
        if gain is not None:
            np.multiply(y, gain, out=y)
        np.add(y, t, out=y)
    return Blocked(spec, block, (dt,))


def elu(spec: NodeSpec) -> Kernel:
    _, (alpha,) = _consts(spec, alpha=1.0)
    return _exp_family(spec, None, alpha, None)


def selu(spec: NodeSpec) -> Kernel:
    _, (alpha, gamma) = _consts(spec, alpha=1.67326319217681884765625, gamma=1.05070102214813232421875)
    return _exp_family(spec, None, alpha * gamma, gamma)


def celu(spec: NodeSpec) -> Kernel:
    dt, (alpha,) = _consts(spec, alpha=1.0)
    return _exp_family(spec, dt.type(1 / float(alpha)), alpha, None)


def mish(spec: NodeSpec) -> Kernel:
    dt = _float(spec)
    zero = dt.type(0)

    def block(x: np.ndarray, y: np.ndarray, t: np.ndarray) -> None:
        np.logaddexp(x, zero, out=t)  # softplus without overflow
        np.tanh(t, out=t)
        np.multiply(x, t, out=y)
    return Blocked(spec, block, (dt,))


def softsign(spec: NodeSpec) -> Kernel:
    dt = _float(spec)
    one = dt.type(1)

    def block(x: np.ndarray, y: np.ndarray, t: np.ndarray) -> None:
        np.abs(x, out=t)
        np.add(t, one, out=t)
        np.divide(x, t, out=y)
    return Blocked(spec, block, (dt,))


def thresholded_relu(spec: NodeSpec) -> Kernel:
    """x where x > alpha, else 0 (NaN and -inf included: a product with a 0/1 mask would give NaN)."""
    dt, (alpha,) = _consts(spec, alpha=1.0)
    zero = dt.type(0)

    def block(x: np.ndarray, y: np.ndarray, off: np.ndarray) -> None:
        np.greater(x, alpha, out=off)
        np.logical_not(off, out=off)
        np.copyto(y, x)  # nothing to do when run in place: NumPy skips a copy onto the same memory
        np.copyto(y, zero, where=off)
    return Blocked(spec, block, (np.bool_,))


def shrink(spec: NodeSpec) -> Kernel:
    """x + bias where x < -lambd, x - bias where x > lambd, else 0 (NaN too, as in the reference). Integers are
    computed in float64 and truncated back, as onnx.reference's astype does."""
    dt = np.dtype(spec.inputs[0].dtype)
    if dt.kind not in "fiu":
        raise UnsupportedOpError(f"Shrink node {spec.name!r}: dtype {dt} is not supported")
    ct = dt if dt.kind == "f" else np.dtype(np.float64)
    lambd, bias = ct.type(np.float32(spec.attr("lambd", 0.5))), ct.type(np.float32(spec.attr("bias", 0.0)))
    lo, zero = -lambd, ct.type(0)

    def block(x: np.ndarray, y: np.ndarray, low: np.ndarray, high: np.ndarray) -> None:
        np.less(x, lo, out=low)
        np.greater(x, lambd, out=high)
        np.subtract(x, bias, out=y, where=high)  # in place: x's other elements are untouched
        np.add(x, bias, out=y, where=low)
        np.logical_or(low, high, out=low)
        np.logical_not(low, out=low)
        np.copyto(y, zero, where=low)
    if dt.kind == "f":
        return Blocked(spec, block, (np.bool_, np.bool_))

    def converted(x: np.ndarray, y: np.ndarray, t: np.ndarray, low: np.ndarray, high: np.ndarray) -> None:
        np.copyto(t, x)
        block(t, t, low, high)
        np.copyto(y, t, casting="unsafe")
    return Blocked(spec, converted, (np.float64, np.bool_, np.bool_), {"invalid": "ignore"})


def swish(spec: NodeSpec) -> Kernel:
    """x / (1 + exp(-alpha x)): 4 passes, the sigmoid never materialized."""
    dt, (alpha,) = _consts(spec, alpha=1.0)
    neg, one = -alpha, dt.type(1)

    def block(x: np.ndarray, y: np.ndarray, t: np.ndarray) -> None:
        np.multiply(x, neg, out=t)
        np.exp(t, out=t)  # overflows to inf for x << 0: x / inf = -0, the right limit
        np.add(t, one, out=t)
        np.divide(x, t, out=y)
    return _Swish(spec, block, (dt,), {"over": "ignore"}, alpha)


class _Swish(Blocked):
    """Swish by csrc/genai.c's one pass over float32 (a decoder's SiLU: 2048 values in ~2 us instead of NumPy's
    four passes and an errstate, ~30 us), NumPy's blocks where the extension is not built or a tensor is strided.
    The scratch is declared either way: a binary's plan is the same with and without the extension."""

    def __init__(self, spec: NodeSpec, block: Any, temps: tuple[Any, ...], quiet: dict[str, str], alpha: Any) -> None:
        super().__init__(spec, block, temps, quiet)
        self.alpha = float(alpha)
        self.float32 = _float(spec) == np.float32

    def bind(self, ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        from ctxrt.backends.cpu import native

        lib = native.library()
        x, y = ins[0], outs[0]
        if lib is None or not self.float32 or not (x.flags.c_contiguous and y.flags.c_contiguous):
            return super().bind(ins, outs, scratch)
        args = native.SwishArgs(n=x.size, x=x.ctypes.data, y=y.ctypes.data, alpha=self.alpha)
        return native.launch("ctxrt_swish", args, (x, y))


class _PRelu(Kernel):
    """max(x, 0) + slope * min(x, 0) with the slope broadcast to x (per channel [C, 1, 1] and the like),
    over boxes of x so that each block's slope is a plain view of the broadcast."""

    def __init__(self, spec: NodeSpec) -> None:
        self.dt = _float(spec)
        self.shape = tuple(spec.outputs[0].shape)
        self.blocks = boxes(self.shape, CHUNK)
        self.scratch = (max(b - a for _, a, b in self.blocks) * self.dt.itemsize,)

    def bind(self, ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        x, y = ins[0], outs[0]
        slope = np.broadcast_to(ins[1], self.shape)
        plan = []
        for index, _, _ in self.blocks:
            shape = box_shape(index, self.shape)
            t = scratch_view(scratch[0], shape, self.dt)
            plan.append((x[index], slope[index], y[index], t, _zeros(shape, self.dt)))

        def run() -> None:
            for xb, sb, yb, t, z in plan:
                np.minimum(xb, z, out=t)
                np.multiply(t, sb, out=t)
                np.maximum(xb, z, out=yb)
                np.add(yb, t, out=yb)
        return run


def prelu(spec: NodeSpec) -> Kernel:
    return _PRelu(spec)


KERNELS = {
    "HardSwish": hard_swish, "Elu": elu, "Selu": selu, "Celu": celu, "Mish": mish, "Softsign": softsign,
    "ThresholdedRelu": thresholded_relu, "Shrink": shrink, "Swish": swish, "PRelu": prelu,
}
