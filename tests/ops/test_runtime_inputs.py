"""Inputs read at run time vs onnxruntime: an input that decides no shape (Clip's bounds, Pad's constant value,
Where's condition) needs no value at compile time, and one compile serves every value. Inputs that decide a shape
(Resize's scales, NonMaxSuppression's max_output_boxes_per_class, Range's limits) still specialize: value inputs
baked in from the feeds (docs/shapes-and-control-flow.md)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import harness
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from harness import make_model, rand
from onnx import helper

import ctxrt
from ctxrt.errors import ValueInputError


@contextmanager
def compiled(model: onnx.ModelProto) -> Iterator[ctxrt.Graph]:
    """The model compiled once, with no value given for any input."""
    ctx = ctxrt.compile(model, backend=harness.BACKEND)
    try:
        yield ctx.graph()
    finally:
        ctx.free()


def oracle(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def same(got: dict[str, np.ndarray], model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> None:
    for out, want in zip(model.graph.output, oracle(model, feeds), strict=True):
        assert got[out.name].shape == want.shape and got[out.name].dtype == want.dtype
        np.testing.assert_allclose(got[out.name], want, rtol=1e-6, atol=1e-6)


def typed(model: onnx.ModelProto, *dtypes: type) -> onnx.ModelProto:
    """The model with its outputs typed (onnxruntime needs output types)."""
    for out, dt in zip(model.graph.output, dtypes, strict=True):
        out.type.tensor_type.elem_type = helper.np_dtype_to_tensor_dtype(np.dtype(dt))
    return model


def test_clip_to_a_floor_computed_from_the_data() -> None:
    """A mel front end's dynamic-range clamp: y = Clip(10 log10(x), max(...) - 80)."""
    nodes = [helper.make_node("Log", ["x"], ["ln"]), helper.make_node("Mul", ["ln", "db"], ["lg"]),
             helper.make_node("ReduceMax", ["lg"], ["top"], keepdims=0),
             helper.make_node("Sub", ["top", "range"], ["floor"]), helper.make_node("Clip", ["lg", "floor"], ["y"])]
    model = typed(make_model(nodes, {"x": rand(2, 80, 30)},
                             {"db": np.float32(10 / np.log(10)), "range": np.float32(80.0)}, opset=13), np.float32)
    with compiled(model) as g:
        for scale in (1.0, 1e-9):  # the second one's floor clamps most values
            feeds = {"x": rand(2, 80, 30, low=1e-12, high=1.0) ** 4 * np.float32(scale)}
            same(g.run(feeds), model, feeds)


@pytest.mark.parametrize("names", [["x", "lo", "hi"], ["x", "lo"], ["x", "", "hi"]])
def test_clip_bounds_given_as_inputs(names: list[str]) -> None:
    feeds = {"x": rand(3, 5, low=-4, high=4)}
    feeds.update({n: np.array(0, np.float32) for n in names[1:] if n})
    model = typed(make_model(helper.make_node("Clip", names, ["y"]), feeds, opset=13), np.float32)
    with compiled(model) as g:
        for lo, hi in ((-1.0, 2.0), (0.5, 0.7), (1.0, -1.0)):  # min > max: every value becomes max
            bounds = {"lo": np.array(lo, np.float32), "hi": np.array(hi, np.float32)}
            feeds.update({n: bounds[n] for n in names[1:] if n})
            same(g.run(feeds), model, feeds)


def test_clip_of_integers_with_a_constant_min_and_a_run_time_max() -> None:
    feeds = {"x": np.arange(-100, 100, dtype=np.int8), "hi": np.array(0, np.int8)}
    model = typed(make_model(helper.make_node("Clip", ["x", "lo", "hi"], ["y"]), feeds, {"lo": np.int8(-50)},
                             opset=13), np.int8)
    with compiled(model) as g:
        for hi in (-60, 7, 127):
            feeds["hi"] = np.array(hi, np.int8)
            same(g.run(feeds), model, feeds)


@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_pad_constant_value_given_as_an_input(dtype: type) -> None:
    feeds = {"x": (rand(2, 3, 4) * 10).astype(dtype), "v": np.array(0, dtype)}
    model = typed(make_model(helper.make_node("Pad", ["x", "pads", "v"], ["y"]), feeds,
                             {"pads": np.array([0, 1, 2, 1, 0, 3], np.int64)}, opset=13), dtype)
    with compiled(model) as g:
        for v in (7, -3):
            feeds["v"] = np.array(v, dtype)
            same(g.run(feeds), model, feeds)


