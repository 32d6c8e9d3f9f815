"""The NumPy backend's kernel table: op type -> factory, merged from the family modules.

The fallback modules fill in ops that no family module provides.
"""

from __future__ import annotations

from ctxrt.backends.cpu import conv, elementwise, matmul, norm, pool, reduce, shape
from ctxrt.backends.cpu.fallback import FALLBACK
from ctxrt.backends.cpu.fallback_nn import FALLBACK_NN
from ctxrt.backends.kernel import KernelFactory

KERNELS: dict[str, KernelFactory] = {}
for _family in (elementwise, reduce, shape, conv, pool, norm, matmul):
    _dup = KERNELS.keys() & _family.KERNELS.keys()
    assert not _dup, f"ops registered twice: {_dup}"
    KERNELS.update(_family.KERNELS)
for _op, _factory in {**FALLBACK, **FALLBACK_NN}.items():
    KERNELS.setdefault(_op, _factory)
