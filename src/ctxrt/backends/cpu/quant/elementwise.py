"""onnxruntime's quantized element-wise ops (com.microsoft): QLinearAdd, QLinearMul, QLinearSigmoid,
QLinearLeakyRelu, QLinearConcat, and QLinearSoftmax.

Each dequantizes in float32, computes, and quantizes back (round half to even, saturate), with the operation
order onnxruntime's reference loops use; its vectorized loops may round a value exactly half-way the other way,
so results agree with onnxruntime's to within one step. All parameters are per tensor. Temporaries are planned
scratch (in blocks of `CHUNK` values for the unary ops).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

import numpy as np

from ctxrt.backends.cpu import native, reduce
from ctxrt.backends.cpu.elementwise import CHUNK
from ctxrt.backends.cpu.quant.common import (
    EIGHT_BIT,
    F32,
    WIDE_INTS,
    Bound,
    fail,
    given,
    limits,
    quantize_into,
    require,
    same_shape_view,
    size,
)
from ctxrt.backends.kernel import Kernel, Launch, NodeSpec, TensorSpec, scratch_view


def _scalars(spec: NodeSpec, positions: tuple[int, ...]) -> None:
    for i in positions:
        if given(spec, i) and size(spec.inputs[i]) != 1:
            raise fail(spec, f"input {i} (a scale or zero point) must be a scalar (per tensor)")


def _param(ins: list[Any], spec: NodeSpec, i: int) -> np.ndarray | None:
    return ins[i].reshape(()) if given(spec, i) else None


def _center(x: np.ndarray, zp: np.ndarray | None, out: np.ndarray) -> None:
    """out = x - zp in out's float type: the integers converted first (a cast inside the subtraction would be
    buffered by NumPy's iterator, an allocation per launch), then the zero point subtracted."""
    np.copyto(out, x, casting="unsafe")
    if zp is not None:
        np.subtract(out, zp, out=out)

