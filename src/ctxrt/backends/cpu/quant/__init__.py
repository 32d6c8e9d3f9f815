"""Quantized operators on the CPU: NumPy reference kernels (docs/quantization.md).

`linear.py` QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear; `gemm.py` the integer matrix products
(MatMulInteger, QLinearMatMul, QGemm, MatMulIntegerToFloat, DynamicQuantizeMatMul); `conv.py` ConvInteger and
QLinearConv; `elementwise.py` QLinearAdd, QLinearMul, the lookup-table activations, QLinearConcat, QLinearSoftmax;
`pool.py` the quantized average pools; `nbits.py` MatMulNBits; `lstm.py` DynamicQuantizeLSTM (8-bit W and R).
"""

from __future__ import annotations

from ctxrt.backends.cpu.quant import conv, elementwise, gemm, linear, lstm, nbits, pool
from ctxrt.backends.kernel import KernelFactory

KERNELS: dict[str, KernelFactory] = {}
for _module in (linear, gemm, conv, elementwise, pool, nbits, lstm):
    _dup = KERNELS.keys() & _module.KERNELS.keys()
    assert not _dup, f"ops registered twice: {_dup}"
    KERNELS.update(_module.KERNELS)
