"""float16 and bfloat16 models computed in float32 (ir/passes/half.py, backends/cpu/widen.py): models converted by
onnxruntime's float16 converter (onnxconverter_common's `convert_float_to_float16`, with and without
`keep_io_types`) match onnxruntime within float16 precision, run their convolutions and GEMMs in float32, keep
their weights at half size in the context binary, and say what the float32 form costs in memory."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from small_nets import cnn, encoder

import ctxrt
from ctxrt.backends import get_backend
from ctxrt.backends.cpu.backend import CpuBackend
from ctxrt.compiler import compile_graphs, save_context

ort = pytest.importorskip("onnxruntime")
float16 = pytest.importorskip("onnxruntime.transformers.float16")

NETS = {"cnn": lambda: cnn(32), "encoder": lambda: encoder(96, 192, heads=4)}


def _half(model: onnx.ModelProto, keep_io_types: bool) -> onnx.ModelProto:
    copy = onnx.ModelProto.FromString(model.SerializeToString())
    return float16.convert_float_to_float16(copy, keep_io_types=keep_io_types)


def _feeds(shape: tuple[int, ...], half: bool) -> dict[str, np.ndarray]:
    x = np.random.default_rng(4).standard_normal(shape).astype(np.float32)
    return {"x": x.astype(np.float16) if half else x}


def _ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> np.ndarray:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]


def _close(got: np.ndarray, want: np.ndarray) -> None:
    """Within float16 precision: a few units in the last place of the output's scale."""
    assert got.dtype == want.dtype and got.shape == want.shape
    got, want = got.astype(np.float32), want.astype(np.float32)
    assert np.abs(got - want).max() <= 4e-3 * max(1.0, np.abs(want).max()), np.abs(got - want).max()


@pytest.mark.parametrize("keep_io_types", [False, True])
@pytest.mark.parametrize("name", NETS)
@pytest.mark.parametrize("onednn", [None, False])
def test_float16_model_matches_onnxruntime_in_float32_kernels(name: str, keep_io_types: bool,
                                                              onednn: bool | None) -> None:
    model, shape = NETS[name]()
    half = _half(model, keep_io_types)
    feeds = _feeds(shape, not keep_io_types)
    backend = CpuBackend(onednn=onednn)
    ctx = ctxrt.compile(half.SerializeToString(), backend=backend)
    try:
        got = ctx.graph().run(feeds)["y"]
    finally:
        ctx.free()
    _close(got, _ort(half, feeds))
    graphs, _ = compile_graphs([(half.SerializeToString(), None, "main")], backend)
    heavy = [s for s in graphs[0].steps if s.op in ("Conv", "MatMul", "Gemm")]
    assert heavy and all(s.outputs[0].dtype == "<f4" for s in heavy), [(s.op, s.outputs[0].dtype) for s in heavy]
    casts = [s for s in graphs[0].steps if s.op == "Cast"]
    assert len(casts) == (0 if keep_io_types else 2), [s.name for s in casts]  # converted once at each edge
    assert any("widened" in s.algorithm for s in heavy)


def test_unsorted_keep_io_types_graph_is_sorted_not_refused() -> None:
    """The converter appends the input Casts after the nodes reading them: valid, not topologically sorted."""
    model, shape = NETS["cnn"]()
    half = _half(model, keep_io_types=True)
    order = {o: k for k, node in enumerate(half.graph.node) for o in node.output}
    assert any(order.get(i, -1) > k for k, node in enumerate(half.graph.node) for i in node.input)
    feeds = _feeds(shape, False)
    _close(ctxrt.InferenceSession(half.SerializeToString()).run(None, feeds)[0], _ort(half, feeds))


def test_weights_stay_half_in_the_binary_and_widen_when_loaded(tmp_path: Path) -> None:
    model, shape = NETS["encoder"]()
    half = _half(model, keep_io_types=False)
    feeds = _feeds(shape, True)
    backend = get_backend("cpu")
    sizes, private = {}, {}
    for label, m in (("float", model), ("half", half)):
        graphs, weights = compile_graphs([(m.SerializeToString(), None, "main")], backend)
        path = save_context(tmp_path / f"{label}.ctx", graphs, weights, backend, [label])
        sizes[label] = ctxrt.read_metadata(path)["weights_size"]
        with ctxrt.context_from_binary(path) as ctx:
            private[label] = ctx.stats["alloc_kernel_bytes"]
            if label == "half":
                _close(ctx.graph().run(feeds)["y"], _ort(half, feeds))
    assert sizes["half"] <= 0.55 * sizes["float"], sizes
    # the float32 form of the large weights is the kernels' own memory, about the float model's weights
    assert 0.8 * sizes["float"] <= private["half"] - private["float"] <= 1.1 * sizes["float"], (private, sizes)


