"""Softmax, LogSoftmax, ReduceX and ArgMax/ArgMin vs onnx.reference; no allocation per launch; in place."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from harness import allocated, check, rand
from harness import bind as bind_kernel
from onnx import helper

RNG = np.random.default_rng(11)


def bind(op: str, x: np.ndarray, y: np.ndarray, attrs: dict[str, Any], opset: int = 17):
    return bind_kernel(op, [x], [y], attrs, opset=opset)




SOFTMAX_CASES = [(9, None), (9, 0), (9, 2), (9, -1), (11, 1), (11, -2), (13, None), (13, 0), (13, 1), (13, 2),
                 (13, -1), (13, -3)]


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("opset, axis", SOFTMAX_CASES)
def test_softmax(op: str, opset: int, axis: int | None) -> None:
    kw = {} if axis is None else {"axis": axis}
    x = rand(2, 3, 4, 5, low=-5, high=5)
    # onnx.reference normalizes along the axis at every opset; before 13 it is over the 2-D coercion.
    check(helper.make_node(op, ["x"], ["y"], **kw), {"x": x}, opset=opset, rtol=1e-5, atol=1e-6,
          oracle="reference" if opset >= 13 else "onnxruntime")


def test_softmax_many_blocks_and_masked_rows() -> None:
    x = rand(3, 12, 64, 64, low=-8, high=8)
    x[0, :, :, 40:] = -10000.0  # additive attention mask
    check(helper.make_node("Softmax", ["x"], ["y"]), {"x": x}, opset=13, rtol=1e-5, atol=1e-7)
    check(helper.make_node("Softmax", ["x"], ["y"], axis=1), {"x": x}, opset=13, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin"])
@pytest.mark.parametrize("axes, keepdims", [([-1], 1), ([1], 0), ([0, 2], 1), ([2, -3], 0), (None, 0), (None, 1)])
def test_reduce_axes_input(op: str, axes, keepdims: int) -> None:
    opset = 13 if op == "ReduceSum" else 18
    inits = {"axes": np.array(axes, np.int64)} if axes is not None else {}
    node = helper.make_node(op, ["x"] + (["axes"] if axes is not None else []), ["y"], keepdims=keepdims)
    check(node, {"x": rand(2, 3, 4)}, inits, opset=opset, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
                                "ReduceL2", "ReduceSumSquare", "ReduceLogSumExp"])
@pytest.mark.parametrize("axes, keepdims", [([1], 1), ([0, -1], 0), (None, 1)])
def test_reduce_axes_attribute(op: str, axes, keepdims: int) -> None:
    kw = {"keepdims": keepdims} | ({"axes": axes} if axes is not None else {})
    check(helper.make_node(op, ["x"], ["y"], **kw), {"x": rand(3, 4, 5, low=0.5, high=1.5)}, opset=11,
          rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op", ["ReduceProd", "ReduceL2", "ReduceLogSumExp"])
def test_reduce_axes_input_without_canonical_form(op: str) -> None:
    node = helper.make_node(op, ["x", "axes"], ["y"], keepdims=0)
    check(node, {"x": rand(3, 4, 5, low=0.5, high=1.5)}, {"axes": np.array([-1], np.int64)}, opset=18, rtol=1e-5)


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceL2", "ReduceSumSquare"])
def test_noop_with_empty_axes(op: str) -> None:
    opset = 13 if op == "ReduceSum" else 18
    node = helper.make_node(op, ["x"], ["y"], noop_with_empty_axes=1)
    check(node, {"x": rand(3, 4)}, opset=opset)


def test_reduce_integers() -> None:
    x = RNG.integers(-20, 20, (4, 5)).astype(np.int64)
    for op in ("ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd"):
        check(helper.make_node(op, ["x"], ["y"], axes=[1]), {"x": x}, opset=11)


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("axis, keepdims, last", [(0, 1, 0), (1, 0, 0), (-1, 1, 1), (2, 0, 1), (-3, 0, 1)])
def test_arg(op: str, axis: int, keepdims: int, last: int) -> None:
    x = RNG.integers(0, 3, (3, 4, 5)).astype(np.float32)  # many ties: first vs last index matters
    node = helper.make_node(op, ["x"], ["y"], axis=axis, keepdims=keepdims, select_last_index=last)
    check(node, {"x": x}, opset=13)


# NumPy 2 runs a broadcast whose inner loop has at most bufsize / 2 elements through an iterator buffer of
# bufsize elements, allocated per call and freed at once: 4 KiB of float32 at the backend's bufsize 1024.
# Softmax over rows of <= 512 broadcasts its row max and sum that way (BERT's attention rows are 128).
ITER_BUFFER = 1024 * 4


@pytest.mark.parametrize("op, shape, y_shape, attrs, opset, bound", [
    ("Softmax", (2, 24, 1024), None, {}, 13, 4096), ("LogSoftmax", (2, 24, 1024), None, {}, 13, 4096),
    ("Softmax", (1, 12, 128, 128), None, {}, 13, 4096 + ITER_BUFFER),
    ("Softmax", (1, 12, 128, 128), None, {"axis": 1}, 13, 4096),
    ("Softmax", (1, 12, 128, 128), None, {"axis": 1}, 9, 4096),
    ("ReduceMean", (1, 128, 768), (1, 128, 1), {"axes": [-1]}, 18, 4096),
    ("ReduceSum", (2, 12, 128), (12,), {"axes": [0, 2], "keepdims": 0}, 13, 4096),
    ("ReduceMax", (2, 12, 128), (), {"keepdims": 0}, 18, 4096),
    ("ReduceL2", (2, 12, 128), (2, 1, 128), {"axes": [1]}, 18, 4096),
    ("ArgMax", (2, 12, 128), (2, 12), {"axis": -1, "keepdims": 0, "select_last_index": 1}, 13, 4096),
    ("ArgMin", (2, 12, 128), (2, 1, 128), {"axis": 1}, 13, 4096),
    ("ArgMax", (2, 12, 128), (2, 12), {"axis": -1, "keepdims": 0}, 13, 4096)])
def test_launch_allocates_nothing(op: str, shape, y_shape, attrs: dict, opset: int, bound: int) -> None:
    x = rand(*shape)
    y = np.empty(shape if y_shape is None else y_shape, np.int64 if op.startswith("Arg") else np.float32)
    assert allocated(bind(op, x, y, attrs, opset)) < bound


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("opset, axis", [(9, 1), (13, -1), (13, 1)])
def test_softmax_in_place(op: str, opset: int, axis: int) -> None:
    x = rand(2, 6, 40, 50, low=-5, high=5)
    want = np.empty_like(x)
    bind(op, x, want, {"axis": axis}, opset)()
    bind(op, x, x, {"axis": axis}, opset)()
    np.testing.assert_array_equal(x, want)
