"""onnx's own backend node cases (tests/ops/onnx/onnx_nodes.py makes them from onnx's generators) of the ops added on
branch ops-gap: the unary math ops (Tan, Asin, Acos, Atan, Sinh, Cosh, Asinh, Acosh, Atanh), Shrink, Hardmax,
LpNormalization, MeanVarianceNormalization, EyeLike, ReverseSequence, BitShift, CumProd and Det; then CenterCropPad,
Col2Im, MaxUnpool, GridSample, DFT and STFT. Each case runs
through an InferenceSession on each backend against onnx's expected outputs (on OpenCL the unary math ops are
table entries of elementwise.cl, the others run in a CPU partition).

Then random inputs against onnx.reference (onnxruntime where the reference is wrong: LpNormalization's p=1 sums x,
not |x|; Hardmax before opset 13 is not coerced to 2-D there; GridSample-16's bilinear and bicubic modes it has no
kernel for, and its cubic mode with border padding, where ctxrt follows onnxruntime) for the attributes and dtypes
the cases leave out."""

from __future__ import annotations

import harness
import numpy as np
import onnx
import pytest
from harness import check, rand
from onnx import helper
from onnx_nodes import cases, run_case

UNARY = {"Tan": (-1.4, 1.4), "Asin": (-0.99, 0.99), "Acos": (-0.99, 0.99), "Atan": (-5, 5), "Sinh": (-4, 4),
         "Cosh": (-4, 4), "Asinh": (-5, 5), "Acosh": (1, 5), "Atanh": (-0.99, 0.99)}
MODULES = (*(op.lower() for op in UNARY), "shrink", "hardmax", "lpnormalization", "meanvariancenormalization",
           "eyelike", "reversesequence", "bitshift", "cumprod", "det", "center_crop_pad", "col2im", "maxunpool",
           "gridsample", "dft", "stft")
OPS = {*UNARY, "Shrink", "Hardmax", "LpNormalization", "MeanVarianceNormalization", "EyeLike", "ReverseSequence",
       "BitShift", "CumProd", "Det", "CenterCropPad", "Col2Im", "MaxUnpool", "GridSample",
       "DFT", "STFT"}
# MaxUnpool's indices with output_shape: onnxruntime (and ctxrt) read them as flat indices of the output_shape
# tensor, which is what a MaxPool of an input of that shape gives; onnx's expected output (its reference's) scatters
# them into the shape inferred from the pooling attributes and pads that at the end.
KNOWN = {"test_maxunpool_export_with_output_shape": "onnx's output places indices in the inferred shape, onnxruntime "
                                                    "and ctxrt in output_shape's"}

_ALL = cases(*MODULES)
# the cases of these ops (not their "_expanded" forms: the functions' bodies, ops ctxrt ran before)
_NAMES = sorted(n for n, c in _ALL.items() if any(node.op_type in OPS for node in c.model.graph.node))


def test_the_cases_are_there() -> None:
    """The selection is not empty by accident (a renamed generator module or case): every op has cases, and
    the CPU backend a kernel for it (the OpenCL backend runs the others in a CPU partition)."""
    from ctxrt.backends.cpu.registry import KERNELS

    assert set(KERNELS) >= OPS, sorted(OPS - set(KERNELS))
    assert {node.op_type for n in _NAMES for node in _ALL[n].model.graph.node} == OPS
    assert set(_NAMES) >= {"test_acosh_example", "test_tan", "test_shrink_soft", "test_hardmax_one_hot", "test_mvn",
                           "test_lpnormalization_default", "test_eyelike_with_dtype", "test_reversesequence_batch",
                           "test_bitshift_right_int8_negative_shift", "test_cumprod_1d_reverse_exclusive",
                           "test_det_nd", "test_center_crop_pad_crop_negative_axes_hwc", "test_col2im_pads",
                           "test_maxunpool_export_without_output_shape", "test_gridsample_bicubic",
                           "test_gridsample_volumetric_nearest_align_corners_1", "test_dft_irfft_opset19",
                           "test_dft_axis", "test_stft_with_window", *KNOWN}
    assert len(_NAMES) >= 110


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.xfail(reason=KNOWN[n], strict=True))
                                  if n in KNOWN else n for n in _NAMES])
