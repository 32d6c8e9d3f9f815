"""The OpenCL kernels of quantized models (docs/opencl.md, docs/quantization.md): integer convolutions (conv.py,
qconv.cl), integer GEMMs (gemm.py, qgemm.cl), and quantize/dequantize, the QLinear element-wise ops, pools and
integer MaxPool (ops.py, quant.cl)."""
