"""Element-wise arithmetic: unary math, Erf and Gelu, binary and variadic ops with NumPy broadcasting.

Every kernel here stays correct when its output is the same memory as an input (the planner runs them in
place), and its launch allocates nothing: temporaries live in declared scratch.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from ctxrt.backends.cpu import strided
from ctxrt.backends.kernel import Kernel, Launch, NodeSpec, scratch_view
from ctxrt.errors import UnsupportedOpError

CHUNK = 16384  # elements per block of multi-pass kernels: their temporaries stay in the L2 cache


class BoundKernel(Kernel):
    """A kernel whose launch is built once by `make(ins, outs, scratch)`: views, aliasing decisions."""

    def __init__(self, make: Callable[[list[Any], list[Any], list[Any]], Launch],
                 scratch: tuple[int, ...] = (), algorithm: str = "default") -> None:
        self.make, self.scratch, self.algorithm = make, scratch, algorithm

    def bind(self, ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        return self.make(ins, outs, scratch)


def operands(ins: list[Any], out: np.ndarray) -> list[Any]:
    """The inputs, with any that is exactly the output's memory replaced by the output array itself.

    NumPy copies an operand that overlaps the output unless both are the same view; an in-place input
    may come as a view with another shape (leading 1s), so it is swapped for the output here."""
    def same(x: Any) -> bool:
        return (x is not None and x.dtype == out.dtype and x.nbytes == out.nbytes and x.size > 0
                and x.ctypes.data == out.ctypes.data)
    return [out if same(x) else x for x in ins]


def flat(a: np.ndarray) -> np.ndarray:
    """A 1-D view (never a copy: a copy would silently detach the launch from the arena)."""
    if not a.flags.c_contiguous:
        raise ValueError("element-wise blocks need contiguous tensors")
    return a.reshape(-1)


def _fail(spec: NodeSpec, what: str) -> UnsupportedOpError:
    return UnsupportedOpError(f"{spec.op} node {spec.name!r}: {what} is not supported")


def _float(spec: NodeSpec) -> np.dtype:
    dt = np.dtype(spec.inputs[0].dtype)
    if dt.kind != "f":
        raise _fail(spec, f"dtype {dt}")
    return dt


# --- unary -------------------------------------------------------------------------------------------

_UNARY: dict[str, np.ufunc] = {
    "Tanh": np.tanh, "Sqrt": np.sqrt, "Exp": np.exp, "Log": np.log, "Neg": np.negative, "Abs": np.abs,
    "Reciprocal": np.reciprocal, "Floor": np.floor, "Ceil": np.ceil, "Sign": np.sign, "Round": np.rint,
    "Sin": np.sin, "Cos": np.cos, "Tan": np.tan, "Asin": np.arcsin, "Acos": np.arccos, "Atan": np.arctan,
    "Sinh": np.sinh, "Cosh": np.cosh, "Asinh": np.arcsinh, "Acosh": np.arccosh, "Atanh": np.arctanh,
}


def unary_kernel(f: np.ufunc) -> Kernel:
    def make(ins: list[Any], outs: list[Any], _s: list[Any]) -> Launch:
        y = outs[0]
        return strided.ufunc(f, y, operands(ins[:1], y)[0])
    return BoundKernel(make)


def unary(spec: NodeSpec) -> Kernel:
    if spec.op == "Tanh" and np.dtype(spec.inputs[0].dtype) == np.float32:  # one native pass (NativeAct)
        return _native_act(spec, lambda x, y: np.tanh(x, out=y), 12, ())
    return unary_kernel(_UNARY[spec.op])


@functools.cache
def _zeros(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    z = np.zeros(shape, dtype)
    z.flags.writeable = False
    return z


def leaky_relu(spec: NodeSpec) -> Kernel:
    dt = _float(spec)
    alpha = dt.type(np.float32(spec.attr("alpha", 0.01)))  # float attributes (defaults too) are float32
    pick = np.maximum if alpha <= 1 else np.minimum  # max(x, ax) for a <= 1, min(x, ax) for a > 1

    def block(x: np.ndarray, y: np.ndarray, t: np.ndarray) -> None:
        np.multiply(x, alpha, out=t)
        pick(x, t, out=y)
    return Blocked(spec, block, (dt,))


def _sigmoid_block(x: np.ndarray, y: np.ndarray) -> None:
    np.negative(x, out=y)
    np.exp(y, out=y)  # exp(-x) = inf for x << 0 gives the right limit, 0
    np.add(y, 1, out=y)
    np.reciprocal(y, out=y)


def sigmoid(spec: NodeSpec) -> Kernel:
    if _float(spec) == np.float32:  # one native pass (NativeAct), four NumPy calls where the extension is missing
        return _native_act(spec, _sigmoid_block, 11, ())

    def make(ins: list[Any], outs: list[Any], _s: list[Any]) -> Launch:
        x, y = ins[0], outs[0]

        def run() -> None:
            with np.errstate(over="ignore"):  # exp(-x) = inf for x << 0 gives the right limit, 0
                np.negative(x, out=y)
                np.exp(y, out=y)
            np.add(y, 1, out=y)
            np.reciprocal(y, out=y)
        return run
    _float(spec)
    return BoundKernel(make)


def hard_sigmoid(spec: NodeSpec) -> Kernel:
    dt = _float(spec)
    alpha, beta = dt.type(np.float32(spec.attr("alpha", 0.2))), dt.type(np.float32(spec.attr("beta", 0.5)))
    zero, one = dt.type(0), dt.type(1)

    def make(ins: list[Any], outs: list[Any], _s: list[Any]) -> Launch:
        x, y = ins[0], outs[0]

        def run() -> None:  # maximum/minimum keep NaN as clip does, without clip's ~10 us of dispatch
            np.multiply(x, alpha, out=y)
            np.add(y, beta, out=y)
            np.maximum(y, zero, out=y)
            np.minimum(y, one, out=y)
        return run
    return BoundKernel(make)


def softplus(spec: NodeSpec) -> Kernel:
    zero = _float(spec).type(0)

    def make(ins: list[Any], outs: list[Any], _s: list[Any]) -> Launch:
        x, y = ins[0], outs[0]
        return lambda: np.logaddexp(x, zero, out=y)  # log(1 + e^x) without overflow
    return BoundKernel(make)


# --- Erf and Gelu ------------------------------------------------------------------------------------

class Blocked(Kernel):
    """A multi-pass unary kernel run over cache-sized blocks of the flattened input and output.

    `block(x, y, *temps)` gets matching blocks (y may be x) and one temporary block per dtype in `temps`;
    `quiet` names floating-point errors that are expected (np.errstate keywords)."""

    def __init__(self, spec: NodeSpec, block: Callable[..., None], temps: tuple[Any, ...],
                 quiet: dict[str, str] | None = None) -> None:
        self.block, self.temps, self.quiet = block, [np.dtype(t) for t in temps], quiet or {}
        self.size = int(np.prod(spec.outputs[0].shape, dtype=np.int64))
        self.chunk = max(1, min(self.size, CHUNK))
        self.scratch = tuple(self.chunk * t.itemsize for t in self.temps)

    def bind(self, ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        x, y = flat(ins[0]), flat(outs[0])
        temps = [scratch_view(s, (self.chunk,), t) for s, t in zip(scratch, self.temps, strict=True)]
        blocks = [(x[a:a + self.chunk], y[a:a + self.chunk], *(t[:min(self.chunk, self.size - a)] for t in temps))
                  for a in range(0, self.size, self.chunk)]
        block, quiet = self.block, self.quiet

        def run() -> None:
            with np.errstate(**quiet):
                for b in blocks:
                    block(*b)
        return run


_STEPS = 2048  # table points per unit of |x|: t = 2048 |x| and its fraction are exact in float32


@functools.cache
def _table(kind: str) -> tuple[np.ndarray, np.ndarray, np.float32]:
    """(values at k / 2048, slopes to the next point, last t), rounded once from float64. Linear
    interpolation errs by <= max|f''| / 8 / 2048^2: 2.9e-8 for erf on [0, 4] (erf(4) = 1 - 1.5e-8);
    GELU's Phi(-a) on [0, 8] is stored divided by 2048 (then t q = |x| q) and keeps its relative accuracy
    in the tail."""
    if kind == "erf":
        end, f = 4.0, math.erf
    else:
        end, f = 8.0, lambda a: 0.5 * math.erfc(a / math.sqrt(2)) / _STEPS
    v = np.array([f(k / _STEPS) for k in range(int(end * _STEPS) + 2)])
    if kind == "gelu":
        v[-2:] = 0.0  # |x| >= 8 (clamped): Phi(-8) = 6e-16 times a clamped t, so GELU(x) = max(x, 0)
    values, slopes = v.astype(np.float32), np.append(np.diff(v), 0.0).astype(np.float32)
    values.flags.writeable = slopes.flags.writeable = False  # shared by every kernel: no context's own memory
    return values, slopes, np.float32(end * _STEPS)


def _lookup(x: np.ndarray, table: tuple[np.ndarray, np.ndarray, np.float32], t: np.ndarray, f: np.ndarray,
            r: np.ndarray, i: np.ndarray) -> None:
    """r = table(|x|) by linear interpolation; t = 2048 |x| clamped to the table. 10 passes, 2 of them
    gathers: a polynomial erf of the same accuracy (njuffa's split erff) takes 33, 2.5x the time."""
    values, slopes, end = table
    np.abs(x, out=t)
    np.multiply(t, np.float32(_STEPS), out=t)
    np.minimum(t, end, out=t)  # also keeps inf out of the int cast
    np.floor(t, out=r)
    np.copyto(i, r, casting="unsafe")  # int64: np.take converts other index types to a new array
    np.subtract(t, r, out=f)
    np.take(slopes, i, out=r, mode="clip")  # mode="raise" would buffer the output
    np.multiply(r, f, out=r)
    np.take(values, i, out=f, mode="clip")
    np.add(r, f, out=r)


def _erf32(table: Any, x: np.ndarray, y: np.ndarray, *temps: np.ndarray) -> None:
    """float32 erf, max error 8.7e-8 vs math.erf; near 0 it keeps its relative accuracy too."""
    _lookup(x, table, *temps)
    np.copysign(temps[2], x, out=y)


def _gelu32(table: Any, zeros: np.ndarray, x: np.ndarray, y: np.ndarray, *temps: np.ndarray) -> None:
    """x Phi(x) = max(x, 0) - |x| Phi(-|x|): no sign fix-up, and no cancellation in the negative tail
    (relative error <= 2e-6 wherever |GELU(x)| > 1e-12)."""
    t, r = temps[0], temps[2]
    _lookup(x, table, *temps)
    np.multiply(r, t, out=r)
    np.maximum(x, zeros[:x.size], out=y)  # against an array: with a scalar it is slower
    np.subtract(y, r, out=y)


_TEMPS = (np.float32, np.float32, np.float32, np.int64)
# NaN cast to an index is clipped to 0 and the NaN fraction gives NaN; 2048 |x| overflows to inf (then
# clamped) past 1.6e35.
_QUIET = {"invalid": "ignore", "over": "ignore"}


def _in_float32(spec: NodeSpec, block: Callable[..., None], temps: tuple[Any, ...]) -> Kernel:
    """A float32 block kernel, run on float16/float64 tensors through one more float32 temporary."""
    if _float(spec) == np.float32:
        return Blocked(spec, block, temps, _QUIET)

    def converted(x: np.ndarray, y: np.ndarray, c: np.ndarray, *rest: np.ndarray) -> None:
        np.copyto(c, x, casting="unsafe")
        block(c, c, *rest)
        np.copyto(y, c, casting="unsafe")
    return Blocked(spec, converted, (np.float32, *temps), _QUIET)


class NativeAct(Blocked):
    """An activation of float32 tensors in one native pass (csrc/gemv.c ctxrt_act, 8 lanes at a time, N. Juffa's
    erf and erfc): GELU as x erfc(-x / sqrt 2) / 2, relative accuracy kept in the negative tail where
    onnxruntime's 1 + erf cancels, and Erf (BERT-6's six GELUs of 128 x 1536, or a float16 model's unfused Erfs:
    ~7-8 ms in the NumPy blocks); Sigmoid and Tanh (an LSTM cell written out, silero VAD's: 4 NumPy calls a
    Sigmoid, ~5 us at 128 values); the blocks where the extension is not built."""

    act: int  # csrc/vmath.h act8's code

    def bind(self, ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        from ctxrt.backends.cpu import native

        x, y = ins[0], outs[0]
        if native.library() is None or not (x.dtype == y.dtype == np.float32 and x.flags.c_contiguous
                                            and y.flags.c_contiguous):
            return super().bind(ins, outs, scratch)
        return native.act(x, y, self.act)


def _native_act(spec: NodeSpec, block: Callable[..., None], act: int, temps: tuple[Any, ...] = _TEMPS) -> Kernel:
    kernel = NativeAct(spec, block, temps, _QUIET)
    kernel.act = act
    return kernel


def erf(spec: NodeSpec) -> Kernel:
    block = functools.partial(_erf32, _table("erf"))
    return _native_act(spec, block, 6) if _float(spec) == np.float32 else _in_float32(spec, block, _TEMPS)


def gelu(spec: NodeSpec) -> Kernel:
    approx = spec.attr("approximate", "none")
    if approx == "none":
        block = functools.partial(_gelu32, _table("gelu"), _zeros((CHUNK,), np.dtype(np.float32)))
        return _native_act(spec, block, 5) if _float(spec) == np.float32 else _in_float32(spec, block, _TEMPS)
    if approx != "tanh":
        raise _fail(spec, f"approximate={approx!r}")
    f32 = np.float32
    k, c = f32(np.sqrt(2 / np.pi)), f32(0.044715)

    def tanh_block(x: np.ndarray, y: np.ndarray, z: np.ndarray) -> None:
        np.multiply(x, x, out=z)  # tanh(k (x + c x^3)) = tanh(k x (1 + c x^2))
        np.multiply(z, c, out=z)
        np.add(z, f32(1), out=z)
        np.multiply(z, x, out=z)
        np.multiply(z, k, out=z)
        np.tanh(z, out=z)
        np.add(z, f32(1), out=z)
        np.multiply(z, x, out=z)
        np.multiply(z, f32(0.5), out=y)
    return _in_float32(spec, tanh_block, (np.float32,))


# --- binary and variadic -----------------------------------------------------------------------------

def ufunc_kernel(f: np.ufunc) -> Kernel:
    def make(ins: list[Any], outs: list[Any], _s: list[Any]) -> Launch:
        y = outs[0]
        a, b = operands(ins, y)
        return strided.ufunc(f, y, a, b)  # natively for float32 Add, Sub, Mul, Div
    return BoundKernel(make)


_BINARY: dict[str, np.ufunc] = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply}


def binary(spec: NodeSpec) -> Kernel:
    return ufunc_kernel(_BINARY[spec.op])


def div(spec: NodeSpec) -> Kernel:
    dt = np.dtype(spec.outputs[0].dtype)
    if dt.kind == "f":
        return ufunc_kernel(np.divide)

    def make(ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        y = outs[0]
        a, b = operands(ins, y)
        t = scratch_view(scratch[0], y.shape, dt)

        def run() -> None:  # ONNX integer Div truncates toward zero: (a - fmod(a, b)) // b is exact
            np.fmod(a, b, out=t)
            np.subtract(a, t, out=t)
            np.floor_divide(t, b, out=y)
        return run
    return BoundKernel(make, (spec.outputs[0].nbytes,))


def mod(spec: NodeSpec) -> Kernel:
    return ufunc_kernel(np.fmod if spec.attr("fmod", 0) else np.mod)


def power(spec: NodeSpec) -> Kernel:
    xt, et = np.dtype(spec.inputs[0].dtype), np.dtype(spec.inputs[1].dtype)
    e = spec.consts[1] if len(spec.consts) > 1 else None
    if e is not None and e.size == 1 and xt.kind == "f" and spec.outputs[0].shape == spec.inputs[0].shape:
        f = {2.0: np.square, 0.5: np.sqrt, -1.0: np.reciprocal, 1.0: np.positive}.get(float(e.reshape(-1)[0]))
        if f is not None:
            return BoundKernel(lambda ins, outs, _s: lambda: f(ins[0], out=outs[0]))
    if et == xt:
        return ufunc_kernel(np.power)
    if xt.kind == "f" or et.kind in "iu":  # exponent cast to the base's type (once, if it is a constant)
        ec = None if e is None else e.astype(xt)
        ebytes = max(1, int(np.prod(spec.inputs[1].shape))) * xt.itemsize

        def make(ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
            y = outs[0]
            x = operands(ins[:1], y)[0]
            if ec is not None:
                return lambda: np.power(x, ec, out=y)
            t = scratch_view(scratch[0], ins[1].shape, xt)

            def run() -> None:
                np.copyto(t, ins[1], casting="unsafe")
                np.power(x, t, out=y)
            return run
        return BoundKernel(make, () if ec is not None else (ebytes,))

    def make_int(ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        y = outs[0]
        t = scratch_view(scratch[0], y.shape, np.float64)

        def run() -> None:  # integer base, float exponent: in float64, truncated back (as onnx.reference)
            np.copyto(t, ins[0])
            np.power(t, ins[1], out=t)
            np.copyto(y, t, casting="unsafe")
        return run
    return BoundKernel(make_int, (int(np.prod(spec.outputs[0].shape)) * 8,))


_VARIADIC: dict[str, np.ufunc] = {"Sum": np.add, "Mean": np.add, "Max": np.maximum, "Min": np.minimum}


def variadic(spec: NodeSpec) -> Kernel:
    f = _VARIADIC[spec.op]
    dt = np.dtype(spec.outputs[0].dtype)
    if spec.op == "Mean" and dt.kind != "f":
        raise _fail(spec, f"dtype {dt}")
    scale = dt.type(1 / len(spec.inputs)) if spec.op == "Mean" and len(spec.inputs) > 1 else None

    def make(ins: list[Any], outs: list[Any], _s: list[Any]) -> Launch:
        y = outs[0]
        xs = sorted(operands(ins, y), key=lambda x: x is not y)  # the in-place input is read first
        if len(xs) == 1:
            return (lambda: None) if xs[0] is y else (lambda: np.copyto(y, xs[0]))
        a, b, rest = xs[0], xs[1], xs[2:]

        def run() -> None:
            f(a, b, out=y)
            for x in rest:
                f(y, x, out=y)
            if scale is not None:
                np.multiply(y, scale, out=y)
        return run
    return BoundKernel(make)


KERNELS = {
    **{op: unary for op in _UNARY}, **{op: binary for op in _BINARY}, **{op: variadic for op in _VARIADIC},
    "LeakyRelu": leaky_relu, "Sigmoid": sigmoid, "HardSigmoid": hard_sigmoid,
    "Softplus": softplus, "Erf": erf, "Gelu": gelu, "Div": div, "Mod": mod, "Pow": power,
}
