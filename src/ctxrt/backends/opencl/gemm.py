"""Gemm and MatMul (batched, broadcast over batch dims, as attention needs) on one register-tiled kernel
(kernels/gemm.cl) with alpha/beta, the bias, a residual and a fused Relu or Gelu in its epilogue (a MatMul's
bias, residual and activation are folded into it by `OpenCLBackend.lower`: FuseMatMulEpilogue). A float16 model's
constant B, which ir/passes/half.py leaves half (the node's `widen`), is read as it is stored, as float (WTYPE:
kernels/halfload.clh)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ctxrt.backends.kernel import Launch, NodeSpec, TensorSpec
from ctxrt.backends.opencl.kernel import WIDEN, ClKernel, Space, weight_type
from ctxrt.errors import UnsupportedOpError
from ctxrt.ir.graph import Graph as IRGraph
from ctxrt.ir.graph import Node

MAX_BATCH_RANK = 4  # dims of an int4 kernel argument
_LIMIT = 1 << 31  # int32 element indices
PROVIDER = "opencl"  # FuseMatMulEpilogue's provider name while it folds
ACTIVATIONS = {None: 0, "Relu": 1, "Gelu": 2, "GeluTanh": 3}  # the kernel's ACT


def _batch_strides(shape: tuple[int, ...], batch: tuple[int, ...]) -> list[int]:
    """Element strides of a row-major [*batch_dims, rows, cols] operand over the output's batch dims (0 where it
    broadcasts or lacks the dim)."""
    lead = (1,) * (len(batch) - (len(shape) - 2)) + tuple(shape[:-2])
    strides, acc = [0] * len(batch), shape[-1] * shape[-2]
    for d in range(len(batch) - 1, -1, -1):
        strides[d] = 0 if lead[d] == 1 else acc
        acc *= lead[d]
    return strides


def _collapse_batch(batch: tuple[int, ...], sa: list[int], sb: list[int]) -> tuple[list[int], list[int], list[int]]:
    """Batch dims with size-1 dims dropped and neighbours merged where both operands are contiguous across."""
    keep = [d for d in range(len(batch)) if batch[d] != 1]
    dims, sa, sb = [batch[d] for d in keep], [sa[d] for d in keep], [sb[d] for d in keep]
    d = len(dims) - 1
    while d > 0:
        if sa[d - 1] == sa[d] * dims[d] and sb[d - 1] == sb[d] * dims[d]:
            dims[d - 1:d + 1], sa[d - 1:d + 1], sb[d - 1:d + 1] = [dims[d - 1] * dims[d]], [sa[d]], [sb[d]]
        d -= 1
    return dims, sa, sb


class Gemm(ClKernel):
    source = "gemm.cl"
    half_inputs = (1,)  # B: a float16 model's weights
    space = Space(
        params={"TM": (1, 2, 4, 8, 16, 32, 64, 128), "TN": (8, 16, 32, 64, 128), "TK": (8, 16, 32),
                "WM": (1, 2, 4, 8), "WN": (1, 2, 4, 8), "LOCAL": (0, 1), "KV": (1, 4, 8, 16), "VN": (1, 4, 8, 16)},
        # PoCL: no local memory (its "local" memory is the same caches) and explicit vectors (PoCL vectorises
        # across work-items, never along a loop inside one). NN, N >= 16: the CPU's micro-kernel, 8 rows x 16
        # columns per work-item (BERT's attention P.V 12x128x128x32: 0.09 ms vs 1.4 ms for 2x1 scalars; 512^3:
        # 1.7 ms vs 20 ms); N < 16, or A and B both transposed: 16x32 tiles of 2x1 scalars. NT (constant
        # weights stored [N, K]): 4x4 dot products of 16-wide vectors per work-item (BERT-6's 128x384x1536:
        # 0.9 ms vs 5.2 ms for one 8-wide dot product per work-item; OpenBLAS ~0.8 ms); M = 1 (GEMV): 1x4 of
        # them (no rows recomputed). On a 2-core EPYC (PoCL 3.1), the minimum of interleaved runs. GPUs: 64x64
        # tiles staged in local memory, 4x4 per work-item.
        defaults={"cpu": {"TM": 32, "TN": 32, "TK": 8, "WM": 8, "WN": 1, "LOCAL": 0, "KV": 1, "VN": 16},
                  "cpu:scalar": {"TM": 16, "TN": 32, "TK": 8, "WM": 2, "WN": 1, "LOCAL": 0, "KV": 1, "VN": 1},
                  "cpu:nt": {"TM": 4, "TN": 32, "TK": 8, "WM": 4, "WN": 4, "LOCAL": 0, "KV": 16, "VN": 1},
                  "cpu:gemv": {"TM": 1, "TN": 64, "TK": 8, "WM": 1, "WN": 4, "LOCAL": 0, "KV": 16, "VN": 1},
                  "gpu": {"TM": 64, "TN": 64, "TK": 16, "WM": 4, "WN": 4, "LOCAL": 1, "KV": 1, "VN": 1},
                  "default": {"TM": 32, "TN": 32, "TK": 16, "WM": 2, "WN": 2, "LOCAL": 1, "KV": 1, "VN": 1}},
        constraints=(lambda p, s: p["TM"] % p["WM"] == 0 and p["TN"] % (p["WN"] * p["VN"]) == 0,
                     lambda p, s: p["LOCAL"] == 1 or p["TK"] == 8,  # TK unused without local memory
                     lambda p, s: p["KV"] == 1 or (p["LOCAL"] == 0 and s["b_t"] and not s["a_t"]),
                     lambda p, s: p["VN"] == 1 or (p["LOCAL"] == 0 and p["KV"] == 1 and not s["b_t"]
                                                   and p["VN"] <= s["N"])),
        work_group=lambda p: (p["TN"] // (p["WN"] * p["VN"]), p["TM"] // p["WM"]),
        local_memory=lambda p, s: p["LOCAL"] * p["TK"] * (p["TM"] + p["TN"]) * s.get("itemsize", 4))

    def __init__(self, spec: NodeSpec, backend: Any, params: Any = None) -> None:
        self._shape(spec)  # the problem first: constraints are checked against it
        super().__init__(spec, backend, params)
        halves = spec.attr(WIDEN) or ()
        dts = {np.dtype(t.dtype) for i, t in enumerate(spec.inputs) if t is not None and i not in halves}
        dts.add(np.dtype(spec.outputs[0].dtype))
        if len(dts) != 1 or next(iter(dts)).kind != "f":
            raise UnsupportedOpError(f"{spec.op} node {spec.name!r}: the OpenCL GEMM takes one float dtype, "
                                     f"got {sorted(map(str, dts))}")
        self.dtype = next(iter(dts))
        self.T = self.cl_type(self.dtype)
        self.wtype = weight_type(spec, 1, self.T)
        act = spec.attr("activation")
        if act == "Gelu":
            act = "GeluTanh" if spec.attr("approximate", "none") == "tanh" else "Gelu"
        if act not in ACTIVATIONS:
            raise UnsupportedOpError(f"{spec.op} node {spec.name!r}: fused activation {act!r}")
        self.act = ACTIVATIONS[act]

    def _shape(self, spec: NodeSpec) -> None:
        """M, N, K, layouts, batch dims and strides, bias strides; declines what the kernel cannot address."""
        a, b = spec.inputs[0].shape, spec.inputs[1].shape
        self.alpha, self.beta = 1.0, 1.0
        self.has_c, self.scm, self.scn = False, 0, 0
        self.residual: int | None = None  # the input index of a MatMul's folded residual
        if spec.op == "Gemm":
            self.a_t, self.b_t = bool(spec.attr("transA", 0)), bool(spec.attr("transB", 0))
            self.alpha, self.beta = float(spec.attr("alpha", 1.0)), float(spec.attr("beta", 1.0))
            self.M, self.K = (a[1], a[0]) if self.a_t else a
            self.N = b[0] if self.b_t else b[1]
            self.lda, self.ldb = a[1], b[1]
            c = spec.inputs[2] if len(spec.inputs) > 2 else None
            if c is not None:
                cs = (1,) * (2 - len(c.shape)) + tuple(c.shape)
                self.has_c, self.scm, self.scn = True, 0 if cs[0] == 1 else cs[1], 0 if cs[1] == 1 else 1
            self.batch, self.bsa, self.bsb = [], [], []
        else:  # MatMul: numpy's rules; B may be stored [N, K] (TransposeMatMulWeights); a folded bias [N] is C
            self.a_t, self.b_t = False, bool(spec.attr("transB", 0))
            self.has_c, self.scn = bool(spec.attr("bias", 0)), 1
            if spec.attr("residual", 0):
                self.residual = 2 + self.has_c
            a2 = a if len(a) >= 2 else (1, *a)
            b2 = b if len(b) >= 2 else (*b, 1)
            self.M, self.K = a2[-2:]
            self.N = b2[-2] if self.b_t else b2[-1]
            self.lda, self.ldb = self.K, (self.K if self.b_t else self.N)
            batch = tuple(np.broadcast_shapes(a2[:-2], b2[:-2]))
            if len(b2) == 2 and len(a2) > 2:  # weights: the batch folds into M, one GEMM
                self.M *= math.prod(a2[:-2])
                batch = ()
            self.batch, self.bsa, self.bsb = _collapse_batch(batch, _batch_strides(a2, batch),
                                                             _batch_strides(b2, batch))
            if len(self.batch) > MAX_BATCH_RANK:
                raise UnsupportedOpError(f"MatMul node {spec.name!r}: {len(self.batch)} batch dims after merging")
        if max(math.prod(t.shape) for t in [*spec.inputs, *spec.outputs] if t is not None) >= _LIMIT:
            raise UnsupportedOpError(f"{spec.op} node {spec.name!r}: tensors past 2^31 elements")

    def problem(self) -> dict[str, int]:
        return {"M": self.M, "N": self.N, "K": self.K, "batch": math.prod(self.batch), "a_t": int(self.a_t),
                "b_t": int(self.b_t), "itemsize": np.dtype(self.spec.outputs[0].dtype).itemsize}

    def variant(self) -> str:
        if self.b_t and not self.a_t:
            return "gemv" if self.M == 1 else "nt"
        return "scalar" if self.N < 16 or self.b_t else ""  # vectors along N need 16 columns of B [K, N]

    def defines(self) -> dict[str, Any]:
        d = {"T": self.T, "A_T": int(self.a_t), "B_T": int(self.b_t), "HAS_C": int(self.has_c),
             "HAS_R": int(self.residual is not None), "ACT": self.act, **self.params}
        if self.wtype:
            d["WTYPE"] = self.wtype
        if self.T == "double":
            d["FP64"] = 1
        return d

    def bind(self, ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        if self.M * self.N * math.prod(self.batch) == 0:
            return lambda: None
        a, b, y = ins[0], ins[1], outs[0]
        c = ins[2] if self.has_c else a
        r = a if self.residual is None else ins[self.residual]
        scalar = self.dtype.type
        args = [np.int32(self.M), np.int32(self.N), np.int32(self.K),
                a.mem, np.uint64(a.offset), np.int32(self.lda), b.mem, np.uint64(b.offset), np.int32(self.ldb),
                c.mem, np.uint64(c.offset), np.int32(self.scm), np.int32(self.scn), r.mem, np.uint64(r.offset),
                y.mem, np.uint64(y.offset),
                scalar(self.alpha), scalar(self.beta), *batch_args(self.backend.cl, self.batch, self.bsa, self.bsb)]
        return self.launch(self.kernel("gemm", *args), *tile_grid(self.params, self.M, self.N, self.batch))


def batch_args(cl: Any, batch: list[int], bsa: list[int], bsb: list[int]) -> list[Any]:
    """The batch dims and A's and B's strides over them as the kernels' int4 arguments (innermost first)."""
    def vec(values: list[int], fill: int) -> Any:
        return cl.cltypes.make_int4(*reversed([fill] * (MAX_BATCH_RANK - len(values)) + values))
    return [vec(batch, 1), vec(bsa, 0), vec(bsb, 0)]


