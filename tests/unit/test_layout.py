"""The layout pass (ir/passes/layout.py) with oneDNN as the provider: where reorders go, which nodes oneDNN
runs, that outputs match onnx.reference, and that kernel choices are recorded in the binary."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import ctxrt
from ctxrt.backends.cpu.backend import CpuBackend
from ctxrt.backends.cpu.onednn import api
from ctxrt.compiler import compile_graphs, compile_ir, compile_options, lower

RNG = np.random.default_rng(0)


def _w(*shape: int) -> np.ndarray:
    return (RNG.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32)


def _model(nodes: list[onnx.NodeProto], inits: dict[str, np.ndarray], x: tuple[int, ...]) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "t", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def conv_chain() -> onnx.ModelProto:
    """A plain conv chain: conv (3 input channels) -> relu -> conv -> maxpool -> conv + residual -> global pool."""
    inits = {"w1": _w(16, 3, 3, 3), "b1": _w(16), "w2": _w(32, 16, 3, 3), "w3": _w(32, 32, 1, 1), "b3": _w(32)}
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("MaxPool", ["c2"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Conv", ["p", "w3", "b3"], ["c3"]),
             helper.make_node("Add", ["c3", "p"], ["s"]), helper.make_node("Relu", ["s"], ["r3"]),
             helper.make_node("GlobalAveragePool", ["r3"], ["y"])]
    return _model(nodes, inits, (1, 3, 32, 32))


def chain_with_reshape() -> onnx.ModelProto:
    """conv -> relu -> conv -> Reshape/Transpose/Reshape (no channel shuffle: plain only) -> conv -> relu -> conv."""
    inits = {f"w{k}": _w(16, 16 if k > 1 else 8, 3, 3) for k in range(1, 5)}
    inits.update(s1=np.array([1, 16, 8, 32], np.int64), s2=np.array([1, 16, 16, 16], np.int64))
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("Reshape", ["c2", "s1"], ["a"]),
             helper.make_node("Transpose", ["a"], ["b"], perm=[0, 1, 3, 2]),
             helper.make_node("Reshape", ["b", "s2"], ["c"]),
             helper.make_node("Conv", ["c", "w3"], ["c3"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c3"], ["r3"]),
             helper.make_node("Conv", ["r3", "w4"], ["y"], pads=[1, 1, 1, 1])]
    return _model(nodes, inits, (1, 8, 16, 16))


def _steps(model: onnx.ModelProto, onednn: bool, prefer: str = "speed"):
    be = CpuBackend(onednn=onednn)
    graph, _ = compile_ir(lower(model, None, be), be, compile_options(prefer))
    return graph.steps


def _reference(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    return ReferenceEvaluator(model).run(None, {"x": x})[0]


def test_onednn_is_installed_for_these_tests() -> None:
    assert api.available(), "onednn-cpu-gomp 2023.2.0 (a dependency on Linux x86-64) is needed for the oneDNN tests"


def test_no_reorder_inside_a_plain_conv_chain() -> None:
    steps = _steps(conv_chain(), onednn=True)
    reorders = [s for s in steps if s.op == "Reorder"]
    # only the model's input is reordered (its first conv reads 3 channels); the global pool writes one pixel
    # per image, stored alike in every layout: nothing is reordered back
    assert len(reorders) == 1 and reorders[0].inputs[0].space == "input"
    assert all(s.attrs.get("kernel") == "onednn" for s in steps if s.op in ("Conv", "MaxPool", "GlobalAveragePool"))
    assert {s.attrs["dst_layout"] for s in steps if s.op == "Conv"} == {"nhwc"}
    fused = [s for s in steps if s.op == "Conv" and s.attrs.get("residual")]  # Add + Relu in the conv's post-ops
    assert len(fused) == 1 and fused[0].inputs[3].shape == (1, 8, 8, 32)  # the residual stored channels-last
    assert not [s for s in _steps(conv_chain(), onednn=False) if s.op == "Reorder"]


def test_reorders_only_around_a_plain_only_op() -> None:
    steps = _steps(chain_with_reshape(), onednn=True)
    reorders = [(s.attrs["from"], s.attrs["to"]) for s in steps if s.op == "Reorder"]
    # the input in; out before the Reshape, in after it; the output out: none between the convs of each side
    assert reorders == [("nchw", "nhwc"), ("nhwc", "nchw"), ("nchw", "nhwc"), ("nhwc", "nchw")]
    ops = [s.op for s in steps]
    assert ops[ops.index("Transpose") - 1] == "Reorder" and ops[ops.index("Transpose") + 1] == "Reorder"
    assert [s.attrs.get("kernel") for s in steps if s.op == "Conv"] == ["onednn"] * 4


def se_block() -> onnx.ModelProto:
    """MobileNetV3's squeeze-and-excitation block between convs, as the exporters write it: the spatial mean
    (ReduceMean over H, W, kept 4-D), two 1x1 convs (Relu, HardSigmoid), the per-channel scale, then HardSwish."""
    c, r = 24, 8
    inits = {"w0": _w(c, 8, 3, 3), "w1": _w(r, c, 1, 1), "b1": _w(r), "w2": _w(c, r, 1, 1), "b2": _w(c),
             "w3": _w(16, c, 1, 1)}
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c0"], pads=[1, 1, 1, 1]),
             helper.make_node("HardSwish", ["c0"], ["h0"]),
             helper.make_node("ReduceMean", ["h0"], ["m"], axes=[-1, -2], keepdims=1),
             helper.make_node("Conv", ["m", "w1", "b1"], ["f1"]), helper.make_node("Relu", ["f1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["f2"]),
             helper.make_node("HardSigmoid", ["f2"], ["s"], alpha=1 / 6),
             helper.make_node("Mul", ["h0", "s"], ["z"]),
             helper.make_node("Conv", ["z", "w3"], ["y"])]
    return _model(nodes, inits, (2, 8, 12, 12))


def test_squeeze_and_excitation_stays_channels_last() -> None:
    """The spatial mean runs as oneDNN's GlobalAveragePool in L, the per-channel scale multiplies in L (its
    [N, C, 1, 1] operand viewed as [N, 1, 1, C]), one-pixel values change layout as views: the only reorders are
    the model's input and output."""
    steps = _steps(se_block(), onednn=True)
    reorders = [s for s in steps if s.op == "Reorder"]
    assert [(s.inputs[0].space, s.outputs[0].space) for s in reorders] == [("input", "arena"), ("arena", "output")]
    pool = [s for s in steps if s.op == "GlobalAveragePool"]
    assert len(pool) == 1 and pool[0].attrs["kernel"] == "onednn" and "ReduceMean" not in [s.op for s in steps]
    (mul,) = [s for s in steps if s.op == "Mul"]
    assert mul.inputs[0].shape == (2, 12, 12, 24) and mul.inputs[1].shape == (2, 1, 1, 24)
    # the HardSwish after the conv runs in the conv's epilogue (FuseConvActivation)
    assert "HardSwish" not in [s.op for s in steps]
    assert [s.attrs.get("activation") for s in steps if s.op == "Conv"].count("HardSwish") == 1


