"""Data-movement kernels vs onnx.reference; no allocation per launch."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from harness import allocated, bind, check, make_model, rand, run_ctxrt
from onnx import helper

from ctxrt.backends.cpu import shape
from ctxrt.backends.kernel import NodeSpec, TensorSpec
from ctxrt.errors import UnsupportedOpError

RNG = np.random.default_rng(5)
I64 = np.iinfo(np.int64)






def ints(*values: Any) -> np.ndarray:
    return np.array(values, np.int64)


@pytest.mark.parametrize("axis", [0, 1, 2, -1, -3])
def test_concat(axis: int) -> None:
    shapes = [[2, 3, 4], [2, 3, 4], [2, 3, 4]]
    for k, s in enumerate(shapes):
        s[axis] += k
    feeds = {f"x{k}": rand(*s) for k, s in enumerate(shapes)}
    check(helper.make_node("Concat", list(feeds), ["y"], axis=axis), feeds)


def test_concat_with_a_constant_input() -> None:
    check(helper.make_node("Concat", ["a", "b", "c"], ["y"], axis=1), {"a": rand(2, 3), "c": rand(2, 1)},
          {"b": rand(2, 2)})


@pytest.mark.parametrize("perm", [[0, 2, 1, 3], [3, 2, 1, 0], [1, 0, 2, 3], [0, 1, 3, 2], None])
def test_transpose(perm) -> None:
    kw = {"perm": perm} if perm else {}
    check(helper.make_node("Transpose", ["x"], ["y"], **kw), {"x": rand(2, 3, 4, 5)})


SLICES = [
    ([1], [3], [1], [1]), ([-3, 0], [100, -1], [2, 0], [1, 1]), ([5], [-100], [1], [-2]),
    ([0, 1], [2**62, 4], [-1, 1], [2, 2]), ([-1], [I64.min], [1], [-1]), ([I64.max], [I64.min], [2], [-3]),
    ([I64.min], [I64.max], [0], [1]), ([4], [2], [1], [1]), ([-100], [100], [-2], [3]), ([2], [0], [0], [-1]),
    ([0, 0, 0], [-1, -1, -1], None, None), ([3], [5], [1], None),
]


@pytest.mark.parametrize("starts, ends, axes, steps", SLICES)
def test_slice(starts, ends, axes, steps) -> None:
    inputs = {"s": starts, "e": ends, "a": axes, "p": steps}  # steps need axes: inputs are positional
    inits = {k: ints(*v) for k, v in inputs.items() if v is not None}
    check(helper.make_node("Slice", ["x", *inits], ["y"]), {"x": rand(4, 6, 5)}, inits)


def test_slice_opset9_attributes() -> None:
    node = helper.make_node("Slice", ["x"], ["y"], starts=[1, -4], ends=[1000, -1], axes=[0, 2])
    check(node, {"x": rand(3, 4, 5)}, opset=9)


@pytest.mark.parametrize("axis, split, opset", [(1, [2, 4], 13), (-1, [1, 2, 3], 13), (0, None, 13), (2, None, 13),
                                                (1, [1, 5], 11), (1, [0, 6], 13)])
def test_split(axis: int, split, opset: int) -> None:
    n = len(split) if split else 3
    outs = [f"y{i}" for i in range(n)]
    if opset < 13:
        node = helper.make_node("Split", ["x"], outs, axis=axis, split=split)
        check(node, {"x": rand(3, 6, 6)}, opset=opset)
        return
    inits = {"split": ints(*split)} if split else {}
    node = helper.make_node("Split", ["x"] + (["split"] if split else []), outs, axis=axis)
    check(node, {"x": rand(3, 6, 6)}, inits, opset=opset)


@pytest.mark.parametrize("dim, n", [(7, 3), (6, 3), (5, 2)])
def test_split_num_outputs(dim: int, n: int) -> None:
    node = helper.make_node("Split", ["x"], [f"y{i}" for i in range(n)], axis=1, num_outputs=n)
    check(node, {"x": rand(2, dim)}, opset=18)


def test_split_with_a_dropped_output_is_refused() -> None:
    spec = NodeSpec("Split", "s", {"axis": 0}, [TensorSpec((6,), np.float32)],
                    [TensorSpec((2,), np.float32), TensorSpec((2,), np.float32)], [None])
    with pytest.raises(UnsupportedOpError, match="Split node 's'"):
        shape.KERNELS["Split"](spec)


@pytest.mark.parametrize("xs, target", [((3, 1), (2, 3, 4)), ((2, 1, 4), (3, 1)), ((1,), (2, 3)), ((4,), (1,)),
                                        ((2, 3), (2, 3))])
def test_expand(xs, target) -> None:
    check(helper.make_node("Expand", ["x", "s"], ["y"]), {"x": rand(*xs)}, {"s": ints(*target)})


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("idx_dtype", [np.int64, np.int32])
def test_gather_negative_indices(axis: int, idx_dtype) -> None:
    idx = np.array([[0, -1], [2, -3]], idx_dtype)
    check(helper.make_node("Gather", ["d", "i"], ["y"], axis=axis), {"i": idx}, {"d": rand(4, 5, 3)})
    check(helper.make_node("Gather", ["d", "i"], ["y"], axis=axis), {"d": rand(4, 5, 3)}, {"i": idx})


def test_gather_embedding_and_scalar_index() -> None:
    ids = RNG.integers(0, 1000, (2, 16)).astype(np.int64)
    check(helper.make_node("Gather", ["w", "i"], ["y"]), {"i": ids}, {"w": rand(1000, 32)})
    check(helper.make_node("Gather", ["x", "i"], ["y"], axis=1), {"x": rand(2, 7, 3)}, {"i": np.array(-2, np.int64)})


@pytest.mark.parametrize("axis", [0, 1, 2])  # onnx.reference fails on negative axes here
@pytest.mark.parametrize("const", [False, True])
def test_gather_elements(axis: int, const: bool) -> None:
    idx = RNG.integers(-3, 3, size=(3, 2, 4)).astype(np.int64)
    data = rand(*(5 if d == axis % 3 else n for d, n in enumerate(idx.shape)))  # onnx.reference's limit
    node = helper.make_node("GatherElements", ["d", "i"], ["y"], axis=axis)
    if const:
        check(node, {"d": data}, {"i": idx})
    else:
        check(node, {"d": data, "i": idx.astype(np.int32)})


@pytest.mark.parametrize("dshape, idx, batch_dims", [
    ((3, 4, 2), [[0, 1], [2, -4]], 0), ((3, 4, 2), [[[1]], [[-1]]], 0), ((3, 4, 2), [[0, 1, 1], [2, 3, 0]], 0),
    ((2, 3, 4), [[1], [2]], 1), ((2, 3, 4), [[[1, 3], [0, 0]], [[2, -1], [1, 2]]], 1),
    ((2, 2, 3, 4), [[[1, 2]], [[0, -1]]], 1), ((2, 3, 4, 2), [[[1], [0], [3]], [[2], [2], [0]]], 2)])
def test_gather_nd(dshape, idx, batch_dims: int) -> None:
    node = helper.make_node("GatherND", ["d", "i"], ["y"], batch_dims=batch_dims)
    check(node, {"d": rand(*dshape), "i": np.array(idx, np.int64)})


@pytest.mark.parametrize("xs, reps", [((2, 3), (2, 1)), ((2, 3), (1, 3)), ((2, 1, 3), (2, 3, 2)), ((4,), (1,))])
def test_tile(xs, reps) -> None:
    check(helper.make_node("Tile", ["x", "r"], ["y"]), {"x": rand(*xs)}, {"r": ints(*reps)})


PADS = [[0, 1, 2, 0], [2, 0, 1, 3], [1, 1, 1, 1], [0, 0, 0, 0]]


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
@pytest.mark.parametrize("pads", PADS)
def test_pad(mode: str, pads) -> None:
    inits = {"p": ints(*pads), "v": np.array(1.5, np.float32)}
    names = ["x", "p"] + (["v"] if mode == "constant" else [])
    check(helper.make_node("Pad", names, ["y"], mode=mode), {"x": rand(4, 5)}, inits, opset=19)


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
def test_pad_negative_crops(mode: str) -> None:
    # onnx.reference (np.pad) refuses negative pads; onnxruntime crops first, then pads what is left.
    x, pads = rand(4, 5), [-1, 2, 1, -2]
    model = make_model(helper.make_node("Pad", ["x", "p"], ["y"], mode=mode), {"x": x}, {"p": ints(*pads)}, 19)
    want = np.pad(x[1:, :3], [(0, 1), (2, 0)], mode=mode)
    np.testing.assert_array_equal(run_ctxrt(model, {"x": x})[0], want)


def test_pad_axes_and_old_opsets() -> None:
    node = helper.make_node("Pad", ["x", "p", "", "a"], ["y"], mode="edge")
    check(node, {"x": rand(2, 3, 4)}, {"p": ints(1, 2, 0, 1), "a": ints(-1, 0)}, opset=18)
    check(helper.make_node("Pad", ["x"], ["y"], pads=[0, 1, 1, 0], value=-2.0), {"x": rand(3, 3)}, opset=2)
    check(helper.make_node("Pad", ["x", "p"], ["y"]), {"x": np.arange(12, dtype=np.int32).reshape(3, 4)},
          {"p": ints(1, 0, 0, 2)}, opset=13)


@pytest.mark.parametrize("op, kw, inits", [
    ("Reshape", {}, {"s": ints(0, -1)}), ("Flatten", {"axis": 2}, {}), ("Flatten", {}, {}),
    ("Squeeze", {}, {"s": ints(1)}), ("Unsqueeze", {}, {"s": ints(-1, 0)}), ("Identity", {}, {})])
def test_copy_ops_as_graph_outputs(op: str, kw, inits) -> None:
    # As graph outputs they are copies; inside graphs the planner makes them zero-copy views.
    check(helper.make_node(op, ["x"] + list(inits), ["y"], **kw), {"x": rand(2, 1, 3)}, inits)


@pytest.mark.parametrize("op, attrs, xs", [("DepthToSpace", {"blocksize": 2}, (1, 8, 2, 3)),
                                           ("DepthToSpace", {"blocksize": 2, "mode": "CRD"}, (2, 8, 3, 2)),
                                           ("SpaceToDepth", {"blocksize": 2}, (2, 3, 4, 6))])
def test_depth_space(op: str, attrs: dict, xs) -> None:
    check(helper.make_node(op, ["x"], ["y"], **attrs), {"x": rand(*xs)})


def test_range_and_constant_of_shape_kernels() -> None:
    y = np.empty(4, np.float32)
    consts = [np.array(1.0, np.float32), np.array(3.0, np.float32), np.array(0.5, np.float32)]
    bind("Range", consts, [y], {}, consts)()
    np.testing.assert_array_equal(y, [1.0, 1.5, 2.0, 2.5])
    z = np.empty((2, 3), np.int64)
    bind("ConstantOfShape", [np.array([2, 3], np.int64)], [z], {"value": np.array([7], np.int64)})()
    assert (z == 7).all()


def _no_alloc_cases() -> list[tuple[str, list[np.ndarray], list[np.ndarray], dict, list | None]]:
    x, emb = rand(1, 128, 12, 64), rand(3000, 768)
    ids, ids32 = RNG.integers(-3000, 3000, (1, 128)).astype(np.int64), RNG.integers(0, 3000, (1, 128)).astype(np.int32)
    parts = [rand(1, 128, 12, 64) for _ in range(3)]
    return [
        ("Transpose", [x], [np.empty((1, 12, 128, 64), np.float32)], {"perm": [0, 2, 1, 3]}, None),
        ("Slice", [x], [np.empty((1, 64, 12, 64), np.float32)], {"starts": [-1], "ends": [I64.min], "axes": [1],
                                                                   "steps": [-2]}, None),
        ("Gather", [emb, ids], [np.empty((1, 128, 768), np.float32)], {}, [emb, None]),
        ("Gather", [emb, ids32], [np.empty((1, 128, 768), np.float32)], {}, [emb, None]),
        ("Gather", [x, np.array(3, np.int64)], [np.empty((1, 128, 64), np.float32)], {"axis": 2}, None),
        ("Concat", parts, [np.empty((1, 384, 12, 64), np.float32)], {"axis": 1}, None),
        ("Split", [x], [np.empty((1, 128, 4, 64), np.float32), np.empty((1, 128, 8, 64), np.float32)],
         {"axis": 2, "split": [4, 8]}, None),
        ("Expand", [rand(1, 1, 128)], [np.empty((1, 12, 128, 128), np.float32)], {}, None),
        ("Tile", [rand(2, 64)], [np.empty((4, 128), np.float32)], {"repeats": [2, 2]}, None),
        ("Pad", [rand(3, 32, 32)], [np.empty((3, 34, 36), np.float32)], {"pads": [0, 1, 2, 0, 1, 2]}, None),
        ("Pad", [rand(3, 32, 32)], [np.empty((3, 34, 36), np.float32)],
         {"pads": [0, 1, 2, 0, 1, 2], "mode": "reflect"}, None),
        ("GatherElements", [rand(64, 32), RNG.integers(-32, 32, (64, 16))], [np.empty((64, 16), np.float32)],
         {"axis": 1}, None),
        ("GatherND", [rand(64, 32, 8), RNG.integers(0, 32, (64, 10, 1))], [np.empty((64, 10, 8), np.float32)],
         {"batch_dims": 1}, None),
        ("Reshape", [x], [np.empty((128, 768), np.float32)], {}, None),
    ]


@pytest.mark.parametrize("case", range(len(_no_alloc_cases())))
def test_launch_allocates_nothing(case: int) -> None:
    op, ins, outs, attrs, consts = _no_alloc_cases()[case]
    assert allocated(bind(op, ins, outs, attrs, consts)) < 4096, op
