"""Issue 9 §5: every node that cannot be compiled is reported at once, with its name; onnx.checker's verdict
on a malformed model is reported as such."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

import ctxrt
from ctxrt.cli import main as cli


def _model(nodes, inits=None, opset=20):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT, [4, 4])],
                          [helper.make_tensor_value_info(n.output[0], T.FLOAT, None) for n in nodes[-2:]],
                          [numpy_helper.from_array(np.asarray(v), k) for k, v in (inits or {}).items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=9)


def test_every_bad_attribute_is_listed_in_one_error_before_planning() -> None:
    nodes = [helper.make_node("Gelu", ["x"], ["a"], approximate="fast", name="gelu_fast"),
             helper.make_node("Gelu", ["a"], ["b"], approximate="erf_like", name="gelu_erf_like"),
             helper.make_node("Pad", ["x", "pads"], ["c"], mode="bogus", name="pad_bogus"),
             helper.make_node("Relu", ["b"], ["d"])]
    inits = {"pads": np.zeros(4, np.int64)}
    with pytest.raises(ctxrt.UnsupportedOpError) as e:
        ctxrt.compile(_model(nodes, inits))
    message = str(e.value)
    assert message.startswith("3 nodes cannot be compiled")
    for name in ("gelu_fast", "gelu_erf_like", "pad_bogus"):
        assert name in message


def test_an_ir3_model_whose_added_initializers_are_not_inputs_runs() -> None:
    """IR 3 wants every initializer listed as a graph input; onnxruntime.quantization adds zero points and scales
    to an old (IR 3, opset 9 lifted to 13) model without listing them, and onnxruntime runs the result."""
    ort = pytest.importorskip("onnxruntime")
    g = helper.make_graph([helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
                           helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", T.FLOAT, [4, 4]),
                           helper.make_tensor_value_info("s", T.FLOAT, [])],  # listed, as IR 3 wants
                          [helper.make_tensor_value_info("y", T.FLOAT, [4, 4])],
                          [numpy_helper.from_array(np.float32(0.1), "s"), numpy_helper.from_array(np.uint8(7), "z")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=3)
    x = np.linspace(-2, 2, 16, dtype=np.float32).reshape(4, 4)
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_array_equal(ctxrt.InferenceSession(m.SerializeToString()).run(None, {"x": x})[0], want)


def test_a_model_the_checker_rejects_is_reported_as_such(tmp_path, capsys) -> None:
    m = _model([helper.make_node("Relu", ["x"], ["y"], alpha=0.5, name="relu_alpha"),
                helper.make_node("Neg", ["y"], ["z"])], opset=17)
    with pytest.raises(ctxrt.ModelError, match="onnx.checker rejects the model: Unrecognized attribute: alpha for "
                                               "operator Relu"):
        ctxrt.compile(m)
    path = tmp_path / "bad.onnx"
    path.write_bytes(m.SerializeToString())
    assert cli(["compile", str(path), "-o", str(tmp_path / "bad.ctx")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "onnx.checker" in err and "Traceback" not in err


def test_an_index_past_its_table_is_one_error_as_onnxruntime_refuses_it(tmp_path, capsys) -> None:
    """A Gather index outside [-n, n - 1] (a token id past the vocabulary fed to an embedding): an InvalidInputError
    (a CtxrtError and a ValueError) naming the node and the index, as onnxruntime refuses it; it was wrapped
    around the table (a silent wrong row). `ctxrt run` says it in one line, exit 2. In-range and negative indices run
    as before, on arrays and in a range program."""
    import onnxruntime as ort

    table = np.arange(12, dtype=np.float32).reshape(4, 3)
    g = helper.make_graph([helper.make_node("Gather", ["t", "i"], ["y"], name="lookup")], "g",
                          [helper.make_tensor_value_info("i", T.INT64, ["n"])],
                          [helper.make_tensor_value_info("y", T.FLOAT, ["n", 3])],
                          [numpy_helper.from_array(table, "t")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    with ctxrt.InferenceSession(model.SerializeToString()) as sess:
        for good in ([1, -4, 3], [0], [-1, 2]):
            idx = np.array(good)
            np.testing.assert_array_equal(sess.run(None, {"i": idx})[0], ref.run(None, {"i": idx})[0])
        for bad, said in (([1, 4], "index 4 is outside [-4, 3]"), ([-5], "index -5 is outside [-4, 3]")):
            with pytest.raises(Exception):  # noqa: B017 - onnxruntime's own error type
                ref.run(None, {"i": np.array(bad)})
            with pytest.raises(ctxrt.InvalidInputError, match=r"Gather node 'lookup': " + said.replace("[", r"\[")):
                sess.run(None, {"i": np.array(bad)})
            assert issubclass(ctxrt.InvalidInputError, ValueError)
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    np.savez(tmp_path / "in.npz", i=np.array([0, 7]))
    assert cli(["run", str(path), "--inputs", str(tmp_path / "in.npz")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "index 7 is outside [-4, 3]" in err


@pytest.mark.parametrize("op", ["GatherElements", "GatherND", "ScatterND", "ScatterElements"])
@pytest.mark.parametrize("const", [False, True], ids=["fed", "constant"])
def test_indices_past_their_axis_are_one_error_before_anything_is_written(op: str, const: bool) -> None:
    """The other index ops as Gather: an index outside its axis (fed, or a constant, refused when the node runs) is
    an InvalidInputError naming the node, as onnxruntime refuses it (they wrapped around); the data in place is not
    half-scattered. In-range and negative indices equal onnxruntime's results."""
    import onnxruntime as ort

    data = np.arange(12, dtype=np.float32).reshape(3, 4)
    nd = op.endswith("ND")
    good = np.array([[1, -1], [0, 2]]) if nd else np.array([[2, -1, 0, 1]])
    bad = np.array([[1, -1], [3, 2]]) if nd else np.array([[2, 5, 0, 1]])
    ins = ["d", "i"] + (["u"] if op.startswith("Scatter") else [])
    upd = np.full((2,) if nd else (1, 4), 100, np.float32)
    attrs = {} if nd else {"axis": 1 if op == "GatherElements" else 1}

    def model(idx):
        inits = [numpy_helper.from_array(idx, "i")] if const else []
        if op.startswith("Scatter"):
            inits.append(numpy_helper.from_array(upd, "u"))
        feeds = [] if const else [helper.make_tensor_value_info("i", T.INT64, list(idx.shape))]
        g = helper.make_graph([helper.make_node(op, ins, ["y"], name="n1", **attrs)], "g",
                              [helper.make_tensor_value_info("d", T.FLOAT, [3, 4])] + feeds,
                              [helper.make_tensor_value_info("y", T.FLOAT, None)], inits)
        return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9).SerializeToString()

    for idx, ok in ((good, True), (bad, False)):
        feeds = {"d": data} if const else {"d": data, "i": idx}
        m = model(idx)
        if ok:
            want = ort.InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
            with ctxrt.InferenceSession(m) as sess:
                np.testing.assert_array_equal(sess.run(None, feeds)[0], want)
            continue
        with pytest.raises(Exception):  # noqa: B017 - onnxruntime's own error type
            ort.InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, feeds)
        with ctxrt.InferenceSession(m) as sess, pytest.raises(ctxrt.InvalidInputError, match="node 'n1': index"):
            sess.run(None, feeds)


