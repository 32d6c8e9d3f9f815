"""Integer matrix products: MatMulInteger, QLinearMatMul, QGemm, MatMulIntegerToFloat, DynamicQuantizeMatMul.

The accumulation is exact: (A - a_zero_point) and (B - b_zero_point) are converted to float64 in scratch and
multiplied by BLAS, whose float64 sums of 8-bit products are exact integers up to 2^53 (any K below 10^11); a sum
beyond int32 (K above ~33,000 at the extremes) would wrap in a 32-bit accumulator and does not here. B goes
through in blocks of columns, so the float64 copy of a weight matrix is never whole (scratch of at most
`_BLOCK_BYTES` for it, planned like any other). The epilogues follow onnxruntime's: the accumulator rounded to
float32, times a float32 multiplier (a_scale * b_scale / y_scale), rounded half to even, offset and saturated.
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from ctxrt.backends.cpu import native
from ctxrt.backends.cpu.quant.common import (
    EIGHT_BIT,
    F32,
    F64,
    WIDE_INTS,
    Bound,
    Requant,
    centred_span,
    dtype_of,
    fail,
    given,
    quantize_into,
    require,
    size,
)
from ctxrt.backends.kernel import Kernel, Launch, NodeSpec, scratch_view

_BLOCK_BYTES = 4 << 20  # float64 bytes of one block of B's columns
Epilogue = Callable[[np.ndarray, int, int, tuple[int, ...]], None]  # (acc block, n0, n1, batch index)


class Shapes:
    """A numpy.matmul of A [..., M, K] by B [..., K, N] (1-D operands promoted), or Gemm's transposed forms."""

    def __init__(self, spec: NodeSpec, ia: int, ib: int, trans_a: bool = False, trans_b: bool = False,
                 added: bool = False, per_tensor: bool = False) -> None:
        a, b = tuple(spec.inputs[ia].shape), tuple(spec.inputs[ib].shape)
        self.a_vec, self.b_vec = len(a) == 1, len(b) == 1
        a2 = (1, *a) if self.a_vec else a
        b2 = (*b, 1) if self.b_vec else b
        self.ta, self.tb = trans_a, trans_b
        self.m, self.k = (a2[-1], a2[-2]) if trans_a else (a2[-2], a2[-1])
        kb, self.n = (b2[-1], b2[-2]) if trans_b else (b2[-2], b2[-1])
        if kb != self.k:
            raise fail(spec, f"inner dimensions differ: A {list(a)}, B {list(b)}")
        self.a_shape, self.b_shape = a2, b2
        self.batch = tuple(np.broadcast_shapes(a2[:-2], b2[:-2]))
        # float32 sums are exact while every partial sum stays within 2^24: K * |A - a_zp| * |B - b_zp| (and nothing
        # `added` to the accumulator, QGemm's C); BLAS's SGEMM is twice DGEMM's speed
        za, zb = _ZERO_POINTS.get(spec.op.rsplit(".", 1)[-1], (None, None))
        span = self.k * centred_span(spec, ia, za) * centred_span(spec, ib, zb)
        self.acc = F32 if span <= 2**24 and not added else F64
        self.algorithm = "int_gemm_f32" if self.acc == F32 else "int_gemm_f64"
        size = self.acc.itemsize
        self.cols = max(1, min(self.n, _BLOCK_BYTES // max(1, size * self.k)))
        # Small batched products with per-tensor parameters (attention's scores, Q K^T and P V) as one batched
        # GEMM: each batch matrix's own launch costs a dozen NumPy calls for a few thousand products.
        count = math.prod(self.batch)
        self.batched = per_tensor and count > 1 and self.cols == self.n and \
            count * (self.m * self.k + self.k * self.n + self.m * self.n) * size <= _BLOCK_BYTES
        lead = (count if self.batched else 1) * size
        self.scratch = (lead * self.m * self.k, lead * self.k * self.cols, lead * self.m * self.cols)
        self.t_bytes = lead // size * self.m * self.cols * 4  # a float32 block of the output (requantization)
        self.blocks = [(n0, min(self.n, n0 + self.cols)) for n0 in range(0, self.n, self.cols)]

    def matrices(self, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """A as [..., M, K] and B as [..., K, N] views broadcast over the batch."""
        a = a.reshape(self.a_shape)
        b = b.reshape(self.b_shape)
        a = np.swapaxes(a, -1, -2) if self.ta else a
        b = np.swapaxes(b, -1, -2) if self.tb else b
        return (np.broadcast_to(a, self.batch + (self.m, self.k)), np.broadcast_to(b, self.batch + (self.k, self.n)))

    def out(self, y: np.ndarray) -> np.ndarray:
        return y.reshape(self.batch + (self.m, self.n))

    def rows(self, p: np.ndarray | None) -> np.ndarray | None:
        """A per-tensor or per-row parameter (scalar, [M], or [..., M, 1]) broadcast to [..., M, 1]."""
        if p is None:
            return None
        if p.size == 1:
            return p.reshape(())
        return np.broadcast_to(p.reshape(self.m, 1) if p.ndim == 1 else p, self.batch + (self.m, 1))

    def columns(self, p: np.ndarray | None) -> np.ndarray | None:
        """A per-tensor or per-column parameter (scalar, [N], or [..., 1, N]) broadcast to [..., 1, N]."""
        if p is None:
            return None
        if p.size == 1:
            return p.reshape(())
        return np.broadcast_to(p.reshape(1, self.n) if p.ndim == 1 else p, self.batch + (1, self.n))

    def bind(self, a: np.ndarray, b: np.ndarray, a_zp: np.ndarray | None, b_zp: np.ndarray | None,
             scratch: list[Any], epilogue: Epilogue, prepare: Callable[[tuple[int, ...]], None] | None = None
             ) -> Launch:
        """The launch: per batch matrix, A - a_zp in float64, then per block of columns B - b_zp, the GEMM and
        `epilogue(acc, n0, n1, index)` (`prepare(index)` first, e.g. to compute per-batch multipliers)."""
        am, bm = self.matrices(a, b)
        az, bz = self.rows(a_zp), self.columns(b_zp)
        if self.batched:
            return self._bind_batched(am, bm, az, bz, scratch, epilogue, prepare)
        af = scratch_view(scratch[0], (self.m, self.k), self.acc)
        blocks = [(n0, n1, scratch_view(scratch[1], (self.k, n1 - n0), self.acc),
                   scratch_view(scratch[2], (self.m, n1 - n0), self.acc)) for n0, n1 in self.blocks]
        plans = []
        for index in np.ndindex(*self.batch):
            za = az if az is None or az.ndim == 0 else az[index]
            zb = bz if bz is None or bz.ndim == 0 else bz[index]
            plans.append((index, am[index], za, [(bm[index][:, n0:n1], zb if zb is None or zb.ndim == 0 else
                                                  zb[:, n0:n1], n0, n1, bf, cf) for n0, n1, bf, cf in blocks]))

        def run() -> None:
            for index, a2, za, cols in plans:
                if prepare is not None:
                    prepare(index)
                _centered(a2, za, af)
                for b2, zb, n0, n1, bf, cf in cols:
                    _centered(b2, zb, bf)
                    np.matmul(af, bf, out=cf)
                    epilogue(cf, n0, n1, index)
        return run


    def block(self, n0: int, n1: int) -> tuple[int, ...]:
        """The shape of an epilogue's accumulator block: [M, n1 - n0], or with the batch in front when batched."""
        return (*(self.batch if self.batched else ()), self.m, n1 - n0)

    def _bind_batched(self, am: np.ndarray, bm: np.ndarray, az: Any, bz: Any, scratch: list[Any], epilogue: Epilogue,
                      prepare: Callable[[Any], None] | None) -> Launch:
        af = scratch_view(scratch[0], am.shape, self.acc)
        bf = scratch_view(scratch[1], bm.shape, self.acc)
        cf = scratch_view(scratch[2], self.block(0, self.n), self.acc)

        def run() -> None:
            if prepare is not None:
                prepare(...)
            _centered(am, az, af)
            _centered(bm, bz, bf)
            np.matmul(af, bf, out=cf)
            epilogue(cf, 0, self.n, ...)
        return run


# op -> positions of A's and B's zero points
_ZERO_POINTS = {"MatMulInteger": (2, 3), "QLinearMatMul": (2, 5), "QGemm": (2, 5), "MatMulIntegerToFloat": (4, 5),
                "DynamicQuantizeMatMul": (None, 3)}


def _centered(x: np.ndarray, zp: np.ndarray | None, out: np.ndarray) -> None:
    """out = x - zp in out's float type: the integers converted first (a cast inside the subtraction would be
    buffered by NumPy's iterator, an allocation per launch), then the zero point subtracted."""
    np.copyto(out, x, casting="unsafe")
    if zp is not None:
        np.subtract(out, zp, out=out)

def _zero_points(spec: NodeSpec, ins: list[Any], ia: int, ib: int) -> tuple[Any, Any]:
    return (ins[ia] if given(spec, ia) else None), (ins[ib] if given(spec, ib) else None)


def matmul_integer(spec: NodeSpec) -> Kernel:
    require(spec, 0, EIGHT_BIT, "A")
    require(spec, 1, EIGHT_BIT, "B")
    fast = _native_igemm(spec)
    if fast is not None:
        return fast
    sh = Shapes(spec, 0, 1, per_tensor=all(not given(spec, i) or size(spec.inputs[i]) == 1 for i in (2, 3)))

    def make(ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        y = sh.out(outs[0])

        def epilogue(acc: np.ndarray, n0: int, n1: int, index: Any) -> None:
            np.copyto(y[index][..., n0:n1], acc, casting="unsafe")
        return sh.bind(ins[0], ins[1], *_zero_points(spec, ins, 2, 3), scratch, epilogue)
    return Bound(make, sh.scratch, sh.algorithm)


def _native_igemm(spec: NodeSpec) -> Kernel | None:
    """MatMulInteger on csrc/qelem.c's exact int16-pair GEMM (vpmaddwd): A [..., M, K] by a 2-D B [K, N], A's
    zero point per tensor, B's per tensor or per column; its int32 sums exact while K |A - za| |B - zb| < 2^31.
    A dynamically quantized encoder's 64 x 128 x 128 products: ~110 us each on the float32 GEMM path, whose B is
    converted to floats at every run. None where the extension is not built or the shapes do not fit."""
    a, b = spec.inputs[0].shape, spec.inputs[1].shape
    if native.library() is None or len(a) < 2 or len(b) != 2 or a[-1] != b[0] or np.dtype(spec.outputs[0].dtype) != \
            np.dtype(np.int32) or tuple(spec.outputs[0].shape) != (*a[:-1], b[1]):
        return None
    if given(spec, 2) and size(spec.inputs[2]) != 1 or given(spec, 3) and size(spec.inputs[3]) not in (1, b[1]):
        return None
    m, k, n = math.prod(a[:-1]), int(a[-1]), int(b[1])
    if k * centred_span(spec, 0, 2) * centred_span(spec, 1, 3) >= 2**31 or 0 in (m, k, n):
        return None
    kp = k + (k & 1)
    zb_count = size(spec.inputs[3]) if given(spec, 3) else 0
    a_signed, b_signed = (int(np.dtype(spec.inputs[i].dtype) == np.int8) for i in (0, 1))

    def make(ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        arrays = [ins[0], ins[1], outs[0]] + [ins[i] for i in (2, 3) if given(spec, i)]
        if not all(x.flags.c_contiguous for x in arrays):
            raise fail(spec, "the native integer GEMM needs contiguous tensors")
        a16, b16 = scratch_view(scratch[0], (m * kp,), np.int16), scratch_view(scratch[1], (kp * n,), np.int16)
        args = native.IGemmArgs(m=m, k=k, n=n, a=ins[0].ctypes.data, b=ins[1].ctypes.data, y=outs[0].ctypes.data,
                                za=ins[2].ctypes.data if given(spec, 2) else None,
                                zb=ins[3].ctypes.data if given(spec, 3) else None, zb_count=zb_count,
                                a_signed=a_signed, b_signed=b_signed, a16=a16.ctypes.data, b16=b16.ctypes.data)
        return native.launch("ctxrt_igemm", args, (arrays, a16, b16))
    return Bound(make, (m * kp * 2, kp * n * 2), "native_int16")


class _Multiplier:
    """The float32 multipliers a_scale * b_scale [/ y_scale] (* alpha) of one batch matrix, [M or 1, N or 1],
    computed as a launch runs (scales may be computed tensors) into scratch."""

    def __init__(self, sh: Shapes, a_rows: bool, b_cols: bool) -> None:
        self.shape = (sh.m if a_rows else 1, sh.n if b_cols else 1)
        self.nbytes = self.shape[0] * self.shape[1] * 4

    def bind(self, sh: Shapes, buf: np.ndarray, a_s: np.ndarray, b_s: np.ndarray, y_s: np.ndarray | None,
             alpha: float = 1.0) -> tuple[np.ndarray, Callable[[tuple[int, ...]], None]]:
        mult = scratch_view(buf, self.shape, F32)
        ar, bc = sh.rows(a_s), sh.columns(b_s)
        ys = None if y_s is None else y_s.reshape(())
        al = np.float32(alpha)

        def prepare(index: tuple[int, ...]) -> None:
            a = ar if ar.ndim == 0 else ar[index]
            b = bc if bc.ndim == 0 else bc[index]
            if al != 1:
                np.multiply(al, a, out=mult)
                np.multiply(mult, b, out=mult)
            else:
                np.multiply(a, b, out=mult)
            if ys is not None:
                np.divide(mult, ys, out=mult)
        return mult, prepare


def _cols(mult: np.ndarray, n0: int, n1: int) -> np.ndarray:
    return mult[:, n0:n1] if mult.shape[1] > 1 else mult


def qlinear_matmul(spec: NodeSpec) -> Kernel:
    require(spec, 0, WIDE_INTS, "a")
    require(spec, 3, WIDE_INTS, "b")
    yt = np.dtype(spec.outputs[0].dtype)
    if yt not in WIDE_INTS:
        raise fail(spec, f"output type {yt} is not supported")
    if size(spec.inputs[6]) != 1 or size(spec.inputs[7]) != 1:
        raise fail(spec, "y_scale and y_zero_point must be scalars")
    sh = Shapes(spec, 0, 3, per_tensor=all(size(spec.inputs[i]) == 1 for i in (1, 2, 4, 5) if given(spec, i)))
    multiplier = _Multiplier(sh, size(spec.inputs[1]) > 1, size(spec.inputs[4]) > 1)
    requant = Requant(yt)

    native_ok = _native_fits(spec, sh, yt)

    def make(ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        if native_ok:
            fast = _native_qmatmul(sh, ins, outs[0], scratch)
            if fast is not None:
                return fast
        y = sh.out(outs[0])
        mult, prepare = multiplier.bind(sh, scratch[3], ins[1], ins[4], ins[6])
        t32 = [scratch_view(scratch[4], sh.block(n0, n1), F32) for n0, n1 in sh.blocks]
        yz = ins[7].reshape(())

        def epilogue(acc: np.ndarray, n0: int, n1: int, index: Any) -> None:
            requant(acc, t32[n0 // sh.cols], _cols(mult, n0, n1), yz, y[index][..., n0:n1])
        return sh.bind(ins[0], ins[3], ins[2], ins[5], scratch, epilogue, prepare)
    return Bound(make, (*sh.scratch, multiplier.nbytes, sh.t_bytes), sh.algorithm)


_NATIVE_WORK = 1 << 16  # floats of B a native QLinearMatMul converts per batch matrix (csrc/qelem.c): within
# the planned block of B's columns (_BLOCK_BYTES), so the whole of B is one block
_EIGHT = (np.dtype(np.int8), np.dtype(np.uint8))


def _native_fits(spec: NodeSpec, sh: Shapes, yt: np.dtype) -> bool:
    """A QLinearMatMul the native kernel computes exactly: per-tensor parameters, 8-bit operands and output, float32
    sums exact, no transposition, one batch shape for A and B (an attention's scores and weighted sums)."""
    return (sh.acc == F32 and not sh.ta and not sh.tb and not sh.a_vec and not sh.b_vec and yt in _EIGHT
            and dtype_of(spec, 0) in _EIGHT and dtype_of(spec, 3) in _EIGHT and sh.a_shape[:-2] == sh.b_shape[:-2]
            and all(size(spec.inputs[i]) == 1 for i in (1, 2, 4, 5) if given(spec, i))
            and sh.k * sh.n <= _NATIVE_WORK)


def _native_qmatmul(sh: Shapes, ins: list[Any], y: np.ndarray, scratch: list[Any]) -> Launch | None:
    """The whole QLinearMatMul (GEMM and requantization) in one native call (csrc/qelem.c): the float32 sums are
    the exact integers the NumPy path's float32 GEMM gives, the multiplier and the rounding are computed in the same
    float32 steps, so the bytes are the same. Its work is the NumPy path's planned scratch (A's, B's and the sums'
    float32 blocks). None where the library is not there or the arrays are not contiguous."""
    lib = native.library()
    a, b = ins[0], ins[3]
    if lib is None or not (a.flags.c_contiguous and b.flags.c_contiguous and y.flags.c_contiguous):
        return None
    arow, bf, acc = (scratch_view(scratch[i], (count,), F32) for i, count in ((0, sh.k), (1, sh.k * sh.n),
                                                                                (2, sh.n)))
    args = native.QMatMulArgs(batch=math.prod(sh.batch), m=sh.m, k=sh.k, n=sh.n, a=a.ctypes.data, b=b.ctypes.data,
                              y=y.ctypes.data, a_signed=int(a.dtype == np.int8), b_signed=int(b.dtype == np.int8),
                              y_signed=int(y.dtype == np.int8), bf=bf.ctypes.data, acc=acc.ctypes.data,
                              arow=arow.ctypes.data)
    ref, call, f32 = ctypes.byref(args), lib.ctxrt_qmatmul, np.float32
    sa, za, sb, zb, sy, zy = (ins[i] if i < len(ins) else None for i in (1, 2, 4, 5, 6, 7))

    def run(_keep: Any = (a, b, y, arow, bf, acc)) -> None:  # scales and zero points may be run-time inputs
        args.mult = float(f32(sa.item()) * f32(sb.item()) / f32(sy.item()))  # as _Multiplier: (a * b) / y
        args.za = 0.0 if za is None else za.item()
        args.zb = 0.0 if zb is None else zb.item()
        args.zc = 0.0 if zy is None else zy.item()
        call(ref)
    return run


def _float_out(spec: NodeSpec, sh: Shapes, multiplier: _Multiplier, at: dict[str, int | None],
               quantize_a: bool = False) -> Kernel:
    """MatMulIntegerToFloat and DynamicQuantizeMatMul: Y = acc * (a_scale * b_scale) + bias, in float32. `at`
    gives the input positions of a_scale, a_zp, b_scale, b_zp and bias (None: the op has none)."""
    yt = np.dtype(spec.outputs[0].dtype)
    if yt not in (F32, np.dtype(np.float16)):
        raise fail(spec, f"output type {yt} is not supported")

    def opt(key: str, ins: list[Any]) -> Any:
        i = at[key]
        return ins[i] if i is not None and given(spec, i) else None

    def make(ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        y = sh.out(outs[0])
        t32 = [scratch_view(scratch[4], (sh.m, n1 - n0), F32) for n0, n1 in sh.blocks]
        bias = opt("bias", ins)
        bias_row = None if bias is None else bias.reshape(1, -1)
        quantize = None
        if quantize_a:  # DynamicQuantizeMatMul: A quantized to uint8 as DynamicQuantizeLinear does
            a_src = scratch_view(scratch[5], tuple(spec.inputs[0].shape), F32)
            a_params = scratch_view(scratch[6], (2,), F32)
            quantize = _dynamic(ins[0], a_src, a_params)
            a_scale, a_zp = a_params[0:1], a_params[1:2]
        else:
            a_src, a_scale, a_zp = ins[0], opt("a_scale", ins), opt("a_zp", ins)
        mult, scales = multiplier.bind(sh, scratch[3], a_scale, opt("b_scale", ins), None)
        first = (0,) * len(sh.batch)

        def prepare(index: tuple[int, ...]) -> None:
            if quantize is not None and index == first:
                quantize()
            scales(index)

        def epilogue(acc: np.ndarray, n0: int, n1: int, index: tuple[int, ...]) -> None:
            t = t32[n0 // sh.cols]
            np.copyto(t, acc, casting="unsafe")
            np.multiply(t, _cols(mult, n0, n1), out=t)
            if bias_row is not None:
                np.add(t, bias_row[:, n0:n1], out=t)
            np.copyto(y[index][:, n0:n1], t, casting="unsafe")
        return sh.bind(a_src, ins[1], a_zp, opt("b_zp", ins), scratch, epilogue, prepare)

    extra = (size(spec.inputs[0]) * 4, 8) if quantize_a else ()
    return Bound(make, (*sh.scratch, multiplier.nbytes, sh.m * sh.cols * 4, *extra), sh.algorithm)


def _dynamic(x: np.ndarray, q: np.ndarray, params: np.ndarray) -> Callable[[], None]:
    """x quantized to uint8 values (held in float32) over [min(x, 0), max(x, 0)]; params = [scale, zero point]."""
    f, flat = np.float32, x.reshape(-1)

    def run() -> None:
        hi = f(max(f(0), np.maximum.reduce(flat)))
        lo = f(min(f(0), np.minimum.reduce(flat)))
        scale = f(1) if hi == lo else f(hi - lo) / f(255)
        zp = np.rint(min(f(255), max(f(0), f(0) - lo / scale)))
        params[0], params[1] = scale, zp
        np.divide(x, scale, out=q)
        quantize_into(q, zp, f(0), f(255), q)
    return run


def matmul_integer_to_float(spec: NodeSpec) -> Kernel:
    require(spec, 0, EIGHT_BIT, "A")
    require(spec, 1, EIGHT_BIT, "B")
    sh = Shapes(spec, 0, 1)
    if size(spec.inputs[2]) != 1 or (given(spec, 4) and size(spec.inputs[4]) != 1):
        raise fail(spec, "a_scale and a_zero_point must be scalars (per tensor)")
    at = {"a_scale": 2, "b_scale": 3, "a_zp": 4, "b_zp": 5, "bias": 6}
    return _float_out(spec, sh, _Multiplier(sh, False, size(spec.inputs[3]) > 1), at)


def dynamic_quantize_matmul(spec: NodeSpec) -> Kernel:
    if dtype_of(spec, 0) != F32:
        raise fail(spec, f"A of type {dtype_of(spec, 0)} is not supported")
    require(spec, 1, EIGHT_BIT, "B")
    sh = Shapes(spec, 0, 1)
    at = {"a_scale": None, "b_scale": 2, "a_zp": None, "b_zp": 3, "bias": 4}
    return _float_out(spec, sh, _Multiplier(sh, False, size(spec.inputs[2]) > 1), at, quantize_a=True)


def qgemm(spec: NodeSpec) -> Kernel:
    """Y = alpha (A - a_zp)(B - b_zp) a_scale b_scale + C, C in int32 at that scale; float, or quantized with
    y_scale / y_zero_point."""
    require(spec, 0, WIDE_INTS, "A")
    require(spec, 3, WIDE_INTS, "B")
    sh = Shapes(spec, 0, 3, bool(spec.attr("transA", 0)), bool(spec.attr("transB", 0)), added=given(spec, 6))
    if size(spec.inputs[1]) != 1 or size(spec.inputs[2]) != 1:
        raise fail(spec, "a_scale and a_zero_point must be scalars")
    quantized = given(spec, 8)  # with y_zero_point the output is quantized, else float32
    yt = np.dtype(spec.outputs[0].dtype)
    if yt not in (WIDE_INTS if quantized else {F32}):
        raise fail(spec, f"output type {yt} is not supported")
    multiplier = _Multiplier(sh, False, size(spec.inputs[4]) > 1)
    alpha = float(np.float32(spec.attr("alpha", 1.0)))
    has_c = given(spec, 6)
    requant = Requant(yt) if quantized else None

    def make(ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        y = sh.out(outs[0])
        mult, prepare = multiplier.bind(sh, scratch[3], ins[1], ins[4], ins[7] if given(spec, 7) else None, alpha)
        t32 = [scratch_view(scratch[4], (sh.m, n1 - n0), F32) for n0, n1 in sh.blocks]
        c = np.broadcast_to(ins[6], (sh.m, sh.n)) if has_c else None
        yz = ins[8].reshape(()) if quantized else None

        def epilogue(acc: np.ndarray, n0: int, n1: int, index: tuple[int, ...]) -> None:
            if c is not None:
                np.add(acc, c[:, n0:n1], out=acc)
            t, out = t32[n0 // sh.cols], y[index][:, n0:n1]
            if requant is not None:
                requant(acc, t, _cols(mult, n0, n1), yz, out)
            else:
                np.copyto(t, acc, casting="unsafe")
                np.multiply(t, _cols(mult, n0, n1), out=out)
        return sh.bind(ins[0], ins[3], ins[2], ins[5] if given(spec, 5) else None, scratch, epilogue, prepare)
    return Bound(make, (*sh.scratch, multiplier.nbytes, sh.m * sh.cols * 4), sh.algorithm)


KERNELS = {"MatMulInteger": matmul_integer, "QLinearMatMul": qlinear_matmul, "QGemm": qgemm,
           "MatMulIntegerToFloat": matmul_integer_to_float, "DynamicQuantizeMatMul": dynamic_quantize_matmul}
