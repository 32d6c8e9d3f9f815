"""Element-wise ops with broadcasting: one kernel (kernels/elementwise.cl) and one table, the one in that file.

The ops, their arity and the dtype kinds they take are read from the table's `#define OP_<name>` lines;
an ONNX op maps to a table entry by name (a few choose by attribute: Gelu's approximation, Cast to bool).
Shapes are collapsed (adjacent dims merged where every input is contiguous across them), then each input
is read at the output's index, as one broadcast element, or through strides.

float16 and bfloat16 tensors (a float16 model's edges and the half weights ir/passes/half.py leaves to a node's
`widen`) are computed as float: read with vload_half (or as a float's high bits) and stored rounded to nearest
even; so Cast to and from them runs here. Arithmetic in half (cl_khr_fp16) is not used.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

import numpy as np

from ctxrt.backends.kernel import Launch, NodeSpec
from ctxrt.backends.opencl.kernel import HALF_TYPES, ClKernel, Space
from ctxrt.backends.opencl.program import source
from ctxrt.errors import UnsupportedOpError

MAX_RANK = 8  # dims of an int8 kernel argument
SOURCE = "elementwise.cl"
_LINE = re.compile(r"^#define OP_(\w+)\(([^)]*)\)\s+.*//\s*kinds:\s*(\S+)\s*$")
_KINDS = {"f": "f", "i": "i", "u": "u", "b": "b", "*": "fiub"}


def parse_table(text: str) -> dict[str, list[str]]:
    """name -> the dtype kinds (numpy kind letters) each input may have, from the table's lines."""
    table = {}
    for line in text.splitlines():
        m = _LINE.match(line.strip())
        if m:
            name, args, kinds = m.groups()
            arity = len([a for a in args.split(",") if a.strip()])
            groups = kinds.split(",")
            if len(groups) == 1:
                groups = groups * arity
            assert len(groups) == arity, f"{SOURCE}: OP_{name} has {arity} inputs but {len(groups)} kinds"
            table[name] = ["".join(_KINDS[c] for c in g) for g in groups]
    return table


TABLE = parse_table(source(SOURCE))


def _entry(spec: NodeSpec) -> str:
    """The table entry an ONNX node runs as."""
    op = spec.op
    if op == "Gelu":
        return "GeluTanh" if spec.attr("approximate", "none") == "tanh" else "Gelu"
    if op in ("Cast", "CastLike"):
        return "CastBool" if np.dtype(spec.outputs[0].dtype) == np.bool_ else "Cast"
    if op == "Sum":
        return "Add"
    return op


def _params(spec: NodeSpec, dt: np.dtype) -> tuple[Any, Any]:
    """(p0, p1): the scalar parameters some entries read, in the output dtype."""
    if spec.op == "Clip":
        info = np.finfo(dt) if dt.kind == "f" else np.iinfo(dt)
        lo, hi = spec.attr("min"), spec.attr("max")
        lo = -np.inf if lo is None and dt.kind == "f" else info.min if lo is None else lo
        hi = np.inf if hi is None and dt.kind == "f" else info.max if hi is None else hi
        return dt.type(np.asarray(lo).reshape(-1)[0]), dt.type(np.asarray(hi).reshape(-1)[0])
    # ONNX float attributes are float32: defaults too (as onnx.reference and onnxruntime read them)
    if spec.op == "LeakyRelu":
        return dt.type(np.float32(spec.attr("alpha", 0.01))), dt.type(0)
    if spec.op == "HardSigmoid":
        return dt.type(np.float32(spec.attr("alpha", 0.2))), dt.type(np.float32(spec.attr("beta", 0.5)))
    if spec.op == "HardSwish":  # x HardSigmoid(x): ONNX's alpha 1/6, beta 0.5; a fused HardSigmoid x x's own
        return dt.type(np.float32(spec.attr("alpha", 1 / 6))), dt.type(np.float32(spec.attr("beta", 0.5)))
    return dt.type(0), dt.type(0)


def collapse(out: tuple[int, ...], ins: list[tuple[int, ...]]) -> tuple[list[int], list[list[int]]]:
    """(dims, element strides per input) with size-1 dims dropped and adjacent dims merged wherever every
    input is contiguous across them (a stride 0 stays 0)."""
    rank = len(out)
    strides = []
    for shape in ins:
        padded = (1,) * (rank - len(shape)) + tuple(shape)
        st, acc = [0] * rank, 1
        for d in range(rank - 1, -1, -1):
            st[d] = 0 if padded[d] == 1 else acc
            acc *= padded[d]
        strides.append(st)
    keep = [d for d in range(rank) if out[d] != 1]
    dims = [out[d] for d in keep]
    strides = [[st[d] for d in keep] for st in strides]
    d = len(dims) - 1
    while d > 0:
        if all(st[d - 1] == st[d] * dims[d] for st in strides):
            dims[d - 1:d + 1] = [dims[d - 1] * dims[d]]
            for st in strides:
                st[d - 1:d + 1] = [st[d]]
        d -= 1
    return dims, strides


def _kind(dtype: Any) -> str:
    return "f" if np.dtype(dtype) in HALF_TYPES else np.dtype(dtype).kind


