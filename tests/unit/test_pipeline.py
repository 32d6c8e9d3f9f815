"""Frontend, passes and executor on hand-made graphs: folding, aliases, in-place, errors, no allocation."""

import warnings

import numpy as np
import onnx
import pytest
from harness import ITERATOR_BUFFER, steady_state_allocation
from onnx import TensorProto, helper, numpy_helper

import ctxrt
from ctxrt.compiler.program import ARENA, INPUT, OUTPUT


def _model(nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, "t", inputs, outputs, initializer=list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def _vi(name, shape, dtype=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, dtype, shape)


def test_shape_arithmetic_folds_away_and_reshape_is_a_view() -> None:
    # y = Reshape(Relu(x), Concat(Shape(x)[0:1], [-1])) then Relu: the shape chain folds, the Reshape
    # becomes a zero-copy alias, and only the two Relus run.
    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Slice", ["s", "zero", "one"], ["s0"]),
        helper.make_node("Concat", ["s0", "minus1"], ["target"], axis=0),
        helper.make_node("Reshape", ["r", "target"], ["flat"]),
        helper.make_node("Relu", ["flat"], ["y"]),
    ]
    inits = [numpy_helper.from_array(np.array([v], np.int64), n) for n, v in
             [("zero", 0), ("one", 1), ("minus1", -1)]]
    m = _model(nodes, [_vi("x", ["N", 3, 4])], [_vi("y", None)], inits)
    ctx = ctxrt.compile(m, shapes={"x": (2, 3, 4)})
    g = ctx.graph()
    assert [s.op for s in g.compiled.steps] == ["Relu", "Relu"]
    x = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    np.testing.assert_array_equal(g.run({"x": x})["y"], np.maximum(x, 0).reshape(2, 12))
    first, second = g.compiled.steps
    assert first.outputs[0].space == ARENA and second.inputs[0].offset == first.outputs[0].offset


def test_elementwise_chain_runs_in_place() -> None:
    nodes = [helper.make_node("Exp", ["x"], ["a"]), helper.make_node("Relu", ["a"], ["b"]),
             helper.make_node("Tanh", ["b"], ["c"]), helper.make_node("Relu", ["c"], ["y"])]
    m = _model(nodes, [_vi("x", [8, 16])], [_vi("y", None)])
    g = ctxrt.compile(m).graph()
    steps = g.compiled.steps
    assert steps[0].inputs[0].space == INPUT and steps[-1].outputs[0].space == OUTPUT
    arena_offsets = {r.offset for s in steps for r in s.inputs + s.outputs if r.space == ARENA}
    assert len(arena_offsets) == 1  # a, b, c share one buffer
    assert g.spillfill_size == 8 * 16 * 4


def test_batchnorm_folds_into_conv() -> None:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    bn = [rng.uniform(0.5, 1.5, 4).astype(np.float32) for _ in range(4)]
    inits = [numpy_helper.from_array(w, "w")] + [numpy_helper.from_array(a, n) for a, n in
                                                 zip(bn, ["g", "b", "m", "v"], strict=True)]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "g", "b", "m", "v"], ["y"])]
    m = _model(nodes, [_vi("x", [1, 3, 8, 8])], [_vi("y", None)], inits)
    ctx = ctxrt.compile(m)
    assert [s.op for s in ctx.graph().compiled.steps] == ["Conv"]
    x = rng.standard_normal((1, 3, 8, 8)).astype(np.float32)
    from onnx.reference import ReferenceEvaluator

    want = ReferenceEvaluator(m).run(None, {"x": x})[0]
    np.testing.assert_allclose(ctx.graph().run({"x": x})["y"], want, rtol=1e-4, atol=1e-5)


def test_initializers_listed_as_inputs_are_constants() -> None:
    w = numpy_helper.from_array(np.ones((3,), np.float32), "w")
    m = _model([helper.make_node("Add", ["x", "w"], ["y"])], [_vi("x", [3]), _vi("w", [3])], [_vi("y", None)],
               [w])
    g = ctxrt.compile(m).graph()
    assert [i.name for i in g.inputs] == ["x"]
    np.testing.assert_array_equal(g.run({"x": np.zeros(3, np.float32)})["y"], np.ones(3, np.float32))


