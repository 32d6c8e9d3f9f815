"""Resize / Upsample vs onnx.reference (onnxruntime where the reference is wrong, said case by case): every mode,
nearest rounding mode and coordinate transformation, cubic_coeff_a, exclude_outside, antialias, axes,
keep_aspect_ratio_policy, roi with extrapolation, scales or sizes, up- and down-sampling at ranks 1 to 3,
float16/32/64 and integers; DepthToSpace / SpaceToDepth; no allocation per launch."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from harness import ITERATOR_BUFFER, allocated, bind, check, make_model, rand, run_ctxrt
from onnx import helper

import ctxrt
from ctxrt.errors import UnsupportedOpError

SHAPES = {1: (2, 3, 7), 2: (1, 3, 7, 6), 3: (1, 2, 5, 6, 4)}
SCALES = {  # per spatial axis, repeated over the rank: up, down, mixed and non-integer factors
    "up2": [2.0], "down": [0.5], "up1.7": [1.7], "mixed": [2.0, 0.6, 1.5], "down0.4": [0.4],
}
COORDS = ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric", "half_pixel_symmetric"]
NEAREST = ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]


def _scales(rank: int, name: str) -> np.ndarray:
    spatial = (SCALES[name] * 3)[:rank]
    return np.array([1.0, 1.0, *spatial], np.float32)


def resize(x: np.ndarray, *, scales: np.ndarray | None = None, sizes: np.ndarray | None = None,
           roi: np.ndarray | None = None, opset: int = 19, oracle: str = "reference", rtol: float = 1e-5,
           atol: float = 1e-5, **attrs: Any) -> None:
    inits = {k: v for k, v in (("roi", roi), ("scales", scales), ("sizes", sizes)) if v is not None}
    names = ["x", "roi" if roi is not None else "", "scales" if scales is not None else "",
             "sizes" if sizes is not None else ""]
    while not names[-1]:
        names.pop()
    check(helper.make_node("Resize", names, ["y"], **attrs), {"x": x}, inits, opset=opset, oracle=oracle,
          rtol=rtol, atol=atol)


def _case(rank: int, scale: str, coord: str, mode: str, ties: bool = False) -> tuple[np.ndarray, str]:
    """(input, oracle). onnx.reference is wrong where a resized axis' length x scale is not an integer under
    align_corners (it divides by that product minus 1, the spec and onnxruntime by the output length minus 1) or
    half_pixel_symmetric, and under pytorch_half_pixel for outputs of length 1 (it maps them to -0.5, the spec and
    onnxruntime to 0): onnxruntime is the oracle there. Except where onnxruntime cannot be: it refuses cubic outside
    2-D, and its float32 coordinates land on either side of the integers that floor/ceil rounding meets under
    half_pixel_symmetric (`ties`); there the input takes sizes whose products are integers."""
    shape, scales = SHAPES[rank], _scales(rank, scale)
    products = [n * float(s) for n, s in zip(shape, scales, strict=True) if s != 1]
    wrong = ((coord in ("align_corners", "half_pixel_symmetric") and any(p != int(p) for p in products))
             or (coord == "pytorch_half_pixel" and any(int(p) == 1 for p in products)))
    if not wrong:
        return rand(*shape), "reference"
    if (mode != "cubic" or rank == 2) and not (ties and coord == "half_pixel_symmetric"):
        return rand(*shape), "onnxruntime"
    return rand(*shape[:2], *[10] * rank), "reference"


@pytest.mark.parametrize("rank", [1, 2, 3])
@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("nearest_mode", NEAREST)
@pytest.mark.parametrize("coord", COORDS)
def test_nearest(rank: int, scale: str, nearest_mode: str, coord: str) -> None:
    x, oracle = _case(rank, scale, coord, "nearest", ties=nearest_mode in ("floor", "ceil"))
    resize(x, scales=_scales(rank, scale), mode="nearest", nearest_mode=nearest_mode,
           coordinate_transformation_mode=coord, oracle=oracle)


@pytest.mark.parametrize("rank", [1, 2, 3])
@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("coord", COORDS)
def test_linear(rank: int, scale: str, coord: str) -> None:
    x, oracle = _case(rank, scale, coord, "linear")
    resize(x, scales=_scales(rank, scale), mode="linear", coordinate_transformation_mode=coord, oracle=oracle)


@pytest.mark.parametrize("rank", [1, 2, 3])
@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("coord", COORDS)
@pytest.mark.parametrize("a, exclude", [(-0.75, 0), (-0.5, 1)])
def test_cubic(rank: int, scale: str, coord: str, a: float, exclude: int) -> None:
    x, oracle = _case(rank, scale, coord, "cubic")
    resize(x, scales=_scales(rank, scale), mode="cubic", coordinate_transformation_mode=coord, cubic_coeff_a=a,
           exclude_outside=exclude, oracle=oracle)


@pytest.mark.parametrize("rank", [1, 2, 3])
@pytest.mark.parametrize("mode", ["linear", "cubic"])
@pytest.mark.parametrize("scale", ["down", "down0.4", "mixed", "up2"])
def test_antialias(rank: int, mode: str, scale: str) -> None:
    resize(rand(*SHAPES[rank]), scales=_scales(rank, scale), mode=mode, antialias=1, opset=18)


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("extrapolation", [0.0, -3.5])
def test_tf_crop_and_resize(mode: str, extrapolation: float) -> None:
    """An roi reaching outside the input on both sides: those outputs take extrapolation_value."""
    roi = np.array([0, 0, -0.2, 0.1, 1, 1, 0.8, 1.3], np.float32)
    resize(rand(1, 3, 7, 6), sizes=np.array([1, 3, 9, 5], np.int64), roi=roi, mode=mode,
           coordinate_transformation_mode="tf_crop_and_resize", extrapolation_value=extrapolation)


@pytest.mark.parametrize("policy", ["stretch", "not_larger", "not_smaller"])
@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_sizes_and_keep_aspect_ratio_policy(policy: str, mode: str) -> None:
    resize(rand(1, 3, 7, 6), sizes=np.array([1, 3, 10, 15], np.int64), mode=mode, keep_aspect_ratio_policy=policy,
           opset=18)


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
def test_axes(mode: str) -> None:
    """axes (opset 18): scales, sizes and roi given for the listed axes only, negative axes too."""
    x = rand(1, 3, 7, 6)
    resize(x, scales=np.array([1.5, 0.5], np.float32), axes=[3, 2], mode=mode, opset=18)
    # onnx.reference fails on negative axes (a transpose by them): onnxruntime there
    resize(x, scales=np.array([1.5, 0.5], np.float32), axes=[-1, 2], mode=mode, opset=18, oracle="onnxruntime")
    resize(x, sizes=np.array([4], np.int64), axes=[2], mode=mode, opset=18)
    resize(x, sizes=np.array([9, 4], np.int64), roi=np.array([0.1, 0, 0.9, 1], np.float32), axes=[2, 3], mode=mode,
           coordinate_transformation_mode="tf_crop_and_resize", opset=18)


def test_resizing_batch_and_channel_axes() -> None:
    resize(rand(2, 3, 4, 5), scales=np.array([1.5, 2, 1, 0.5], np.float32), mode="linear")


@pytest.mark.parametrize("dtype", [np.float64, np.float16])
@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
def test_float_dtypes(dtype: Any, mode: str) -> None:
    tol = 1e-12 if dtype == np.float64 else 3e-3
    if mode == "cubic" and dtype == np.float64:
        tol = 1e-5  # onnx.reference's cubic weights are float32 (cubic_coeff_a is a float32 scalar there)
    resize(rand(1, 3, 7, 6, dtype=dtype), scales=_scales(2, "up1.7"), mode=mode, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int64])
def test_nearest_integers(dtype: Any) -> None:
    x = np.random.default_rng(3).integers(0, 100, (1, 3, 7, 6)).astype(dtype)
    resize(x, scales=_scales(2, "mixed"), mode="nearest", nearest_mode="round_prefer_ceil")


def test_tf_half_pixel_for_nn_opset11() -> None:
    # onnx.reference does not know this Resize-11 mode: onnxruntime is the oracle
    resize(rand(1, 3, 7, 6), scales=_scales(2, "up1.7"), roi=np.zeros(0, np.float32), mode="nearest",
           coordinate_transformation_mode="tf_half_pixel_for_nn", opset=11, oracle="onnxruntime")


# Resize-10 and Upsample have no coordinate or rounding mode: onnx.reference cannot run them, onnxruntime
# (asymmetric coordinates, nearest truncates, or takes the ceiling when shrinking) is the oracle.
@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize("scales", [[1, 1, 2, 3], [1, 1, 0.5, 0.6], [1, 1, 1.7, 2.5]])
def test_resize_opset10(mode: str, scales: list[float]) -> None:
    node = helper.make_node("Resize", ["x", "s"], ["y"], mode=mode)
    check(node, {"x": rand(1, 3, 7, 6)}, {"s": np.array(scales, np.float32)}, opset=10, oracle="onnxruntime")


@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize("opset", [7, 9])
def test_upsample(mode: str, opset: int) -> None:
    scales = [1.0, 1.0, 2.0, 1.5]
    if opset == 7:
        node, inits = helper.make_node("Upsample", ["x"], ["y"], mode=mode, scales=scales), {}
    else:
        node, inits = helper.make_node("Upsample", ["x", "s"], ["y"], mode=mode), {"s": np.array(scales, np.float32)}
    check(node, {"x": rand(1, 3, 5, 6)}, inits, opset=opset, oracle="onnxruntime")


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_depth_to_space(mode: str) -> None:
    check(helper.make_node("DepthToSpace", ["x"], ["y"], blocksize=2, mode=mode), {"x": rand(2, 12, 3, 5)}, opset=13)


def test_space_to_depth() -> None:
    check(helper.make_node("SpaceToDepth", ["x"], ["y"], blocksize=3), {"x": rand(2, 2, 6, 9)}, opset=13)


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_space_to_depth_modes_invert_depth_to_space(mode: str) -> None:
    """SpaceToDepth has DepthToSpace's `mode` since opset 28; each mode inverts its DepthToSpace."""
    x = rand(2, 3, 4, 6)
    nodes = [helper.make_node("SpaceToDepth", ["x"], ["s"], blocksize=2, mode=mode),
             helper.make_node("DepthToSpace", ["s"], ["y"], blocksize=2, mode=mode)]
    s, y = run_ctxrt(make_model(nodes, {"x": x}, opset=28, outputs=["s", "y"]), {"x": x})
    np.testing.assert_array_equal(y, x)
    b = x.reshape(2, 3, 2, 2, 3, 2)  # (n, c, h', bh, w', bw)
    want = b.transpose(0, 3, 5, 1, 2, 4) if mode == "DCR" else b.transpose(0, 1, 3, 5, 2, 4)
    np.testing.assert_array_equal(s, want.reshape(2, 12, 2, 3))


