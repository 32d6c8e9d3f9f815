"""oneDNN's int8 primitives for QLinearConv, QLinearMatMul and QGemm (backends/cpu/onednn/int8.py): chosen where
the weights are constant int8, within one step of the NumPy integer kernels (exact int32 sums, onnxruntime's
float32 requantization) and of onnxruntime; the weights prepacked when the kernel is built, the binary keeping
them as the model gives them.

Activations stay in [0, 127] and weights in [-64, 63]: oneDNN's and onnxruntime's u8 x s8 kernels on AVX2 without
VNNI sum pairs of products in saturating int16, exact only there (reduce_range's 7-bit weights).
"""

from __future__ import annotations

import harness  # tests/ops is on sys.path (tests/conftest.py)
import numpy as np
import pytest
from onnx import helper, numpy_helper
from quant_helpers import MS, assert_ints, ints, ort_outputs, qmodel

import ctxrt
from ctxrt.backends.cpu.backend import CpuBackend
from ctxrt.backends.cpu.onednn import api

pytestmark = pytest.mark.skipif(not api.available(), reason="oneDNN is not installed")


def _run(model, feeds: dict[str, np.ndarray], onednn: bool) -> tuple[np.ndarray, list[str]]:
    ctx = ctxrt.compile(model, backend=CpuBackend(onednn=onednn))
    try:
        g = ctx.graph()
        return g.run(feeds)[g.outputs[0].name], [s.algorithm for s in g.compiled.steps]
    finally:
        ctx.free()


def _check(model, feeds: dict[str, np.ndarray], ty: object, onednn: bool = True) -> None:
    got, algorithms = _run(model, feeds, onednn=True)
    assert any(a.startswith("onednn:int8") for a in algorithms) == onednn, algorithms
    numpy, _ = _run(model, feeds, onednn=False)
    assert_ints(got, numpy, within=1, rare=0.02, name="oneDNN vs NumPy")
    assert_ints(got, ort_outputs(model, feeds, [ty])[0], within=1, rare=0.02, name="oneDNN vs onnxruntime")


def _scales(n: int, per_channel: bool) -> np.ndarray:
    return harness.rand(n if per_channel else 1, low=0.002, high=0.01)