def test_unsupported_ops_are_all_listed_before_any_work() -> None:
    # ops of a domain ctxrt does not implement (onnx.checker leaves them unchecked)
    nodes = [helper.make_node("Relu", ["x"], ["a"]),
             helper.make_node("Frob", ["a"], ["b"], name="d1", domain="org.example"),
             helper.make_node("Twist", ["b"], ["c"], name="c1", domain="org.example"),
             helper.make_node("Frob", ["c"], ["y"], name="d2", domain="org.example")]
    m = _model(nodes, [_vi("x", [2, 2])], [_vi("y", None)])
    m.opset_import.append(helper.make_opsetid("org.example", 1))
    with pytest.raises(ctxrt.UnsupportedOpError) as e:
        ctxrt.compile(m)
    assert "org.example.Twist (c1)" in str(e.value) and "org.example.Frob (d1, d2)" in str(e.value)


def test_unbound_dynamic_dims_bind_to_one_with_a_warning() -> None:
    m = _model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", ["N", "S"])], [_vi("y", None)])
    with pytest.warns(ctxrt.errors.CtxrtWarning, match=r"input 'x' axis 0 \(N\), input 'x' axis 1 \(S\)"):
        assert ctxrt.compile(m).graph().inputs[0].shape == (1, 1)
    m2 = _model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", ["N", 5])], [_vi("y", None)])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing bound by default: nothing said
        assert ctxrt.compile(m2, shapes={"x": (3, 5)}).graph().inputs[0].shape == (3, 5)
    with pytest.raises(ctxrt.ShapeError, match="unknown inputs"):
        ctxrt.compile(m2, shapes={"nope": (1, 5)})
    with pytest.raises(ctxrt.ShapeError, match="fixed at 5"):
        ctxrt.compile(m2, shapes={"x": (1, 6)})


def test_wrong_feeds_raise_shape_errors() -> None:
    m = _model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", [2, 3])], [_vi("y", None)])
    g = ctxrt.compile(m).graph()
    with pytest.raises(ctxrt.ShapeError, match="expects float32"):
        g.run({"x": np.zeros((2, 3), np.float64)})
    with pytest.raises(ctxrt.ShapeError, match=r"\[2, 3\]"):
        g.run({"x": np.zeros((3, 2), np.float32)})
    with pytest.raises(ctxrt.ShapeError, match="missing"):
        g.run({})


def test_freed_context_refuses_to_run() -> None:
    m = _model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", [2])], [_vi("y", None)])
    ctx = ctxrt.compile(m)
    g = ctx.graph()
    ctx.free()
    with pytest.raises(ctxrt.LifecycleError, match="freed"):
        g.run({"x": np.zeros(2, np.float32)})


def test_malformed_model_files_raise_model_error(tmp_path) -> None:
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x08\x07garbage" * 10)
    with pytest.raises(ctxrt.ModelError):
        ctxrt.compile(bad)
    with pytest.raises(ctxrt.ModelError, match="no such"):
        ctxrt.compile(tmp_path / "missing.onnx")


def test_steady_state_execute_allocates_no_numpy_memory() -> None:
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((16, 8, 3, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal((16,)).astype(np.float32), "b")]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Flatten", ["p"], ["f"]),
             helper.make_node("Softmax", ["f"], ["y"], axis=1)]
    m = _model(nodes, [_vi("x", [1, 8, 64, 64])], [_vi("y", None)], inits, opset=13)
    g = ctxrt.compile(m).graph()
    feeds = {"x": rng.standard_normal((1, 8, 64, 64)).astype(np.float32)}
    outs = {"y": np.empty((1, 16 * 32 * 32), np.float32)}
    peak, growth = steady_state_allocation(lambda: g.execute(feeds, outs))
    smallest_tensor = 16 * 32 * 32 * 4
    assert smallest_tensor > ITERATOR_BUFFER
    assert peak < ITERATOR_BUFFER
    assert growth < 2048  # nothing accumulates from run to run


def test_onnx_model_with_external_data_loads(tmp_path) -> None:
    w = numpy_helper.from_array(np.arange(4096, dtype=np.float32), "w")
    m = _model([helper.make_node("Add", ["x", "w"], ["y"])], [_vi("x", [4096])], [_vi("y", None)], [w])
    onnx.save_model(m, tmp_path / "m.onnx", save_as_external_data=True, location="m.data", size_threshold=0)
    assert (tmp_path / "m.data").exists()
    g = ctxrt.compile(tmp_path / "m.onnx").graph()
    np.testing.assert_array_equal(g.run({"x": np.ones(4096, np.float32)})["y"], np.arange(4096) + 1.0)