def test_where_condition_given_as_an_input() -> None:
    """A small boolean input read as data (not a value input): one compile for every condition."""
    feeds = {"c": np.zeros(6, bool), "a": rand(4, 6), "b": rand(4, 6)}
    model = typed(make_model(helper.make_node("Where", ["c", "a", "b"], ["y"]), feeds), np.float32)
    with compiled(model) as g:
        for k in range(3):
            feeds["c"] = harness.RNG.integers(0, 2, 6).astype(bool) if k else np.ones(6, bool)
            same(g.run(feeds), model, feeds)


def test_a_session_compiles_once_for_every_bound() -> None:
    feeds = {"x": rand(3, 5), "lo": np.array(0, np.float32), "hi": np.array(1, np.float32)}
    model = typed(make_model(helper.make_node("Clip", ["x", "lo", "hi"], ["y"]), feeds, opset=13), np.float32)
    with ctxrt.InferenceSession(model.SerializeToString(), harness.BACKEND) as sess:
        for lo in (-0.5, 0.0, 0.25):
            feeds["lo"] = np.array(lo, np.float32)
            (y,) = sess.run(None, feeds)
            np.testing.assert_array_equal(y, oracle(model, feeds)[0])
        assert sess.stats["shape_variants_compiled"] == 0  # compiled when it opened, for the declared shapes


def test_resize_scales_still_specialize() -> None:
    """Scales decide the output shape: a value input (named when missing), one variant per value in a session."""
    feeds = {"x": rand(1, 2, 3, 4), "scales": np.array([1, 1, 2, 2], np.float32)}
    model = typed(make_model(helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="nearest"), feeds,
                             opset=13), np.float32)
    with pytest.raises(ValueInputError, match="input 'scales' is needed at compile time.*Resize"):
        ctxrt.compile(model, backend=harness.BACKEND)
    ctx = ctxrt.compile(model, backend=harness.BACKEND, values={"scales": [1, 1, 0.6, 1.5]})  # as --value gives it
    try:
        feeds["scales"] = np.array([1, 1, 0.6, 1.5], np.float32)
        same(ctx.graph().run(feeds), model, feeds)
    finally:
        ctx.free()
    with ctxrt.InferenceSession(model.SerializeToString(), harness.BACKEND) as sess:
        for scales in ([1, 1, 2, 2], [1, 1, 0.5, 1.5], [1, 1, 2, 2]):
            feeds["scales"] = np.array(scales, np.float32)
            (y,) = sess.run(None, feeds)
            np.testing.assert_array_equal(y, oracle(model, feeds)[0])
        assert sess.stats["shape_variants_compiled"] == 2


def test_non_max_suppression_limit_as_a_value_input() -> None:
    """max_output_boxes_per_class sizes the output's bound: baked in from the feeds, read by the kernel."""
    feeds = {"boxes": rand(1, 6, 4, low=0, high=1), "scores": rand(1, 2, 6, low=0, high=1),
             "limit": np.array([2], np.int64), "iou": np.array([0.5], np.float32)}
    model = typed(make_model(helper.make_node("NonMaxSuppression", ["boxes", "scores", "limit", "iou"], ["y"]),
                             feeds, opset=11), np.int64)
    with ctxrt.InferenceSession(model.SerializeToString(), harness.BACKEND) as sess:
        for limit in (2, 4):
            feeds["limit"] = np.array([limit], np.int64)
            (y,) = sess.run(None, feeds)
            np.testing.assert_array_equal(y, oracle(model, feeds)[0])


def test_range_of_float_scalars_and_a_constant_output() -> None:
    """Range's limits decide its length: float scalars are value inputs too (also through arithmetic); the
    output, folded to a constant, is written by a copy."""
    feeds = {"start": np.array(1.5, np.float32), "n": np.array(4, np.float32), "delta": np.array(0.5, np.float32)}
    nodes = [helper.make_node("Mul", ["n", "delta"], ["span"]), helper.make_node("Add", ["start", "span"], ["limit"]),
             helper.make_node("Range", ["start", "limit", "delta"], ["y"])]
    model = typed(make_model(nodes, feeds, opset=13), np.float32)
    with ctxrt.InferenceSession(model.SerializeToString(), harness.BACKEND) as sess:
        for n in (4, 7):
            feeds["n"] = np.array(n, np.float32)
            (y,) = sess.run(None, feeds)
            np.testing.assert_array_equal(y, oracle(model, feeds)[0])
