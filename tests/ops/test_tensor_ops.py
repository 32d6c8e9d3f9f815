"""Element-wise, logic, reduction and shape ops against onnx.reference on random inputs."""

from __future__ import annotations

import math

import numpy as np
import pytest
from harness import check, rand
from onnx import TensorProto, helper

BROADCASTS = [((3, 4), (3, 4)), ((2, 3, 4), (4,)), ((2, 1, 4), (3, 1)), ((1,), (2, 3)), ((5, 1, 1), (1, 4, 3))]


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div", "Max", "Min", "Pow"])
@pytest.mark.parametrize("sa, sb", BROADCASTS)
def test_binary_broadcasting(op: str, sa, sb) -> None:
    low = 0.5 if op in ("Div", "Pow") else -1.0
    a, b = rand(*sa, low=low, high=2.0), rand(*sb, low=low, high=2.0)
    check(helper.make_node(op, ["a", "b"], ["y"]), {"a": a, "b": b}, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op", ["Equal", "Less", "Greater", "GreaterOrEqual", "LessOrEqual"])
def test_comparisons(op: str) -> None:
    a = np.random.default_rng(1).integers(-3, 3, size=(2, 3, 4)).astype(np.int64)
    b = np.random.default_rng(2).integers(-3, 3, size=(3, 1)).astype(np.int64)
    check(helper.make_node(op, ["a", "b"], ["y"]), {"a": a, "b": b})


@pytest.mark.parametrize("op", ["And", "Or"])
def test_logic(op: str) -> None:
    rng = np.random.default_rng(3)
    check(helper.make_node(op, ["a", "b"], ["y"]), {"a": rng.random((2, 5)) > 0.5, "b": rng.random((5,)) > 0.5})


@pytest.mark.parametrize("op", ["Relu", "Tanh", "Sqrt", "Exp", "Neg", "Abs", "Log", "Reciprocal"])
def test_unary(op: str) -> None:
    low = 0.1 if op in ("Sqrt", "Log", "Reciprocal") else -2.0
    check(helper.make_node(op, ["x"], ["y"]), {"x": rand(3, 7, low=low, high=2.0)}, rtol=1e-5, atol=1e-6)


def test_erf_matches_math_erf_to_5e7() -> None:
    x = np.linspace(-6, 6, 100_001, dtype=np.float32).reshape(1, -1)
    got = check(helper.make_node("Erf", ["x"], ["y"]), {"x": x}, rtol=0, atol=5e-7)[0]
    want = np.array([math.erf(v) for v in x.reshape(-1).astype(np.float64)])
    assert np.max(np.abs(got.reshape(-1) - want)) < 5e-7


def test_isnan_and_where() -> None:
    x = rand(4, 5)
    x[1, 2] = np.nan
    check(helper.make_node("IsNaN", ["x"], ["y"]), {"x": x})
    cond = np.random.default_rng(4).random((4, 1)) > 0.5
    check(helper.make_node("Where", ["c", "a", "b"], ["y"]), {"c": cond, "a": rand(4, 5), "b": rand(5)})


def test_sum_variadic() -> None:
    check(helper.make_node("Sum", ["a", "b", "c"], ["y"]), {"a": rand(2, 3), "b": rand(2, 3), "c": rand(3)})


@pytest.mark.parametrize("to, src", [(TensorProto.FLOAT, np.int64), (TensorProto.INT64, np.float32),
                                     (TensorProto.BOOL, np.float32), (TensorProto.FLOAT, np.bool_)])
def test_cast(to: int, src) -> None:
    x = (rand(3, 4, low=-3, high=3) > 0) if src == np.bool_ else rand(3, 4, low=-3, high=3).astype(src)
    check(helper.make_node("Cast", ["x"], ["y"], to=to), {"x": x})


@pytest.mark.parametrize("axes, keepdims", [([-1], 1), ([1], 0), ([0, 2], 1), (None, 0)])
def test_reduce_mean(axes, keepdims: int) -> None:
    inits = {"axes": np.array(axes, np.int64)} if axes is not None else {}
    node = helper.make_node("ReduceMean", ["x"] + (["axes"] if axes is not None else []), ["y"], keepdims=keepdims)
    check(node, {"x": rand(2, 3, 4)}, inits, opset=18, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("starts, ends, axes, steps", [
    ([1], [3], [1], [1]), ([-3, 0], [100, -1], [2, 0], [1, 1]), ([5], [-100], [1], [-2]),
    ([0, 1], [2**62, 4], [-1, 1], [2, 2])])
def test_slice(starts, ends, axes, steps) -> None:
    inits = {k: np.array(v, np.int64) for k, v in zip(["s", "e", "a", "p"], [starts, ends, axes, steps], strict=True)}
    check(helper.make_node("Slice", ["x", "s", "e", "a", "p"], ["y"]), {"x": rand(3, 6, 5)}, inits)


@pytest.mark.parametrize("axis, split", [(1, [2, 4]), (-1, [1, 1, 3]), (0, None)])
def test_split(axis: int, split) -> None:
    n = len(split) if split else 3
    outs = [f"y{i}" for i in range(n)]
    inits = {"split": np.array(split, np.int64)} if split else {}
    node = helper.make_node("Split", ["x"] + (["split"] if split else []), outs, axis=axis)
    check(node, {"x": rand(3, 6, 5)}, inits)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_concat(axis: int) -> None:
    shapes = [(2, 3, 4), (2, 3, 4)]
    shapes[1] = tuple(d + 1 if i == axis % 3 else d for i, d in enumerate(shapes[1]))
    check(helper.make_node("Concat", ["a", "b"], ["y"], axis=axis), {"a": rand(*shapes[0]), "b": rand(*shapes[1])})


@pytest.mark.parametrize("perm", [[0, 2, 1, 3], [3, 2, 1, 0], None])
def test_transpose(perm) -> None:
    kw = {"perm": perm} if perm else {}
    check(helper.make_node("Transpose", ["x"], ["y"], **kw), {"x": rand(2, 3, 4, 5)})


def test_expand() -> None:
    check(helper.make_node("Expand", ["x", "s"], ["y"]), {"x": rand(3, 1)}, {"s": np.array([2, 3, 4], np.int64)})


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_gather_negative_indices(axis: int) -> None:
    idx = np.array([[0, -1], [2, -3]], np.int64)
    check(helper.make_node("Gather", ["d", "i"], ["y"], axis=axis), {"i": idx}, {"d": rand(4, 5, 3)})


@pytest.mark.parametrize("axis", [0, 1])
def test_gather_elements(axis: int) -> None:
    idx = np.random.default_rng(5).integers(-3, 3, size=(3, 4)).astype(np.int64)
    check(helper.make_node("GatherElements", ["d", "i"], ["y"], axis=axis), {"d": rand(3, 4), "i": idx})


def test_gather_nd() -> None:
    idx = np.array([[0, 1], [2, 0]], np.int64)
    check(helper.make_node("GatherND", ["d", "i"], ["y"]), {"d": rand(3, 4, 2), "i": idx})


@pytest.mark.parametrize("op, kw, inits", [
    ("Reshape", {}, {"s": np.array([0, -1], np.int64)}), ("Flatten", {"axis": 2}, {}),
    ("Squeeze", {}, {"s": np.array([1], np.int64)}), ("Unsqueeze", {}, {"s": np.array([-1, 0], np.int64)})])
def test_view_ops_as_graph_outputs(op: str, kw, inits) -> None:
    # As graph outputs they are copies; inside graphs they are zero-copy views (tests/unit).
    check(helper.make_node(op, ["x"] + list(inits), ["y"], **kw), {"x": rand(2, 1, 3)}, inits)
