"""The NumPy backend's kernel table: op type -> factory, merged from the kernel modules."""

from __future__ import annotations

from ctxrt.backends.cpu import (
    activations,
    control,
    convtranspose,
    dynamic,
    einsum,
    elementwise,
    logic,
    nn,
    norm,
    reduce,
    resize,
    rnn_cells,
    scatter,
    select,
    shape,
    spatial,
)
from ctxrt.backends.kernel import KernelFactory

KERNELS: dict[str, KernelFactory] = {}
for _module in (elementwise, activations, logic, reduce, shape, norm, nn, spatial, convtranspose, resize, rnn_cells,
                select, scatter, einsum, control, dynamic):
    _dup = KERNELS.keys() & _module.KERNELS.keys()
    assert not _dup, f"ops registered twice: {_dup}"
    KERNELS.update(_module.KERNELS)