def paddle_gates(scale: str = "Div", c: float = 6.0) -> onnx.ModelProto:
    """Hard gates written out as Paddle exports them, between convs: x * clip(x + 3, 0, 6) / 6 (hard-swish) after
    the first, clip(x + 3, 0, 6) / 6 (hard-sigmoid) scaling the second's output per pixel (`scale`: Div by c, or
    Mul by 1 / c), and a scalar Add and Mul in between."""
    inits = {"w1": _w(16, 8, 3, 3), "w2": _w(16, 16, 1, 1), "w3": _w(16, 16, 3, 3),
             "three": np.array(3.0, np.float32), "zero": np.array(0.0, np.float32), "six": np.array(6.0, np.float32),
             "c": np.array(c if scale == "Div" else 1 / c, np.float32), "half": np.array([[[[0.5]]]], np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["a", "three"], ["a3"]), helper.make_node("Clip", ["a3", "zero", "six"], ["ac"]),
             helper.make_node("Mul", ["a", "ac"], ["am"]), helper.make_node(scale, ["am", "c"], ["h"]),
             helper.make_node("Conv", ["h", "w2"], ["b"]),
             helper.make_node("Add", ["three", "b"], ["b3"]), helper.make_node("Clip", ["b3", "zero", "six"], ["bc"]),
             helper.make_node(scale, ["bc", "c"], ["g"]), helper.make_node("Mul", ["h", "g"], ["hg"]),
             helper.make_node("Mul", ["hg", "half"], ["hh"]), helper.make_node("Add", ["hh", "three"], ["z"]),
             helper.make_node("Conv", ["z", "w3"], ["y"], pads=[1, 1, 1, 1])]
    return _model(nodes, inits, (2, 8, 10, 12))


