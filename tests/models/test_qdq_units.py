"""QDQ node units run as integer kernels (ir/passes/qdq.py): models from onnxruntime's `quantize_static` (QDQ, per
tensor and per channel, 8-bit and 16-bit activations) have their DequantizeLinear -> op -> QuantizeLinear units
replaced by QLinear ops, and match onnxruntime within one quantization step; a unit that cannot run on integers
keeps its float semantics."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from small_nets import calibration, cnn, encoder

import ctxrt
from ctxrt.backends import get_backend
from ctxrt.backends.cpu.backend import CpuBackend
from ctxrt.compiler import compile_graphs, save_context
from ctxrt.runtime.report import graph_kernels

ort = pytest.importorskip("onnxruntime")
q = pytest.importorskip("onnxruntime.quantization")

NETS = {"cnn": lambda: cnn(16, 16), "encoder": lambda: encoder(32, 64, seq=8, heads=2)}
FLOAT_OPS = {"Conv", "MatMul", "Gemm", "Add", "Mul", "Sigmoid", "AveragePool", "GlobalAveragePool", "Concat"}
EIGHT_BIT_ONLY = {"Sigmoid", "AveragePool", "GlobalAveragePool", "Concat"}  # lookup tables, pools: 16-bit stay float


def quantized(tmp: Path, name: str, kind: str) -> tuple[str, tuple[int, ...]]:
    model, shape = NETS[name]()
    src, out = tmp / f"{name}.onnx", tmp / f"{name}-{kind}.onnx"
    onnx.save(model, str(src))
    options = {"quant_format": q.QuantFormat.QDQ, "per_channel": kind == "channel", "reduce_range": True,
               "activation_type": q.QuantType.QUInt8, "weight_type": q.QuantType.QInt8}
    if kind == "uint16":  # 16-bit activations, 8-bit weights, ONNX's own Q/DQ of opset 21
        options.update(activation_type=q.QuantType.QUInt16, reduce_range=False)
    q.quantize_static(str(src), str(out), calibration(shape), **options)
    return str(out), shape


def _step(path: str) -> float:
    model = onnx.load(path)
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    last = next(n for n in model.graph.node if model.graph.output[0].name in n.output)
    return float(np.max(inits[last.input[1]])) if last.op_type == "DequantizeLinear" else 0.0


def _ort(path: str, feeds: dict[str, np.ndarray]) -> np.ndarray:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"]).run(None, feeds)[0]


def _ops(path: str, backend: CpuBackend) -> Counter:
    graphs, _ = compile_graphs([(path, None, "main")], backend)
    return Counter(s.op for s in graphs[0].steps)


@pytest.mark.parametrize("onednn", [None, False])
@pytest.mark.parametrize("kind", ["tensor", "channel", "uint16"])
@pytest.mark.parametrize("name", NETS)
def test_qdq_units_run_as_integers_within_a_step(tmp_path: Path, name: str, kind: str, onednn: bool | None) -> None:
    path, shape = quantized(tmp_path, name, kind)
    backend = CpuBackend(onednn=onednn)
    ops = _ops(path, backend)
    floats = FLOAT_OPS - EIGHT_BIT_ONLY if kind == "uint16" else FLOAT_OPS
    assert not floats & ops.keys(), ops  # every unit of these ops runs on integers
    assert ops["QLinearConv" if name == "cnn" else "QLinearMatMul"] >= 3, ops
    step = _step(path) or 1e-3  # the encoder ends in a float LayerNormalization: a 16-bit step before it, scaled
    for seed in range(3):
        feeds = {"x": np.random.default_rng(seed).standard_normal(shape).astype(np.float32)}
        ctx = ctxrt.compile(path, backend=backend)
        try:
            got = ctx.graph().run(feeds)[ctx.graph().outputs[0].name]
        finally:
            ctx.free()
        assert np.abs(got - _ort(path, feeds)).max() <= step * 1.001, (np.abs(got - _ort(path, feeds)).max(), step)


def test_classifier_top1_matches_onnxruntime(tmp_path: Path) -> None:
    path, shape = quantized(tmp_path, "cnn", "channel")
    session = ctxrt.InferenceSession(path)
    for seed in range(8):
        feeds = {"x": np.random.default_rng(10 + seed).standard_normal(shape).astype(np.float32)}
        assert np.argmax(session.run(None, feeds)[0]) == np.argmax(_ort(path, feeds))


def test_inspect_kernels_lists_the_integer_units(tmp_path: Path) -> None:
    path, _ = quantized(tmp_path, "cnn", "tensor")
    backend = get_backend("cpu")
    graphs, weights = compile_graphs([(path, None, "main")], backend)
    binary = save_context(tmp_path / "m.ctx", graphs, weights, backend, [path])
    ops = {k["op"] for k in graph_kernels(str(binary))[0]["kernels"]}
    assert {"QLinearConv", "QLinearAdd", "QGemm"} <= ops and not FLOAT_OPS & ops, ops


def _unit_model(bias: np.ndarray, ws: np.ndarray, extra_reader: bool) -> onnx.ModelProto:
    """DQ(x) -> Conv(DQ(w), bias) -> Q -> DQ -> y; with `extra_reader` the Conv's float output is an output too."""
    rng = np.random.default_rng(8)
    n = helper.make_node
    nodes = [n("QuantizeLinear", ["x", "s", "z"], ["xq"]), n("DequantizeLinear", ["xq", "s", "z"], ["xd"]),
             n("DequantizeLinear", ["w", "ws"], ["wd"], axis=0), n("Conv", ["xd", "wd", "b"], ["c"], pads=[1, 1, 1, 1]),
             n("QuantizeLinear", ["c", "ys", "z"], ["cq"]), n("DequantizeLinear", ["cq", "ys", "z"], ["y"])]
    inits = [numpy_helper.from_array(np.float32(0.05), "s"), numpy_helper.from_array(np.uint8(128), "z"),
             numpy_helper.from_array(rng.integers(-60, 60, (8, 4, 3, 3)).astype(np.int8), "w"),
             numpy_helper.from_array(ws, "ws"),
             numpy_helper.from_array(bias, "b"), numpy_helper.from_array(np.float32(0.1), "ys")]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if extra_reader:
        outputs.append(helper.make_tensor_value_info("c", TensorProto.FLOAT, None))
    graph = helper.make_graph(nodes, "unit", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 6, 6])],
                              outputs, initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("case", ["bias on the grid", "bias off the grid", "float output read too"])
