"""Constant folding without onnx.reference's evaluator (frontend/fold.py): each op's edge cases give the values,
dtypes and shapes onnx.reference gives; what it does not take is left to onnx.reference (None)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper
from onnx.reference import ReferenceEvaluator

from ctxrt.frontend.fold import FoldError, fold

i64 = np.int64
CASES = [  # (op, attributes, inputs, opset)
    ("Concat", {"axis": -1}, [np.arange(6, dtype=i64).reshape(2, 3), np.arange(2, dtype=i64).reshape(2, 1)], 17),
    ("Concat", {"axis": 0}, [np.array([1], i64), np.array([], i64), np.array([7, 8], i64)], 17),
    ("Gather", {"axis": 0}, [np.array([4, 5, 6], i64), np.array(1, i64)], 17),  # a 0-d index: a 0-d value
    ("Gather", {"axis": 1}, [np.arange(12, dtype=np.float32).reshape(3, 4), np.array([[-1, 0]], i64)], 17),
    ("Squeeze", {}, [np.zeros((1, 3, 1), i64), np.array([-1], i64)], 17),
    ("Squeeze", {}, [np.zeros((1, 3, 1), i64)], 17),
    ("Squeeze", {}, [np.zeros((1, 3, 1), i64), np.array([], i64)], 17),  # empty axes: nothing squeezed
    ("Squeeze", {"axes": [0]}, [np.zeros((1, 3, 1), i64)], 11),
    ("Unsqueeze", {}, [np.array(5, i64), np.array([0], i64)], 17),
    ("Unsqueeze", {}, [np.zeros((2, 3), i64), np.array([-1, 0], i64)], 17),
    ("Unsqueeze", {"axes": [0, 3]}, [np.zeros((2, 3), i64)], 11),
    ("Reshape", {}, [np.arange(24, dtype=i64).reshape(2, 3, 4), np.array([0, -1], i64)], 17),
    ("Reshape", {"allowzero": 1}, [np.zeros((0, 3), np.float32), np.array([3, 0], i64)], 17),
    ("Expand", {}, [np.array([[1], [2]], i64), np.array([1, 3], i64)], 17),
    ("Expand", {}, [np.array([1, 2, 3], np.float32), np.array([2, 1, 1], i64)], 17),
    ("Slice", {}, [np.arange(10, dtype=i64), np.array([-3], i64), np.array([2 ** 62], i64)], 17),
    ("Slice", {}, [np.arange(10, dtype=i64), np.array([8], i64), np.array([-2 ** 62], i64), np.array([0], i64),
                   np.array([-3], i64)], 17),
    ("Slice", {}, [np.arange(12, dtype=i64).reshape(3, 4), np.array([1, -1], i64), np.array([3, 0], i64),
                   np.array([0, 1], i64), np.array([1, -1], i64)], 17),
    ("Range", {}, [np.array(2, i64), np.array(11, i64), np.array(3, i64)], 17),
    ("Range", {}, [np.array(5, np.int32), np.array(0, np.int32), np.array(-2, np.int32)], 17),
    ("Trilu", {}, [np.ones((3, 4), i64), np.array(1, i64)], 17),
    ("Trilu", {"upper": 0}, [np.ones((2, 3, 3), np.float32), np.array(-1, i64)], 17),
    ("Add", {}, [np.array([2 ** 31 - 1], np.int32), np.array([1], np.int32)], 17),  # wraps, as NumPy's
    ("Mul", {}, [np.array([[2], [3]], i64), np.array([4, 5], i64)], 17),
    ("Sub", {}, [np.array(7, i64), np.array([1, 2], i64)], 17),
]


@pytest.mark.parametrize("op, attrs, ins, opset", CASES, ids=[f"{c[0]}-{k}" for k, c in enumerate(CASES)])
def test_folds_as_onnx_reference(op, attrs, ins, opset) -> None:
    got = fold(op, attrs, ins, opset)
    assert got is not None
    names = [f"i{k}" for k in range(len(ins))]
    node = helper.make_node(op, names, ["o"], **attrs)
    io = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
          for n, a in zip(names, ins, strict=True)]
    graph = helper.make_graph([node], "t", io, [helper.make_tensor_value_info("o", 0, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    want = np.asarray(ReferenceEvaluator(model).run(None, dict(zip(names, ins, strict=True)))[0])
    got = np.asarray(got[0])
    assert (got.shape, got.dtype) == (want.shape, want.dtype)
    np.testing.assert_array_equal(got, want)


def test_what_it_does_not_take_is_left_to_onnx_reference() -> None:
    f32 = np.float32
    assert fold("Add", {}, [np.ones(2, f32), np.ones(2, f32)], 17) is None  # float arithmetic: onnx.reference's
    assert fold("Div", {}, [np.ones(2, i64), np.ones(2, i64)], 17) is None  # (truncation, not NumPy's floor)
    assert fold("Range", {}, [np.array(0.5, f32), np.array(2, f32), np.array(0.5, f32)], 17) is None
    assert fold("Concat", {"axis": 0}, [np.array(1, i64), np.array([2], i64)], 17) is None  # a 0-d input
    assert fold("Slice", {"starts": [0], "ends": [1]}, [np.arange(3, dtype=i64)], 9) is None  # attributes (opset 1)
    assert fold("Unsqueeze", {}, [np.ones(2, i64)], 17) is None  # no axes
    assert fold("Softmax", {}, [np.ones(2, f32)], 17) is None
    assert fold("Range", {}, [np.array(0, i64), np.array(4, i64), np.array(0, i64)], 17) is None  # a zero step
    assert fold("Slice", {}, [np.arange(3, dtype=i64), np.array([0], i64), np.array([2], i64), np.array([0], i64),
                              np.array([0], i64)], 17) is None  # a zero step


@pytest.mark.parametrize("op, attrs, ins", [
    ("Gather", {"axis": 0}, [np.arange(3, dtype=i64), np.array([5], i64)]),  # past a position table's rows
    ("Gather", {"axis": 0}, [np.arange(3, dtype=i64), np.array([-4], i64)]),
    ("Squeeze", {}, [np.zeros((1, 3), i64), np.array([2], i64)]),  # an axis out of range
    ("Unsqueeze", {}, [np.zeros((2, 3), i64), np.array([3], i64)])])
def test_an_index_out_of_bounds_is_the_models_error_not_a_fallback(op, attrs, ins) -> None:
    """Raised at once (onnx.reference, whose NumPy calls fail the same way, is not imported to say so): a session's
    first upper bound past a decoder's position table fails fast, then is halved (runtime/session.py)."""
    with pytest.raises(FoldError):
        fold(op, attrs, ins, 17)
    names = [f"i{k}" for k in range(len(ins))]
    io = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
          for n, a in zip(names, ins, strict=True)]
    graph = helper.make_graph([helper.make_node(op, names, ["o"], **attrs)], "t", io,
                              [helper.make_tensor_value_info("o", 0, None)])
    with pytest.raises(Exception):  # noqa: B017, PT011  (onnx.reference's own: an IndexError or a ValueError)
        ReferenceEvaluator(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])).run(
            None, dict(zip(names, ins, strict=True)))
