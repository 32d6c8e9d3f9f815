"""LayerNormalization (opset 17) for the NumPy backend."""

from __future__ import annotations

from typing import Any

import numpy as np

from ctxrt.backends.kernel import Kernel, Launch, NodeSpec, scratch_view
from ctxrt.errors import UnsupportedOpError


class LayerNorm(Kernel):
    """Rows of the trailing axes normalized. Row means are GEMVs against a column of 1/n (one BLAS call
    instead of NumPy's slower reduction wrapper); 1/std is computed on the small [rows, 1] statistics
    and applied with one multiply. May run in place (y is x)."""

    def __init__(self, spec: NodeSpec) -> None:
        shape = spec.inputs[0].shape
        axis = int(spec.attr("axis", -1)) % len(shape)
        if len(spec.outputs) > 1:
            raise UnsupportedOpError(f"LayerNormalization {spec.name!r}: Mean/InvStdDev outputs are not supported")
        self.dt = np.dtype(spec.outputs[0].dtype)
        self.n = int(np.prod(shape[axis:], dtype=np.int64))
        self.rows = int(np.prod(shape[:axis], dtype=np.int64))
        self.eps = self.dt.type(spec.attr("epsilon", 1e-5))
        self.col = np.full((self.n, 1), 1 / self.n, self.dt)
        item = self.dt.itemsize
        self.scratch = (self.rows * item, self.rows * item, self.rows * self.n * item)

    def bind(self, ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        rows, n, dt, eps, col = self.rows, self.n, self.dt, self.eps, self.col
        x, y = ins[0].reshape(rows, n), outs[0].reshape(rows, n)
        gamma = ins[1].reshape(n)
        beta = ins[2].reshape(n) if len(ins) > 2 and ins[2] is not None else None
        mu, inv = scratch_view(scratch[0], (rows, 1), dt), scratch_view(scratch[1], (rows, 1), dt)
        sq = scratch_view(scratch[2], (rows, n), dt)

        def run() -> None:
            np.matmul(x, col, out=mu)
            np.subtract(x, mu, out=y)
            np.multiply(y, y, out=sq)
            np.matmul(sq, col, out=inv)
            np.add(inv, eps, out=inv)
            np.sqrt(inv, out=inv)
            np.reciprocal(inv, out=inv)
            np.multiply(y, inv, out=y)
            np.multiply(y, gamma, out=y)
            if beta is not None:
                np.add(y, beta, out=y)
        return run


KERNELS = {"LayerNormalization": LayerNorm}