def test_onnx_node_case(name: str) -> None:
    run_case(_ALL[name], harness.BACKEND)


# ---- unary math -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("op", sorted(UNARY))
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_unary_math(op: str, dtype) -> None:
    lo, hi = UNARY[op]
    x = rand(3, 5, 7, low=lo, high=hi).astype(dtype)
    # float16 is computed in float32 (ir/passes/half.py) and rounded once; the reference computes in float16
    tol = {"rtol": 2e-3, "atol": 1e-3} if dtype == np.float16 else {"rtol": 1e-5, "atol": 1e-6}
    check(helper.make_node(op, ["x"], ["y"]), {"x": x}, **tol)


def test_unary_math_in_a_chain_and_empty() -> None:
    """Run in place in a chain (compiler/build.py INPLACE), and on a zero-size input."""
    nodes = [helper.make_node("Tanh", ["x"], ["a"]), helper.make_node("Atanh", ["a"], ["b"]),
             helper.make_node("Sinh", ["b"], ["c"]), helper.make_node("Asinh", ["c"], ["y"])]
    check(nodes, {"x": rand(4, 9, low=-2, high=2)}, rtol=1e-4, atol=1e-5)
    check(helper.make_node("Acos", ["x"], ["y"]), {"x": rand(0, 3)})


# ---- Shrink -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int8, np.uint8])
def test_shrink(dtype) -> None:
    x = rand(4, 25, low=-10, high=10)
    x[0, :4] = [1.5, -1.5, 1.4, -1.6]  # at and around lambd
    x = x.round().astype(dtype) if np.dtype(dtype).kind in "iu" else x.astype(dtype)
    if np.dtype(dtype).kind == "u":
        x = np.abs(x)
    bias = 0.0 if np.dtype(dtype).kind == "u" else 0.75
    check(helper.make_node("Shrink", ["x"], ["y"], lambd=1.5, bias=bias), {"x": x})
    check(helper.make_node("Shrink", ["x"], ["y"]), {"x": x})


# ---- Hardmax ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("axis", [-1, 0, 1, -3])
def test_hardmax_ties_go_to_the_first(axis: int) -> None:
    x = harness.RNG.integers(0, 3, (3, 4, 5)).astype(np.float32)  # many ties
    check(helper.make_node("Hardmax", ["x"], ["y"], axis=axis), {"x": x}, opset=13)


def test_hardmax_before_opset_13_coerces_to_2d() -> None:
    x = harness.RNG.integers(0, 4, (2, 3, 4)).astype(np.float32)
    for axis in (0, 1, 2):
        check(helper.make_node("Hardmax", ["x"], ["y"], axis=axis), {"x": x}, opset=11, oracle="onnxruntime")


def test_hardmax_float64_and_empty() -> None:
    check(helper.make_node("Hardmax", ["x"], ["y"], axis=0), {"x": rand(6, 3).astype(np.float64)}, opset=13)
    check(helper.make_node("Hardmax", ["x"], ["y"]), {"x": rand(2, 0)}, opset=13)


# ---- LpNormalization, MeanVarianceNormalization -----------------------------------------------------------

@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_lp_normalization(p: int, axis: int) -> None:
    x = rand(4, 6, 3)
    x[1, :, :] = 0  # a zero norm gives zeros (along axis 0 and -1 some rows are all zero)
    x[:, 2, :] = 0
    node = helper.make_node("LpNormalization", ["x"], ["y"], p=p, axis=axis)
    check(node, {"x": np.abs(x)})  # onnx.reference sums x for p=1: right for positive x only
    check(node, {"x": x}, oracle="onnxruntime" if p == 1 else "reference")


