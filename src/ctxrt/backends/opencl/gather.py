"""Gather (any axis) and GatherND (any batch_dims) on OpenCL (kernels/gather.cl), with indices of any integer
type; negative indices count from the end, out-of-range ones wrap (never a read outside the data; the CPU backend
refuses them, an InvalidInputError, reading the indices it holds on the host: here they are on the device; indices
fed from the host are checked before the run, runtime/graph.py `check_indices`)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ctxrt.backends.cpu.shape import _axis
from ctxrt.backends.kernel import Launch, NodeSpec
from ctxrt.backends.opencl.kernel import ClKernel
from ctxrt.backends.opencl.shape_ops import LIMIT, MAX_RANK, MOVE_SPACE, UINT, _fail, _int8, local_3d


class Gather(ClKernel):
    """Gather: data (pre, n, post) at `count` indices -> (pre, count, post); GatherND: rows of data (rows, inner)
    picked by index tuples."""

    source = "gather.cl"
    space = MOVE_SPACE

    def __init__(self, spec: NodeSpec, backend: Any, params: Any = None) -> None:
        super().__init__(spec, backend, params)
        data, idx = spec.inputs[0], spec.inputs[1]
        if np.dtype(idx.dtype).kind not in "iu":
            raise _fail(spec, f"indices of dtype {np.dtype(idx.dtype)}")
        self.ti = self.cl_type(idx.dtype)
        self.itemsize = np.dtype(data.dtype).itemsize
        if self.itemsize not in UINT:
            raise _fail(spec, f"elements of {self.itemsize} bytes")
        if max(math.prod(t.shape) for t in (data, idx, spec.outputs[0])) >= LIMIT:
            raise _fail(spec, "tensors past 2^31 elements")
        self.nd = spec.op == "GatherND"
        (self._nd if self.nd else self._gather)(spec)

    def _gather(self, spec: NodeSpec) -> None:
        shape = spec.inputs[0].shape
        axis = _axis(spec, int(spec.attr("axis", 0)), len(shape))
        self.n, self.count = shape[axis], math.prod(spec.inputs[1].shape)
        self.pre, self.post = math.prod(shape[:axis]), math.prod(shape[axis + 1:])
        if self.n == 0 and self.count:
            raise _fail(spec, "indices into an empty axis")

    def _nd(self, spec: NodeSpec) -> None:
        dshape, ishape = spec.inputs[0].shape, spec.inputs[1].shape
        b = int(spec.attr("batch_dims", 0))
        k = ishape[-1]
        if not 0 <= b < len(ishape) or b + k > len(dshape) or k > MAX_RANK or k < 1:
            raise _fail(spec, f"batch_dims {b} with indices of shape {list(ishape)} into {list(dshape)}")
        self.k, self.inner = k, math.prod(dshape[b + k:])
        self.tuples = math.prod(ishape[:-1])
        self.per_batch = math.prod(ishape[b:-1])
        self.batch_rows = math.prod(dshape[b:b + k])
        self.rdims = list(dshape[b:b + k])
        self.rstr = [math.prod(dshape[b + j + 1:b + k]) for j in range(k)]
        if 0 in self.rdims and self.tuples:
            raise _fail(spec, "indices into an empty axis")

    def defines(self) -> dict[str, Any]:
        d = {"T": UINT[self.itemsize], "TI": self.ti}
        return {**d, "KN": self.k} if self.nd else d

    def bind(self, ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        x, idx, y = ins[0], ins[1], outs[0]
        cl, wgs = self.backend.cl, self.params["WGS"]
        tensors = [x.mem, np.uint64(x.offset), idx.mem, np.uint64(idx.offset), y.mem, np.uint64(y.offset)]
        if self.nd:
            if self.tuples * self.inner == 0:
                return lambda: None
            args = [*tensors, np.int32(self.inner), np.int32(self.tuples), np.int32(max(self.per_batch, 1)),
                    np.int32(self.batch_rows), _int8(cl, self.rdims, 1), _int8(cl, self.rstr, 0)]
            return self.launch(self.kernel("gather_nd", *args), (self.inner, self.tuples, 1),
                               local_3d(self.inner, self.tuples, wgs))
        if self.pre * self.count * self.post == 0:
            return lambda: None
        args = [*tensors, np.int32(self.n), np.int32(self.count), np.int32(self.post), np.int32(self.pre)]
        return self.launch(self.kernel("gather", *args), (self.post, self.count, self.pre),
                           local_3d(self.post, self.count, wgs))


def _factory(spec: NodeSpec, backend: Any) -> Gather:
    return Gather(spec, backend)


KERNELS = {"Gather": _factory, "GatherND": _factory}