def test_units_that_cannot_run_as_integers_keep_float_semantics(case: str) -> None:
    rng = np.random.default_rng(9)
    ws = rng.uniform(0.002, 0.01, 8).astype(np.float32)
    on_grid = (rng.integers(-500, 500, 8) * (np.float32(0.05) * ws)).astype(np.float32)
    bias = on_grid + np.float32(0.0123) if case == "bias off the grid" else on_grid
    model = _unit_model(bias, ws, case == "float output read too").SerializeToString()
    ops = Counter(s.op for s in compile_graphs([(model, None, "main")], get_backend("cpu"))[0][0].steps)
    assert ("QLinearConv" in ops) == (case == "bias on the grid"), ops
    feeds = {"x": rng.standard_normal((1, 4, 6, 6)).astype(np.float32)}
    got = ctxrt.InferenceSession(model).run(None, feeds)
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)
    assert np.abs(got[0] - want[0]).max() <= 0.1 * 1.001
    if case != "bias on the grid":  # float semantics: the same as onnxruntime's float Conv, to rounding
        np.testing.assert_allclose(got[-1], want[-1], rtol=1e-5, atol=1e-5)


def _zero_point(dt: object, value: int) -> np.ndarray:
    """`value` as a uint8 zero point, or shifted by -128 as an int8 one."""
    return np.array(value if dt == np.uint8 else value - 128, dt)