@pytest.mark.parametrize("attr, value", [("mode", "area"), ("coordinate_transformation_mode", "corner"),
                                         ("nearest_mode", "round")])
def test_bad_attribute_values_are_named(attr: str, value: str) -> None:
    node = helper.make_node("Resize", ["x", "", "s"], ["y"], name="rs", **{attr: value})
    model = make_model(node, {"x": rand(1, 3, 4, 4)}, {"s": _scales(2, "up2")}, opset=19)
    with pytest.raises(UnsupportedOpError, match=f"Resize node 'rs': attribute {attr}='{value}'"):
        ctxrt.compile(model)


def test_scales_from_a_graph_input_are_refused() -> None:
    node = helper.make_node("Resize", ["x", "", "s"], ["y"], name="rs")
    model = make_model(node, {"x": rand(1, 3, 4, 4), "s": _scales(2, "up2")}, opset=19)
    with pytest.raises(ctxrt.errors.CtxrtError, match="Resize node 'rs'|scales"):
        ctxrt.compile(model)


@pytest.mark.parametrize("attrs, out", [
    (dict(mode="nearest", scales=[1.0, 1.0, 2.0, 2.0]), (1, 8, 20, 24)),
    (dict(mode="linear", scales=[1.0, 1.0, 2.0, 2.0]), (1, 8, 20, 24)),
    (dict(mode="cubic", scales=[1.0, 1.0, 0.5, 0.5], antialias=1), (1, 8, 5, 6)),
    (dict(mode="linear", scales=[1.0, 1.0, 2.0, 2.0, 2.0]), (1, 8, 20, 24, 8)),
])
def test_no_allocation_per_launch(attrs: dict, out: tuple[int, ...]) -> None:
    x = rand(*out[:2], *[10, 12, 4][:len(out) - 2])
    # the weights broadcast along the resized axis: NumPy buffers such short loops (bufsize-bounded)
    assert allocated(bind("Resize", [x], [np.empty(out, np.float32)], attrs, opset=19)) < ITERATOR_BUFFER


