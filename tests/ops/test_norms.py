"""LayerNormalization, InstanceNormalization, GroupNormalization, BatchNormalization and Gemm with every optional
input and output, vs onnx.reference (onnxruntime where the reference is wrong or missing, said per test)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from harness import ITERATOR_BUFFER, allocated, bind, check, make_model, rand, run_ctxrt
from onnx import helper

import ctxrt
from ctxrt.errors import UnsupportedOpError

RNG = np.random.default_rng(5)


def ort_check(nodes, feeds: dict, inits: dict, opset: int, types: list, rtol: float = 1e-4,
              atol: float = 1e-5) -> None:
    """ctxrt vs onnxruntime, output types given (where onnx.reference cannot run the node)."""
    import onnxruntime as ort

    model = make_model(nodes, feeds, inits, opset)
    for out, t in zip(model.graph.output, types, strict=True):
        out.type.tensor_type.elem_type = helper.np_dtype_to_tensor_dtype(np.dtype(t))
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    for g, w in zip(run_ctxrt(model, feeds), want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g.astype(np.float64), w, rtol=rtol, atol=atol)


# --- LayerNormalization --------------------------------------------------------------------------------

@pytest.mark.parametrize("axis", [-1, -2, 0, 1, 2])
@pytest.mark.parametrize("outputs", [["y"], ["y", "mean", "inv"], ["y", "", "inv"], ["y", "mean"]])
def test_layernorm_axis_and_optional_outputs(axis: int, outputs: list[str]) -> None:
    shape = (2, 3, 5)
    norm = shape[axis:]
    node = helper.make_node("LayerNormalization", ["x", "s", "b"], outputs, axis=axis, epsilon=1e-3)
    check(node, {"x": rand(*shape)}, {"s": rand(*norm), "b": rand(*norm)}, opset=17, rtol=1e-4, atol=1e-5)


def test_layernorm_run_time_scale_no_bias_and_broadcast_parameters() -> None:
    node = helper.make_node("LayerNormalization", ["x", "s"], ["y", "mean", "inv"])
    check(node, {"x": rand(2, 3, 8), "s": rand(8)}, opset=17, rtol=1e-4, atol=1e-5)
    node = helper.make_node("LayerNormalization", ["x", "s", "b"], ["y"], axis=1)
    check(node, {"x": rand(2, 3, 4)}, {"s": rand(1), "b": rand(4)}, opset=17, rtol=1e-4, atol=1e-5)
    check(node, {"x": rand(2, 3, 4), "s": rand(3, 1), "b": rand(1, 4)}, opset=17, rtol=1e-4, atol=1e-5)


def test_layernorm_float16_is_normalized_in_float32() -> None:
    # onnx.reference types Mean/InvStdDev as float16; the spec (and onnxruntime) as the stash type, float32
    node = helper.make_node("LayerNormalization", ["x", "s", "b"], ["y", "mean", "inv"], stash_type=1)
    x = rand(2, 3, 64, high=4.0).astype(np.float16)
    ort_check(node, {"x": x}, {"s": rand(64).astype(np.float16), "b": rand(64).astype(np.float16)}, 17,
              [np.float16, np.float32, np.float32], rtol=2e-3, atol=2e-3)


def test_layernorm_float64_and_in_place() -> None:
    node = helper.make_node("LayerNormalization", ["x", "s", "b"], ["y"])
    f64 = {k: rand(7).astype(np.float64) for k in "sb"}
    check(node, {"x": rand(3, 7).astype(np.float64)}, f64, opset=17)
    nodes = [helper.make_node("Add", ["x", "x"], ["t"]), helper.make_node("LayerNormalization", ["t", "s"], ["y", "m"])]
    check(nodes, {"x": rand(4, 6)}, {"s": rand(6)}, opset=17, rtol=1e-4, atol=1e-5)


def test_layernorm_runs_on_onednn_where_it_can() -> None:
    """float32 rows with Scale and B of the normalized shape, Y only: oneDNN's kernel (constant and run-time
    parameters, no B, in place after an Add); the optional outputs or a broadcast Scale: NumPy's."""
    from ctxrt.backends.cpu.onednn import api

    if not api.available():
        pytest.skip("oneDNN is not installed")
    cases = [([helper.make_node("LayerNormalization", ["x", "s", "b"], ["y"])], {"x": rand(1, 1, 256)},
              {"s": rand(256), "b": rand(256)}, True),
             ([helper.make_node("LayerNormalization", ["x", "s"], ["y"], axis=1)],
              {"x": rand(3, 4, 5), "s": rand(4, 5)}, {}, True),
             ([helper.make_node("Add", ["x", "x"], ["t"]), helper.make_node("LayerNormalization", ["t", "s"], ["y"])],
              {"x": rand(16, 384)}, {"s": rand(384)}, True),
             ([helper.make_node("LayerNormalization", ["x", "s", "b"], ["y", "m"])], {"x": rand(2, 8)},
              {"s": rand(8), "b": rand(8)}, False),
             ([helper.make_node("LayerNormalization", ["x", "s", "b"], ["y"], axis=1)], {"x": rand(2, 3, 4)},
              {"s": rand(1), "b": rand(4)}, False)]
    for nodes, feeds, inits, onednn in cases:
        check(nodes, feeds, inits, opset=17, rtol=1e-4, atol=1e-5)
        g = ctxrt.compile(make_model(nodes, feeds, inits, 17)).graph()
        algos = [k.algorithm for s, k in zip(g.compiled.steps, g._kernels, strict=True) if s.op == "LayerNormalization"]
        assert algos and all(a.startswith("onednn:layernorm") == onednn for a in algos), algos