def _tiny(dtype: int, nodes: list, inits: list, shape: tuple[int, ...], out: list[int]) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("x", dtype, shape)],
                              [helper.make_tensor_value_info("y", dtype, out)], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_bfloat16_matmul_computes_in_float32() -> None:
    import ml_dtypes

    rng = np.random.default_rng(5)
    w = (rng.standard_normal((96, 80)) / 10).astype(ml_dtypes.bfloat16)
    b = (rng.standard_normal(80) / 10).astype(ml_dtypes.bfloat16)
    n = helper.make_node
    model = _tiny(TensorProto.BFLOAT16, [n("MatMul", ["x", "w"], ["m"]), n("Add", ["m", "b"], ["a"]),
                                         n("Relu", ["a"], ["y"])],
                  [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")], (12, 96), [12, 80])
    x = rng.standard_normal((12, 96)).astype(ml_dtypes.bfloat16)
    got = ctxrt.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    want = np.maximum(x.astype(np.float32) @ w.astype(np.float32) + b.astype(np.float32), 0)
    assert got.dtype == ml_dtypes.bfloat16
    np.testing.assert_allclose(got.astype(np.float32), want, rtol=1e-2, atol=1e-2)


def test_ops_outside_the_float32_region_keep_their_type_between_casts() -> None:
    """Mod (fmod) is left in float16: its input cast back, its output cast to float32 for the MatMul."""
    rng = np.random.default_rng(6)
    w = (rng.standard_normal((64, 80)) / 8).astype(np.float16)
    n = helper.make_node
    model = _tiny(TensorProto.FLOAT16, [n("Mul", ["x", "two"], ["d"]), n("Mod", ["d", "three"], ["r"], fmod=1),
                                        n("MatMul", ["r", "w"], ["y"])],
                  [numpy_helper.from_array(np.float16(2), "two"), numpy_helper.from_array(np.float16(3), "three"),
                   numpy_helper.from_array(w, "w")], (8, 64), [8, 80])
    feeds = {"x": rng.standard_normal((8, 64)).astype(np.float16)}
    graphs, _ = compile_graphs([(model.SerializeToString(), None, "main")], get_backend("cpu"))
    types = {s.op: s.inputs[0].dtype for s in graphs[0].steps}
    assert types["Mod"] == "<f2" and types["MatMul"] == "<f4" and types["Mul"] == "<f4"
    _close(ctxrt.InferenceSession(model.SerializeToString()).run(None, feeds)[0], _ort(model, feeds))


def test_gather_from_a_large_half_table_runs_on_the_table_as_stored() -> None:
    rng = np.random.default_rng(7)
    table = rng.standard_normal((4000, 32)).astype(np.float16)
    n = helper.make_node
    graph = helper.make_graph([n("Gather", ["table", "ids"], ["e"]), n("Relu", ["e"], ["y"])], "embed",
                              [helper.make_tensor_value_info("ids", TensorProto.INT64, [6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [6, 32])],
                              initializer=[numpy_helper.from_array(table, "table")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    feeds = {"ids": np.array([0, 5, 3999, 7, 7, 100], np.int64)}
    ctx = ctxrt.compile(model.SerializeToString())
    try:
        got = ctx.graph().run(feeds)["y"]
        assert ctx.stats["alloc_kernel_bytes"] < table.nbytes  # the table is not widened
    finally:
        ctx.free()
    np.testing.assert_array_equal(got, np.maximum(table[feeds["ids"]], 0))


@pytest.mark.parametrize("keep_io_types", [False, True])
def test_a_float16_models_exported_gelu_is_fused(keep_io_types: bool) -> None:
    """x * 0.5 * (1 + Erf(x / sqrt 2)) in a float16 model (its sqrt 2 rounded to float16, 1.4140625): fused into
    one Gelu once computed in float32 (no Erf left), within float16 precision of onnxruntime."""
    rng = np.random.default_rng(7)
    n = helper.make_node
    inits = [numpy_helper.from_array(rng.standard_normal((32, 64)).astype(np.float32) * 0.2, "w"),
             numpy_helper.from_array(np.float32(np.sqrt(2)), "sqrt2"), numpy_helper.from_array(np.float32(1), "one"),
             numpy_helper.from_array(np.float32(0.5), "half")]
    nodes = [n("MatMul", ["x", "w"], ["h"]), n("Div", ["h", "sqrt2"], ["s"]), n("Erf", ["s"], ["e"]),
             n("Add", ["e", "one"], ["p"]), n("Mul", ["half", "p"], ["q"]), n("Mul", ["h", "q"], ["y"])]
    graph = helper.make_graph(nodes, "gelu", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 64])], inits)
    model = _half(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), keep_io_types)
    graphs, _ = compile_graphs([(model, None, "main")], get_backend("cpu"))
    ops = [s.op for s in graphs[0].steps]
    assert "Erf" not in ops and ("Gelu" in ops or any(s.attrs.get("activation") == "Gelu" for s in graphs[0].steps))
    feeds = _feeds((8, 32), half=not keep_io_types)
    _close(ctxrt.InferenceSession(model.SerializeToString()).run(None, feeds)[0], _ort(model, feeds))


@pytest.mark.parametrize("keep_io_types", [False, True])
def test_a_float16_model_is_one_range_program_for_every_batch(keep_io_types: bool) -> None:
    """A float16 MLP whose batch is dynamic, through a session at batches 1..6 and back: one compile (its widened
    kernels recorded the probes' compile option, so every probe's program differed from the upper bound's and
    the session compiled each batch exactly), every output within float16 precision of onnxruntime's."""
    rng = np.random.default_rng(5)
    inits = [numpy_helper.from_array((rng.standard_normal((64, 256)) / 8).astype(np.float32), "w1"),
             numpy_helper.from_array(rng.standard_normal(256).astype(np.float32), "b1"),
             numpy_helper.from_array((rng.standard_normal((256, 32)) / 16).astype(np.float32), "w2")]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Add", ["h", "b1"], ["hb"]),
             helper.make_node("Relu", ["hb"], ["r"]), helper.make_node("MatMul", ["r", "w2"], ["y"])]
    g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 32])], inits)
    half = _half(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), keep_io_types)
    with ctxrt.InferenceSession(half.SerializeToString()) as sess:
        for b in (1, 2, 3, 4, 5, 6, 3, 1):
            feeds = _feeds((b, 64), not keep_io_types)
            _close(sess.run(None, feeds)[0], _ort(half, feeds))
        assert sess.stats["shape_variants_compiled"] == 1 and sess.stats["range_programs_compiled"] == 1
