"""Element-wise kernels (unary, binary with NumPy broadcasting, comparisons, logic, casts)."""

from __future__ import annotations

import numpy as np

from ctxrt.backends.kernel import FnKernel, Kernel, NodeSpec


def _relu(ins: list[np.ndarray], outs: list[np.ndarray], _s: list[np.ndarray]) -> None:
    np.maximum(ins[0], 0, out=outs[0])


def relu(spec: NodeSpec) -> Kernel:
    return FnKernel(_relu)


KERNELS = {
    "Relu": relu,
}