@pytest.mark.parametrize("op,ishape,ushape", [("ScatterND", [2, 2], [2, 4]), ("ScatterND", [2, 1], [2, 3]),
                                              ("ScatterElements", [1, 4], [1, 3]),
                                              ("ScatterElements", [1, 1, 1], [1, 1, 1])])
def test_scatter_updates_of_another_shape_are_a_shape_error(op: str, ishape: list[int], ushape: list[int]) -> None:
    """onnx's inference lets updates of the wrong shape through (onnxruntime refuses them when it runs): a
    ShapeError naming the node and the shape they must have; it failed inside NumPy's reshape."""
    g = helper.make_graph([helper.make_node(op, ["d", "i", "u"], ["y"], name="n1")], "g",
                          [helper.make_tensor_value_info("d", T.FLOAT, [3, 4]),
                           helper.make_tensor_value_info("i", T.INT64, ishape),
                           helper.make_tensor_value_info("u", T.FLOAT, ushape)],
                          [helper.make_tensor_value_info("y", T.FLOAT, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9).SerializeToString()
    feeds = {"d": np.zeros((3, 4), np.float32), "i": np.zeros(ishape, np.int64), "u": np.ones(ushape, np.float32)}
    said = "indices of rank 3 into data of rank 2" if len(ishape) == 3 else f"updates of shape {ushape}"
    with pytest.raises(ctxrt.ShapeError, match=f"{op} node 'n1': {said}".replace("[", r"\[")):
        ctxrt.InferenceSession(m).run(None, feeds)


def test_inputs_that_do_not_broadcast_are_named_not_a_shape_chain_further_on() -> None:
    """An export traced at one length (a loop unrolled, a constant of the traced length added to the input) fed
    another: the element-wise node whose inputs do not broadcast is the ShapeError, as onnxruntime names it; the
    message was about a Slice further on whose bounds 'are computed at run time' (onnx's inference leaves the
    node's output untyped, so nothing after it folds)."""
    bias = numpy_helper.from_array(np.ones((1, 8), np.float32), "traced")
    nodes = [helper.make_node("Add", ["x", "traced"], ["a"], name="add_traced"),
             helper.make_node("Shape", ["a"], ["s"]), helper.make_node("Slice", ["x", "zero", "s"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT, [1, "seq"])],
                          [helper.make_tensor_value_info("y", T.FLOAT, None)],
                          [bias, numpy_helper.from_array(np.zeros(2, np.int64), "zero")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9).SerializeToString()
    with ctxrt.InferenceSession(m) as sess:
        assert sess.run(None, {"x": np.ones((1, 8), np.float32)})[0].shape == (1, 8)
        with pytest.raises(ctxrt.ShapeError, match=r"Add node 'add_traced': its inputs' shapes \[\[1, 9\], \[1, 8\]\] "
                                                    "do not broadcast"):
            sess.run(None, {"x": np.ones((1, 9), np.float32)})