def _binary(spec: NodeSpec, mul: bool) -> Kernel:
    """QLinearAdd: C = (A_scale (A - A_zp) + B_scale (B - B_zp)) / C_scale + C_zp;
    QLinearMul: C = (A - A_zp)(B - B_zp) A_scale B_scale / C_scale + C_zp (broadcasting A against B)."""
    yt = require(spec, 0, WIDE_INTS, "A")
    require(spec, 3, {yt}, "B")
    _scalars(spec, (1, 2, 4, 5, 6, 7))
    shape = tuple(spec.outputs[0].shape)
    lo, hi = limits(yt)

    fixed = _fixed_b(spec, mul)

    def make(ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        a, b, y = ins[0], ins[3], outs[0]
        sa, za, sb, zb = _param(ins, spec, 1), _param(ins, spec, 2), _param(ins, spec, 4), _param(ins, spec, 5)
        sc, zc = _param(ins, spec, 6), _param(ins, spec, 7)
        ta, tb = scratch_view(scratch[0], shape, F32), scratch_view(scratch[1], shape, F32)
        m = scratch_view(scratch[2], (), F32)
        params = [_param(ins, spec, i) for i in (1, 2, 4, 5, 6, 7)]
        fast = _native_add(a, b, y, None if mul else fixed, params, mul)
        if fast is None and fixed is None and b.shape == y.shape != a.shape:  # A the smaller: the operands swapped
            fast = _native_add(b, a, y, None, [*params[2:4], *params[0:2], *params[4:]], mul)  # (+, x: commutative)
        if fast is not None:
            return fast
        if fixed is not None and not mul:  # B_scale (B - B_zp) made once: a bias, a constant residual
            def run_fixed() -> None:
                _center(a, za, ta)
                np.multiply(ta, sa, out=ta)
                np.add(ta, fixed, out=ta)
                np.divide(ta, sc, out=ta)
                quantize_into(ta, zc, lo, hi, y)
            return run_fixed

        def run() -> None:
            _center(a, za, ta)
            _center(b, zb, tb)
            if mul:
                np.multiply(ta, tb, out=ta)
                np.multiply(sa, sb, out=m)
                np.divide(m, sc, out=m)
                np.multiply(ta, m, out=ta)
            else:
                np.multiply(ta, sa, out=ta)
                np.multiply(tb, sb, out=tb)
                np.add(ta, tb, out=ta)
                np.divide(ta, sc, out=ta)
            quantize_into(ta, zc, lo, hi, y)
        return run
    return Bound(make, (size(shape) * 4, size(shape) * 4, 4))


def _native_add(a: np.ndarray, b: np.ndarray, y: np.ndarray, fixed: np.ndarray | None, params: list[Any],
                mul: bool = False) -> Launch | None:
    """QLinearAdd (QLinearMul: `mul`) of 8-bit tensors of y's shape, or B one value or one per position of the
    last axis (QLinearAdd: also B fixed, a constant) on the native kernel (csrc/qelem.c: the same float32
    operations in the same order as `run` below, one pass instead of eight); None where it does not apply."""
    lib = native.library()
    if lib is None or y.dtype not in (np.dtype(np.int8), np.dtype(np.uint8)) or a.dtype != y.dtype:
        return None
    if not (a.shape == y.shape and a.flags.c_contiguous and y.flags.c_contiguous):
        return None
    period = 0
    if fixed is not None:
        if fixed.dtype != F32 or not fixed.flags.c_contiguous:
            return None
        if fixed.size == 1 and fixed.shape != y.shape:  # one value
            period = 1
        elif fixed.shape != y.shape:  # a bias along the last axis: repeated
            last = y.shape[-1] if y.ndim else 1
            if fixed.size != last or y.size % max(last, 1) or any(d != 1 for d in fixed.shape[:-1]) or \
                    fixed.ndim > y.ndim:
                return None
            period = last
    elif b.dtype != y.dtype or not b.flags.c_contiguous:
        return None
    elif b.size == 1 and b.shape != y.shape:
        period = 1  # one value of B (an attention's scale)
    elif b.shape != y.shape:  # B along the last axes: a mask over heads (and rows), a per-channel scale (NHWC)
        inner = tuple(b.shape[next((i for i, d in enumerate(b.shape) if d != 1), b.ndim):])
        if not inner or b.ndim > y.ndim or tuple(y.shape[y.ndim - len(inner):]) != inner:
            return None
        period = b.size
    args = native.QAddArgs(n=y.size, a=a.ctypes.data, b=None if fixed is not None else b.ctypes.data,
                           fixed=native.address(fixed), period=period, y=y.ctypes.data,
                           is_signed=int(y.dtype == np.int8), mul=int(mul))
    if not native.read_params(args.src, params):  # run-time inputs in general: the kernel reads them each run
        return None
    return native.launch("ctxrt_qadd", args, (a, b, y, fixed, *params))


def _fixed_b(spec: NodeSpec, mul: bool) -> np.ndarray | None:
    """QLinearAdd's B_scale (B - B_zp) in float32, in B's shape, where B and its parameters are constants: the same
    values the launch would compute each run."""
    consts = [spec.consts[i] if i < len(spec.consts) else None for i in (3, 4, 5)]
    if mul or consts[0] is None or consts[1] is None or (given(spec, 5) and consts[2] is None):
        return None
    tb = consts[0].astype(F32)
    if consts[2] is not None:
        np.subtract(tb, consts[2].astype(F32).reshape(()), out=tb)
    np.multiply(tb, consts[1].astype(F32).reshape(()), out=tb)
    return tb


def qlinear_add(spec: NodeSpec) -> Kernel:
    return _binary(spec, mul=False)


def qlinear_mul(spec: NodeSpec) -> Kernel:
    return _binary(spec, mul=True)


def _unary(spec: NodeSpec, f: Callable[[np.ndarray, np.ndarray], None], temps: int) -> Kernel:
    """y = quantize(f(dequantize(x))) over blocks of CHUNK values; `f(t, u)` works in place on t (u: a second
    temporary when `temps` is 2)."""
    yt = require(spec, 0, EIGHT_BIT, "X")
    _scalars(spec, (1, 2, 3, 4))
    n = size(spec.inputs[0])
    chunk = max(1, min(n, CHUNK))
    lo, hi = limits(yt)

    def make(ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        x, y = ins[0].reshape(-1), outs[0].reshape(-1)
        xs, xz, ys, yz = (_param(ins, spec, i) for i in range(1, 5))
        t, u = (scratch_view(scratch[k], (chunk,), F32) for k in (0, temps - 1))
        blocks = [(x[a:a + chunk], y[a:a + chunk], t[:min(chunk, n - a)], u[:min(chunk, n - a)])
                  for a in range(0, n, chunk)]

        def run() -> None:
            with np.errstate(over="ignore"):
                for xb, yb, tb, ub in blocks:
                    _center(xb, xz, tb)
                    np.multiply(tb, xs, out=tb)
                    f(tb, ub)
                    np.divide(tb, ys, out=tb)
                    quantize_into(tb, yz, lo, hi, yb)
        return run
    return Bound(make, (chunk * 4,) * temps)


def _sigmoid(t: np.ndarray, _u: np.ndarray) -> None:
    np.negative(t, out=t)
    np.exp(t, out=t)  # exp(-x) = inf for x << 0 gives the right limit, 0
    np.add(t, 1, out=t)
    np.reciprocal(t, out=t)


def qlinear_sigmoid(spec: NodeSpec) -> Kernel:
    return _unary(spec, _sigmoid, 1)


def qlinear_leaky_relu(spec: NodeSpec) -> Kernel:
    alpha = np.float32(spec.attr("alpha", 0.01))
    pick = np.maximum if alpha <= 1 else np.minimum  # max(x, ax) for a <= 1, min(x, ax) for a > 1

    def f(t: np.ndarray, u: np.ndarray) -> None:
        np.multiply(t, alpha, out=u)
        pick(t, u, out=t)
    return _unary(spec, f, 2)


def qlinear_concat(spec: NodeSpec) -> Kernel:
    """Y = concat(quantize(dequantize(X_i))) along `axis`; inputs Y_scale, Y_zp, then (X_i, scale_i, zp_i). Where
    the extension is built, each part is one pass through a 256-byte table of its requantization (csrc/qelem.c,
    ctxrt_lut8; a copy where the parameters agree), made with the NumPy path's float32 operations: the same
    bytes."""
    yt = np.dtype(spec.outputs[0].dtype)
    if yt not in EIGHT_BIT or (len(spec.inputs) - 2) % 3:
        raise fail(spec, f"output type {yt} with {len(spec.inputs)} inputs is not supported")
    out = tuple(spec.outputs[0].shape)
    axis = int(spec.attr("axis")) % len(out)
    _scalars(spec, tuple(i for i in range(len(spec.inputs)) if i < 2 or (i - 2) % 3))
    parts = list(range(2, len(spec.inputs), 3))
    for i in parts:
        require(spec, i, {yt}, f"input {i}")
    pre, post = size(out[:axis]), size(out[axis + 1:])
    biggest = max(size(spec.inputs[i]) for i in parts)
    lo, hi = limits(yt)

    def make(ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        y3 = same_shape_view(outs[0], (pre, out[axis], post))
        ys, yz = _param(ins, spec, 0), _param(ins, spec, 1)
        plan, off = [], 0
        for i in parts:
            n = spec.inputs[i].shape[axis]
            t = scratch_view(scratch[0], (pre, n, post), F32)
            plan.append((ins[i].reshape(pre, n, post), _param(ins, spec, i + 1), _param(ins, spec, i + 2), t,
                         y3[:, off:off + n]))
            off += n
        fast = _native_concat(spec, plan, ys, yz, lo, hi)
        if fast is not None:
            return fast

        def run() -> None:
            for x, s, z, t, yv in plan:
                _center(x, z, t)
                np.multiply(t, s, out=t)  # dequantized, then divided by the output's scale (onnxruntime's order)
                np.divide(t, ys, out=t)
                quantize_into(t, yz, lo, hi, yv)
        return run
    return Bound(make, (biggest * 4,))


_BYTES = np.arange(256, dtype=np.uint8)  # every byte: the inputs of a 256-entry table (read only)
_BYTES.flags.writeable = False


def _requantized(xt: np.dtype, s: Any, z: Any, ys: Any, yz: Any, lo: Any, hi: Any, yt: np.dtype,
                 table: np.ndarray, t: np.ndarray) -> None:
    """table[b] = QLinearConcat's value of the 8-bit value whose byte is b, computed as its NumPy path does (t: 256
    float32 of work)."""
    x = _BYTES.view(xt)
    _center(x, z, t)
    np.multiply(t, s, out=t)
    np.divide(t, ys, out=t)
    quantize_into(t, yz, lo, hi, table.view(yt))


def _native_concat(spec: NodeSpec, plan: list[tuple], ys: Any, yz: Any, lo: Any, hi: Any) -> Launch | None:
    """QLinearConcat's parts through ctxrt_lut8 (None without the extension or for strided parts). The tables are
    made once where every parameter is a constant, else at each run from the parameters' current values."""
    lib = native.library()
    if lib is None or not all(x.flags.c_contiguous and yv.strides[2] == 1 and yv.strides[1] == yv.shape[2]
                              for x, _, _, _, yv in plan):
        return None
    yt = np.dtype(spec.outputs[0].dtype)
    tables = np.zeros((len(plan), 256), np.uint8)
    calls = []
    for j, (x, _, _, _, yv) in enumerate(plan):
        pre, n, post = x.shape
        calls.append(native.Lut8Args(rows=pre, cols=n * post, x=x.ctypes.data, ldx=n * post, y=yv.ctypes.data,
                                     ldy=yv.strides[0], lut=tables[j].ctypes.data))
    refs, call = [ctypes.byref(a) for a in calls], lib.ctxrt_lut8
    fixed = all(i < len(spec.consts) and spec.consts[i] is not None
                for i in range(len(spec.inputs)) if given(spec, i) and (i < 2 or (i - 2) % 3))

    work = np.empty(256, F32)  # (parameters fed at run time refill the tables at each run: nothing allocated)

    def fill() -> None:
        for j, (x, s, z, _, _) in enumerate(plan):
            _requantized(x.dtype, s, z, ys, yz, lo, hi, yt, tables[j], work)
    if fixed:
        fill()

    def run(_keep: object = (plan, calls, tables, work)) -> None:
        if not fixed:
            fill()
        for ref in refs:
            call(ref)
    return run


def qlinear_softmax(spec: NodeSpec) -> Kernel:
    """Softmax of the dequantized input (the `opset` attribute picks Softmax-1's coerced 2-D or Softmax-13's
    single axis), quantized back. onnxruntime multiplies by floor(1 / y_scale): the same for its usual scale
    1/256; and it does not saturate int8 outputs at 128 (softmax 1.0 with zero point -128 wraps to -128)."""
    yt = require(spec, 0, EIGHT_BIT, "X")
    _scalars(spec, (1, 2, 3, 4))
    shape = tuple(spec.inputs[0].shape)
    attrs = {} if spec.attr("axis") is None else {"axis": int(spec.attr("axis"))}
    opset = int(spec.attr("opset", 13))
    f32 = TensorSpec(shape, F32)
    inner = reduce.softmax(NodeSpec("Softmax", spec.name, attrs, [f32], [f32], [None], opset))
    lo, hi = limits(yt)

    def make(ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        x, y = ins[0], outs[0]
        xs, xz, ys, yz = (_param(ins, spec, i) for i in range(1, 5))
        t = scratch_view(scratch[0], shape, F32)
        softmax = inner.bind([t], [t], scratch[1:])  # in place

        def run() -> None:
            _center(x, xz, t)
            np.multiply(t, xs, out=t)
            softmax()
            np.divide(t, ys, out=t)
            quantize_into(t, yz, lo, hi, y)
        return run
    return Bound(make, (size(shape) * 4, *inner.scratch))


def qlinear_lookup(spec: NodeSpec) -> Kernel:
    """ctxrt's QLinearLookup (made by ir/passes/qdq.py from a QDQ unit of element-wise ops): 8-bit x to 8-bit y
    through a 256-byte table (input 1: [1, 256]), or (input 2: [2, C] float32, a BatchNormalization) y =
    saturate(round_half_even(x a_c + b_c)), channels along `axis` (the stored channel axis). Native where the
    extension is built (csrc/qelem.c ctxrt_lut8, ctxrt_affine8: the NumPy path's float32 operations in its order,
    the same bytes), else NumPy."""
    x, y = spec.inputs[0], spec.outputs[0]
    xt, yt = np.dtype(x.dtype), np.dtype(y.dtype)
    if xt not in EIGHT_BIT or yt not in EIGHT_BIT or tuple(x.shape) != tuple(y.shape):
        raise fail(spec, "8-bit input and output of one shape are needed")
    table, affine = (spec.consts[i] if i < len(spec.consts) else None for i in (1, 2))
    if affine is not None:
        return _affine(spec, xt, yt, affine)
    if table is None or table.dtype != np.uint8 or table.shape != (1, 256):
        raise fail(spec, "its table must be a constant [1, 256] of bytes")
    n = size(x)
    fast = native.library() is not None

    def make(ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        xb, yb = ins[0].reshape(-1).view(np.uint8), outs[0].reshape(-1).view(np.uint8)
        if fast and xb.flags.c_contiguous and yb.flags.c_contiguous:
            args = native.Lut8Args(rows=1, cols=n, x=xb.ctypes.data, ldx=n, y=yb.ctypes.data, ldy=n,
                                   lut=table.ctypes.data)
            return native.launch("ctxrt_lut8", args, (xb, yb, table))
        flat = table.reshape(-1)
        return lambda: np.take(flat, xb, out=yb)
    return Bound(make)


def _affine(spec: NodeSpec, xt: np.dtype, yt: np.dtype, affine: np.ndarray) -> Kernel:
    """QLinearLookup's affine form: y = saturate(round_half_even(x a + b)), a and b of each value's channel: rows of
    one channel (channels first: row r is channel r % C) or rows of all channels (channels last)."""
    if affine.dtype != np.float32 or affine.ndim != 2 or affine.shape[0] != 2:
        raise fail(spec, "its affine map must be a constant [2, channels] of float32")
    shape, count = tuple(spec.inputs[0].shape), affine.shape[1]
    axis = int(spec.attr("axis", -1)) % len(shape)
    if count > 1 and shape[axis] != count:
        raise fail(spec, f"{count} channels' affine maps for {shape[axis]} channels")
    last = axis == len(shape) - 1 and count > 1  # (per column, a[c]: only with one map per channel)
    rows = 1 if count == 1 else size(shape[:-1]) if last else size(shape[:axis + 1])  # (one channel: one row)
    cols = size(shape) // rows if rows else 0
    a, b = (np.ascontiguousarray(affine[i]) for i in (0, 1))
    fast = native.library() is not None
    lo, hi = limits(yt)

    def make(ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        xb, yb = ins[0].reshape(rows, cols), outs[0].reshape(rows, cols)
        if fast and xb.flags.c_contiguous and yb.flags.c_contiguous:
            args = native.Affine8Args(rows=rows, cols=cols, x=xb.ctypes.data, ldx=cols, y=yb.ctypes.data, ldy=cols,
                                      a=a.ctypes.data, b=b.ctypes.data, channels=count, per=2 if last else 1,
                                      x_signed=int(xt == np.int8), y_signed=int(yt == np.int8))
            return native.launch("ctxrt_affine8", args, (xb, yb, a, b))
        t = scratch_view(scratch[0], (rows, cols), F32)
        channel = np.arange(cols if last else rows) % count  # of each column (row)
        wa, wb = (v[channel][None, :] if last else v[channel][:, None] for v in (a, b))

        def run() -> None:
            np.copyto(t, xb, casting="unsafe")
            np.multiply(t, wa, out=t)
            np.add(t, wb, out=t)
            quantize_into(t, None, lo, hi, yb)
        return run
    return Bound(make, () if fast else (rows * cols * 4,))


KERNELS = {"QLinearLookup": qlinear_lookup, "QLinearAdd": qlinear_add, "QLinearMul": qlinear_mul,
           "QLinearSigmoid": qlinear_sigmoid,
           "QLinearLeakyRelu": qlinear_leaky_relu, "QLinearConcat": qlinear_concat, "QLinearSoftmax": qlinear_softmax}
