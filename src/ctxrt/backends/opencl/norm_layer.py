"""LayerNormalization on OpenCL: a row kernel of kernels/rows.cl (rows.py) with its optional Mean and InvStdDev
outputs (one value per row, written by the same launch)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ctxrt.backends.kernel import Launch, NodeSpec
from ctxrt.backends.opencl.rows import RowKernel
from ctxrt.errors import UnsupportedOpError
from ctxrt.ir.canonical import output_slots

_STASH_FLOAT, _STASH_DOUBLE = 1, 11  # ONNX element types allowed as stash_type


class LayerNorm(RowKernel):
    """Rows of the trailing dims from `axis`: mean, mean squared deviation (two passes, as the reference),
    (x - mean) / sqrt(var + eps) * Scale + B, computed in the input's type. Declines what the NumPy backend does
    differently: statistics wider than the input (float32 with stash_type double), and Scale or B that are not
    the normalized shape (the NumPy backend broadcasts those over the whole input). Correct in place."""

    entry = "layernorm"

    def __init__(self, spec: NodeSpec, backend: Any, params: Any = None) -> None:
        shape = spec.inputs[0].shape
        rank = len(shape)
        axis = int(spec.attr("axis", -1))
        if not -rank <= axis < rank:
            raise self._fail(spec, f"attribute 'axis' value {axis} (rank {rank})")
        axis %= rank
        dt = np.dtype(spec.inputs[0].dtype)
        self.set_rows(spec, shape, range(axis, rank), dt)
        super().__init__(spec, backend, params)
        stash = int(spec.attr("stash_type", _STASH_FLOAT))
        if dt.kind != "f" or stash not in (_STASH_FLOAT, _STASH_DOUBLE) or (stash == _STASH_DOUBLE
                                                                            and dt != np.float64):
            raise self._fail(spec, f"dtype {dt} with stash_type {stash}")
        n = self.geom.n
        for k, t in enumerate(spec.inputs[1:3], 1):
            if t is not None and (math.prod(t.shape) != n or len(t.shape) > rank - axis):
                raise self._fail(spec, f"input {k} of shape {list(t.shape)} (not the normalized shape)")
        if len(spec.inputs) < 2 or spec.inputs[1] is None:
            raise self._fail(spec, "a missing Scale")
        self.has_b = len(spec.inputs) > 2 and spec.inputs[2] is not None
        self.slots = output_slots(spec.attrs, len(spec.outputs), 3)
        stats = {np.dtype(spec.outputs[s].dtype) for s in self.slots[1:] if s is not None}
        if any(s.kind != "f" for s in stats):
            raise self._fail(spec, f"statistics of dtype {sorted(map(str, stats))}")
        self.ts = self.cl_type(next(iter(stats))) if stats else None
        self.eps = dt.type(float(spec.attr("epsilon", 1e-5)))

    @staticmethod
    def _fail(spec: NodeSpec, what: str) -> UnsupportedOpError:
        return UnsupportedOpError(f"{spec.op} node {spec.name!r}: no OpenCL kernel for {what}")

    def defines(self) -> dict[str, Any]:
        d = {**super().defines(), "HAS_B": int(self.has_b), "HAS_MEAN": int(self.slots[1] is not None),
             "HAS_INV": int(self.slots[2] is not None)}
        if self.ts is not None:
            d["TS"] = self.ts
        return d

    def bind(self, ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        x, g, y = ins[0], ins[1], outs[0]
        b = ins[2] if self.has_b else g
        mean, inv = (y if s is None else outs[s] for s in self.slots[1:])
        return self.launch_rows(*self.tensor(x), *self.tensor(g), *self.tensor(b), *self.tensor(y),
                                *self.tensor(mean), *self.tensor(inv), self.eps)


def _factory(spec: NodeSpec, backend: Any) -> LayerNorm:
    return LayerNorm(spec, backend)


KERNELS = {"LayerNormalization": _factory}