@pytest.mark.parametrize("axes", [None, [1], [-1], [0, 1, 2, 3], [2, 3], [0, -1]])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_mean_variance_normalization(axes, dtype) -> None:
    x = (rand(2, 3, 4, 5) * 3 + 1).astype(dtype)
    node = helper.make_node("MeanVarianceNormalization", ["x"], ["y"], **({} if axes is None else {"axes": axes}))
    if dtype == np.float32:
        check(node, {"x": x}, rtol=1e-4, atol=1e-5)
        return
    # onnx.reference runs the function, whose epsilon is a float32 constant, and onnxruntime has no float64 kernel:
    # the function's formula in NumPy
    red = tuple(a % 4 for a in (axes or [0, 2, 3]))
    mean = x.mean(axis=red, keepdims=True)
    want = (x - mean) / (np.sqrt((x * x).mean(axis=red, keepdims=True) - mean * mean) + 1e-9)
    got = harness.run_ctxrt(harness.make_model(node, {"x": x}), {"x": x})[0]
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


# ---- EyeLike, ReverseSequence -----------------------------------------------------------------------------

@pytest.mark.parametrize("k", [0, 2, -1, -3, 5, -4])
def test_eye_like(k: int) -> None:
    check(helper.make_node("EyeLike", ["x"], ["y"], k=k), {"x": rand(3, 5)})
    check(helper.make_node("EyeLike", ["x"], ["y"], k=k, dtype=onnx.TensorProto.INT32),
          {"x": rand(5, 3).astype(np.float64)})
    check(helper.make_node("EyeLike", ["x"], ["y"], k=k, dtype=onnx.TensorProto.BOOL), {"x": rand(4, 4)})


@pytest.mark.parametrize("batch_axis, time_axis", [(1, 0), (0, 1)])
def test_reverse_sequence(batch_axis: int, time_axis: int) -> None:
    x = rand(5, 4, 3) if time_axis == 0 else rand(4, 5, 3)  # 5 steps, batch 4
    lens = np.array([5, 1, 3, 0], np.int64)
    node = helper.make_node("ReverseSequence", ["x", "lens"], ["y"], batch_axis=batch_axis, time_axis=time_axis)
    check(node, {"x": x, "lens": lens})
    check(node, {"x": (x * 10).astype(np.int32), "lens": np.array([2, 5, 4, 1], np.int64)})


# ---- BitShift ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.uint32, np.uint64])
def test_bit_shift_unsigned(direction: str, dtype) -> None:
    bits = np.dtype(dtype).itemsize * 8
    x = harness.RNG.integers(0, np.iinfo(dtype).max, (3, 8), dtype=dtype, endpoint=True)
    y = harness.RNG.integers(0, bits, (8,), dtype=dtype)  # broadcast along the rows
    check(helper.make_node("BitShift", ["x", "y"], ["z"], direction=direction), {"x": x, "y": y}, opset=11)


@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64])
def test_bit_shift_signed_and_out_of_range(direction: str, dtype) -> None:
    bits = np.dtype(dtype).itemsize * 8
    info = np.iinfo(dtype)
    x = harness.RNG.integers(info.min, info.max, (4, 10), dtype=dtype, endpoint=True)
    y = harness.RNG.integers(-bits - 3, bits + 3, (4, 10)).astype(dtype)  # negative and too wide too
    check(helper.make_node("BitShift", ["x", "y"], ["z"], direction=direction), {"x": x, "y": y}, opset=28)


# ---- CumProd ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
@pytest.mark.parametrize("axis", [0, 1, -1, -3])
def test_cum_prod(exclusive: int, reverse: int, axis: int) -> None:
    node = helper.make_node("CumProd", ["x", "axis"], ["y"], exclusive=exclusive, reverse=reverse)
    a = {"axis": np.array(axis, np.int32)}
    check(node, {"x": rand(3, 4, 5, low=0.5, high=1.5)}, a, opset=26)
    check(node, {"x": harness.RNG.integers(-3, 4, (3, 4, 5)).astype(np.int64)}, a, opset=26)
    check(node, {"x": harness.RNG.integers(0, 4, (3, 4, 5)).astype(np.uint32)},
          {"axis": np.array(axis, np.int64)}, opset=26)