# --- InstanceNormalization, GroupNormalization -------------------------------------------------------

@pytest.mark.parametrize("shape", [(2, 3, 5), (2, 3, 4, 5), (1, 2, 3, 4, 2), (2, 3, 1)])
@pytest.mark.parametrize("const", [True, False])
def test_instance_norm(shape, const: bool) -> None:
    node = helper.make_node("InstanceNormalization", ["x", "s", "b"], ["y"], epsilon=1e-4)
    params = {"s": rand(shape[1]), "b": rand(shape[1])}
    feeds, inits = ({"x": rand(*shape)}, params) if const else ({"x": rand(*shape), **params}, {})
    check(node, feeds, inits, opset=13, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("opset", [18, 21])
@pytest.mark.parametrize("groups", [1, 2, 6])
@pytest.mark.parametrize("const", [True, False])
def test_group_norm_per_group_at_18_per_channel_at_21(opset: int, groups: int, const: bool) -> None:
    c = 6
    n = c if opset >= 21 else groups
    node = helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=groups, epsilon=1e-3)
    params = {"s": rand(n), "b": rand(n)}
    feeds, inits = ({"x": rand(2, c, 3, 2)}, params) if const else ({"x": rand(2, c, 3, 2), **params}, {})
    check(node, feeds, inits, opset=opset, rtol=1e-4, atol=1e-5)
    check(node, feeds, inits, opset=opset, rtol=1e-4, atol=1e-5, oracle="onnxruntime")


def test_group_norm_float16_stash_and_a_chain_after_it() -> None:
    node = helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=2, stash_type=1)
    x = rand(2, 4, 5).astype(np.float16)
    check(node, {"x": x}, {"s": rand(4).astype(np.float16), "b": rand(4).astype(np.float16)}, opset=21, rtol=2e-3,
          atol=2e-3)
    # onnx's shape inference types nothing after a GroupNormalization unless the frontend helps: a Conv follows
    nodes = [helper.make_node("GroupNormalization", ["x", "s", "b"], ["t"], num_groups=2),
             helper.make_node("Conv", ["t", "w"], ["y"])]
    check(nodes, {"x": rand(1, 4, 5, 5)}, {"s": rand(4), "b": rand(4), "w": rand(3, 4, 1, 1)}, opset=21, rtol=1e-4,
          atol=1e-5)


# --- BatchNormalization ------------------------------------------------------------------------------

def _bn_params() -> dict[str, np.ndarray]:
    return {"s": rand(3, low=0.5, high=1.5), "b": rand(3), "m": rand(3), "v": rand(3, low=0.5, high=1.5)}


@pytest.mark.parametrize("shape", [(2, 3), (2, 3, 5), (2, 3, 4, 4), (1, 3, 2, 2, 2)])
@pytest.mark.parametrize("opset", [9, 15])
def test_batchnorm_inference_with_run_time_parameters(shape, opset: int) -> None:
    # onnx.reference's BatchNormalization-9 takes its training path whenever momentum has its default:
    # onnxruntime is the oracle at opset 9
    oracle = "onnxruntime" if opset < 14 else "reference"
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], epsilon=1e-3)
    check(node, {"x": rand(*shape), **_bn_params()}, opset=opset, rtol=1e-5, atol=1e-5, oracle=oracle)
    check(node, {"x": rand(*shape)}, _bn_params(), opset=opset, rtol=1e-5, atol=1e-5, oracle=oracle)


@pytest.mark.parametrize("opset", [14, 15])
@pytest.mark.parametrize("const", [True, False])
def test_batchnorm_training_mode_running_statistics(opset: int, const: bool) -> None:
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y", "rm", "rv"], training_mode=1,
                            momentum=0.8, epsilon=1e-4)
    feeds, inits = ({"x": rand(4, 3, 5, 2)}, _bn_params()) if const else ({"x": rand(4, 3, 5, 2), **_bn_params()}, {})
    check(node, feeds, inits, opset=opset, rtol=1e-4, atol=1e-5)
    check(node, feeds, inits, opset=opset, rtol=1e-4, atol=1e-5, oracle="onnxruntime")


