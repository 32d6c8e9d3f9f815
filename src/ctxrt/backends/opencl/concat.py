"""Concat and Split along any axis on OpenCL (kernels/concat.cl): one launch per group of up to 8 tensors."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ctxrt.backends.cpu.shape import _axis, _split_sizes
from ctxrt.backends.kernel import Launch, NodeSpec
from ctxrt.backends.opencl.kernel import ClKernel
from ctxrt.backends.opencl.shape_ops import LIMIT, MOVE_SPACE, UINT, _fail, _int8, local_3d

GROUP = 8  # tensors per launch: the kernel's (buffer, offset) argument pairs


class Concat(ClKernel):
    """Concat (inputs into output 0) or Split (input 0 into the outputs): the concatenated tensor as (outer,
    total) columns, tensor k's columns `widths[k]` wide starting at `starts[k]`."""

    source = "concat.cl"
    space = MOVE_SPACE

    def __init__(self, spec: NodeSpec, backend: Any, params: Any = None) -> None:
        super().__init__(spec, backend, params)
        self.split = spec.op == "Split"
        whole = spec.inputs[0] if self.split else spec.outputs[0]
        parts = spec.outputs if self.split else spec.inputs
        if any(t is None for t in parts):
            raise _fail(spec, "a missing input")
        rank = len(whole.shape)
        axis = _axis(spec, int(spec.attr("axis", 0)), rank)
        if self.split:
            sizes = _split_sizes(spec, whole.shape[axis])
            if [o.shape[axis] for o in parts] != sizes:
                raise _fail(spec, f"outputs of sizes {[o.shape[axis] for o in parts]} for split {sizes}")
        inner = math.prod(whole.shape[axis + 1:])
        self.outer = math.prod(whole.shape[:axis])
        self.widths = [t.shape[axis] * inner for t in parts]
        self.starts = [sum(self.widths[:k]) for k in range(len(parts))]
        self.total = sum(self.widths)
        self.itemsize = np.dtype(whole.dtype).itemsize
        if self.itemsize not in UINT:
            raise _fail(spec, f"elements of {self.itemsize} bytes")
        if math.prod(whole.shape) >= LIMIT:
            raise _fail(spec, "tensors past 2^31 elements")

    def defines(self) -> dict[str, Any]:
        return {"T": UINT[self.itemsize], "NIN": min(GROUP, len(self.widths))}

    def bind(self, ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        whole, parts = (ins[0], outs) if self.split else (outs[0], ins)
        cl, wgs = self.backend.cl, self.params["WGS"]
        name = "split" if self.split else "concat"
        launches = []
        for g in range(0, len(parts), GROUP):
            group = list(range(g, min(g + GROUP, len(parts))))
            col0 = self.starts[g]
            cols = sum(self.widths[k] for k in group)
            if cols * self.outer == 0:
                continue
            tensors = []
            for k in group + [group[0]] * (GROUP - len(group)):  # unused slots: any valid buffer
                tensors += [parts[k].mem, np.uint64(parts[k].offset)]
            args = [np.int32(self.outer), np.int32(cols), np.int32(self.total), np.int32(col0),
                    _int8(cl, [self.starts[k] - col0 for k in group], cols),
                    _int8(cl, [self.widths[k] for k in group], 0), whole.mem, np.uint64(whole.offset), *tensors]
            launches.append(self.launch(self.kernel(name, *args), (cols, self.outer, 1),
                                        local_3d(cols, self.outer, wgs)))
        if not launches:
            return lambda: None
        if len(launches) == 1:
            return launches[0]

        def run() -> Any:
            for launch in launches:
                event = launch()
            return event  # the last group's (what a tuner times: groups are alike)
        return run


def _factory(spec: NodeSpec, backend: Any) -> Concat:
    return Concat(spec, backend)


KERNELS = {"Concat": _factory, "Split": _factory}