@pytest.mark.parametrize("scale", ["Div", "Mul"])
def test_paddles_hard_gates_fuse_and_stay_channels_last(scale) -> None:
    """x * clip(x + 3, 0, 6) / 6 after a conv is its HardSwish epilogue, clip(x + 3, 0, 6) / 6 its HardSigmoid (Mul
    by 1/6 as well as Div by 6), and element-wise ops with one scalar operand (Add 3, Mul by a [1, 1, 1, 1]
    constant) and Clip with constant bounds run channels-last: the only reorders are the model's input and output
    (PP-OCR's classifier had 71 reorders around such ops); values as onnx's reference. Bounds that are not a hard
    gate's (clip to 6, divided by 5) stay as they are, with the same values."""
    steps = _steps(paddle_gates(scale), onednn=True)
    ops = [s.op for s in steps]
    assert [s.attrs.get("activation") for s in steps if s.op == "Conv"] == ["HardSwish", "HardSigmoid", None]
    assert "Clip" not in ops and "Div" not in ops and ops.count("Mul") == 2
    assert [(s.inputs[0].space, s.outputs[0].space) for s in steps if s.op == "Reorder"] == \
        [("input", "arena"), ("arena", "output")]
    x = RNG.standard_normal((2, 8, 10, 12)).astype(np.float32) * 4
    for model in (paddle_gates(scale), paddle_gates(scale, c=5.0)):
        got = ctxrt.compile(model).graph().run({"x": x})["y"]
        np.testing.assert_allclose(got, _reference(model, x), rtol=1e-4, atol=1e-5)
    assert "Clip" in [s.op for s in _steps(paddle_gates(scale, c=5.0), onednn=True)]


RESIZES = {  # attributes, scales or sizes (NCHW), as exporters write them
    "nearest 2x (Paddle)": ({"mode": "nearest", "coordinate_transformation_mode": "asymmetric",
                             "nearest_mode": "floor"}, [1.0, 1.0, 2.0, 2.0], None),
    "linear half_pixel": ({"mode": "linear"}, [1.0, 1.0, 2.0, 2.0], None),
    "nearest sizes": ({"mode": "nearest"}, None, [2, 16, 10, 12]),
    "cubic downscale": ({"mode": "cubic", "coordinate_transformation_mode": "pytorch_half_pixel"},
                        [1.0, 1.0, 0.5, 0.5], None),
}


