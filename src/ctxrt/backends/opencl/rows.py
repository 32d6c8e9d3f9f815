"""What the row kernels of kernels/rows.cl share (Softmax, LogSoftmax, LayerNormalization, ReduceX, ArgMax,
ArgMin): the geometry of rows, the tunable space and the launch.

A node's input is seen as rows: the kept dims enumerate the rows (in row-major order, which is a reduction's
output order) and the reduced dims the elements of one row. Adjacent dims of the same kind are merged and dims
of size 1 dropped, so any set of axes becomes at most four groups of each kind (rank 8); a row is contiguous
(vector loads) when its one reduced group is innermost.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from ctxrt.backends.kernel import Launch, NodeSpec
from ctxrt.backends.opencl.kernel import ClKernel, Space
from ctxrt.errors import UnsupportedOpError

MAX_GROUPS = 4  # dims of an int4 kernel argument
LIMIT = 1 << 31  # int element offsets


@dataclass(frozen=True)
class Rows:
    """rows x n elements: kept and reduced dims with their element strides, innermost first."""

    kdims: tuple[int, ...]
    kstr: tuple[int, ...]
    rdims: tuple[int, ...]
    rstr: tuple[int, ...]

    @property
    def rows(self) -> int:
        return math.prod(self.kdims)

    @property
    def n(self) -> int:
        return math.prod(self.rdims)

    @property
    def contig(self) -> bool:
        return len(self.rdims) == 1 and self.rstr[0] == 1


def rows_of(shape: tuple[int, ...], reduced: Iterable[int]) -> Rows:
    """The rows of a contiguous tensor of `shape` folded along the `reduced` axes."""
    reduced = set(reduced)
    groups: list[list[Any]] = []  # [kind, size, stride], outermost first
    stride = 1
    for d in range(len(shape) - 1, -1, -1):
        if shape[d] != 1:
            kind = d in reduced
            if groups and groups[0][0] == kind:  # contiguous across: one dim
                groups[0][1] *= shape[d]
            else:
                groups.insert(0, [kind, shape[d], stride])
        stride *= shape[d]
    kept = [(s, st) for kind, s, st in reversed(groups) if not kind] or [(1, 0)]
    red = [(s, st) for kind, s, st in reversed(groups) if kind] or [(1, 1)]
    return Rows(*(tuple(v) for v in zip(*kept, strict=True)), *(tuple(v) for v in zip(*red, strict=True)))


def _int4(cl: Any, values: tuple[int, ...]) -> Any:
    return cl.cltypes.make_int4(*values, *[0] * (MAX_GROUPS - len(values)))


# ALG 0: a work-item per row (WGS rows per group), VW-wide vector loads along contiguous rows; ALG 1: a
# work-group of WGS per row, combined in local memory.
# PoCL: a work-item per row with 16-wide vectors (attention's 1536 softmax rows of 128: 0.10 ms vs 1.0 ms for a
# work-group per row, 0.26 ms with 8-wide vectors; LayerNorm 128 x 384: 0.014 vs 0.076 ms); strided rows (softmax
# along a middle axis) one element per step, neighbouring work-items reading neighbouring columns (within 20% of
# the best). GPUs: a work-group per row, coalesced; strided rows a work-item per column (coalesced across
# work-items).
SPACE = Space(
    params={"ALG": (0, 1), "VW": (1, 2, 4, 8, 16), "WGS": (8, 16, 32, 64, 128, 256)},
    defaults={"cpu": {"ALG": 0, "VW": 16, "WGS": 16}, "cpu:strided": {"ALG": 0, "VW": 1, "WGS": 64},
              "gpu": {"ALG": 1, "VW": 1, "WGS": 128}, "gpu:strided": {"ALG": 0, "VW": 1, "WGS": 64},
              "default": {"ALG": 1, "VW": 1, "WGS": 64}},
    constraints=(lambda p, s: p["VW"] == 1 or (p["ALG"] == 0 and s["contig"] == 1),),
    work_group=lambda p: (p["WGS"],),
    local_memory=lambda p, s: p["ALG"] * p["WGS"] * s["itemsize"])


class RowKernel(ClKernel):
    """A rows.cl kernel: subclasses set the geometry (`set_rows`) before `super().__init__`, then the type."""

    source = "rows.cl"
    space = SPACE
    entry: ClassVar[str]  # the kernel's name in rows.cl

    def set_rows(self, spec: NodeSpec, shape: tuple[int, ...], reduced: Iterable[int], dtype: np.dtype) -> None:
        self.geom = rows_of(tuple(shape), reduced)
        self.dtype = np.dtype(dtype)
        if max(len(self.geom.kdims), len(self.geom.rdims)) > MAX_GROUPS:
            raise UnsupportedOpError(f"{spec.op} node {spec.name!r}: more than {MAX_GROUPS} groups of kept or "
                                     f"reduced axes in shape {list(shape)}")
        if math.prod(shape) >= LIMIT:
            raise UnsupportedOpError(f"{spec.op} node {spec.name!r}: tensors past 2^31 elements")

    def __init__(self, spec: NodeSpec, backend: Any, params: Any = None) -> None:
        super().__init__(spec, backend, params)
        self.T = self.cl_type(self.dtype)  # declines types the device cannot compute in

    def problem(self) -> dict[str, int]:
        g = self.geom
        return {"rows": g.rows, "n": g.n, "contig": int(g.contig), "itemsize": self.dtype.itemsize}

    def variant(self) -> str:
        return "" if self.geom.contig else "strided"

    def defines(self) -> dict[str, Any]:
        g = self.geom
        d = {"T": self.T, "FLOAT": int(self.dtype.kind == "f"), "KRANK": len(g.kdims), "RRANK": len(g.rdims),
             "CONTIG": int(g.contig), **self.params}
        if self.T == "double":
            d["FP64"] = 1
        return d

    def launch_rows(self, *args: Any) -> Launch:
        """The launch of `entry` over every row, `args` following the geometry's arguments."""
        g = self.geom
        if g.rows == 0:
            return lambda: None
        cl = self.backend.cl
        geometry = [np.int32(g.rows), np.int32(g.n), _int4(cl, g.kdims), _int4(cl, g.kstr), _int4(cl, g.rdims),
                    _int4(cl, g.rstr)]
        wgs = self.params["WGS"]
        per_group = self.params.get("ALG", 0) == 1
        return self.launch(self.kernel(self.entry, *geometry, *args), (g.rows * wgs if per_group else g.rows,),
                           (wgs,))

    @staticmethod
    def tensor(t: Any) -> list[Any]:
        """A ClTensor as its two kernel arguments."""
        return [t.mem, np.uint64(t.offset)]
