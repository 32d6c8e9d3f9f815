"""GlobalAveragePool and GlobalMaxPool on OpenCL (kernels/global_pool.cl), any spatial rank: one row of H * W
values per image and channel, reduced to one."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ctxrt.backends.kernel import Launch, NodeSpec
from ctxrt.backends.opencl.kernel import ClKernel, Space
from ctxrt.backends.opencl.spatial import LIMIT, decline


class GlobalPool(ClKernel):
    source = "global_pool.cl"
    space = Space(
        params={"VW": (1, 2, 4, 8, 16), "R": (1, 2, 4, 8, 16, 32, 64, 128, 256), "RPG": (1, 2, 4, 8, 16, 32, 64)},
        # PoCL: a row per work-item, read in vectors of 8. GPUs: 64 work-items per row, 4 rows per work-group.
        defaults={"cpu": {"VW": 8, "R": 1, "RPG": 16}, "gpu": {"VW": 1, "R": 64, "RPG": 4},
                  "default": {"VW": 1, "R": 16, "RPG": 4}},
        work_group=lambda p: (p["R"], p["RPG"]),
        local_memory=lambda p, s: (p["R"] > 1) * p["R"] * p["RPG"] * s.get("itemsize", 4))

    def __init__(self, spec: NodeSpec, backend: Any, params: Any = None) -> None:
        shape = spec.inputs[0].shape
        if len(shape) < 3:
            raise decline(spec, f"input of rank {len(shape)}")
        if math.prod(shape) >= LIMIT:
            raise decline(spec, "tensors past 2^31 elements")
        self.rows, self.length = shape[0] * shape[1], math.prod(shape[2:])
        super().__init__(spec, backend, params)
        dt = np.dtype(spec.inputs[0].dtype)
        if dt.kind != "f" or np.dtype(spec.outputs[0].dtype) != dt:
            raise decline(spec, f"dtype {dt}")
        self.T = self.cl_type(dt)

    def problem(self) -> dict[str, int]:
        return {"rows": self.rows, "L": self.length, "itemsize": np.dtype(self.spec.inputs[0].dtype).itemsize}

    def defines(self) -> dict[str, Any]:
        d = {"T": self.T, "MAX": int(self.spec.op == "GlobalMaxPool"), **self.params}
        if self.T == "double":
            d["FP64"] = 1
        return d

    def bind(self, ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        if self.rows == 0:
            return lambda: None
        p, x, y = self.params, ins[0], outs[0]
        args = [np.int32(self.rows), np.int32(self.length), x.mem, np.uint64(x.offset), y.mem, np.uint64(y.offset)]
        return self.launch(self.kernel("global_pool", *args), (p["R"], self.rows), (p["R"], p["RPG"]))


def _global_pool(spec: NodeSpec, backend: Any) -> GlobalPool:
    return GlobalPool(spec, backend)


KERNELS = {"GlobalAveragePool": _global_pool, "GlobalMaxPool": _global_pool}
