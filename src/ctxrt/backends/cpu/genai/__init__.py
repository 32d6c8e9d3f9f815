"""Kernels for the operators of decoder models written by onnxruntime-genai's model builder: GroupQueryAttention,
RotaryEmbedding (com.microsoft and ONNX-23), SkipSimplifiedLayerNormalization, SkipLayerNormalization,
SimplifiedLayerNormalization and RMSNormalization-23.

Ops of the com.microsoft domain are keyed "com.microsoft.<op>" (frontend.checks.op_key): a key here is what admits
the op; frontend/extensions.py types their outputs for shape inference.
"""

from __future__ import annotations

from ctxrt.backends.cpu.genai import gqa, norms, rotary
from ctxrt.backends.kernel import KernelFactory

KERNELS: dict[str, KernelFactory] = {**gqa.KERNELS, **norms.KERNELS, **rotary.KERNELS}
