"""Models quantized by onnxruntime's own tools, run by ctxrt: quantize_static (QDQ and QOperator, per tensor and per
channel; 16-bit QDQ with com.microsoft's Quantize/DequantizeLinear), quantize_dynamic and MatMulNBitsQuantizer
(4-bit weights, MatMulNBits or blocked int4 DequantizeLinear), of a small CNN and of a transformer-style block,
against onnxruntime: within one quantization step of the output.

The oracle is onnxruntime with its graph optimizations off, which runs the ops as the model writes them. Optimized,
it fuses QDQ groups into its own integer kernels, whose float32 requantizations round some values the other way
(a step of difference there can grow by a step or two through the following layers); and its u8 x s8 kernels on
AVX2 sum pairs of products in saturating int16 (onnxruntime's documented "saturation issue"), so the static models
here are quantized with reduce_range (7-bit weights), where onnxruntime is exact.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper
from small_nets import calibration

import ctxrt
from ctxrt.backends import get_backend
from ctxrt.compiler import compile_graphs, save_context

ort = pytest.importorskip("onnxruntime")
quantization = pytest.importorskip("onnxruntime.quantization")


def _init(rng: np.random.Generator, name: str, shape: tuple[int, ...], scale: float | None = None) -> onnx.TensorProto:
    scale = scale or 1 / np.sqrt(np.prod(shape[1:]) if len(shape) > 1 else shape[0])
    return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)


def cnn(c: int = 16) -> tuple[onnx.ModelProto, tuple[int, ...]]:
    """Conv-Relu-MaxPool, Conv-Relu, depthwise Conv + residual Add, Sigmoid, AveragePool, Concat, global pool,
    Gemm: the ops quantize_static turns into QLinearConv, QLinearAdd, QLinearSigmoid, QLinearAveragePool,
    QLinearConcat, QLinearGlobalAveragePool and QGemm."""
    rng = np.random.default_rng(1)
    n = helper.make_node
    nodes = [n("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]), n("Relu", ["c1"], ["r1"]),
             n("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
             n("Conv", ["p1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]), n("Relu", ["c2"], ["r2"]),
             n("Conv", ["r2", "w3", "b3"], ["c3"], group=c, pads=[1, 1, 1, 1]), n("Add", ["c3", "r2"], ["a3"]),
             n("Sigmoid", ["a3"], ["s3"]), n("AveragePool", ["s3"], ["ap"], kernel_shape=[2, 2], strides=[2, 2]),
             n("Concat", ["ap", "ap"], ["cc"], axis=1), n("GlobalAveragePool", ["cc"], ["g"]),
             n("Flatten", ["g"], ["f"]), n("Gemm", ["f", "wf", "bf"], ["y"], transB=1)]
    inits = [_init(rng, "w1", (c, 3, 3, 3)), _init(rng, "b1", (c,), 0.1), _init(rng, "w2", (c, c, 3, 3)),
             _init(rng, "b2", (c,), 0.1), _init(rng, "w3", (c, 1, 3, 3)), _init(rng, "b3", (c,), 0.1),
             _init(rng, "wf", (10, 2 * c)), _init(rng, "bf", (10,), 0.1)]
    shape = (1, 3, 16, 16)
    graph = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("x", 1, shape)],
                              [helper.make_tensor_value_info("y", 1, [1, 10])], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), shape


def block(d: int = 32, h: int = 64) -> tuple[onnx.ModelProto, tuple[int, ...]]:
    """Self-attention (Q, K, V projections, scores, Softmax) with a residual and LayerNormalization, then an
    MLP (MatMul, bias, Relu, MatMul, bias) and a residual: a transformer encoder block of MatMuls."""
    rng = np.random.default_rng(2)
    n = helper.make_node
    nodes = [n("MatMul", ["x", "wq"], ["q"]), n("MatMul", ["x", "wk"], ["k"]), n("MatMul", ["x", "wv"], ["v"]),
             n("Transpose", ["k"], ["kt"], perm=[0, 2, 1]), n("MatMul", ["q", "kt"], ["s"]),
             n("Mul", ["s", "scale"], ["ss"]), n("Softmax", ["ss"], ["p"], axis=-1), n("MatMul", ["p", "v"], ["att"]),
             n("Add", ["att", "x"], ["r1"]), n("LayerNormalization", ["r1", "ln_g", "ln_b"], ["n1"], axis=-1),
             n("MatMul", ["n1", "w1"], ["h1"]), n("Add", ["h1", "b1"], ["h1b"]), n("Relu", ["h1b"], ["h1r"]),
             n("MatMul", ["h1r", "w2"], ["h2"]), n("Add", ["h2", "b2"], ["h2b"]), n("Add", ["h2b", "n1"], ["y"])]
    inits = [_init(rng, "wq", (d, d)), _init(rng, "wk", (d, d)), _init(rng, "wv", (d, d)),
             numpy_helper.from_array(np.array(1 / np.sqrt(d), np.float32), "scale"),
             numpy_helper.from_array(np.ones(d, np.float32), "ln_g"), numpy_helper.from_array(np.zeros(d, np.float32),
                                                                                             "ln_b"),
             _init(rng, "w1", (d, h)), _init(rng, "b1", (h,), 0.1), _init(rng, "w2", (h, d)),
             _init(rng, "b2", (d,), 0.1)]
    shape = (1, 8, d)
    graph = helper.make_graph(nodes, "block", [helper.make_tensor_value_info("x", 1, shape)],
                              [helper.make_tensor_value_info("y", 1, shape)], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), shape


MODELS = {"cnn": cnn, "block": block}


def _save(built: tuple[onnx.ModelProto, tuple[int, ...]], path: Path) -> tuple[str, tuple[int, ...]]:
    onnx.save(built[0], str(path))
    return str(path), built[1]


def quantize(src: str, shape: tuple[int, ...], kind: str, out: Path) -> str:
    q = quantization
    if kind == "dynamic":
        q.quantize_dynamic(src, str(out), weight_type=q.QuantType.QUInt8)
    elif kind.startswith("nbits"):
        from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

        fmt = q.QuantFormat.QDQ if kind.endswith("qdq") else q.QuantFormat.QOperator
        quantizer = MatMulNBitsQuantizer(onnx.load(src), bits=4, block_size=16, is_symmetric=False, quant_format=fmt)
        quantizer.process()
        quantizer.model.save_model_to_file(str(out))
    elif kind == "QDQ16-contrib":  # 16-bit activations and weights: com.microsoft Quantize/DequantizeLinear
        q.quantize_static(src, str(out), calibration(shape), quant_format=q.QuantFormat.QDQ,
                          activation_type=q.QuantType.QUInt16, weight_type=q.QuantType.QInt16,
                          extra_options={"UseQDQContribOps": True})
    else:
        fmt, per_channel = kind.split("-")
        q.quantize_static(src, str(out), calibration(shape), quant_format=getattr(q.QuantFormat, fmt),
                          per_channel=per_channel == "channel", activation_type=q.QuantType.QUInt8,
                          weight_type=q.QuantType.QInt8, reduce_range=True)
    return str(out)


def _step(path: str) -> float:
    """The quantization step of the graph's output: the scale of the DequantizeLinear that produces it (a float
    output: 0, then compared to 1e-5)."""
    model = onnx.load(path)
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    made = {o: node for node in model.graph.node for o in node.output}
    node = made.get(model.graph.output[0].name)
    if node is None or node.op_type != "DequantizeLinear":
        return 0.0
    return float(np.max(inits[node.input[1]]))


def _ort(path: str, feeds: dict[str, np.ndarray], optimize: bool) -> np.ndarray:
    so = ort.SessionOptions()
    if not optimize:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"]).run(None, feeds)[0]


KINDS = ["QDQ-tensor", "QDQ-channel", "QOperator-tensor", "QOperator-channel", "QDQ16-contrib", "dynamic", "nbits",
         "nbits-qdq"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", MODELS)
def test_quantized_model_matches_onnxruntime(tmp_path: Path, name: str, kind: str) -> None:
    if kind.startswith("nbits") and name == "cnn":
        pytest.skip("MatMulNBitsQuantizer quantizes MatMuls: the CNN has none")
    src, shape = _save(MODELS[name](), tmp_path / f"{name}.onnx")
    path = quantize(src, shape, kind, tmp_path / f"{name}-{kind}.onnx")
    feeds = {"x": np.random.default_rng(4).standard_normal(shape).astype(np.float32)}
    got = ctxrt.InferenceSession(path).run(None, feeds)[0]
    want = _ort(path, feeds, optimize=False)
    step = _step(path)
    assert np.abs(got - want).max() <= max(step, 1e-5) * 1.001, (np.abs(got - want).max(), step)
    # onnxruntime's fused integer kernels (optimizations on): a few steps at most, on a handful of values
    assert np.abs(got - _ort(path, feeds, optimize=True)).max() <= max(4 * step, 0.05)

    backend = get_backend("cpu")  # the same through a context binary
    graphs, weights = compile_graphs([(path, None, "main")], backend)
    binary = save_context(tmp_path / "m.ctx", graphs, weights, backend, [path])
    with ctxrt.context_from_binary(binary) as ctx:
        np.testing.assert_array_equal(ctx.graph().run(feeds)[ctx.graph().outputs[0].name], got)


@pytest.mark.parametrize("name,kind,ratio", [("cnn", "QDQ-channel", 0.3), ("block", "QDQ-tensor", 0.3),
                                             ("block", "nbits", 0.22), ("block", "nbits-qdq", 0.22)])
def test_context_binary_keeps_quantized_weights(tmp_path: Path, name: str, kind: str, ratio: float) -> None:
    """A QDQ model's weights stay int8 (4-bit: packed) in the binary, not folded into float copies."""
    built = cnn(64) if name == "cnn" else block(128, 512)
    src, shape = _save(built, tmp_path / f"{name}.onnx")
    path = quantize(src, shape, kind, tmp_path / f"{name}-{kind}.onnx")
    backend = get_backend("cpu")
    sizes_out = {}
    for label, model in (("float", src), ("quantized", path)):
        graphs, weights = compile_graphs([(model, None, "main")], backend)
        meta = ctxrt.read_metadata(save_context(tmp_path / f"{label}.ctx", graphs, weights, backend, [model]))
        sizes_out[label] = meta["weights_size"]
        dtypes = {entry[2] for entry in meta["weights"].values()}
    assert sizes_out["quantized"] <= ratio * sizes_out["float"], sizes_out
    assert dtypes & {"|i1", "|u1", "int4", "uint4"}, dtypes
    # the memory accounting says so: by storage type, in the context's stats and in `ctxrt inspect`
    with ctxrt.context_from_binary(tmp_path / "quantized.ctx") as ctx:
        by_type = ctx.weights_by_type()
        integers = sum(n for t, n in by_type.items() if t in ("int8", "uint8", "int4", "uint4"))
        assert integers >= 0.6 * sum(by_type.values()), by_type  # (4-bit blocks of 16: a float scale each)
        assert all(ctx.stats[f"weights_bytes_{t}"] == n for t, n in by_type.items())
    from ctxrt.cli_inspect import inspect_report

    assert inspect_report(ctxrt.read_metadata(tmp_path / "quantized.ctx"))["weights_by_type"] == by_type
