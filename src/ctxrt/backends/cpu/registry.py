"""The NumPy backend's kernel table: op type -> factory, merged from the kernel modules.

A node the layout pass gave to oneDNN (attribute `kernel="onednn"`) is built by oneDNN's factory for its op;
every other node by NumPy's.
"""

from __future__ import annotations

from ctxrt.backends.cpu import (
    control,
    dynamic,
    einsum,
    elementwise,
    genai,
    layout_ops,
    nn,
    norm,
    onednn,
    quant,
    reduce,
    scatter,
    shape,
    spectral,
    widen,
)
from ctxrt.backends.cpu.conv import convtranspose
from ctxrt.backends.cpu.image import grid_sample, resize, spatial, unpool
from ctxrt.backends.cpu.pointwise import activations, clamp, logic, select
from ctxrt.backends.cpu.rnn import rnn_cells
from ctxrt.backends.kernel import Kernel, KernelFactory, NodeSpec
from ctxrt.errors import UnsupportedOpError

KERNELS: dict[str, KernelFactory] = {}
for _module in (elementwise, clamp, activations, logic, reduce, shape, norm, nn, spatial, convtranspose, resize,
                rnn_cells, select, scatter, einsum, control, dynamic, layout_ops, quant, genai, unpool,
                grid_sample, spectral):
    _dup = KERNELS.keys() & _module.KERNELS.keys()
    assert not _dup, f"ops registered twice: {_dup}"
    KERNELS.update(_module.KERNELS)


def _routed(numpy: KernelFactory, provided: KernelFactory) -> KernelFactory:
    def factory(spec: NodeSpec) -> Kernel:
        return provided(spec) if spec.attr("kernel") == onednn.NAME else numpy(spec)
    return factory


def _preferred(numpy: KernelFactory, provided: KernelFactory) -> KernelFactory:
    def factory(spec: NodeSpec) -> Kernel:
        if spec.attr("kernel") not in (None, onednn.NAME) or not onednn.api.available():
            return numpy(spec)
        try:
            return provided(spec)
        except UnsupportedOpError:
            return numpy(spec)
    return factory


for _op, _factory in onednn.KERNELS.items():
    KERNELS[_op] = _routed(KERNELS[_op], _factory)
for _op, _factory in onednn.ELTWISE.items():
    KERNELS[_op] = _preferred(KERNELS[_op], _factory)
KERNELS["Reorder"] = onednn.reorder  # only the layout pass makes Reorders, for oneDNN's layouts
for _op, _factory in KERNELS.items():  # half-precision weights widened when built (ir/passes/half.py)
    KERNELS[_op] = widen.widening(_factory)
