"""oneDNN as a kernel provider of the CPU backend (`onednn-cpu-gomp`, a dependency on Linux x86-64): which ops it
runs, and the question the layout pass asks of it."""

from __future__ import annotations

from ctxrt.backends.cpu import widen
from ctxrt.backends.cpu.onednn import api, int8, kernels, matmul
from ctxrt.backends.kernel import KernelFactory, NodeSpec
from ctxrt.errors import CtxrtError

NAME = "onednn"  # the `kernel` attribute of the nodes it runs
# Ops it runs in the layout the pass chooses (channels-last or blocked), and ops it runs on plain tensors.
LAYOUT_OPS: dict[str, KernelFactory] = {
    "Conv": kernels.conv, "MaxPool": kernels.maxpool, "AveragePool": kernels.avgpool,
    "GlobalAveragePool": kernels.global_avgpool, "LRN": kernels.lrn, "BatchNormalization": kernels.batchnorm,
    "QLinearConv": int8.qconv, "ConvTranspose": kernels.conv_transpose}
# Not LogSoftmax: oneDNN's log is off by up to 1.2e-4 relative near 0 (onnxruntime's, NumPy's: 1e-7).
# The integer GEMMs of QDQ units (int8.py) too; QLinearConv is in both: NHWC between int8 convs, NCHW where
# the layout pass leaves its input or output plain (int8.py reorders those sides inside its launch).
PLAIN_OPS: dict[str, KernelFactory] = {"MatMul": matmul.matmul, "Gemm": matmul.matmul, "Softmax": kernels.softmax,
                                       "LayerNormalization": kernels.layernorm, "QLinearMatMul": int8.qmatmul,
                                       "QGemm": int8.qmatmul, "QLinearConv": int8.qconv,
                                       "MatMulInteger": int8.matmul_integer, "ConvInteger": int8.conv_integer}
KERNELS = {**LAYOUT_OPS, **PLAIN_OPS}
# Element-wise ops it runs whatever their layout, chosen by the kernel table itself (registry.py), not the layout
# pass: NumPy's kernel where oneDNN declines (another dtype) or is not installed.
# (Not HardSigmoid: oneDNN's clips NaN to 0 or 1, ONNX's keeps it.)
ELTWISE: dict[str, KernelFactory] = {"HardSwish": kernels.eltwise}
reorder = kernels.reorder


def supports(spec: NodeSpec) -> bool:
    """Whether oneDNN runs this node (as the layout pass would record it) with a fast implementation."""
    factory = KERNELS.get(spec.op)
    if factory is None or not api.available():
        return False
    if spec.attr(widen.WIDEN):  # half weights: its kernel sees them widened
        spec = widen.widened_spec(spec)[0]
    try:
        factory(spec)
    except CtxrtError:
        return False
    return True
