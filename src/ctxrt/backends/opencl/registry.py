"""The OpenCL backend's kernel table: op type -> factory(spec, backend), merged from the kernel modules.

An op missing here (or whose factory declines a node with UnsupportedOpError) runs on the cpu backend."""

from __future__ import annotations

from collections.abc import Callable

from ctxrt.backends.kernel import Kernel
from ctxrt.backends.opencl import (
    concat,
    conv,
    elementwise,
    gather,
    gemm,
    norm,
    norm_layer,
    pool,
    quant_conv,
    quant_gemm,
    quant_ops,
    reduce,
    shape_ops,
    window,
)

KERNELS: dict[str, Callable[..., Kernel]] = {}
for _module in (elementwise, gemm, conv, window, pool, norm, reduce, norm_layer, shape_ops, concat, gather, quant_conv,
                quant_gemm, quant_ops):
    _dup = KERNELS.keys() & _module.KERNELS.keys()
    assert not _dup, f"ops registered twice: {_dup}"
    KERNELS.update(_module.KERNELS)