@pytest.mark.parametrize("group", [1, 2, 16])
@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("types", [(np.uint8, np.uint8), (np.int8, np.int8)], ids=["u8", "s8"])
def test_qlinear_conv_int8(group: int, per_channel: bool, types: tuple[object, object]) -> None:
    tx, ty = types
    c = m = 16
    x = ints(tx, 1, c, 10, 9, lo=0, hi=127)
    node = helper.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"], ["y"],
                            pads=[1, 1, 1, 1], strides=[1, 2], group=group)
    inits = {"xs": np.float32(0.05), "xz": np.array(7 if tx == np.uint8 else -3, tx),
             "w": ints(np.int8, m, c // group, 3, 3, lo=-64, hi=63), "ws": _scales(m, per_channel),
             "wz": np.zeros(m if per_channel else 1, np.int8), "ys": np.float32(0.2),
             "yz": np.array(120 if ty == np.uint8 else 5, ty), "b": ints(np.int32, m, lo=-999, hi=999)}
    # s8 inputs with a zero point and padding came out up to 4 steps off on AVX2: left to NumPy
    _check(qmodel(node, {"x": x}, inits), {"x": x}, ty, onednn=tx == np.uint8)


def test_full_range_weights_without_vnni_stay_with_numpy() -> None:
    a = ints(np.uint8, 9, 32)
    node = helper.make_node("QLinearMatMul", ["a", "as", "az", "b", "bs", "bz", "ys", "yz"], ["y"])
    b = ints(np.int8, 32, 8, lo=-128, hi=127)
    b[0, 0] = -128
    inits = {"as": np.float32(0.04), "az": np.uint8(9), "b": b, "bs": np.float32(0.01), "bz": np.int8(0),
             "ys": np.float32(0.3), "yz": np.uint8(100)}
    got, algorithms = _run(qmodel(node, {"a": a}, inits), {"a": a}, onednn=True)
    assert any(a.startswith("onednn") for a in algorithms) == api.has_vnni(), algorithms
    exact, _ = _run(qmodel(node, {"a": a}, inits), {"a": a}, onednn=False)  # (onnxruntime saturates here too)
    assert_ints(got, exact, within=1, rare=0.02)


@pytest.mark.parametrize("op", ["QLinearMatMul", "QGemm"])
@pytest.mark.parametrize("per_column", [False, True])
def test_qlinear_matmul_and_qgemm_int8(op: str, per_column: bool) -> None:
    k, n = 48, 24
    a = ints(np.uint8, 2, 9, k, lo=0, hi=127) if op == "QLinearMatMul" else ints(np.uint8, 9, k, lo=0, hi=127)
    common = {"as": np.float32(0.04), "az": np.uint8(9), "bs": _scales(n, per_column), "ys": np.float32(0.3),
              "yz": np.uint8(100)}
    if op == "QLinearMatMul":
        node = helper.make_node(op, ["a", "as", "az", "b", "bs", "bz", "ys", "yz"], ["y"])
        inits = {**common, "b": ints(np.int8, k, n, lo=-64, hi=63), "bz": np.zeros(n if per_column else 1, np.int8)}
    else:
        node = helper.make_node(op, ["a", "as", "az", "b", "bs", "bz", "c", "ys", "yz"], ["y"], domain=MS, transB=1)
        inits = {**common, "b": ints(np.int8, n, k, lo=-64, hi=63), "bz": np.zeros(n if per_column else 1, np.int8),
                 "c": ints(np.int32, n, lo=-999, hi=999)}
    _check(qmodel(node, {"a": a}, inits), {"a": a}, np.uint8)


def test_asymmetric_weights_stay_with_numpy() -> None:
    a = ints(np.uint8, 9, 32, lo=0, hi=127)
    node = helper.make_node("QLinearMatMul", ["a", "as", "az", "b", "bs", "bz", "ys", "yz"], ["y"])
    inits = {"as": np.float32(0.04), "az": np.uint8(9), "b": ints(np.int8, 32, 8, lo=-64, hi=63),
             "bs": np.float32(0.01), "bz": np.int8(3), "ys": np.float32(0.3), "yz": np.uint8(100)}
    _, algorithms = _run(qmodel(node, {"a": a}, inits), {"a": a}, onednn=True)
    assert not any(a.startswith("onednn") for a in algorithms), algorithms


def _fire_net() -> tuple[object, tuple[int, ...]]:
    """A SqueezeNet-style float model: a 3-channel stem conv, MaxPool, a fire module (squeeze 1x1, expand 1x1 and
    3x3, Concat along channels), Dropout, a BatchNormalization not folded, a 1x1 conv, a residual Add,
    GlobalAveragePool, Gemm."""
    rng = np.random.default_rng(5)
    n = helper.make_node

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32)

    inits = {"w0": w(16, 3, 3, 3), "b0": w(16), "ws": w(8, 16, 1, 1), "bs": w(8), "we1": w(12, 8, 1, 1),
             "be1": w(12), "we3": w(12, 8, 3, 3), "be3": w(12), "wc": w(24, 24, 1, 1), "bc": w(24),
             "wf": w(10, 24), "bf": w(10), "bn_g": rng.uniform(0.5, 1.5, 24).astype(np.float32),
             "bn_b": w(24), "bn_m": w(24), "bn_v": rng.uniform(0.5, 1.5, 24).astype(np.float32)}
    nodes = [n("Conv", ["x", "w0", "b0"], ["c0"], strides=[2, 2], pads=[1, 1, 1, 1]), n("Relu", ["c0"], ["r0"]),
             n("MaxPool", ["r0"], ["p0"], kernel_shape=[3, 3], strides=[2, 2]),
             n("Conv", ["p0", "ws", "bs"], ["cs"]), n("Relu", ["cs"], ["rs"]),
             n("Conv", ["rs", "we1", "be1"], ["ce1"]), n("Relu", ["ce1"], ["re1"]),
             n("Conv", ["rs", "we3", "be3"], ["ce3"], pads=[1, 1, 1, 1]), n("Relu", ["ce3"], ["re3"]),
             n("Concat", ["re1", "re3"], ["cat"], axis=1), n("Dropout", ["cat"], ["drop"]),
             n("BatchNormalization", ["drop", "bn_g", "bn_b", "bn_m", "bn_v"], ["bn"]),
             n("Conv", ["bn", "wc", "bc"], ["cc"]), n("Add", ["cc", "cat"], ["sum"]),
             n("GlobalAveragePool", ["sum"], ["g"]), n("Flatten", ["g"], ["f"]),
             n("Gemm", ["f", "wf", "bf"], ["y"], transB=1)]
    graph = helper.make_graph(nodes, "fire", [helper.make_tensor_value_info("x", 1, [1, 3, 33, 33])],
                              [helper.make_tensor_value_info("y", 1, [1, 10])],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), (1, 3, 33, 33)