@pytest.mark.parametrize("same", [True, False], ids=["same parameters", "other parameters"])
@pytest.mark.parametrize("dt", [np.uint8, np.int8], ids=["u8", "s8"])
def test_dequantize_then_quantize_runs_on_the_integers(tmp_path: Path, same: bool, dt: object) -> None:
    """DequantizeLinear -> Dropout -> QuantizeLinear (Dropout gone at inference): an Identity of the integers with the
    same parameters, a requantization through a table (a one-part QLinearConcat) with others; no float in between.
    The same bytes as onnxruntime's unoptimized float path."""
    def zp(v: int) -> np.ndarray:
        return _zero_point(dt, v)
    s2, z2 = (np.float32(0.05), zp(100)) if same else (np.float32(0.0371), zp(37))
    inits = {"s1": np.float32(0.05), "z1": zp(100), "s2": s2, "z2": z2}
    n = helper.make_node
    nodes = [n("QuantizeLinear", ["x", "s1", "z1"], ["q1"]), n("DequantizeLinear", ["q1", "s1", "z1"], ["d1"]),
             n("Dropout", ["d1"], ["dr"]), n("QuantizeLinear", ["dr", "s2", "z2"], ["q2"]),
             n("DequantizeLinear", ["q2", "s2", "z2"], ["y"])]
    graph = helper.make_graph(nodes, "requantize", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8, 5])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8, 5])],
                              [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    path = tmp_path / "requantize.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    ops = _ops(str(path), CpuBackend(onednn=False))
    assert ops == Counter({"QuantizeLinear": 1, "DequantizeLinear": 1, **({} if same else {"QLinearConcat": 1})}), ops
    x = np.linspace(-8, 8, 80, dtype=np.float32).reshape(2, 8, 5)
    np.testing.assert_array_equal(ctxrt.InferenceSession(str(path)).run(None, {"x": x})[0], _ort(str(path), {"x": x}))


def _op_model(tmp: Path, nodes: list, inits: dict, shape: tuple[int, ...], extra_inputs: tuple[str, ...] = ()
                ) -> str:
    graph = helper.make_graph(nodes, "unit", [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(shape))
                                              for n in ("x", *extra_inputs)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))],
                              [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    path = tmp / "unit.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)]), str(path))  # 20: Gelu
    return str(path)


def _quantized_op(op_nodes: list, dt: object, zy: int = 128, inputs: tuple[str, ...] = ("x",)) -> tuple[list, dict]:
    """Q -> DQ of each input, the op's nodes (reading d_<input>, writing "f"), Q -> DQ to "y"."""
    def zp(v: int) -> np.ndarray:
        return _zero_point(dt, v)
    inits = {"s1": np.float32(0.04), "z1": zp(120), "s2": np.float32(0.03), "z2": zp(zy)}
    n = helper.make_node
    nodes = [node for i in inputs for node in (n("QuantizeLinear", [i, "s1", "z1"], [f"q_{i}"]),
                                                 n("DequantizeLinear", [f"q_{i}", "s1", "z1"], [f"d_{i}"]))]
    return nodes + op_nodes + [n("QuantizeLinear", ["f", "s2", "z2"], ["q2"]),
                               n("DequantizeLinear", ["q2", "s2", "z2"], ["y"])], inits


def _same_without_native(path: str, feeds: dict, monkeypatch) -> np.ndarray:
    """The output with the native kernels, checked equal to NumPy's."""
    from ctxrt.backends.cpu import native

    got = ctxrt.InferenceSession(path).run(None, feeds)[0]
    monkeypatch.setattr(native, "library", lambda: None)
    np.testing.assert_array_equal(ctxrt.InferenceSession(path).run(None, feeds)[0], got)
    return got


LOOKUPS = {"Relu": ({}, {}), "Clip": ({}, {"lo": np.float32(-0.5), "hi": np.float32(1.5)}),
           "HardSwish": ({}, {}), "Tanh": ({}, {}), "Gelu": ({"approximate": "tanh"}, {}), "Elu": ({"alpha": 0.7}, {})}


@pytest.mark.parametrize("dt", [np.uint8, np.int8], ids=["u8", "s8"])
@pytest.mark.parametrize("op", LOOKUPS)
def test_elementwise_units_run_as_tables(tmp_path: Path, op: str, dt: object, monkeypatch) -> None:
    """DequantizeLinear -> element-wise op -> QuantizeLinear: one QLinearLookup (a 256-byte table made from the
    unit's float computation), within a step of onnxruntime's float unit; native and NumPy give the same bytes."""
    attrs, consts = LOOKUPS[op]
    node = helper.make_node(op, ["d_x", *consts], ["f"], **attrs)
    nodes, inits = _quantized_op([node], dt)
    path = _op_model(tmp_path, nodes, {**inits, **consts}, (2, 3, 7, 9))
    assert _ops(path, CpuBackend(onednn=False)) == Counter({"QuantizeLinear": 1, "QLinearLookup": 1,
                                                             "DequantizeLinear": 1})
    x = np.random.default_rng(3).standard_normal((2, 3, 7, 9)).astype(np.float32) * 3
    got = _same_without_native(path, {"x": x}, monkeypatch)
    assert np.abs(got - _ort(path, {"x": x})).max() <= 0.03 * 1.001


@pytest.mark.parametrize("dt", [np.uint8, np.int8], ids=["u8", "s8"])
@pytest.mark.parametrize("quantized_scale", [False, True], ids=["float scale", "int8 scale"])
def test_batch_norm_unit_runs_as_an_affine_map_per_channel(tmp_path: Path, dt: object, quantized_scale: bool,
                                                            monkeypatch) -> None:
    """DequantizeLinear -> BatchNormalization -> QuantizeLinear (a quantized model whose BatchNormalization was not
    folded; the quantizer makes its scale an int8 weight): y = round(x a + b) per channel, channels first and (after
    an int8 convolution, oneDNN's layouts) channels last; within a step of onnxruntime; native and NumPy agree."""
    rng = np.random.default_rng(6)
    c = 8
    consts = {"g": rng.uniform(0.5, 1.5, c).astype(np.float32), "b": rng.uniform(-1, 1, c).astype(np.float32),
              "mu": rng.uniform(-1, 1, c).astype(np.float32), "var": rng.uniform(0.5, 1.5, c).astype(np.float32)}
    n = helper.make_node
    pre = []
    if quantized_scale:
        gs = np.abs(consts["g"]).max() / 127
        consts["gq"], consts["gs"] = np.rint(consts.pop("g") / gs).astype(np.int8), np.float32(gs)
        pre = [n("DequantizeLinear", ["gq", "gs"], ["g"])]
    nodes, inits = _quantized_op(pre + [n("BatchNormalization", ["d_x", "g", "b", "mu", "var"], ["f"])], dt)
    path = _op_model(tmp_path, nodes, {**inits, **consts}, (2, c, 5, 6))
    assert _ops(path, CpuBackend(onednn=False))["QLinearLookup"] == 1
    x = rng.standard_normal((2, c, 5, 6)).astype(np.float32) * 2
    got = _same_without_native(path, {"x": x}, monkeypatch)
    assert np.abs(got - _ort(path, {"x": x})).max() <= 0.03 * 1.001


@pytest.mark.parametrize("zy", [0, 7], ids=["zero point at the minimum", "zero point above it"])
def test_add_then_relu_fuses_where_saturation_is_the_relu(tmp_path: Path, zy: int) -> None:
    """DequantizeLinear x 2 -> Add -> Relu -> QuantizeLinear (a ResNet's residual): QLinearAdd where the output's
    zero point is its type's minimum (0 quantizes there, negatives saturate to it), else float."""
    n = helper.make_node
    nodes, inits = _quantized_op([n("Add", ["d_x", "d_r"], ["sum"]), n("Relu", ["sum"], ["f"])], np.uint8, zy,
                                 ("x", "r"))
    path = _op_model(tmp_path, nodes, inits, (2, 3, 4, 5), ("r",))
    ops = _ops(path, CpuBackend(onednn=False))
    assert (ops["QLinearAdd"], ops["Relu"]) == ((1, 0) if zy == 0 else (0, 1)), ops
    rng = np.random.default_rng(8)
    feeds = {k: rng.standard_normal((2, 3, 4, 5)).astype(np.float32) * 2 for k in ("x", "r")}
    got = ctxrt.InferenceSession(path).run(None, feeds)[0]
    assert np.abs(got - _ort(path, feeds)).max() <= 0.03 * 1.001


def test_gelu_chain_runs_as_one_table(tmp_path: Path, monkeypatch) -> None:
    """DequantizeLinear -> Div by sqrt(2) -> Erf -> QuantizeLinear (an exported BERT's GELU, whose Div and Erf the
    quantizer leaves in float): one QLinearLookup; within a step of onnxruntime; native and NumPy agree."""
    n = helper.make_node
    nodes, inits = _quantized_op([n("Div", ["d_x", "sqrt2"], ["half"]), n("Erf", ["half"], ["f"])], np.uint8)
    path = _op_model(tmp_path, nodes, {**inits, "sqrt2": np.float32(np.sqrt(2))}, (2, 16, 24))
    assert _ops(path, CpuBackend(onednn=False)) == Counter({"QuantizeLinear": 1, "QLinearLookup": 1,
                                                             "DequantizeLinear": 1})
    x = np.random.default_rng(2).standard_normal((2, 16, 24)).astype(np.float32) * 2
    got = _same_without_native(path, {"x": x}, monkeypatch)
    assert np.abs(got - _ort(path, {"x": x})).max() <= 0.03 * 1.001


@pytest.mark.parametrize("per_axis", [False, True], ids=["per tensor", "per column"])
def test_quantized_embedding_gathers_integer_rows(tmp_path: Path, per_axis: bool) -> None:
    """Gather from DequantizeLinear(int8 table): the rows gathered as integers, then dequantized (no float copy of
    the table at each run); the same values as onnxruntime."""
    rng = np.random.default_rng(9)
    table = rng.integers(-128, 128, (1000, 64)).astype(np.int8)
    scale = rng.uniform(0.01, 0.02, 64 if per_axis else 1).astype(np.float32)
    inits = {"table": table, "scale": scale if per_axis else scale.reshape(())}
    axis = {"axis": 1} if per_axis else {}
    nodes = [helper.make_node("DequantizeLinear", ["table", "scale"], ["embedding"], **axis),
             helper.make_node("Gather", ["embedding", "ids"], ["y"])]
    graph = helper.make_graph(nodes, "embed", [helper.make_tensor_value_info("ids", TensorProto.INT64, [2, 7])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 7, 64])],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    path = tmp_path / "embed.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    graphs, _ = compile_graphs([(str(path), None, "main")], CpuBackend(onednn=False))
    steps = graphs[0].steps
    assert [s.op for s in steps] == ["Gather", "DequantizeLinear"]
    assert steps[0].inputs[0].dtype == "|i1" and steps[1].inputs[0].shape == (2, 7, 64)
    ids = rng.integers(0, 1000, (2, 7))
    np.testing.assert_array_equal(ctxrt.InferenceSession(str(path)).run(None, {"ids": ids})[0],
                                  _ort(str(path), {"ids": ids}))


def test_a_chain_whose_constant_raises_the_rank_stays_float(tmp_path: Path) -> None:
    """x (2, 3) + c (1, 1, 1) is (1, 2, 3): not an element-wise map of x in place, so no table; it runs as the
    float unit and matches onnxruntime."""
    n = helper.make_node
    nodes, inits = _quantized_op([n("Add", ["d_x", "c"], ["f"])], np.uint8)
    graph = helper.make_graph(nodes, "rank", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 3])],
                              [numpy_helper.from_array(np.asarray(v), k) for k, v in
                               {**inits, "c": np.full((1, 1, 1), 0.5, np.float32)}.items()])
    path = tmp_path / "rank.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    assert "QLinearLookup" not in _ops(str(path), CpuBackend(onednn=False))
    x = np.linspace(-3, 3, 6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(ctxrt.InferenceSession(str(path)).run(None, {"x": x})[0], _ort(str(path), {"x": x}))