def tile_grid(p: dict[str, int], m: int, n: int, batch: list[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(global, local) sizes of a tiled GEMM (gemm.cl, qgemm.cl): TM x TN tiles of WM x (WN VN) per work item."""
    rn, rm = p["TN"] // (p["WN"] * p["VN"]), p["TM"] // p["WM"]
    return (-(-n // p["TN"]) * rn, -(-m // p["TM"]) * rm, math.prod(batch)), (rn, rm, 1)


def _gemm(spec: NodeSpec, backend: Any) -> Gemm:
    return Gemm(spec, backend)


def fold_epilogues(graph: IRGraph, backend: Any) -> IRGraph:
    """Each MatMul this kernel runs gets the constant bias Add, the residual Add and the Relu or Gelu that follow
    it folded into its epilogue (a transformer layer's projections: one launch instead of up to four, and the
    intermediate tensors gone), where the kernel accepts the fused node."""
    from ctxrt.ir.passes.fuse_epilogue import FuseMatMulEpilogue

    def accepts(g: IRGraph, node: Node) -> bool:
        ins = [g.values[n] if n else None for n in node.inputs]
        spec = NodeSpec(node.op, node.name, node.attrs,
                        [None if v is None else TensorSpec(v.shape, np.dtype(v.dtype)) for v in ins],
                        [TensorSpec(g.values[o].shape, np.dtype(g.values[o].dtype)) for o in node.outputs],
                        [None if v is None else v.const for v in ins], g.opset)
        try:
            Gemm(spec, backend)
        except UnsupportedOpError:
            return False
        return True

    marked = [n for n in graph.nodes if n.op == "MatMul" and accepts(graph, n)]
    for node in marked:  # the pass folds into the nodes of one provider
        node.attrs = {**node.attrs, "kernel": PROVIDER}
    graph = FuseMatMulEpilogue(PROVIDER, accepts)(graph).graph
    for node in marked:
        node.attrs = {k: v for k, v in node.attrs.items() if k != "kernel"}
    return graph


KERNELS = {"Gemm": _gemm, "MatMul": _gemm}