@pytest.mark.parametrize("case", list(RESIZES))
def test_resize_between_convs_stays_channels_last(case) -> None:
    """A Resize between convs (an FPN's upsample: PP-OCR's detector had 10 reorders around its six) runs on the
    channels-last value, its scales, sizes and roi mapped onto the stored axes: the only reorders are the model's
    input and output, values as onnx's reference."""
    attrs, scales, sizes = RESIZES[case]
    n, h, w = 2, 5, 6
    inits = {"w1": _w(16, 8, 3, 3), "w2": _w(16, 8, 1, 1), "w3": _w(16, 16, 3, 3),
             "roi": np.zeros(0, np.float32), "scales": np.array(scales or [], np.float32)}
    inputs = ["roi", "scales"]
    if sizes:
        inits["sizes"] = np.array(sizes, np.int64)
        inputs = ["roi", "", "sizes"]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["x", "w2"], ["b"]),
             helper.make_node("Resize", ["a", *inputs], ["ra"], **attrs),
             helper.make_node("Resize", ["b", *inputs], ["rb"], **attrs),
             helper.make_node("Add", ["ra", "rb"], ["s"]),
             helper.make_node("Conv", ["s", "w3"], ["y"], pads=[1, 1, 1, 1])]
    model = _model(nodes, inits, (n, 8, h, w))
    steps = _steps(model, onednn=True)
    assert [(s.inputs[0].space, s.outputs[0].space) for s in steps if s.op == "Reorder"] == \
        [("input", "arena"), ("arena", "output")]
    resized = [s for s in steps if s.op == "Resize"]
    assert len(resized) == 2 and all(s.attrs.get("channels_last") == 1 for s in resized)
    x = RNG.standard_normal((n, 8, h, w)).astype(np.float32)
    got = ctxrt.compile(model).graph().run({"x": x})["y"]
    np.testing.assert_allclose(got, _reference(model, x), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("layout", ["nhwc", "nChw8c", "nChw16c"])
@pytest.mark.parametrize("make", [conv_chain, chain_with_reshape, se_block])
def test_layouts_match_the_reference(make, layout: str) -> None:
    model = make()
    x = RNG.standard_normal(tuple(d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim))
    x = x.astype(np.float32)
    with ctxrt.compile(model, backend=CpuBackend(onednn=True, layout=layout)) as ctx:
        got = ctx.graph().run({"x": x})["y"]
    want = _reference(model, x)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def _shufflenet_block() -> onnx.ModelProto:
    """ShuffleNet's unit: grouped 1x1 conv (4 groups of 6 channels), channel shuffle, depthwise 3x3, grouped 1x1."""
    c, g = 24, 4
    inits = {"w1": _w(c, c // g, 1, 1), "w2": _w(c, 1, 3, 3), "b2": _w(c), "w3": _w(c, c // g, 1, 1),
             "s1": np.array([1, g, c // g, 14, 14], np.int64), "s2": np.array([1, c, 14, 14], np.int64)}
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], group=g),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Reshape", ["r1", "s1"], ["a"]),
             helper.make_node("Transpose", ["a"], ["b"], perm=[0, 2, 1, 3, 4]),
             helper.make_node("Reshape", ["b", "s2"], ["c"]),
             helper.make_node("Conv", ["c", "w2", "b2"], ["c2"], group=c, pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["c2", "w3"], ["y"], group=g)]
    return _model(nodes, inits, (1, c, 14, 14))


@pytest.mark.parametrize("onednn", [True, False])
def test_channel_shuffle_fused_and_kept_channels_last(onednn: bool) -> None:
    model = _shufflenet_block()
    steps = _steps(model, onednn)
    assert "Transpose" not in [s.op for s in steps] and "ChannelShuffle" in [s.op for s in steps]
    reorders = [s for s in steps if s.op == "Reorder"]
    assert len(reorders) == (2 if onednn else 0)  # the input in, the output out; none around the shuffle
    # (NumPy's planar depthwise kernel, or the native one where the extension is built)
    assert bool({"direct_depthwise", "native:dw_planar"} & {s.algorithm for s in steps}) != onednn
    x = RNG.standard_normal((1, 24, 14, 14)).astype(np.float32)
    with ctxrt.compile(model, backend=CpuBackend(onednn=onednn)) as ctx:
        got = ctx.graph().run({"x": x})["y"]
    np.testing.assert_allclose(got, _reference(model, x), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])  # LogSoftmax: NumPy's (oneDNN's log is less accurate)
@pytest.mark.parametrize(("opset", "axis", "shape", "on_onednn"), [
    (17, -1, (2, 12, 16, 16), True), (17, 1, (1, 1000, 1, 1), True), (11, 1, (2, 3, 5), True),
    (11, 2, (2, 3, 4, 5), True), (17, 1, (2, 3, 5), False), (17, 0, (4, 3), False)])
def test_softmax_on_onednn_matches_onnxruntime(op: str, opset: int, axis: int, shape: tuple[int, ...],
                                               on_onednn: bool) -> None:
    """Legacy opsets (< 13) normalize over every axis from `axis` on (onnx.reference gets that wrong: the
    oracle is onnxruntime). Along an axis with more after it oneDNN 3.2 has only its reference implementation:
    NumPy's kernel runs those."""
    import onnxruntime as ort

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))
    g = helper.make_graph([helper.make_node(op, ["x"], ["y"], axis=axis)], "t", [x],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)
    xv = (RNG.standard_normal(shape) * 10).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": xv})[0]
    with ctxrt.compile(model, backend=CpuBackend(onednn=True)) as ctx:
        g = ctx.graph()
        (step,) = g.compiled.steps
        assert step.algorithm.startswith("onednn:softmax") == (on_onednn and op == "Softmax")
        for n in (1, 2):
            ctx.num_threads = n
            np.testing.assert_allclose(g.run({"x": xv})["y"], want, rtol=1e-5, atol=1e-5)


