"""Integer matrix products on the device (kernels/qgemm.cl): QLinearMatMul, QGemm, MatMulInteger, MatMulIntegerToFloat
and DynamicQuantizeMatMul, 8-bit operands and weights (8-bit on the device too), their products summed exactly (in
float32 chunks below 2^24, added in int32), the requantization (or the float scaling) in the epilogue, in the float32
steps of the NumPy kernels (backends/cpu/quant/gemm.py): the bytes are the same.

A constant 2-D B (weights) is prepacked at compile time, still 8-bit and the same count of bytes, as [K, N] (vectors
along N: the faster layout from 32 rows of A on PoCL) or [N, K] (dot products along K: a few rows, a token); the
layout is recorded in the node's attributes (`kernel`, `b_shape`, `b_t`) so a loaded context reads it as it is. A
run-time B (attention's Q K^T and P V in a QDQ transformer) is read where it lies, batched and broadcast like
MatMul's. Scales and zero points are read from their tensors as the kernel runs.

DynamicQuantizeMatMul quantizes its float A on the device first (its range, then its values, into scratch: two
small launches before the product), as DynamicQuantizeLinear does.

Declined (the node runs in a CPU partition): 16-bit operands, per-row A parameters, per-batch B parameters,
non-float32 scales, zero points of another type than their operand, float16 outputs, sums that could pass int32
(K |A - za| |B - zb| >= 2^31: K above ~33,000 at the extremes), QGemm of batched operands, tensors past 2^31
elements, more than 4 batch dims after merging.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ctxrt.backends.cpu.quant.common import centred_span
from ctxrt.backends.kernel import Launch, NodeSpec
from ctxrt.backends.opencl.gemm import MAX_BATCH_RANK, _batch_strides, _collapse_batch, batch_args, tile_grid
from ctxrt.backends.opencl.kernel import ClKernel, Space
from ctxrt.backends.opencl.spatial import decline

PACKED = "opencl_qgemm"  # the `kernel` attribute of a node whose B is prepacked for qgemm.cl
_LIMIT = 1 << 31
_I8, _U8 = np.dtype(np.int8), np.dtype(np.uint8)
_EIGHT = {_I8, _U8}
_F32, _I32 = np.dtype(np.float32), np.dtype(np.int32)
# a constant B is packed [K, N] (vectors along N, 8 rows per work-item) from this many rows of A, else [N, K] (dot
# products along K): 768 x 768 weights on PoCL (2-core EPYC), M = 16: 0.36 ms as [N, K], 0.49 as [K, N]; M = 32:
# 0.70 and 0.28; M = 128 (x 384 x 1536): 1.8 and 1.1
_NN_ROWS = 32
_RANGE = {_I8: (-128, 127), _U8: (0, 255)}

# op -> input positions: A, B, a_scale, a_zp, b_scale, b_zp, y_scale, y_zp, C (int32), float bias
_INPUTS = {
    "QLinearMatMul": dict(a=0, b=3, a_s=1, a_z=2, b_s=4, b_z=5, y_s=6, y_z=7, c=None, fb=None),
    "QGemm": dict(a=0, b=3, a_s=1, a_z=2, b_s=4, b_z=5, y_s=7, y_z=8, c=6, fb=None),
    "MatMulInteger": dict(a=0, b=1, a_s=None, a_z=2, b_s=None, b_z=3, y_s=None, y_z=None, c=None, fb=None),
    "MatMulIntegerToFloat": dict(a=0, b=1, a_s=2, a_z=4, b_s=3, b_z=5, y_s=None, y_z=None, c=None, fb=6),
    "DynamicQuantizeMatMul": dict(a=0, b=1, a_s=None, a_z=None, b_s=2, b_z=3, y_s=None, y_z=None, c=None, fb=4),
}
_DQ_WGS = 64  # dq_range's work-group (one)
_DQ_PARAMS = 64  # scratch bytes before the quantized A: its scale (float) and zero point (uchar at byte 4)


class QGemmKernel(ClKernel):
    source = "qgemm.cl"
    space = Space(
        params={"TM": (1, 2, 4, 8, 16, 32, 64), "TN": (8, 16, 32, 64, 128), "WM": (1, 2, 4, 8),
                "WN": (1, 2, 4, 8), "KV": (1, 4, 8, 16), "VN": (1, 4, 8, 16)},
        # PoCL: explicit 16-wide vectors (an AVX-512 register) of float32 sums, exact (chunks of K, see qgemm.cl):
        # twice the speed of int32 multiplies. NN (B [K, N]: run-time B, and weights from 32 rows of A): 8 rows x
        # 16 columns per work-item, A's values loaded 8 at a time (narrower vectors below 16 columns; BERT's
        # attention 12x128x64x128: 0.38-0.51 ms vs 0.94 with one A value per step and int32 sums); NT (weights
        # stored [N, K], a few rows): 4x4 dot products per work-item, M = 1: 1x4. GPUs: scalars, 2x2 outputs per
        # work-item (no local-memory variant yet).
        defaults={"cpu": {"TM": 32, "TN": 32, "WM": 8, "WN": 1, "KV": 1, "VN": 16},
                  "cpu:nn8": {"TM": 32, "TN": 16, "WM": 8, "WN": 1, "KV": 1, "VN": 8},
                  "cpu:nn4": {"TM": 32, "TN": 8, "WM": 8, "WN": 1, "KV": 1, "VN": 4},
                  "cpu:scalar": {"TM": 16, "TN": 32, "WM": 2, "WN": 1, "KV": 1, "VN": 1},
                  "cpu:nt": {"TM": 4, "TN": 32, "WM": 4, "WN": 4, "KV": 16, "VN": 1},
                  "cpu:gemv": {"TM": 1, "TN": 64, "WM": 1, "WN": 4, "KV": 16, "VN": 1},
                  "default": {"TM": 16, "TN": 16, "WM": 2, "WN": 2, "KV": 1, "VN": 1}},
        constraints=(lambda p, s: p["TM"] % p["WM"] == 0 and p["TN"] % (p["WN"] * p["VN"]) == 0,
                     lambda p, s: p["KV"] == 1 or (s["b_t"] and not s["a_t"]),
                     lambda p, s: p["VN"] == 1 or (p["KV"] == 1 and not s["b_t"] and p["VN"] <= s["N"])),
        work_group=lambda p: (p["TN"] // (p["WN"] * p["VN"]), p["TM"] // p["WM"]))

    def __init__(self, spec: NodeSpec, backend: Any, params: Any = None) -> None:
        self.at = _INPUTS[spec.op.rsplit(".", 1)[-1]]
        self._shape(spec)
        super().__init__(spec, backend, params)
        self._types(spec)

    # -- what the node is --------------------------------------------------------------------------------
    def _given(self, key: str) -> bool:
        i = self.at[key]
        return i is not None and i < len(self.spec.inputs) and self.spec.inputs[i] is not None

    def _size(self, key: str) -> int:
        return math.prod(self.spec.inputs[self.at[key]].shape)

    def _shape(self, spec: NodeSpec) -> None:
        self.spec = spec
        ia, ib = self.at["a"], self.at["b"]
        a = tuple(spec.inputs[ia].shape)
        packed = spec.attr("kernel") == PACKED
        b = tuple(spec.attr("b_shape")) if packed else tuple(spec.inputs[ib].shape)
        const_b = packed or (ib < len(spec.consts) and spec.consts[ib] is not None)
        if spec.op.endswith("QGemm"):
            if len(a) != 2 or len(b) != 2:
                raise decline(spec, f"QGemm of shapes {list(a)} x {list(b)} (2-D only)")
            self.a_t, bt = bool(spec.attr("transA", 0)), bool(spec.attr("transB", 0))
            self.M, self.K = (a[1], a[0]) if self.a_t else a
            self.N = b[0] if bt else b[1]
            b2, a2 = b, a
            batch: tuple[int, ...] = ()
        else:
            self.a_t, bt = False, False
            a2 = a if len(a) >= 2 else (1, *a)
            b2 = b if len(b) >= 2 else (*b, 1)
            self.M, self.K = a2[-2:]
            self.N = b2[-1]
            batch = tuple(np.broadcast_shapes(a2[:-2], b2[:-2]))
            if len(b2) == 2 and len(a2) > 2:  # weights: the batch folds into M, one GEMM
                self.M *= math.prod(a2[:-2])
                batch = ()
        # the stored layout of B: a constant 2-D B is prepacked ([N, K] for dot products along K with few rows of
        # A and no transA, else [K, N]), a run-time one is read as it lies
        self.pack = const_b and len(b2) == 2
        self.b_t = (not self.a_t and (self.M < _NN_ROWS or self.N < 16)) if self.pack else bt
        if packed:
            self.b_t = bool(spec.attr("b_t"))
        self.lda = self.M if self.a_t else self.K
        self.ldb = self.K if self.b_t else self.N
        self.batch, self.bsa, self.bsb = _collapse_batch(batch, _batch_strides(a2, batch),
                                                         _batch_strides(b2, batch))
        if len(self.batch) > MAX_BATCH_RANK:
            raise decline(spec, f"{len(self.batch)} batch dims after merging")
        if max(math.prod(t.shape) for t in [*spec.inputs, *spec.outputs] if t is not None) >= _LIMIT:
            raise decline(spec, "tensors past 2^31 elements")

    def _types(self, spec: NodeSpec) -> None:
        at, op = self.at, spec.op.rsplit(".", 1)[-1]
        ta, tb = np.dtype(spec.inputs[at["a"]].dtype), np.dtype(spec.inputs[at["b"]].dtype)
        self.dq = op == "DynamicQuantizeMatMul"  # A float32, quantized to uint8 first (two launches, in scratch)
        if self.dq:
            if ta != _F32:
                raise decline(spec, f"DynamicQuantizeMatMul of a {ta} A")
            ta = _U8
            self.scratch = (_DQ_PARAMS + math.prod(spec.inputs[at["a"]].shape),)
        if ta not in _EIGHT or tb not in _EIGHT:
            raise decline(spec, f"operands {ta} x {tb} (8-bit only)")
        self.TA, self.TB = self.cl_type(ta), self.cl_type(tb)
        for key, t in (("a_z", ta), ("b_z", tb)):
            if self._given(key) and np.dtype(spec.inputs[at[key]].dtype) != t:
                raise decline(spec, f"a zero point of type {spec.inputs[at[key]].dtype} for a {t} operand")
        for key in ("a_s", "b_s", "y_s"):
            if self._given(key) and np.dtype(spec.inputs[at[key]].dtype) != _F32:
                raise decline(spec, f"scales of type {spec.inputs[at[key]].dtype} (float32 only)")
        for key in ("a_s", "a_z", "y_s", "y_z"):
            if self._given(key) and self._size(key) != 1:
                raise decline(spec, f"{key} of shape {list(spec.inputs[at[key]].shape)} (per tensor only)")
        self.cols = {}
        for key in ("b_s", "b_z"):  # per tensor, or per column: [N] or [1, ..., 1, N]
            if self._given(key):
                shape = tuple(spec.inputs[at[key]].shape)
                self.cols[key] = math.prod(shape) > 1
                if self.cols[key] and (shape[-1] != self.N or math.prod(shape) != self.N):
                    raise decline(spec, f"{key} of shape {list(shape)} (per tensor or per column)")
        yt = np.dtype(spec.outputs[0].dtype)
        if op == "MatMulInteger":
            self.mode, ok = 0, yt == _I32
        elif op in ("MatMulIntegerToFloat", "DynamicQuantizeMatMul") or (op == "QGemm" and not self._given("y_z")):
            self.mode, ok = 2, yt == _F32
        else:
            self.mode, ok = 1, yt in _EIGHT
            if ok and np.dtype(spec.inputs[at["y_z"]].dtype) != yt:
                raise decline(spec, "a y_zero_point of another type than Y")
        if not ok:
            raise decline(spec, f"{op} with output {yt}")
        self.TY = self.cl_type(yt)
        self.yrange = _RANGE.get(yt, (0, 0))
        self.has_c, self.scm, self.scn = False, 0, 0
        if self._given("c"):
            c = tuple(spec.inputs[at["c"]].shape)
            if np.dtype(spec.inputs[at["c"]].dtype) != _I32 or len(c) > 2:
                raise decline(spec, f"C of type {spec.inputs[at['c']].dtype} and shape {list(c)}")
            cs = (1,) * (2 - len(c)) + c
            self.has_c, self.scm, self.scn = True, 0 if cs[0] == 1 else cs[1], 0 if cs[1] == 1 else 1
        self.has_fb = self._given("fb")
        if self.has_fb and (np.dtype(spec.inputs[at["fb"]].dtype) != _F32 or self._size("fb") != self.N):
            raise decline(spec, "a bias that is not float32 [N]")
        self.alpha = float(np.float32(spec.attr("alpha", 1.0))) if op == "QGemm" else 1.0
        # every partial sum of the int32 accumulator is exact
        za = at["a_z"] if self._given("a_z") else None
        zb = at["b_z"] if self._given("b_z") else None
        product = centred_span(spec, at["a"], za) * centred_span(spec, at["b"], zb)  # the largest |product|
        if self.K * product >= _LIMIT:
            raise decline(spec, f"K = {self.K}: int32 sums could overflow")
        # float32 sums (twice the int32 rate on CPUs' vector units) of chunks of K whose partial sums stay exact
        # integers (below 2^24), a multiple of the vector widths along K; a chunk at least K long where one is
        self.kc = (1 << 24) // product // 16 * 16
        self.kc = min(self.kc, -(-self.K // 16) * 16)
        if self.pack and spec.attr("kernel") != PACKED:
            w = np.asarray(spec.consts[at["b"]])
            w2 = w.reshape(w.shape if w.ndim == 2 else (w.shape[0], 1))  # (a 1-D B is [K, 1])
            stored_t = spec.op.endswith("QGemm") and bool(spec.attr("transB", 0))  # w2 is [N, K]
            packed = w2 if stored_t == self.b_t else w2.T
            self.constants = {at["b"]: np.ascontiguousarray(packed)}
            self.attrs = {"kernel": PACKED, "b_shape": list(w.shape), "b_t": int(self.b_t)}

    # -- the contract ------------------------------------------------------------------------------------
    def problem(self) -> dict[str, int]:
        return {"M": self.M, "N": self.N, "K": self.K, "batch": math.prod(self.batch), "a_t": int(self.a_t),
                "b_t": int(self.b_t)}

    def variant(self) -> str:
        if self.b_t and not self.a_t:
            return "gemv" if self.M == 1 else "nt"
        if self.b_t:
            return "scalar"
        return "" if self.N >= 16 else "nn8" if self.N >= 8 else "nn4" if self.N >= 4 else "scalar"

    def defines(self) -> dict[str, Any]:
        d = {"TA": self.TA, "TB": self.TB, "TY": self.TY, "MODE": self.mode, "A_T": int(self.a_t),
             "B_T": int(self.b_t), "HAS_AZ": int(self._given("a_z") or self.dq), "HAS_BZ": int(self._given("b_z")),
             "BZ_COL": int(self.cols.get("b_z", False)), "BS_COL": int(self.cols.get("b_s", False)),
             "HAS_YS": int(self._given("y_s")), "HAS_C": int(self.has_c), "HAS_FB": int(self.has_fb),
             "KC": self.kc,
             **self.params}
        if self.mode == 1:
            d["YLO"], d["YHI"] = self.yrange
        if self.dq:
            d["DQ"], d["DQ_WGS"] = 1, _DQ_WGS
        if self.divides and self.backend.info.fp64:
            d["FP64"] = 1
        return d

    @property
    def divides(self) -> bool:
        return self.mode > 0 and (self._given("y_s") or self.dq)

    def bind(self, ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        if self.M * self.N * math.prod(self.batch) == 0:
            return lambda: None
        at = self.at
        a, b, y = ins[at["a"]], ins[at["b"]], outs[0]
        given = {key: [ins[at[key]].mem, np.uint64(ins[at[key]].offset)] for key in at if self._given(key)}
        first = None
        if self.dq:  # A quantized into scratch: [scale, zero point] then the uint8 values
            x, s, n = a, scratch[0], np.int32(math.prod(a.shape))
            params, q = [s.mem, np.uint64(s.offset)], [s.mem, np.uint64(s.offset + _DQ_PARAMS)]
            given["a_s"], given["a_z"] = params, [s.mem, np.uint64(s.offset + 4)]
            xr = [x.mem, np.uint64(x.offset)]
            rng = self.launch(self.kernel("dq_range", n, *xr, *params), (_DQ_WGS,), (_DQ_WGS,))
            quant = self.launch(self.kernel("dq_quantize", n, *xr, *params, *q), (int(n),), (64,))

            def first() -> None:
                rng()
                quant()
            a_args = q
        else:
            a_args = [a.mem, np.uint64(a.offset)]

        def t(key: str) -> list[Any]:
            return given.get(key) or [y.mem, np.uint64(0)]

        args = [np.int32(self.M), np.int32(self.N), np.int32(self.K),
                *a_args, np.int32(self.lda), b.mem, np.uint64(b.offset), np.int32(self.ldb),
                *t("a_z"), *t("b_z"), *t("a_s"), *t("b_s"), *t("y_s"), *t("y_z"),
                *t("c"), np.int32(self.scm), np.int32(self.scn), *t("fb"),
                y.mem, np.uint64(y.offset), np.float32(self.alpha),
                *batch_args(self.backend.cl, self.batch, self.bsa, self.bsb)]
        gemm = self.launch(self.kernel("qgemm", *args), *tile_grid(self.params, self.M, self.N, self.batch))
        if first is None:
            return gemm

        def launch() -> Any:
            first()
            return gemm()
        return launch


def _qgemm(spec: NodeSpec, backend: Any) -> QGemmKernel:
    return QGemmKernel(spec, backend)


KERNELS = {"QLinearMatMul": _qgemm, "QGemm": _qgemm, "MatMulInteger": _qgemm, "MatMulIntegerToFloat": _qgemm,
           "DynamicQuantizeMatMul": _qgemm}