def test_cum_prod_empty() -> None:
    node = helper.make_node("CumProd", ["x", "axis"], ["y"], exclusive=1)
    check(node, {"x": rand(0, 4)}, {"axis": np.array(1, np.int64)}, opset=26)
    check(node, {"x": rand(3, 0)}, {"axis": np.array(1, np.int64)}, opset=26)


# ---- Det --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(2, 2), (5, 2, 2), (3, 3), (2, 4, 3, 3), (1, 6, 6), (0, 3, 3)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_det(shape, dtype) -> None:
    x = rand(*shape, low=-2, high=2).astype(dtype)
    check(helper.make_node("Det", ["x"], ["y"]), {"x": x}, rtol=1e-4, atol=1e-5)


def test_det_float16_and_singular() -> None:
    x = rand(4, 3, 3, low=-2, high=2).astype(np.float16)  # NumPy's linalg (the reference's) has no float16
    got = harness.run_ctxrt(harness.make_model(helper.make_node("Det", ["x"], ["y"]), {"x": x}), {"x": x})[0]
    assert got.dtype == np.float16
    np.testing.assert_array_equal(got, np.linalg.det(x.astype(np.float32)).astype(np.float16))
    singular = np.array([[[1, 2], [2, 4]], [[0, 0], [0, 0]]], np.float32)
    check(helper.make_node("Det", ["x"], ["y"]), {"x": singular})


# ---- CenterCropPad, Col2Im, MaxUnpool ---------------------------------------------------------------------

@pytest.mark.parametrize("shape, axes", [([3, 8], [0, 1]), ([6, 3], None), ([5, 2], [-1, -3]), ([7], [1]),
                                         ([4, 4, 4], [2, 0, 1])])
def test_center_crop_pad(shape, axes) -> None:
    x = rand(5, 6, 4) if axes is not None else rand(4, 6)
    node = helper.make_node("CenterCropPad", ["x", "shape"], ["y"], **({} if axes is None else {"axes": axes}))
    inits = {"shape": np.array(shape, np.int64)}
    check(node, {"x": x}, inits, opset=18)
    check(node, {"x": (x * 100).astype(np.int32)}, inits, opset=18)


@pytest.mark.parametrize("image, block, attrs", [
    ([5, 6], [2, 3], {}),
    ([7, 6], [3, 2], {"strides": [2, 1], "pads": [1, 0, 1, 2], "dilations": [1, 2]}),
    ([6, 6], [2, 2], {"strides": [2, 2]}),
    ([4, 5, 3], [2, 2, 1], {"pads": [0, 1, 0, 1, 0, 1]}),
])
def test_col2im(image, block, attrs) -> None:
    nd = len(image)
    strides, dil = attrs.get("strides", [1] * nd), attrs.get("dilations", [1] * nd)
    pads = attrs.get("pads", [0] * 2 * nd)
    grid = [(i + pads[d] + pads[nd + d] - dil[d] * (b - 1) - 1) // strides[d] + 1
            for d, (i, b) in enumerate(zip(image, block, strict=True))]
    x = rand(2, 3 * int(np.prod(block)), int(np.prod(grid)))
    node = helper.make_node("Col2Im", ["x", "image", "block"], ["y"], **attrs)
    check(node, {"x": x}, {"image": np.array(image, np.int64), "block": np.array(block, np.int64)}, opset=18)


