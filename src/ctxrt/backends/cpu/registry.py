"""The NumPy backend's kernel table: op type -> factory, merged from the family modules."""

from __future__ import annotations

from ctxrt.backends.cpu import conv, elementwise, matmul, norm, pool, reduce, shape
from ctxrt.backends.kernel import KernelFactory

KERNELS: dict[str, KernelFactory] = {}
for _family in (elementwise, reduce, shape, conv, pool, norm, matmul):
    _dup = KERNELS.keys() & _family.KERNELS.keys()
    assert not _dup, f"ops registered twice: {_dup}"
    KERNELS.update(_family.KERNELS)