def test_kernel_choice_recorded_in_the_binary_and_reloaded(tmp_path) -> None:
    from ctxrt.compiler import context_info
    from ctxrt.format import write_context
    from ctxrt.runtime.report import graph_kernels

    model, be = conv_chain(), CpuBackend(onednn=True)
    graphs, weights = compile_graphs([(model, None, "main")], be)
    path = tmp_path / "m.ctx"
    write_context(path, graphs, weights, context_info(be, ["m.onnx"]))
    report = graph_kernels(path)[0]
    assert [r["from"] + ">" + r["to"] for r in report["reorders"]] == ["nchw>nhwc"]
    assert all(k["algorithm"].startswith("onednn:") for k in report["kernels"] if k["op"] == "Conv")
    assert report["prepacked_bytes"] > 0  # oneDNN's weight formats, made at compile time
    x = RNG.standard_normal((1, 3, 32, 32)).astype(np.float32)
    with ctxrt.context_from_binary(path) as ctx:
        got = ctx.graph().run({"x": x})["y"]
        assert ctx.stats["weights_prepacked_bytes"] == report["prepacked_bytes"]
    np.testing.assert_allclose(got, _reference(model, x), rtol=1e-4, atol=1e-5)


def test_binary_with_onednn_kernels_where_onednn_is_absent_is_a_clear_error(tmp_path, monkeypatch) -> None:
    """Decided: a clear error at load (finalize), naming the node and the fix; no fallback, since the weights
    are stored in oneDNN's formats."""
    from ctxrt.compiler import context_info
    from ctxrt.format import write_context

    be = CpuBackend(onednn=True)
    graphs, weights = compile_graphs([(conv_chain(), None, "main")], be)
    path = tmp_path / "m.ctx"
    write_context(path, graphs, weights, context_info(be, ["m.onnx"]))
    monkeypatch.setitem(api._STATE, "lib", None)
    with pytest.raises(ctxrt.UnsupportedOpError, match=r"oneDNN, which is not installed here: pip install"):
        ctxrt.context_from_binary(path)
    with pytest.raises(ctxrt.CtxrtError, match="oneDNN was asked for but is not installed"):
        CpuBackend(onednn=True)
    assert not CpuBackend().onednn  # the default without it: NumPy kernels


def test_prefer_memory_chooses_no_kernel_with_enlarged_constants() -> None:
    """A 1x1 conv 128 -> 512 channels: oneDNN prefers weights blocked by 48 output channels (padded to 528),
    and with prefer="speed" a Winograd conv's transform is 4x its weights; with prefer="memory" neither."""
    inits = {"w1": _w(512, 128, 1, 1), "w2": _w(64, 64, 3, 3)}
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"]), helper.make_node("Relu", ["a"], ["y1"]),
             helper.make_node("Conv", ["x2", "w2"], ["y2"], pads=[1, 1, 1, 1])]
    g = helper.make_graph(nodes, "t", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 128, 28, 28]),
                                       helper.make_tensor_value_info("x2", TensorProto.FLOAT, [1, 64, 56, 56])],
                          [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y1", "y2")],
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)

    def growth(steps, consts) -> list[int]:
        return [int(consts[s.inputs[i].key].nbytes) - int(orig) for s in steps
                for i, orig in s.attrs.get("prepacked", ()) if s.inputs[i] is not None]

    for onednn in (True, False):
        be = CpuBackend(onednn=onednn)
        for prefer in ("speed", "memory"):
            graph, consts = compile_ir(lower(model, None, be), be, compile_options(prefer))
            grown = growth(graph.steps, consts)
            if prefer == "memory":
                assert all(d <= 0 for d in grown), grown
            else:
                assert any(d > 0 for d in grown), "the speed choice no longer enlarges: the test lost its case"


