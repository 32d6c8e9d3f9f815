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
    reduce,
    shape_ops,
    window,
)
from ctxrt.backends.opencl.quant import conv as quant_conv
from ctxrt.backends.opencl.quant import gemm as quant_gemm
from ctxrt.backends.opencl.quant import ops as quant_ops

KERNELS: dict[str, Callable[..., Kernel]] = {}
for _module in (elementwise, gemm, conv, window, pool, norm, reduce, norm_layer, shape_ops, concat, gather, quant_conv,
                quant_gemm, quant_ops):
    _dup = KERNELS.keys() & _module.KERNELS.keys()
    assert not _dup, f"ops registered twice: {_dup}"
    KERNELS.update(_module.KERNELS)
