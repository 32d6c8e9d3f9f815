"""The CNN kernel classes of the light models (ResNet-50, SqueezeNet, ShuffleNet, DenseNet-121, Inception-v1) as
small ONNX models with seeded random weights, one class each: bench_opencl.py times them on OpenCL, NumPy and
onnxruntime, bench_tuning.py tunes them. A conv class is Conv + bias, then Relu (fused into the conv by ctxrt's
and onnxruntime's graph passes) and, for residual classes, the Add of a second input before the Relu."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

# (label, op, input shape, attributes, weight shape for Conv, fused epilogue: "", "relu" or "residual")
CLASSES: list[tuple[str, str, tuple[int, ...], dict, tuple[int, ...] | None, str]] = [
    ("ResNet-50 stem conv 7x7/2 3->64 224", "Conv", (1, 3, 224, 224), {"strides": [2, 2], "pads": [3, 3, 3, 3]},
     (64, 3, 7, 7), "relu"),
    ("ResNet-50 conv 3x3 64 56", "Conv", (1, 64, 56, 56), {"pads": [1, 1, 1, 1]}, (64, 64, 3, 3), "relu"),
    ("ResNet-50 conv 1x1 64->256 56 + residual", "Conv", (1, 64, 56, 56), {}, (256, 64, 1, 1), "residual"),
    ("ResNet-50 conv 1x1/2 512->1024 28", "Conv", (1, 512, 28, 28), {"strides": [2, 2]}, (1024, 512, 1, 1), ""),
    ("ResNet-50 conv 3x3 256 14", "Conv", (1, 256, 14, 14), {"pads": [1, 1, 1, 1]}, (256, 256, 3, 3), "relu"),
    ("ResNet-50 conv 1x1 2048->512 7", "Conv", (1, 2048, 7, 7), {}, (512, 2048, 1, 1), "relu"),
    ("ResNet-50 MaxPool 3x3/2 64 112", "MaxPool", (1, 64, 112, 112),
     {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}, None, ""),
    ("SqueezeNet conv 1x1 512->1000 13", "Conv", (1, 512, 13, 13), {}, (1000, 512, 1, 1), "relu"),
    ("SqueezeNet conv 3x3 16->64 55", "Conv", (1, 16, 55, 55), {"pads": [1, 1, 1, 1]}, (64, 16, 3, 3), "relu"),
    ("ShuffleNet depthwise 3x3 136 28", "Conv", (1, 136, 28, 28), {"pads": [1, 1, 1, 1], "group": 136},
     (136, 1, 3, 3), ""),
    ("ShuffleNet depthwise 3x3/2 112 56", "Conv", (1, 112, 56, 56),
     {"pads": [1, 1, 1, 1], "strides": [2, 2], "group": 112}, (112, 1, 3, 3), ""),
    ("ShuffleNet grouped conv 1x1 g4 136 28", "Conv", (1, 136, 28, 28), {"group": 4}, (136, 34, 1, 1), "relu"),
    ("ShuffleNet AveragePool 3x3/2 24 56", "AveragePool", (1, 24, 56, 56),
     {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}, None, ""),
    ("DenseNet-121 BatchNormalization 128 56", "BatchNormalization", (1, 128, 56, 56), {"epsilon": 1e-5}, None,
     ""),
    ("DenseNet-121 conv 3x3 128->32 56", "Conv", (1, 128, 56, 56), {"pads": [1, 1, 1, 1]}, (32, 128, 3, 3), ""),
    ("DenseNet-121 GlobalAveragePool 1024 7", "GlobalAveragePool", (1, 1024, 7, 7), {}, None, ""),
    ("Inception-v1 LRN 5 64 55", "LRN", (1, 64, 55, 55), {"size": 5, "alpha": 1e-4, "beta": 0.75}, None, ""),
]


def class_model(index: int, seed: int = 0) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """The ONNX model of CLASSES[index] and its seeded feeds."""
    label, op, shape, attrs, wshape, epilogue = CLASSES[index]
    rng = np.random.default_rng(seed)

    def rand(*s: int, low: float = -1.0, high: float = 1.0) -> np.ndarray:
        return rng.uniform(low, high, s).astype(np.float32)

    feeds, inits = {"x": rand(*shape)}, {}
    out = "y" if not epilogue else "c"
    if op == "Conv":
        fan_in = float(np.prod(wshape[1:]))
        inits = {"w": rand(*wshape) / np.float32(np.sqrt(fan_in)), "b": rand(wshape[0], low=-0.1, high=0.1)}
        nodes = [helper.make_node("Conv", ["x", "w", "b"], [out], **attrs)]
    elif op == "BatchNormalization":
        c = shape[1]
        inits = {"s": rand(c, low=0.5, high=1.5), "b": rand(c), "m": rand(c), "v": rand(c, low=0.5, high=1.5)}
        nodes = [helper.make_node(op, ["x", "s", "b", "m", "v"], [out], **attrs)]
    else:
        nodes = [helper.make_node(op, ["x"], [out], **attrs)]
    if epilogue == "residual":
        feeds["r"] = rand(shape[0], wshape[0], *shape[2:])
        nodes.append(helper.make_node("Add", ["c", "r"], ["s"]))
        nodes.append(helper.make_node("Relu", ["s"], ["y"]))
    elif epilogue == "relu":
        nodes.append(helper.make_node("Relu", ["c"], ["y"]))
    inputs = [helper.make_tensor_value_info(k, TensorProto.FLOAT, v.shape) for k, v in feeds.items()]
    graph = helper.make_graph(nodes, label, inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), feeds