def test_matmul_bias_residual_and_gelu_fold_into_onednn_epilogue() -> None:
    """A transformer's projection: MatMul, Add bias, Add residual, then Gelu: one oneDNN matmul with post-ops;
    NumPy keeps four nodes."""
    w, b = _w(32, 48), _w(48)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["a"]),
             helper.make_node("Add", ["r", "a"], ["s"]), helper.make_node("Gelu", ["s"], ["y"], domain="")]
    g = helper.make_graph(nodes, "t", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 16, 32]),
                                       helper.make_tensor_value_info("r", TensorProto.FLOAT, [2, 16, 48])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)], ir_version=9)
    feeds = {"x": RNG.standard_normal((2, 16, 32)).astype(np.float32),
             "r": RNG.standard_normal((2, 16, 48)).astype(np.float32)}
    want = ReferenceEvaluator(model).run(None, feeds)[0]
    for onednn, ops in ((True, ["MatMul"]), (False, ["MatMul", "Add", "Add", "Gelu"])):
        steps = _steps(model, onednn)
        assert [s.op for s in steps] == ops
        if onednn:
            assert {k: steps[0].attrs.get(k) for k in ("kernel", "bias", "residual", "activation")} == \
                {"kernel": "onednn", "bias": 1, "residual": 1, "activation": "Gelu"}
        with ctxrt.compile(model, backend=CpuBackend(onednn=onednn)) as ctx:
            np.testing.assert_allclose(ctx.graph().run(feeds)["y"], want, rtol=1e-4, atol=1e-5)


def _convnext_block() -> onnx.ModelProto:
    """ConvNeXt's block as transformers exports it: a stem conv, then depthwise 7x7, a permute to channels-last, a
    LayerNorm and two linear layers over channels, the permute back, the residual add; a last conv."""
    c = 16
    inits = {"w0": _w(c, 3, 4, 4), "w1": _w(c, 1, 7, 7), "b1": _w(c), "g": _w(c) + 1, "be": _w(c),
             "m1": _w(c, 4 * c), "m2": _w(4 * c, c), "w3": _w(c, c, 1, 1)}
    nodes = [helper.make_node("Conv", ["x", "w0"], ["s"], kernel_shape=[4, 4], strides=[4, 4]),
             helper.make_node("Conv", ["s", "w1", "b1"], ["d"], group=c, pads=[3, 3, 3, 3]),
             helper.make_node("Transpose", ["d"], ["t"], perm=[0, 2, 3, 1]),
             helper.make_node("LayerNormalization", ["t", "g", "be"], ["n"], axis=-1),
             helper.make_node("MatMul", ["n", "m1"], ["h"]),
             helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "m2"], ["o"]),
             helper.make_node("Transpose", ["o"], ["b"], perm=[0, 3, 1, 2]),
             helper.make_node("Add", ["s", "b"], ["a"]),
             helper.make_node("Conv", ["a", "w3"], ["y"])]
    return _model(nodes, inits, (1, 3, 32, 32))


def test_permutes_between_channels_first_and_last_are_views() -> None:
    """Where oneDNN holds activations channels-last, ConvNeXt's permute to channels-last of a conv's output and the
    permute back (read by the residual add in channels-last) are the stored bytes: views, no Transpose copy and no
    Reorder around them (only the model's input and output are reordered); onnx.reference's outputs."""
    model = _convnext_block()
    steps = _steps(model, onednn=True)
    assert "Transpose" not in [s.op for s in steps], [s.op for s in steps]
    # (the model's input into channels-last, its output back: nothing in between)
    assert all(s.inputs[0].space == "input" or s.outputs[0].space == "output" for s in steps if s.op == "Reorder")
    x = RNG.standard_normal((1, 3, 32, 32)).astype(np.float32)
    for onednn in (True, False):
        with ctxrt.compile(model, backend=CpuBackend(onednn=onednn)) as ctx:
            got = ctx.graph().run({"x": x})["y"]
        np.testing.assert_allclose(got, _reference(model, x), rtol=1e-4, atol=1e-5)