IMAGE_RESIZES = {  # between convs: channels last, csrc/gemv.c's one-pass resize (8 and 12 channels)
    "linear up2 half_pixel": dict(mode="linear", scales=[2.0, 2.0]),
    "linear down0.5 align_corners": dict(mode="linear", scales=[0.5, 0.5],
                                         coordinate_transformation_mode="align_corners"),
    "linear 1.7 x 0.6 asymmetric": dict(mode="linear", scales=[1.7, 0.6], coordinate_transformation_mode="asymmetric"),
    "linear down antialias": dict(mode="linear", scales=[0.4, 0.5], antialias=1),
    "cubic up2 exclude_outside": dict(mode="cubic", scales=[2.0, 2.0], exclude_outside=1, cubic_coeff_a=-0.5),
    "cubic 1.5 pytorch_half_pixel": dict(mode="cubic", scales=[1.5, 1.5],
                                         coordinate_transformation_mode="pytorch_half_pixel"),
    "nearest up3 floor": dict(mode="nearest", scales=[3.0, 3.0], nearest_mode="floor"),
    "nearest 0.6 x 1 round_prefer_ceil": dict(mode="nearest", scales=[0.6, 1.0], nearest_mode="round_prefer_ceil"),
}


@pytest.mark.parametrize("channels", [8, 12])
@pytest.mark.parametrize("case", list(IMAGE_RESIZES))
def test_image_resize_between_convs(case: str, channels: int) -> None:
    """A Resize of channels-last images (the layout of the convs around it) in one native pass per output row:
    against onnxruntime, for every mode; the pass is the one that ran (where the extension is built)."""
    import harness

    from ctxrt.backends.cpu import native

    attrs = dict(IMAGE_RESIZES[case])
    scales = np.array([1.0, 1.0, *attrs.pop("scales")], np.float32)
    nodes = [helper.make_node("Conv", ["x", "w0"], ["h"], pads=[1, 1, 1, 1]),
             helper.make_node("Resize", ["h", "", "s"], ["r"], **attrs),
             helper.make_node("Conv", ["r", "w1"], ["y"])]
    inits = {"w0": rand(channels, 4, 3, 3), "s": scales, "w1": rand(4, channels, 1, 1)}
    feeds = {"x": rand(2, 4, 11, 13)}
    check(nodes, feeds, inits, opset=18, rtol=1e-4, atol=1e-5, oracle="onnxruntime")
    if harness.BACKEND == "cpu" and native.library() is not None:
        with ctxrt.compile(make_model(nodes, feeds, inits, opset=18)) as ctx:
            (step,) = [s for s in ctx.graph().compiled.steps if s.op == "Resize"]
        assert step.algorithm.startswith("native:"), step.algorithm

