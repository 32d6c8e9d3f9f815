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
