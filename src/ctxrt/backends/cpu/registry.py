"""The NumPy backend's kernel table: op type -> factory, merged from the kernel modules."""

from __future__ import annotations

from ctxrt.backends.cpu import control, dynamic, elementwise, logic, nn, norm, reduce, shape
from ctxrt.backends.kernel import KernelFactory

KERNELS: dict[str, KernelFactory] = {}
for _module in (elementwise, logic, reduce, shape, norm, nn, control, dynamic):
    _dup = KERNELS.keys() & _module.KERNELS.keys()
    assert not _dup, f"ops registered twice: {_dup}"
    KERNELS.update(_module.KERNELS)