@pytest.mark.parametrize("head", ["Conv", "BatchNormalization"])
def test_per_channel_mul_add_fold_into_conv_and_batchnorm(head) -> None:
    rng = np.random.default_rng(3)
    c = 6
    inits = {"w": rng.standard_normal((c, c, 3, 3)).astype(np.float32),
             "s": rng.uniform(0.5, 1.5, (c, 1, 1)).astype(np.float32),
             "t": rng.standard_normal((c, 1, 1)).astype(np.float32)}
    if head == "Conv":
        first = helper.make_node("Conv", ["x", "w"], ["h"], pads=[1, 1, 1, 1])
    else:
        for k in ("g", "b", "m"):
            inits[k] = rng.uniform(0.5, 1.5, c).astype(np.float32)
        inits["v"] = rng.uniform(0.5, 1.5, c).astype(np.float32)
        first = helper.make_node("BatchNormalization", ["x", "g", "b", "m", "v"], ["h"])
    nodes = [first, helper.make_node("Mul", ["h", "s"], ["hm"]), helper.make_node("Add", ["hm", "t"], ["y"])]
    m = _model(nodes, [_vi("x", [1, c, 5, 5])], [_vi("y", None)],
               [numpy_helper.from_array(v, k) for k, v in inits.items()])
    ctx = ctxrt.compile(m)
    assert [s.op for s in ctx.graph().compiled.steps] == [head]
    from onnx.reference import ReferenceEvaluator

    x = rng.standard_normal((1, c, 5, 5)).astype(np.float32)
    want = ReferenceEvaluator(m).run(None, {"x": x})[0]
    np.testing.assert_allclose(ctx.graph().run({"x": x})["y"], want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("spelling", ["legacy", "dynamo"])
def test_exported_gelu_becomes_one_kernel(spelling) -> None:
    consts = {"sqrt2": np.array(np.sqrt(2.0), np.float32), "one": np.array(1.0, np.float32),
              "half": np.array(0.5, np.float32)}
    nodes = [helper.make_node("Div", ["x", "sqrt2"], ["d"]), helper.make_node("Erf", ["d"], ["e"]),
             helper.make_node("Add", ["e", "one"], ["a"])]
    if spelling == "legacy":  # (x * (1 + erf)) * 0.5
        nodes += [helper.make_node("Mul", ["x", "a"], ["m"]), helper.make_node("Mul", ["m", "half"], ["y"])]
    else:  # x * (0.5 * (1 + erf))
        nodes += [helper.make_node("Mul", ["half", "a"], ["m"]), helper.make_node("Mul", ["x", "m"], ["y"])]
    m = _model(nodes, [_vi("x", [4, 40000])], [_vi("y", None)],
               [numpy_helper.from_array(v, k) for k, v in consts.items()])
    g = ctxrt.compile(m).graph()
    assert [s.op for s in g.compiled.steps] == ["Gelu"]
    x = np.random.default_rng(0).standard_normal((4, 40000)).astype(np.float32) * 3
    from onnx.reference import ReferenceEvaluator

    want = ReferenceEvaluator(m).run(None, {"x": x})[0]
    np.testing.assert_allclose(g.run({"x": x})["y"], want, rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("spelling", ["legacy", "dynamo", "shared-cube"])
def test_exported_tanh_gelu_becomes_one_kernel(spelling) -> None:
    """GPT-2's GELU, 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), as both torch exporters spell it: one Gelu
    (approximate="tanh"); a cube that something else also reads is left alone."""
    consts = {"c1": np.array(0.044715, np.float32), "c2": np.array(np.sqrt(2 / np.pi), np.float32),
              "one": np.array(1.0, np.float32), "half": np.array(0.5, np.float32), "three": np.array(3.0, np.float32)}
    if spelling == "dynamo":  # Pow, constants first, x * (0.5 * (1 + t))
        nodes = [helper.make_node("Pow", ["x", "three"], ["p"]), helper.make_node("Mul", ["c1", "p"], ["m1"]),
                 helper.make_node("Add", ["x", "m1"], ["a1"]), helper.make_node("Mul", ["c2", "a1"], ["m2"]),
                 helper.make_node("Tanh", ["m2"], ["t"]), helper.make_node("Add", ["t", "one"], ["a2"]),
                 helper.make_node("Mul", ["half", "a2"], ["m3"]), helper.make_node("Mul", ["x", "m3"], ["y"])]
    else:  # x * (x * x), (x * (1 + t)) * 0.5
        nodes = [helper.make_node("Mul", ["x", "x"], ["sq"]), helper.make_node("Mul", ["x", "sq"], ["p"]),
                 helper.make_node("Mul", ["c1", "p"], ["m1"]), helper.make_node("Add", ["x", "m1"], ["a1"]),
                 helper.make_node("Mul", ["c2", "a1"], ["m2"]), helper.make_node("Tanh", ["m2"], ["t"]),
                 helper.make_node("Add", ["one", "t"], ["a2"]), helper.make_node("Mul", ["x", "a2"], ["m3"]),
                 helper.make_node("Mul", ["m3", "half"], ["y"])]
    outs = [_vi("y", None)] + ([_vi("sq", None)] if spelling == "shared-cube" else [])
    m = _model(nodes, [_vi("x", [4, 4096])], outs, [numpy_helper.from_array(v, k) for k, v in consts.items()])
    g = ctxrt.compile(m).graph()
    ops = [s.op for s in g.compiled.steps]
    assert ops == ["Gelu"] if spelling != "shared-cube" else "Gelu" not in ops
    if spelling != "shared-cube":
        assert g.compiled.steps[0].attrs["approximate"] == "tanh"
    x = np.random.default_rng(0).standard_normal((4, 4096)).astype(np.float32) * 3
    from onnx.reference import ReferenceEvaluator

    want = ReferenceEvaluator(m).run(None, {"x": x})[0]
    np.testing.assert_allclose(g.run({"x": x})["y"], want, rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("spelling", ["dynamo", "legacy", "div", "shared"])
def test_exported_rms_norm_becomes_one_kernel(spelling) -> None:
    """Llama's and Qwen2's RMS norm as torch exports it, x * (1 / sqrt(mean(x^2) + eps)) * gamma with float32
    Casts around it (dynamo: Pow, Div(1, s), the Casts; legacy: x * x, Reciprocal, gamma first; div: x / s): one
    RMSNormalization step, equal to the reference; a statistic that something else also reads is left alone."""
    rng = np.random.default_rng(5)
    consts = {"two": np.array(2.0, np.float32), "eps": np.array(1e-6, np.float32), "one": np.array(1.0, np.float32),
              "axes": np.array([-1], np.int64), "gamma": rng.uniform(0.5, 1.5, 96).astype(np.float32)}
    f32 = TensorProto.FLOAT
    if spelling == "legacy":
        nodes = [helper.make_node("Mul", ["x", "x"], ["sq"]), helper.make_node("ReduceMean", ["sq"], ["m"], axes=[-1]),
                 helper.make_node("Add", ["m", "eps"], ["a"]), helper.make_node("Sqrt", ["a"], ["s"]),
                 helper.make_node("Reciprocal", ["s"], ["r"]), helper.make_node("Mul", ["r", "x"], ["n"]),
                 helper.make_node("Mul", ["gamma", "n"], ["y"])]
        opset = 17
    else:
        nodes = [helper.make_node("Cast", ["x"], ["xc"], to=f32), helper.make_node("Pow", ["xc", "two"], ["sq"]),
                 helper.make_node("ReduceMean", ["sq", "axes"], ["m"], keepdims=1),
                 helper.make_node("Add", ["m", "eps"], ["a"]), helper.make_node("Sqrt", ["a"], ["s"])]
        if spelling == "div":
            nodes.append(helper.make_node("Div", ["xc", "s"], ["n"]))
        else:
            nodes += [helper.make_node("Div", ["one", "s"], ["r"]), helper.make_node("Mul", ["xc", "r"], ["n"])]
        nodes += [helper.make_node("Cast", ["n"], ["nc"], to=f32), helper.make_node("Mul", ["gamma", "nc"], ["y"])]
        opset = 18
    outs = [_vi("y", None)] + ([_vi("s", None)] if spelling == "shared" else [])
    m = helper.make_model(helper.make_graph(nodes, "rms", [_vi("x", [2, 7, 96])], outs,
                                            [numpy_helper.from_array(v, k) for k, v in consts.items()]),
                          opset_imports=[helper.make_opsetid("", opset)])
    g = ctxrt.compile(m).graph()
    ops = [s.op for s in g.compiled.steps]
    if spelling == "shared":
        assert "RMSNormalization" not in ops and "Cast" not in ops  # the same-type Casts still go
    else:
        assert ops == ["RMSNormalization"], ops
    x = rng.standard_normal((2, 7, 96)).astype(np.float32) * 3
    from onnx.reference import ReferenceEvaluator

    want = ReferenceEvaluator(m).run(None, {"x": x})[0]
    np.testing.assert_allclose(g.run({"x": x})["y"], want, rtol=1e-5, atol=1e-6)


def test_gated_mlp_silu_folds_into_the_gemm() -> None:
    """A Llama MLP's gate: MatMul then torch's SiLU (Sigmoid * x): FuseSilu makes it a Swish, which oneDNN's GEMM
    takes as a post-op (one launch, no intermediate), equal to the reference."""
    from ctxrt.backends.cpu.onednn import api

    if not api.available():
        pytest.skip("oneDNN is not installed")
    rng = np.random.default_rng(9)
    w = numpy_helper.from_array(rng.standard_normal((64, 96)).astype(np.float32) / 8, "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Sigmoid", ["h"], ["s"]),
             helper.make_node("Mul", ["s", "h"], ["y"])]
    m = _model(nodes, [_vi("x", [1, 16, 64])], [_vi("y", None)], [w])
    g = ctxrt.compile(m).graph()
    assert [(s.op, s.attrs.get("activation")) for s in g.compiled.steps] == [("MatMul", "Swish")]
    x = rng.standard_normal((1, 16, 64)).astype(np.float32)
    from onnx.reference import ReferenceEvaluator

    want = ReferenceEvaluator(m).run(None, {"x": x})[0]
    np.testing.assert_allclose(g.run({"x": x})["y"], want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("act", ["HardSwish", "HardSigmoid", "Clip", "LeakyRelu", "Sigmoid", "Tanh", "Elu", "SiLU",
                                 "Gelu", "ClipFed"])
@pytest.mark.parametrize("layout", ["nhwc", "nChw8c"])
def test_conv_activations_fold_into_onednn_epilogues(act, layout) -> None:
    """The activation that alone follows a oneDNN Conv (MobileNetV3's HardSwish, MobileNetV2's Clip 0..6,
    EfficientNet's SiLU) runs in the conv's epilogue: no step of its own, onnxruntime's values; a Clip whose bound
    is fed at run time stays a step."""
    import onnxruntime as ort

    from ctxrt.backends.cpu.backend import CpuBackend
    from ctxrt.backends.cpu.onednn import api

    if not api.available():
        pytest.skip("oneDNN is not installed")
    rng = np.random.default_rng(4)
    w = rng.standard_normal((16, 8, 3, 3)).astype(np.float32) * 0.3
    b = rng.standard_normal(16).astype(np.float32)
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")]
    if act.startswith("Clip"):
        inits += [numpy_helper.from_array(np.array(-0.5, np.float32), "lo"),
                  numpy_helper.from_array(np.array(6.0, np.float32), "hi")]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1])]
    inputs = [_vi("x", [2, 8, 10, 10])]
    if act == "SiLU":  # torch's spelling, fused into Swish first
        nodes += [helper.make_node("Sigmoid", ["c"], ["s"]), helper.make_node("Mul", ["c", "s"], ["a"])]
    elif act == "Clip":
        nodes.append(helper.make_node("Clip", ["c", "lo", "hi"], ["a"]))
    elif act == "ClipFed":
        nodes.append(helper.make_node("Clip", ["c", "bound", "hi"], ["a"]))
        inputs.append(_vi("bound", []))
    elif act == "Gelu":
        nodes.append(helper.make_node("Gelu", ["c"], ["a"]))
    else:
        attrs = {"LeakyRelu": {"alpha": 0.2}, "Elu": {"alpha": 0.7}, "HardSigmoid": {"alpha": 0.3, "beta": 0.4}}
        nodes.append(helper.make_node(act, ["c"], ["a"], **attrs.get(act, {})))
    nodes.append(helper.make_node("MaxPool", ["a"], ["y"], kernel_shape=[2, 2], strides=[2, 2]))
    m = _model(nodes, inputs, [_vi("y", None)], inits, opset=20)
    feeds = {"x": rng.standard_normal((2, 8, 10, 10)).astype(np.float32) * 2}
    if act == "ClipFed":
        feeds["bound"] = np.array(1.5, np.float32)
    ctx = ctxrt.compile(m, shapes={k: v.shape for k, v in feeds.items()}, backend=CpuBackend(layout=layout))
    steps = ctx.graph().compiled.steps
    conv = next(s for s in steps if s.op == "Conv")
    fused = act != "ClipFed"
    assert (conv.attrs.get("activation") is not None) == fused, [(s.op, s.attrs.get("activation")) for s in steps]
    assert len([s for s in steps if s.op not in ("Conv", "MaxPool", "Reorder")]) == (0 if fused else 1)
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    got = np.empty_like(want)
    ctx.graph().execute(feeds, {"y": got})
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_a_pass_that_changes_the_graph_out_of_order_is_refused_and_an_unchanged_one_is_not_checked() -> None:
    """The graph is checked in topological order once before the passes, then after each pass that says it
    changed the graph (PlanError naming the node): a pass that changed nothing is not checked again."""
    from ctxrt.errors import PlanError
    from ctxrt.ir.graph import Graph, Node, Value
    from ctxrt.ir.passes import base

    def graph(order):
        nodes = {"a": Node("Relu", "a", ["x"], ["y"]), "b": Node("Relu", "b", ["y"], ["z"])}
        values = {n: Value(n, np.dtype(np.float32), (2,)) for n in "xyz"}
        return Graph("g", [nodes[k] for k in order], values, ["x"], ["z"])

    class Swap(base.Pass):
        def __init__(self, modified):
            self.modified, self.checked = modified, 0

        def call(self, g):
            g.nodes = g.nodes[::-1]
            return base.PassResult(g, self.modified)

        def ensures(self, g):
            self.checked += 1
            base.check_topological(g)

    with pytest.raises(PlanError, match="node 'b' \\(Relu\\) reads 'y' before it is produced"):
        base.run_passes(graph("ab"), [Swap(True)])
    quiet = Swap(False)
    base.run_passes(graph("ab"), [quiet])
    assert quiet.checked == 0
    with pytest.raises(PlanError, match="before it is produced"):  # an input out of order: refused before any pass
        base.run_passes(graph("ba"), [])


