"""LRN and BatchNormalization (inference, where the compiler could not fold it into a Conv: DenseNet's
BatchNormalization -> Relu -> Conv) on OpenCL (kernels/lrn.cl, kernels/batchnorm.cl)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ctxrt.backends.kernel import Launch, NodeSpec
from ctxrt.backends.opencl.kernel import ClKernel, Space
from ctxrt.backends.opencl.spatial import LIMIT, decline, float_type

_PLANES = Space(
    params={"VW": (1, 2, 4, 8, 16), "N": (1, 2, 4, 8, 16), "WX": (1, 2, 4, 8, 16, 32, 64), "WY": (1, 2, 4, 8, 16)},
    # PoCL: vectors of 16 along a plane, one work-item per work-group. GPUs: one value per work-item, 64x4 groups.
    defaults={"cpu": {"VW": 16, "N": 4, "WX": 1, "WY": 1}, "gpu": {"VW": 1, "N": 1, "WX": 64, "WY": 4},
              "default": {"VW": 1, "N": 1, "WX": 16, "WY": 4}},
    work_group=lambda p: (p["WX"], p["WY"]))


def _planes(spec: NodeSpec) -> tuple[int, int, int]:
    """(images, channels, values per channel plane) of input 0, (N, C, ...)."""
    shape = spec.inputs[0].shape
    if len(shape) < 2 or math.prod(shape) >= LIMIT:
        raise decline(spec, f"input of shape {shape}")
    return shape[0], shape[1], math.prod(shape[2:])


class LRN(ClKernel):
    """N: channels per work-item."""

    source = "lrn.cl"
    space = _PLANES

    def __init__(self, spec: NodeSpec, backend: Any, params: Any = None) -> None:
        self.n, self.c, self.hw = _planes(spec)
        super().__init__(spec, backend, params)
        self.T = float_type(self, spec)
        self.size = int(spec.attr("size", 0))
        if self.size < 1:
            raise decline(spec, f"size={self.size}")
        # ONNX float attributes are float32 (as onnxruntime reads them)
        dt = np.dtype(spec.outputs[0].dtype).type
        self.consts = [dt(np.float32(spec.attr("alpha", 1e-4)) / self.size), dt(np.float32(spec.attr("beta", 0.75))),
                       dt(np.float32(spec.attr("bias", 1.0)))]

    def defines(self) -> dict[str, Any]:
        lo = (self.size - 1) // 2
        d = {"T": self.T, "LO": lo, "HI": self.size - 1 - lo, "VW": self.params["VW"], "CB": self.params["N"],
             "WX": self.params["WX"], "WY": self.params["WY"]}
        return {**d, "FP64": 1} if self.T == "double" else d

    def bind(self, ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        if self.n * self.c * self.hw == 0:
            return lambda: None
        p, x, y = self.params, ins[0], outs[0]
        args = [np.int32(self.c), np.int32(self.hw), *self.consts, x.mem, np.uint64(x.offset), y.mem,
                np.uint64(y.offset)]
        gsize = (-(-self.hw // p["VW"]), -(-self.c // p["N"]), self.n)
        return self.launch(self.kernel("lrn", *args), gsize, (p["WX"], p["WY"], 1))


class BatchNorm(ClKernel):
    """N: vectors per work-item."""

    source = "batchnorm.cl"
    space = _PLANES

    def __init__(self, spec: NodeSpec, backend: Any, params: Any = None) -> None:
        self.n, self.c, self.hw = _planes(spec)
        super().__init__(spec, backend, params)
        self.T = float_type(self, spec)
        if len(spec.outputs) > 1 or spec.attr("training_mode", 0) or not spec.attr("spatial", 1):
            raise decline(spec, "training mode or spatial=0")
        if len(spec.inputs) != 5 or any(t is None or tuple(t.shape) != (self.c,) for t in spec.inputs[1:]):
            raise decline(spec, f"parameters of shapes {[None if t is None else t.shape for t in spec.inputs[1:]]}")
        self.epsilon = np.dtype(spec.outputs[0].dtype).type(np.float32(spec.attr("epsilon", 1e-5)))

    def defines(self) -> dict[str, Any]:
        d = {"T": self.T, "VW": self.params["VW"], "PV": self.params["N"], "WX": self.params["WX"],
             "WY": self.params["WY"]}
        return {**d, "FP64": 1} if self.T == "double" else d

    def bind(self, ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        if self.n * self.c * self.hw == 0:
            return lambda: None
        p = self.params
        args = [np.int32(self.c), np.int32(self.hw), self.epsilon,
                *(a for t in (*ins, outs[0]) for a in (t.mem, np.uint64(t.offset)))]
        gsize = (-(-self.hw // (p["VW"] * p["N"])), self.c, self.n)
        return self.launch(self.kernel("batchnorm", *args), gsize, (p["WX"], p["WY"], 1))


def _lrn(spec: NodeSpec, backend: Any) -> LRN:
    return LRN(spec, backend)


def _batchnorm(spec: NodeSpec, backend: Any) -> BatchNorm:
    return BatchNorm(spec, backend)


KERNELS = {"LRN": _lrn, "BatchNormalization": _batchnorm}
