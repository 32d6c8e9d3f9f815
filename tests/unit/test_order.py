"""Graphs whose nodes are valid but listed out of order are sorted by the frontend (frontend/order.py), subgraphs
too, stably; a sorted model is returned as it is, a cycle left for the checker to name."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import ctxrt
from ctxrt.errors import ModelError
from ctxrt.frontend.order import sorted_model


def _model(nodes: list[onnx.NodeProto]) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_nodes_listed_out_of_order_are_sorted_stably() -> None:
    n = helper.make_node
    model = _model([n("Add", ["b", "a"], ["y"], name="last"), n("Relu", ["x"], ["a"], name="first"),
                    n("Neg", ["x"], ["b"], name="second")])
    ordered = sorted_model(model)
    assert [node.name for node in ordered.graph.node] == ["first", "second", "last"]
    assert [node.name for node in model.graph.node] == ["last", "first", "second"]  # the caller's model untouched
    assert sorted_model(ordered) is ordered
    x = np.arange(6, dtype=np.float32).reshape(2, 3) - 2
    np.testing.assert_array_equal(ctxrt.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0],
                                  np.maximum(x, 0) - x)


def test_a_subgraph_reading_a_later_outer_value_is_sorted_after_it() -> None:
    n = helper.make_node
    then = helper.make_graph([n("Mul", ["t", "two"], ["o"]), n("Add", ["v", "v"], ["t"])], "then", [],
                             [helper.make_tensor_value_info("o", TensorProto.FLOAT, [2, 3])])
    other = helper.make_graph([n("Identity", ["v"], ["o2"])], "else", [],
                              [helper.make_tensor_value_info("o2", TensorProto.FLOAT, [2, 3])])
    model = _model([n("If", ["c"], ["y"], then_branch=then, else_branch=other),
                    n("Constant", [], ["two"], value_float=2.0), n("Relu", ["x"], ["v"]),
                    n("Constant", [], ["c"], value=helper.make_tensor("c", TensorProto.BOOL, [], [True]))])
    ordered = sorted_model(model)
    assert [node.op_type for node in ordered.graph.node][-1] == "If"
    branch = next(a.g for a in ordered.graph.node[-1].attribute if a.name == "then_branch")
    assert [node.op_type for node in branch.node] == ["Add", "Mul"]
    x = np.arange(6, dtype=np.float32).reshape(2, 3) - 2
    np.testing.assert_array_equal(ctxrt.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0],
                                  4 * np.maximum(x, 0))


def test_a_cycle_is_left_for_the_checker() -> None:
    n = helper.make_node
    model = _model([n("Add", ["x", "b"], ["a"]), n("Relu", ["a"], ["b"]), n("Identity", ["a"], ["y"])])
    assert sorted_model(model) is not model
    with pytest.raises(ModelError, match="topologically sorted"):
        ctxrt.InferenceSession(model.SerializeToString())