@pytest.mark.parametrize("shape, kernel, strides, pads", [
    ((2, 3, 9), [2], [2], [0, 0]),
    ((1, 2, 7, 9), [3, 2], [2, 2], [1, 0, 1, 1]),
    ((2, 1, 6, 5), [2, 2], [2, 2], [0, 0, 0, 0]),
    ((1, 2, 4, 5, 6), [2, 2, 3], [2, 1, 3], [0, 0, 0, 0, 0, 0]),
])
@pytest.mark.parametrize("with_shape", [False, True])
def test_max_unpool_inverts_max_pool(shape, kernel, strides, pads, with_shape: bool) -> None:
    """MaxPool's values and indices unpooled against onnxruntime: onto the pooled input's shape given as
    `output_shape` (the odd sizes make it larger than the shape the attributes give), or without it, from an input
    of the shape the attributes give back (larger ones would have indices past its end)."""
    attrs = {"kernel_shape": kernel, "strides": strides, "pads": pads}
    if not with_shape:
        nd = len(kernel)
        pooled = [(n + pads[d] + pads[nd + d] - kernel[d]) // strides[d] + 1 for d, n in enumerate(shape[2:])]
        shape = (*shape[:2], *((p - 1) * strides[d] - pads[d] - pads[nd + d] + kernel[d]
                               for d, p in enumerate(pooled)))
    nodes = [helper.make_node("MaxPool", ["x"], ["v", "i"], **attrs),
             helper.make_node("MaxUnpool", ["v", "i"] + (["s"] if with_shape else []), ["y"], **attrs)]
    inits = {"s": np.array(shape, np.int64)} if with_shape else {}
    got = check(nodes, {"x": rand(*shape)}, inits, opset=11, oracle="onnxruntime")[0]
    if with_shape:
        assert got.shape == shape


# ---- GridSample -------------------------------------------------------------------------------------------

GRID_PADDINGS = ["zeros", "border", "reflection"]


def _grid(*shape: int, low: float = -1.6, high: float = 1.6) -> np.ndarray:
    """Random normalized points, most inside [-1, 1], some outside (far outside too), with exact values among
    them: the corners' -1 and 1, and 0, a nearest tie (x.5) for an even width without align_corners."""
    g = rand(*shape, low=low, high=high)
    flat = g.reshape(-1)
    special = np.array([-1, 1, 0, -3.7, 3.7, 1.25, -0.5, 0.5, -2.2, 5.0], np.float32)
    k = min(flat.size, special.size)
    flat[:k] = special[:k] if low < -1 else np.clip(special[:k], low, high)
    return g


def _grid_sample(mode: str, padding: str, align: int) -> onnx.NodeProto:
    return helper.make_node("GridSample", ["x", "grid"], ["y"], mode=mode, padding_mode=padding, align_corners=align)


@pytest.mark.parametrize("align", [0, 1])
@pytest.mark.parametrize("padding", GRID_PADDINGS)
@pytest.mark.parametrize("mode", ["linear", "nearest", "cubic"])
def test_grid_sample_2d(mode: str, padding: str, align: int) -> None:
    """A batch of 2 with its own grids, points inside and outside [-1, 1]. Cubic with border padding against
    onnxruntime: onnx.reference clamps a point outside to the edge before interpolating, onnxruntime (and
    PyTorch) clamp only the taps (docs/spatial-ops.md)."""
    feeds = {"x": rand(2, 3, 5, 6), "grid": _grid(2, 4, 7, 2)}
    oracle = "onnxruntime" if (mode, padding) == ("cubic", "border") else "reference"
    check(_grid_sample(mode, padding, align), feeds, opset=20, rtol=1e-5, atol=1e-5, oracle=oracle)
    if oracle == "reference":  # the same against onnxruntime, at opset 22
        check(_grid_sample(mode, padding, align), feeds, opset=22, rtol=1e-5, atol=1e-5, oracle="onnxruntime")


@pytest.mark.parametrize("align", [0, 1])
@pytest.mark.parametrize("padding", GRID_PADDINGS)
@pytest.mark.parametrize("mode", ["bilinear", "nearest", "bicubic"])
def test_grid_sample_opset16(mode: str, padding: str, align: int) -> None:
    """Opset 16's mode names (onnx.reference knows only opset 20's), against onnxruntime; an odd and an even
    width, and a grid of another size than X."""
    feeds = {"x": rand(3, 2, 4, 7), "grid": _grid(3, 6, 5, 2)}
    check(_grid_sample(mode, padding, align), feeds, opset=16, rtol=1e-5, atol=1e-5, oracle="onnxruntime")


@pytest.mark.parametrize("align", [0, 1])
@pytest.mark.parametrize("padding", GRID_PADDINGS)
@pytest.mark.parametrize("mode", ["linear", "nearest", "cubic"])
def test_grid_sample_3d_and_1d(mode: str, padding: str, align: int) -> None:
    """Volumetric (onnxruntime has no cubic there) and 1-D inputs against onnx.reference; cubic with border
    padding inside [-1, 1], where onnx.reference and onnxruntime agree."""
    low, high = (-1, 1) if (mode, padding) == ("cubic", "border") else (-1.6, 1.6)
    node = _grid_sample(mode, padding, align)
    check(node, {"x": rand(2, 2, 3, 4, 5), "grid": _grid(2, 3, 2, 4, 3, low=low, high=high)}, opset=20,
          rtol=1e-5, atol=1e-5)
    check(node, {"x": rand(2, 3, 7), "grid": _grid(2, 9, 1, low=low, high=high)}, opset=20, rtol=1e-5, atol=1e-5)


def test_grid_sample_dtypes() -> None:
    """float64; integers (nearest only: onnx.reference truncates the weights to integers, onnxruntime has no
    kernel); float16, computed in float32 (ir/passes/half.py)."""
    grid = _grid(2, 3, 4, 2)
    for mode in ("linear", "cubic"):
        check(_grid_sample(mode, "reflection", 1), {"x": rand(2, 3, 5, 6).astype(np.float64), "grid": grid.astype(
            np.float64)}, opset=20, rtol=1e-6, atol=1e-6)
    x = harness.RNG.integers(-100, 100, (2, 3, 5, 6)).astype(np.int32)
    for padding in GRID_PADDINGS:
        check(_grid_sample("nearest", padding, 0), {"x": x, "grid": grid}, opset=20)
    x16, g16 = rand(2, 3, 5, 6).astype(np.float16), grid.astype(np.float16)
    node = _grid_sample("linear", "reflection", 0)
    got = harness.run_ctxrt(harness.make_model(node, {"x": x16, "grid": g16}, opset=20), {"x": x16, "grid": g16})[0]
    want = harness.reference(harness.make_model(node, {"x": x16, "grid": g16}, opset=20),
                             {"x": x16.astype(np.float32), "grid": g16.astype(np.float32)})[0]
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float32), want, rtol=2e-3, atol=2e-3)


