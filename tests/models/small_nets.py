"""Small float32 networks built in code, for the float16 and quantization tests: a CNN (convolutions, depthwise,
residual, pools, a classifier) and a BERT-style encoder (attention with heads, LayerNormalization, an MLP)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper


def _init(rng: np.random.Generator, name: str, shape: tuple[int, ...], scale: float | None = None) -> onnx.TensorProto:
    scale = scale or 1 / np.sqrt(np.prod(shape[1:]) if len(shape) > 1 else shape[0])
    return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)


def _model(nodes: list, name: str, x: tuple[int, ...], y: list[int], inits: list) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, name, [helper.make_tensor_value_info("x", 1, x)],
                              [helper.make_tensor_value_info("y", 1, y)], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def cnn(c: int = 16, hw: int = 16, classes: int = 10) -> tuple[onnx.ModelProto, tuple[int, ...]]:
    """Conv-Relu-MaxPool, Conv-Relu, depthwise Conv + residual Add, 1x1 Conv-Relu, AveragePool, Concat, global
    pool, Gemm."""
    rng = np.random.default_rng(1)
    n = helper.make_node
    nodes = [n("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]), n("Relu", ["c1"], ["r1"]),
             n("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
             n("Conv", ["p1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]), n("Relu", ["c2"], ["r2"]),
             n("Conv", ["r2", "w3", "b3"], ["c3"], group=c, pads=[1, 1, 1, 1]), n("Add", ["c3", "r2"], ["a3"]),
             n("Conv", ["a3", "w4", "b4"], ["c4"]), n("Relu", ["c4"], ["r4"]),
             n("AveragePool", ["r4"], ["ap"], kernel_shape=[2, 2], strides=[2, 2]),
             n("Concat", ["ap", "ap"], ["cc"], axis=1), n("GlobalAveragePool", ["cc"], ["g"]),
             n("Flatten", ["g"], ["f"]), n("Gemm", ["f", "wf", "bf"], ["y"], transB=1)]
    inits = [_init(rng, "w1", (c, 3, 3, 3)), _init(rng, "b1", (c,), 0.1), _init(rng, "w2", (c, c, 3, 3)),
             _init(rng, "b2", (c,), 0.1), _init(rng, "w3", (c, 1, 3, 3)), _init(rng, "b3", (c,), 0.1),
             _init(rng, "w4", (2 * c, c, 1, 1)), _init(rng, "b4", (2 * c,), 0.1),
             _init(rng, "wf", (classes, 4 * c)), _init(rng, "bf", (classes,), 0.1)]
    shape = (1, 3, hw, hw)
    return _model(nodes, "cnn", shape, [1, classes], inits), shape


def encoder(d: int = 64, h: int = 128, seq: int = 16, heads: int = 4, layers: int = 1
            ) -> tuple[onnx.ModelProto, tuple[int, ...]]:
    """BERT-style layers: Q, K, V projections with biases, heads split by Reshape/Transpose, scaled scores, Softmax,
    output projection, residual, LayerNormalization, MLP (MatMul, bias, Relu, MatMul, bias), residual, norm."""
    rng = np.random.default_rng(2)
    n = helper.make_node
    dh = d // heads
    nodes: list = []
    inits = [numpy_helper.from_array(np.array([1, seq, heads, dh], np.int64), "heads"),
             numpy_helper.from_array(np.array([1, seq, d], np.int64), "merged"),
             numpy_helper.from_array(np.array(1 / np.sqrt(dh), np.float32), "scale")]
    x = "x"
    for layer in range(layers):
        p = f"l{layer}_"
        for w in "qkv":
            nodes += [n("MatMul", [x, f"{p}w{w}"], [f"{p}{w}0"]), n("Add", [f"{p}{w}0", f"{p}b{w}"], [f"{p}{w}1"]),
                      n("Reshape", [f"{p}{w}1", "heads"], [f"{p}{w}2"])]
            inits += [_init(rng, f"{p}w{w}", (d, d)), _init(rng, f"{p}b{w}", (d,), 0.1)]
        nodes += [n("Transpose", [f"{p}q2"], [f"{p}qt"], perm=[0, 2, 1, 3]),
                  n("Transpose", [f"{p}k2"], [f"{p}kt"], perm=[0, 2, 3, 1]),
                  n("Transpose", [f"{p}v2"], [f"{p}vt"], perm=[0, 2, 1, 3]),
                  n("MatMul", [f"{p}qt", f"{p}kt"], [f"{p}s"]), n("Mul", [f"{p}s", "scale"], [f"{p}ss"]),
                  n("Softmax", [f"{p}ss"], [f"{p}pr"], axis=-1), n("MatMul", [f"{p}pr", f"{p}vt"], [f"{p}at"]),
                  n("Transpose", [f"{p}at"], [f"{p}at2"], perm=[0, 2, 1, 3]),
                  n("Reshape", [f"{p}at2", "merged"], [f"{p}at3"]),
                  n("MatMul", [f"{p}at3", f"{p}wo"], [f"{p}o0"]), n("Add", [f"{p}o0", f"{p}bo"], [f"{p}o1"]),
                  n("Add", [f"{p}o1", x], [f"{p}r1"]),
                  n("LayerNormalization", [f"{p}r1", f"{p}g1", f"{p}e1"], [f"{p}n1"], axis=-1),
                  n("MatMul", [f"{p}n1", f"{p}w1"], [f"{p}h0"]), n("Add", [f"{p}h0", f"{p}c1"], [f"{p}h1"]),
                  n("Relu", [f"{p}h1"], [f"{p}h2"]), n("MatMul", [f"{p}h2", f"{p}w2"], [f"{p}m0"]),
                  n("Add", [f"{p}m0", f"{p}c2"], [f"{p}m1"]), n("Add", [f"{p}m1", f"{p}n1"], [f"{p}r2"]),
                  n("LayerNormalization", [f"{p}r2", f"{p}g2", f"{p}e2"], [f"{p}out"], axis=-1)]
        inits += [_init(rng, f"{p}wo", (d, d)), _init(rng, f"{p}bo", (d,), 0.1), _init(rng, f"{p}w1", (d, h)),
                  _init(rng, f"{p}c1", (h,), 0.1), _init(rng, f"{p}w2", (h, d)), _init(rng, f"{p}c2", (d,), 0.1)]
        for k in "12":
            inits += [numpy_helper.from_array(np.ones(d, np.float32), f"{p}g{k}"),
                      numpy_helper.from_array(np.zeros(d, np.float32), f"{p}e{k}")]
        x = f"{p}out"
    nodes.append(n("Identity", [x], ["y"]))
    shape = (1, seq, d)
    return _model(nodes, "encoder", shape, list(shape), inits), shape


def calibration(shape: tuple[int, ...], count: int = 8) -> object:
    """onnxruntime.quantization's calibration reader: `count` random float32 feeds of input "x" (seed 3)."""
    from onnxruntime.quantization import CalibrationDataReader

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            rng = np.random.default_rng(3)
            self.data = iter([{"x": rng.standard_normal(shape).astype(np.float32)} for _ in range(count)])

        def get_next(self) -> dict | None:
            return next(self.data, None)
    return Reader()
