"""InferenceSession.get_inputs()/get_outputs() for models that leave output shapes undeclared: the shapes
onnxruntime reports (inferred, symbolic dims by name, unknown dims None), never [] for an unknown shape."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import zoo
from onnx import TensorProto, helper, numpy_helper
from test_models import Run, assert_close

import ctxrt


def _args(sess) -> list[tuple[str, object, str]]:
    return [(a.name, a.shape, a.type) for a in sess.get_inputs() + sess.get_outputs()]


def test_undeclared_output_shape_is_inferred_and_bindable(backend, squeezenet) -> None:
    path, feeds, want = squeezenet
    model = onnx.load(str(path))
    model.graph.output[0].type.tensor_type.ClearField("shape")  # as some exporters write outputs
    data = model.SerializeToString()
    theirs = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    with ctxrt.InferenceSession(data, backend) as sess:
        assert _args(sess) == _args(theirs)
        (out,) = sess.get_outputs()
        assert out.shape == [1, 1000, 1, 1]
        y = ctxrt.Tensor.empty(tuple(out.shape), np.float32, sess)
        b = sess.io_binding()
        b.bind_input("data_0", feeds["data_0"])
        b.bind_output(out.name, y)
        sess.run_with_iobinding(b)
        assert_close(Run(want, {out.name: y.numpy()}, 0, 0))


def _dynamic_model() -> onnx.ModelProto:
    """Outputs without shapes from an input with a named, an unnamed and fixed dims."""
    outs = ["r", "nz", "rs", "d", "c"]
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("NonZero", ["x"], ["nz"]),
             helper.make_node("Reshape", ["x", "shp"], ["rs"]), helper.make_node("Flatten", ["x"], ["d"]),
             helper.make_node("Concat", ["x", "x"], ["c"], axis=2)]
    out_vis = [helper.make_tensor_value_info(o, TensorProto.INT64 if o == "nz" else TensorProto.FLOAT, None)
               for o in outs]
    out_vis[3] = helper.make_tensor_value_info("d", TensorProto.FLOAT, ["N", None])  # declared dims stay
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, None, 4])
    shp = numpy_helper.from_array(np.array([0, -1], np.int64), "shp")
    graph = helper.make_graph(nodes, "g", [x], out_vis, initializer=[shp])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_dynamic_dims_by_name_unknown_dims_none() -> None:
    data = _dynamic_model().SerializeToString()
    theirs = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    with ctxrt.InferenceSession(data) as sess:
        assert _args(sess) == _args(theirs)
        assert sess.get_outputs()[0].shape == ["batch", 3, None, 4]
        assert sess.get_outputs()[1].shape == [4, None]  # NonZero: its count is data-dependent
        x = np.random.default_rng(0).standard_normal((2, 3, 5, 4)).astype(np.float32)
        for got, want in zip(sess.run(None, {"x": x}), theirs.run(None, {"x": x}), strict=True):
            np.testing.assert_array_equal(got, want)


def test_unknown_rank_is_none_not_a_scalar() -> None:
    """Reshape to a shape fed at run time: not even the rank is known (onnxruntime reports [])."""
    graph = helper.make_graph([helper.make_node("Reshape", ["x", "s"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
                               helper.make_tensor_value_info("s", TensorProto.INT64, [None])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    data = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()
    with ctxrt.InferenceSession(data) as sess:
        assert sess.get_outputs()[0].shape is None
        assert sess.run(None, {"x": np.ones((2, 3), np.float32), "s": np.array([3, 2])})[0].shape == (3, 2)


def test_static_model_reports_compiled_shapes_inference_leaves_open() -> None:
    """TopK's K from a ReduceMax of constants: onnx inference cannot tell K; the compiled shape is known."""
    nodes = [helper.make_node("Constant", [], ["f"], value=numpy_helper.from_array(np.array([1, 3], np.int64))),
             helper.make_node("ReduceMax", ["f"], ["k"], keepdims=1), helper.make_node("TopK", ["x", "k"], ["v", "i"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6])],
                              [helper.make_tensor_value_info("v", TensorProto.FLOAT, None),
                               helper.make_tensor_value_info("i", TensorProto.INT64, None)])
    data = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()
    theirs = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    with ctxrt.InferenceSession(data) as sess:
        assert _args(sess) == _args(theirs)
        assert [o.shape for o in sess.get_outputs()] == [[2, 3], [2, 3]]


def test_light_model_declared_shapes_unchanged() -> None:
    path = zoo.light_model("resnet50")
    theirs = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    with ctxrt.InferenceSession(path) as sess:
        assert _args(sess) == _args(theirs)