def test_grid_sample_refuses_interpolated_integers() -> None:
    import ctxrt
    from ctxrt.errors import UnsupportedOpError

    feeds = {"x": np.ones((1, 1, 3, 3), np.int32), "grid": _grid(1, 2, 2, 2)}
    with pytest.raises(UnsupportedOpError, match="linear mode on int32"):
        ctxrt.compile(harness.make_model(_grid_sample("linear", "zeros", 0), feeds, opset=20),
                      backend=harness.BACKEND)


@pytest.mark.parametrize("x_shape, grid_shape", [((0, 3, 4, 5), (0, 2, 2, 2)), ((2, 0, 4, 5), (2, 2, 2, 2)),
                                                 ((2, 3, 4, 5), (2, 0, 3, 2)), ((2, 3, 0, 5), (2, 2, 3, 2))])
def test_grid_sample_empty(x_shape, grid_shape) -> None:
    """Zero-size batches, channels, grids; an empty image samples zeros (zeros padding: every point is outside).
    onnx.reference returns a 1-D empty array for an empty output: the shape is checked here."""
    feeds = {"x": rand(*x_shape), "grid": _grid(*grid_shape)}
    got = harness.run_ctxrt(harness.make_model(_grid_sample("linear", "zeros", 0), feeds, opset=20), feeds)[0]
    assert got.shape == (x_shape[0], x_shape[1], *grid_shape[1:-1]) and not got.any()