def test_qdq_cnn_stays_channels_last_between_int8_ops(tmp_path) -> None:
    """A QDQ SqueezeNet-style model (onnxruntime's quantize_static, per channel): its 8-bit activations stay NHWC
    from the first int8 conv to the global pool (QLinearConv, MaxPool, QLinearConcat along channels, QLinearAdd,
    QLinearGlobalAveragePool, the BatchNormalization unit's QLinearLookup), no Reorder between them; the
    DequantizeLinear -> QuantizeLinear left where Dropout was is gone; outputs as the NumPy kernels' (plain NCHW)
    within one step, and as onnxruntime's."""
    import onnx
    import onnxruntime as ort
    from onnxruntime import quantization as q
    from small_nets import calibration

    model, shape = _fire_net()
    src, path = tmp_path / "fire.onnx", tmp_path / "fire-qdq.onnx"
    onnx.save(model, str(src))
    q.quantize_static(str(src), str(path), calibration(shape), quant_format=q.QuantFormat.QDQ, per_channel=True,
                      reduce_range=True, activation_type=q.QuantType.QUInt8, weight_type=q.QuantType.QInt8)
    ctx = ctxrt.compile(str(path), backend=CpuBackend(onednn=True))
    try:
        g = ctx.graph()
        steps = g.compiled.steps
        ops = [s.op for s in steps]
        assert "Reorder" not in ops and "DequantizeLinear" in ops and ops.count("QuantizeLinear") == 1, ops
        laid = {s.op: s.attrs for s in steps if s.attrs.get("src_layout") == "nhwc" or s.attrs.get("axis") == 3
                or s.attrs.get("channels_last")}
        assert {"QLinearConv", "MaxPool", "QLinearConcat", "QLinearGlobalAveragePool",
                "QLinearLookup"} <= set(laid), ops
        convs = [s for s in steps if s.op == "QLinearConv"]
        assert all(s.algorithm.startswith("onednn:int8") for s in convs)
        assert [s.attrs["src_layout"] for s in convs] == ["nchw"] + ["nhwc"] * (len(convs) - 1)
        x = np.random.default_rng(4).standard_normal(shape).astype(np.float32)
        got = g.run({"x": x})["y"]
    finally:
        ctx.free()
    quantized = onnx.load(str(path))
    last = next(nd for nd in quantized.graph.node if nd.output[0] == "y")  # the output's DequantizeLinear
    step = float(next(numpy_helper.to_array(i) for i in quantized.graph.initializer if i.name == last.input[1]))
    numpy, _ = _run(quantized, {"x": x}, onednn=False)
    assert np.abs(got - numpy).max() <= step * 1.001
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    want = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert np.abs(got - want).max() <= step * 1.001