def test_batchnorm_9_training_outputs_as_onnxruntime() -> None:
    # onnx.reference's BatchNormalization-9 normalizes with the updated running statistics and has no extra
    # outputs; onnxruntime uses the batch's (as opset 14) and returns saved_var as 1/std: it is the oracle
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y", "rm", "rv", "sm", "sv"])
    ort_check(node, {"x": rand(2, 3, 4), **_bn_params()}, {}, 13, [np.float32] * 5)


def test_batchnorm_training_in_place() -> None:
    nodes = [helper.make_node("Relu", ["x"], ["t"]),
             helper.make_node("BatchNormalization", ["t", "s", "b", "m", "v"], ["y", "rm", "rv"], training_mode=1)]
    check(nodes, {"x": rand(3, 3, 4)}, _bn_params(), opset=15, rtol=1e-4, atol=1e-5)


# --- Gemm ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("c_shape", [None, (), (1,), (7,), (1, 7), (5, 1), (5, 7)])
@pytest.mark.parametrize("c_const", [True, False])
@pytest.mark.parametrize("ta, tb", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_gemm_any_c(c_shape, c_const: bool, ta: int, tb: int) -> None:
    a = rand(6, 5) if ta else rand(5, 6)
    b = rand(7, 6) if tb else rand(6, 7)
    feeds, inits = {"a": a}, {"b": b}
    if c_shape is not None:
        (inits if c_const else feeds)["c"] = rand(*c_shape)
    node = helper.make_node("Gemm", ["a", "b"] + (["c"] if c_shape is not None else []), ["y"], alpha=0.7, beta=1.9,
                            transA=ta, transB=tb)
    check(node, feeds, inits, opset=13, rtol=1e-5, atol=1e-5)


def test_gemm_beta_zero_integers_run_time_b_and_fused_relu() -> None:
    check(helper.make_node("Gemm", ["a", "b", "c"], ["y"], beta=0.0),
          {"a": rand(3, 4), "b": rand(4, 2), "c": rand(3, 2)}, opset=13)
    ints = {k: RNG.integers(-3, 3, s).astype(np.int64) for k, s in (("a", (3, 4)), ("b", (4, 2)), ("c", (2,)))}
    check(helper.make_node("Gemm", ["a", "b", "c"], ["y"]), ints, opset=13)
    check(helper.make_node("Gemm", ["a", "b", "c"], ["y"], transB=1, alpha=2.0),
          {"a": rand(3, 4), "b": rand(2, 4), "c": rand(2)}, opset=13)
    nodes = [helper.make_node("Gemm", ["a", "b", "c"], ["t"], beta=0.3), helper.make_node("Relu", ["t"], ["y"])]
    check(nodes, {"a": rand(3, 4), "c": rand(3, 1)}, {"b": rand(4, 2)}, opset=13)


# --- errors and allocation -------------------------------------------------------------------------------

@pytest.mark.parametrize("node, feeds, opset, needle", [
    (helper.make_node("LayerNormalization", ["x", "s"], ["y"], name="ln", stash_type=7), {"s": rand(4)}, 17,
     "'stash_type' value 7"),
    (helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"], name="gn", num_groups=3),
     {"s": rand(4), "b": rand(4)}, 21, "'num_groups' value 3"),
])
def test_unsupported_values_name_op_node_and_attribute(node: onnx.NodeProto, feeds: dict, opset: int,
                                                       needle: str) -> None:
    with pytest.raises(UnsupportedOpError, match=needle) as e:
        ctxrt.compile(make_model(node, {"x": rand(2, 4, 4), **feeds}, opset=opset))
    assert node.op_type in str(e.value) and repr(node.name) in str(e.value)


def test_launches_allocate_nothing() -> None:
    x = rand(4, 32, 64)
    p = {k: v for k, v in _bn_params().items()}
    launches = [
        bind("LayerNormalization", [x, rand(64), rand(64)], [np.empty_like(x), np.empty((4, 32, 1), np.float32),
                                                              np.empty((4, 32, 1), np.float32)]),
        bind("LayerNormalization", [x.astype(np.float16), rand(64)], [np.empty(x.shape, np.float16)]),
        bind("InstanceNormalization", [x, rand(32), rand(32)], [np.empty_like(x)]),
        bind("GroupNormalization", [x, rand(32), rand(32)], [np.empty_like(x)], {"num_groups": 8}, opset=21),
        bind("BatchNormalization", [rand(4, 3, 64), p["s"], p["b"], p["m"], p["v"]],
             [np.empty((4, 3, 64), np.float32)]),
        bind("BatchNormalization", [rand(4, 3, 64), p["s"], p["b"], p["m"], p["v"]],
             [np.empty((4, 3, 64), np.float32), np.empty(3, np.float32), np.empty(3, np.float32)],
             {"training_mode": 1}, opset=15),
        bind("Gemm", [rand(32, 64), rand(64, 16), rand(32, 1)], [np.empty((32, 16), np.float32)], {"beta": 0.5}),
    ]
    for launch in launches:
        assert allocated(launch) < ITERATOR_BUFFER
