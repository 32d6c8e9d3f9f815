"""Zero-size dimensions: inputs, intermediates and outputs with a 0 dim, against onnxruntime. A decoder's first
step has an empty past (past length 0) concatenated with the new keys; Split parts, Slice results, Gather
indices, NonZero and NonMaxSuppression results and Trilu inputs may be empty."""

from __future__ import annotations

import harness
import numpy as np
import onnx
import pytest
from harness import check, rand
from onnx import helper, numpy_helper

import ctxrt

HEADS, HEAD_DIM = 2, 8
MODEL = HEADS * HEAD_DIM


def i64(*v: int) -> np.ndarray:
    return np.array(v, np.int64)


def attention_model() -> onnx.ModelProto:
    """One decoder self-attention block with a key/value cache: Concat(past, new) along the sequence axis, the
    scores' MatMul, Softmax, the MatMul with the values; outputs the block's result and the present cache.
    Batch, sequence and past length are dynamic."""
    rng = np.random.default_rng(7)
    w = {n: (rng.standard_normal((MODEL, MODEL)) / 4).astype(np.float32) for n in ("wq", "wk", "wv", "wo")}
    split_heads = i64(0, 0, HEADS, HEAD_DIM)
    nodes = []
    for n in ("q", "k", "v"):
        nodes += [helper.make_node("MatMul", ["x", f"w{n}"], [f"{n}_flat"]),
                  helper.make_node("Reshape", [f"{n}_flat", "heads"], [f"{n}_4d"]),
                  helper.make_node("Transpose", [f"{n}_4d"], [f"{n}_new"], perm=[0, 2, 1, 3])]
    nodes += [
        helper.make_node("Concat", ["past_k", "k_new"], ["present_k"], axis=2),
        helper.make_node("Concat", ["past_v", "v_new"], ["present_v"], axis=2),
        helper.make_node("Transpose", ["present_k"], ["k_t"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q_new", "k_t"], ["scores"]),
        helper.make_node("Mul", ["scores", "scale"], ["scaled"]),
        helper.make_node("Softmax", ["scaled"], ["probs"], axis=-1),
        helper.make_node("MatMul", ["probs", "present_v"], ["ctx"]),
        helper.make_node("Transpose", ["ctx"], ["ctx_t"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["ctx_t", "merge"], ["ctx_flat"]),
        helper.make_node("MatMul", ["ctx_flat", "wo"], ["y"]),
    ]
    f32 = onnx.TensorProto.FLOAT
    cache = ["batch", HEADS, "past", HEAD_DIM]
    inputs = [helper.make_tensor_value_info("x", f32, ["batch", "seq", MODEL]),
              helper.make_tensor_value_info("past_k", f32, cache), helper.make_tensor_value_info("past_v", f32, cache)]
    outputs = [helper.make_tensor_value_info("y", f32, ["batch", "seq", MODEL]),
               helper.make_tensor_value_info("present_k", f32, ["batch", HEADS, "total", HEAD_DIM]),
               helper.make_tensor_value_info("present_v", f32, ["batch", HEADS, "total", HEAD_DIM])]
    inits = {**w, "heads": split_heads, "merge": i64(0, 0, MODEL), "scale": np.float32(HEAD_DIM ** -0.5)}
    graph = helper.make_graph(nodes, "attention", inputs, outputs,
                              [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def attention_feeds(batch: int, seq: int, past: int) -> dict[str, np.ndarray]:
    return {"x": rand(batch, seq, MODEL), "past_k": rand(batch, HEADS, past, HEAD_DIM),
            "past_v": rand(batch, HEADS, past, HEAD_DIM)}


def compare(got: list[np.ndarray], want: list[np.ndarray]) -> None:
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def test_attention_with_an_empty_past_in_a_session() -> None:
    import onnxruntime as ort

    model = attention_model().SerializeToString()
    oracle = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    with ctxrt.InferenceSession(model, harness.BACKEND) as sess:
        feeds = attention_feeds(1, 5, 0)  # the prompt: nothing cached yet
        y, k, v = sess.run(None, feeds)
        compare([y, k, v], oracle.run(None, feeds))
        assert k.shape == (1, HEADS, 5, HEAD_DIM)
        for _ in range(2):  # the next tokens read the cache the previous step returned
            feeds = {"x": rand(1, 1, MODEL), "past_k": k, "past_v": v}
            y, k, v = sess.run(None, feeds)
            compare([y, k, v], oracle.run(None, feeds))
        assert k.shape == (1, HEADS, 7, HEAD_DIM)


def test_attention_with_an_empty_past_compiled() -> None:
    import onnxruntime as ort

    model = attention_model()
    feeds = attention_feeds(2, 3, 0)
    ctx = ctxrt.compile(model, {n: a.shape for n, a in feeds.items()}, backend=harness.BACKEND)
    try:
        got = ctx.graph().run(feeds)
    finally:
        ctx.free()
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    compare([got[o.name] for o in model.graph.output], want)


def test_zero_size_inputs_and_outputs_through_the_whole_graph() -> None:
    """Every tensor empty: nothing to compute, outputs of the right shape."""
    x = rand(3, 0, 4)
    check([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Add", ["r", "x"], ["y"]),
           helper.make_node("Transpose", ["y"], ["t"], perm=[2, 1, 0])], {"x": x}, oracle="onnxruntime")


@pytest.mark.parametrize("k", [0, 3])
def test_matmul_over_an_empty_inner_dim_is_zeros(k: int) -> None:
    y = check(helper.make_node("MatMul", ["a", "b"], ["y"]), {"a": rand(2, 4, 0), "b": rand(0, k)},
              oracle="onnxruntime")[0]
    assert y.shape == (2, 4, k) and not y.any()


@pytest.mark.parametrize("rows, inner", [(0, 16), (3, 0)])
def test_matmul_with_constant_weights_and_an_empty_dim(rows: int, inner: int) -> None:
    check(helper.make_node("MatMul", ["a", "w"], ["y"]), {"a": rand(2, rows, inner)}, {"w": rand(inner, 8)},
          oracle="onnxruntime")


def test_gemm_over_an_empty_inner_dim_adds_the_bias() -> None:
    check(helper.make_node("Gemm", ["a", "b", "c"], ["y"], alpha=2.0, beta=0.5),
          {"a": rand(3, 0), "b": rand(0, 5), "c": rand(3, 5)}, oracle="onnxruntime")


def test_concat_with_empty_parts() -> None:
    check(helper.make_node("Concat", ["a", "b", "c"], ["y"], axis=1),
          {"a": rand(2, 0, 3), "b": rand(2, 4, 3), "c": rand(2, 0, 3)}, oracle="onnxruntime")


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
                                "ReduceL2", "ReduceSumSquare", "ReduceLogSumExp", "ReduceLogSum"])
def test_reductions_over_an_empty_axis(op: str) -> None:
    check(helper.make_node(op, ["x", "axes"], ["y"], keepdims=0), {"x": rand(2, 0, 3)}, {"axes": i64(1)},
          opset=18, oracle="onnxruntime")


@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin"])
@pytest.mark.parametrize("dtype", [np.int32, np.bool_])
def test_max_and_min_over_an_empty_axis_of_integers(op: str, dtype: type) -> None:
    check(helper.make_node(op, ["x", "axes"], ["y"]), {"x": np.zeros((2, 0, 3), dtype)}, {"axes": i64(1)},
          opset=20, oracle="reference")


@pytest.mark.parametrize("shape, axis", [((2, 0), -1), ((0, 5), -1), ((2, 0, 3), 1)])
@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_softmax_of_empty_tensors(op: str, shape: tuple[int, ...], axis: int) -> None:
    check(helper.make_node(op, ["x"], ["y"], axis=axis), {"x": rand(*shape)}, opset=13, oracle="onnxruntime")


def test_split_with_an_empty_part() -> None:
    check(helper.make_node("Split", ["x", "sizes"], ["a", "b", "c"], axis=1), {"x": rand(2, 5)},
          {"sizes": i64(2, 0, 3)}, opset=13, oracle="onnxruntime")


def test_slice_to_empty_then_concat() -> None:
    check([helper.make_node("Slice", ["x", "starts", "ends", "axes"], ["s"]),
           helper.make_node("Concat", ["s", "x"], ["y"], axis=0)],
          {"x": rand(4, 3)}, {"starts": i64(2), "ends": i64(2), "axes": i64(0)}, oracle="onnxruntime")


def test_gather_with_empty_indices() -> None:
    check(helper.make_node("Gather", ["x", "i"], ["y"], axis=1), {"x": rand(3, 4), "i": np.zeros((0, 2), np.int64)},
          oracle="onnxruntime")


@pytest.mark.parametrize("upper", [0, 1])
def test_trilu_of_an_empty_matrix(upper: int) -> None:
    check(helper.make_node("Trilu", ["x"], ["y"], upper=upper), {"x": rand(3, 0, 5)}, oracle="onnxruntime")


def test_pad_of_an_empty_tensor() -> None:
    check(helper.make_node("Pad", ["x", "pads", "value"], ["y"]), {"x": rand(0, 3)},
          {"pads": i64(1, 0, 2, 1), "value": np.float32(2.5)}, oracle="onnxruntime")


@pytest.mark.parametrize("shape", [(3, 4), (0, 4)])
def test_nonzero_with_an_empty_result(shape: tuple[int, ...]) -> None:
    y = check(helper.make_node("NonZero", ["x"], ["y"]), {"x": np.zeros(shape, np.float32)}, oracle="onnxruntime")[0]
    assert y.shape == (2, 0)


@pytest.mark.parametrize("boxes", [0, 3])
def test_non_max_suppression_with_an_empty_result(boxes: int) -> None:
    feeds = {"boxes": rand(1, boxes, 4, low=0, high=1), "scores": rand(1, 2, boxes, low=0, high=0.5)}
    y = check(helper.make_node("NonMaxSuppression", ["boxes", "scores", "limit", "iou", "threshold"], ["y"]), feeds,
              {"limit": i64(2), "iou": np.float32(0.5), "threshold": np.float32(0.9)}, opset=11,
              oracle="onnxruntime")[0]
    assert y.shape == (0, 3)