def test_shape_inference_runs_once_where_folding_changes_no_type(monkeypatch) -> None:
    """After the first inference every value of the exported decoder has a static shape: folding its shape chains
    then changes no other value's type, so onnx's inference is not run again (twice before: a range compile's
    probes each paid it); the graph is the same as with a second inference."""
    import sys
    from pathlib import Path

    import onnx.shape_inference

    from ctxrt.backends import get_backend, supported_ops
    from ctxrt.frontend import onnx as frontend

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
    import decoders

    path = decoders.gpt2_decoder("dynamo")
    shapes = {"input_ids": [1, 5]} | {k: [1, decoders.HEADS, 7, 16] for k in decoders.names()[0][1:]}
    calls = []
    real = onnx.shape_inference.infer_shapes
    monkeypatch.setattr(onnx.shape_inference, "infer_shapes", lambda *a, **k: calls.append(1) or real(*a, **k))
    once = frontend.to_ir(str(path), supported_ops(get_backend("cpu")), shapes)
    assert len(calls) == 1
    monkeypatch.setattr(frontend.Folder, "_all_typed", lambda self: False)  # as before: inferred again
    again = frontend.to_ir(str(path), supported_ops(get_backend("cpu")), shapes)
    assert len(calls) == 3
    assert [(n.op, n.inputs, n.outputs) for n in once.nodes] == [(n.op, n.inputs, n.outputs) for n in again.nodes]
    assert {k: (v.dtype, v.shape) for k, v in once.values.items()} == \
        {k: (v.dtype, v.shape) for k, v in again.values.items()}