# ---- DFT, STFT --------------------------------------------------------------------------------------------

# (inverse, onesided, parts): a one-sided transform is of a real signal, its inverse of a complex one-sided spectrum
_DFT_KINDS = [(0, 0, 1), (0, 0, 2), (0, 1, 1), (1, 0, 1), (1, 0, 2), (1, 1, 2)]


@pytest.mark.parametrize("inverse, onesided, parts", _DFT_KINDS)
@pytest.mark.parametrize("axis", [1, 2, -2, -3])
@pytest.mark.parametrize("dft_length", [None, 5, 12])
def test_dft(inverse: int, onesided: int, parts: int, axis: int, dft_length) -> None:
    """Opset 20 (axis an input) and 17 (an attribute; the inputs' rank 4 makes -2 and -3 the same axes); real and
    complex signals, dft_length padding and cutting."""
    x = rand(2, 7, 6, parts, low=-2, high=2)
    inits = {} if dft_length is None else {"n": np.array(dft_length, np.int64)}
    n = "n" if dft_length is not None else ""
    attrs = {"inverse": inverse, "onesided": onesided}
    check(helper.make_node("DFT", ["x", n, "axis"], ["y"], **attrs), {"x": x},
          {**inits, "axis": np.array(axis, np.int64)}, opset=20, rtol=1e-4, atol=1e-4)
    check(helper.make_node("DFT", ["x", n] if n else ["x"], ["y"], axis=axis % 4, **attrs), {"x": x}, inits,
          opset=17, rtol=1e-4, atol=1e-4)


def test_dft_float64_and_empty() -> None:
    x = rand(3, 8, 2).astype(np.float64)
    check(helper.make_node("DFT", ["x"], ["y"], axis=1), {"x": x}, opset=17, rtol=1e-10, atol=1e-10)
    check(helper.make_node("DFT", ["x"], ["y"], axis=1, inverse=1), {"x": x}, opset=17, rtol=1e-10, atol=1e-10)
    node = helper.make_node("DFT", ["x"], ["y"], axis=1, onesided=1)
    x = rand(0, 8, 1)
    got = harness.run_ctxrt(harness.make_model(node, {"x": x}, opset=17), {"x": x})[0]
    assert got.shape == (0, 5, 2)


@pytest.mark.parametrize("onesided, parts", [(None, 1), (1, 1), (0, 1), (0, 2)])  # onesided: real signals only
@pytest.mark.parametrize("window", [False, True])
def test_stft(onesided, parts: int, window: bool) -> None:
    """A batch of 2, frames of 16 every 5 samples (the last samples in no frame), a Hann window or none;
    onesided 1 by default (the schema's; onnx's shape inference takes 0)."""
    x = rand(2, 64, parts)
    inits = {"step": np.array(5, np.int64), "len": np.array(16, np.int64)}
    if window:
        inits["w"] = (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(16) / 16)).astype(np.float32)
    attrs = {} if onesided is None else {"onesided": onesided}
    node = helper.make_node("STFT", ["x", "step", "w" if window else "", "len"], ["y"], **attrs)
    got = check(node, {"x": x}, inits, opset=17, rtol=1e-4, atol=1e-4)[0]
    assert got.shape == (2, 10, 9 if onesided in (None, 1) else 16, 2)


def test_stft_window_read_at_run_time() -> None:
    x = rand(1, 40, 1)
    node = helper.make_node("STFT", ["x", "step", "w"], ["y"])
    model = harness.make_model(node, {"x": x, "w": rand(8)}, {"step": np.array(4, np.int64)}, opset=17)
    for _ in range(2):
        feeds = {"x": x, "w": rand(8)}
        np.testing.assert_allclose(harness.run_ctxrt(model, feeds)[0], harness.reference(model, feeds)[0],
                                   rtol=1e-4, atol=1e-5)
