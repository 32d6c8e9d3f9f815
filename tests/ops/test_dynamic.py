"""Ops whose output size depends on the data (NonZero, Compress, Unique, NonMaxSuppression): planned at an
upper bound, the real shape returned; against onnxruntime."""

from __future__ import annotations

import json

import numpy as np
import onnxruntime as ort
import pytest
from harness import ITERATOR_BUFFER, check, make_model, rand, steady_state_allocation
from onnx import TensorProto as T
from onnx import helper

import ctxrt
from ctxrt.cli import main as cli
from ctxrt.errors import UnsupportedOpError

RNG = np.random.default_rng(0)


def sparse(*shape, dtype=np.float32, density=0.4):
    return (rand(*shape) * (RNG.random(shape) < density)).astype(dtype)


@pytest.mark.parametrize("x", [sparse(7), sparse(3, 4), sparse(2, 3, 4, dtype=np.int32), sparse(5, 6) > 0,
                               np.zeros((3, 3), np.float32), np.ones((2, 5), np.int64)])
def test_nonzero(x) -> None:
    got = check(helper.make_node("NonZero", ["x"], ["y"]), {"x": x}, oracle="onnxruntime")
    assert got[0].shape == (x.ndim, np.count_nonzero(x))


def test_nonzero_through_transpose_and_cast_is_a_graph_output() -> None:
    """torch.nonzero exports NonZero -> Transpose."""
    nodes = [helper.make_node("NonZero", ["x"], ["nz"]), helper.make_node("Transpose", ["nz"], ["t"], perm=[1, 0]),
             helper.make_node("Cast", ["t"], ["y"], to=6)]
    got = check(nodes, {"x": sparse(4, 5)}, oracle="onnxruntime")
    assert got[0].dtype == np.int32


@pytest.mark.parametrize("axis", [None, 0, 1, -1])
@pytest.mark.parametrize("clen", [2, 4])
def test_compress(axis, clen) -> None:
    cond = np.array([1, 0, 1, 1][:clen], bool)
    attrs = {} if axis is None else {"axis": axis}
    check(helper.make_node("Compress", ["x", "c"], ["y"], **attrs), {"x": rand(4, 5), "c": cond}, oracle="onnxruntime")


def check_ort(node, feeds, inits=None, types=()):
    """ctxrt vs onnxruntime where onnx.reference cannot run the node (its outputs typed by `types`)."""
    m = make_model(node, feeds, inits)
    for out, t in zip(m.graph.output, types, strict=True):
        out.type.tensor_type.elem_type = t
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    got = ctxrt.compile(m).graph().run(feeds)
    for out, w in zip(m.graph.output, want, strict=True):
        np.testing.assert_array_equal(got[out.name], w, err_msg=out.name)


@pytest.mark.parametrize("attrs", [{}, {"sorted": 0}, {"axis": 0}, {"axis": 1, "sorted": 0}, {"axis": -1}])
def test_unique(attrs) -> None:
    x = RNG.integers(0, 3, size=(4, 3)).astype(np.float32)
    x[2] = x[0]  # repeated rows for axis=0
    node = helper.make_node("Unique", ["x"], ["y", "first", "inverse", "counts"], **attrs)
    check_ort(node, {"x": x}, types=(T.FLOAT, T.INT64, T.INT64, T.INT64))


def test_unique_with_only_its_values_read() -> None:
    check(helper.make_node("Unique", ["x"], ["y"]), {"x": RNG.integers(0, 5, 9).astype(np.int64)},
          oracle="onnxruntime")


def boxes(batch, n, center):
    corners = RNG.random((batch, n, 2)).astype(np.float32) * 4
    sizes = RNG.random((batch, n, 2)).astype(np.float32) + 0.5
    if center:
        return np.concatenate([corners, sizes], -1)
    return np.concatenate([corners, corners + sizes], -1)[..., [0, 1, 2, 3]]


@pytest.mark.parametrize("center", [0, 1])
@pytest.mark.parametrize("thresholds", [(), (0.5,), (0.3, 0.4)])
def test_non_max_suppression(center, thresholds) -> None:
    b, c, n = 2, 3, 12
    feeds = {"boxes": boxes(b, n, center), "scores": RNG.random((b, c, n)).astype(np.float32)}
    inits = {"k": np.array([4], np.int64)}
    names = ["boxes", "scores", "k"]
    for i, t in enumerate(thresholds):
        inits[f"t{i}"] = np.array([t], np.float32)
        names.append(f"t{i}")
    node = helper.make_node("NonMaxSuppression", names, ["sel"], center_point_box=center)
    check_ort(node, feeds, inits, types=(T.INT64,))