class Elementwise(ClKernel):
    source = SOURCE
    half_inputs = range(3)  # any half input is read as float
    space = Space(
        params={"VW": (1, 2, 4, 8), "WGS": (32, 64, 128, 256)},
        # PoCL vectorises a work-group's work-items (not a loop inside one: VW 4 made Sigmoid 5x slower):
        # large groups of one element each, as GPUs want too (coalesced loads, many waves in flight).
        defaults={"cpu": {"VW": 1, "WGS": 256}, "gpu": {"VW": 1, "WGS": 256}, "default": {"VW": 1, "WGS": 64}},
        work_group=lambda p: (p["WGS"],))

    def __init__(self, spec: NodeSpec, backend: Any, params: Any = None) -> None:
        super().__init__(spec, backend, params)
        entry = _entry(spec)
        kinds = TABLE.get(entry)
        ins = spec.inputs
        if kinds is None or len(ins) != len(kinds) or any(t is None for t in ins):
            raise UnsupportedOpError(f"{spec.op} node {spec.name!r}: no OpenCL element-wise kernel for "
                                     f"{len(ins)} inputs")
        for k, (t, allowed) in enumerate(zip(ins, kinds, strict=True)):
            if _kind(t.dtype) not in allowed:
                raise UnsupportedOpError(f"{spec.op} node {spec.name!r}: input {k} dtype {np.dtype(t.dtype)} "
                                         "has no OpenCL kernel")
        out = spec.outputs[0]
        self.n = math.prod(out.shape)
        if self.n >= 1 << 31:
            raise UnsupportedOpError(f"{spec.op} node {spec.name!r}: {self.n} elements exceed 32-bit indices")
        dims, strides = collapse(out.shape, [t.shape for t in ins])
        if len(dims) > MAX_RANK:
            raise UnsupportedOpError(f"{spec.op} node {spec.name!r}: rank {len(dims)} after collapsing")
        contiguous = collapse(out.shape, [out.shape])[1][0]
        self.modes = [0 if st == contiguous else 1 if not any(st) else 2 for st in strides]
        self.dims, self.strides = dims, strides
        self.entry = entry
        dts = [np.dtype(t.dtype) for t in [*ins, out]]
        if any(d in HALF_TYPES for d in dts) and np.dtype(np.float64) in dts:
            raise UnsupportedOpError(f"{spec.op} node {spec.name!r}: float64 with half precision (rounded twice "
                                     "through float)")
        self.halves = [HALF_TYPES.get(d, 0) for d in dts]  # H0.. and HO: 1 float16, 2 bfloat16
        self.types = [self._type(d) for d in dts[:-1]]
        self.out_type = self._type(dts[-1])
        self.p = _params(spec, np.dtype(np.float32) if self.halves[-1] else dts[-1])

    def _type(self, dt: np.dtype) -> str:
        """The OpenCL type a tensor is computed in: float for half precision."""
        return "float" if dt in HALF_TYPES else self.cl_type(dt)

    def defines(self) -> dict[str, Any]:
        d: dict[str, Any] = {"OP": f"OP_{self.entry}", "NIN": len(self.types), "TO": self.out_type,
                             "RANK": max(1, len(self.dims)), **self.params}
        for k, (t, m) in enumerate(zip(self.types, self.modes, strict=True)):
            d[f"T{k}"], d[f"M{k}"] = t, m
        for k, h in enumerate(self.halves):
            if h:
                d["HO" if k == len(self.types) else f"H{k}"] = h
        if "double" in (*self.types, self.out_type):
            d["FP64"] = 1
        elif self.entry in ("Erf", "Gelu"):
            d["FAST_ERF"] = 1
        return d

    def bind(self, ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        if self.n == 0:
            return lambda: None
        cltypes = self.backend.cl.cltypes
        vec = [0] * MAX_RANK
        for d, size in enumerate(reversed(self.dims)):
            vec[d] = size
        strides = []
        for k in range(3):
            st = [0] * MAX_RANK
            if k < len(self.strides):
                for d, s in enumerate(reversed(self.strides[k])):
                    st[d] = s
            strides.append(cltypes.make_int8(*st))
        args: list[Any] = []
        for k in range(3):
            t = ins[k] if k < len(ins) else ins[0]  # unused inputs: any valid buffer
            args += [t.mem, np.uint64(t.offset)]
        y = outs[0]
        args += [y.mem, np.uint64(y.offset), np.uint32(self.n), *self.p, cltypes.make_int8(*vec), *strides]
        vw, wgs = self.params["VW"], self.params["WGS"]
        return self.launch(self.kernel("elementwise", *args), (-(-self.n // vw),), (wgs,))


def _factory(spec: NodeSpec, backend: Any) -> Elementwise:
    return Elementwise(spec, backend)


def _two_inputs(spec: NodeSpec, backend: Any) -> Elementwise:
    """Sum / Max / Min of exactly two inputs (more fall back)."""
    if len(spec.inputs) != 2:
        raise UnsupportedOpError(f"{spec.op} node {spec.name!r}: the OpenCL kernel takes two inputs")
    return Elementwise(spec, backend)


KERNELS: dict[str, Callable[..., Elementwise]] = {
    **{op: _factory for op in TABLE if op not in ("GeluTanh", "CastBool")},
    "Gelu": _factory, "Cast": _factory, "Sum": _two_inputs, "Max": _two_inputs, "Min": _two_inputs,
}