def test_non_max_suppression_with_run_time_thresholds_and_flipped_corners() -> None:
    bx = boxes(1, 10, 0)
    bx[0, ::2] = bx[0, ::2][:, [2, 3, 0, 1]]  # corners in the other order
    feeds = {"boxes": bx, "scores": RNG.random((1, 2, 10)).astype(np.float32),
             "iou": np.array([0.2], np.float32), "score": np.array([0.3], np.float32)}
    node = helper.make_node("NonMaxSuppression", ["boxes", "scores", "k", "iou", "score"], ["sel"])
    check_ort(node, feeds, {"k": np.array([10], np.int64)}, types=(T.INT64,))


def test_readers_that_need_the_size_are_refused_by_name() -> None:
    nodes = [helper.make_node("NonZero", ["x"], ["nz"], name="nz"),
             helper.make_node("ReduceSum", ["nz"], ["y"], keepdims=0, name="sum_nz")]
    with pytest.raises(UnsupportedOpError, match=r"ReduceSum node 'sum_nz' reads 'nz', whose size along axis 1 "
                                                 "is known only at run time"):
        ctxrt.compile(make_model(nodes, {"x": rand(3, 3)}))
    nodes = [helper.make_node("NonZero", ["x"], ["nz"]), helper.make_node("Shape", ["nz"], ["y"], name="shape_nz")]
    with pytest.raises(UnsupportedOpError, match="Shape node 'shape_nz' reads 'nz'"):
        ctxrt.compile(make_model(nodes, {"x": rand(3, 3)}))


def test_real_shapes_through_execute_sessions_and_bindings(tmp_path) -> None:
    m = make_model([helper.make_node("NonZero", ["x"], ["y"])], {"x": rand(3, 4)})
    x = sparse(3, 4)
    want = np.array(np.nonzero(x))
    g = ctxrt.compile(m).graph()
    assert g.outputs[0].shape == (2, 12)  # the upper bound
    out = {"y": np.empty((2, 12), np.int64)}
    assert g.execute({"x": x}, out) == {"y": want.shape}
    np.testing.assert_array_equal(out["y"][:, :want.shape[1]], want)
    with ctxrt.InferenceSession(m.SerializeToString()) as sess:
        np.testing.assert_array_equal(sess.run(None, {"x": x})[0], want)
        b = sess.io_binding()
        b.bind_input("x", x)
        b.bind_output("y")
        sess.run_with_iobinding(b)
        np.testing.assert_array_equal(b.copy_outputs_to_cpu()[0], want)
    path = tmp_path / "m.onnx"
    path.write_bytes(m.SerializeToString())
    assert cli(["compile", str(path), "-o", str(tmp_path / "m.ctx")]) == 0
    assert cli(["inspect", str(tmp_path / "m.ctx"), "--json"]) == 0


def test_inspect_shows_the_bound(capsys, tmp_path) -> None:
    path = tmp_path / "m.onnx"
    path.write_bytes(make_model([helper.make_node("NonZero", ["x"], ["y"])], {"x": rand(3, 4)}).SerializeToString())
    assert cli(["compile", str(path), "-o", str(tmp_path / "m.ctx")]) == 0
    capsys.readouterr()
    assert cli(["inspect", str(tmp_path / "m.ctx")]) == 0
    assert "output y: <i8[2, <=12]" in capsys.readouterr().out
    assert cli(["inspect", str(tmp_path / "m.ctx"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["graphs"][0]["bounded_outputs"] == {"y": 1}
    assert cli(["run", str(tmp_path / "m.ctx"), "--json"]) == 0
    shape = json.loads(capsys.readouterr().out)["outputs"]["y"]
    assert shape[0] == 2 and shape[1] <= 12


@pytest.mark.parametrize("op", ["NonZero", "Compress"])
def test_nonzero_and_compress_allocate_nothing_per_run(op) -> None:
    x = sparse(64, 64)
    feeds = {"x": x} if op == "NonZero" else {"x": x, "c": RNG.random(64) < 0.5}
    node = helper.make_node(op, list(feeds), ["y"], **({"axis": 1} if op == "Compress" else {}))
    g = ctxrt.compile(make_model(node, feeds)).graph()
    outs = {"y": np.empty(g.outputs[0].shape, np.dtype(g.outputs[0].dtype))}
    peak, growth = steady_state_allocation(lambda: g.execute(feeds, outs))
    assert peak < ITERATOR_BUFFER and growth < 2048
