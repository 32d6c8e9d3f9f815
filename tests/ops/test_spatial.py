"""Conv, ConvTranspose and the pools at spatial ranks 1, 2 and 3 vs onnx.reference (onnxruntime where the
reference is wrong, said case by case), with the edge attributes: odd sizes, asymmetric pads, ceil_mode windows
that fall off the end, dilation > 1, groups, stride > kernel, every auto_pad; no allocation per launch."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from harness import ITERATOR_BUFFER, allocated, bind, check, make_model, rand
from onnx import helper

import ctxrt
from ctxrt.errors import UnsupportedOpError

TOL = {np.float32: (1e-4, 1e-5), np.float64: (1e-10, 1e-12), np.float16: (1e-2, 1e-2)}


def _w(*shape: int, dtype: Any = np.float32) -> np.ndarray:
    return (rand(*shape) / np.sqrt(np.prod(shape[1:]))).astype(dtype)


def _spatial(rank: int, sizes: tuple[int, ...] = (9, 8, 7)) -> tuple[int, ...]:
    return sizes[:rank]


def _per_axis(value: list[int], rank: int) -> list[int]:
    return (value * rank)[:rank]


CONV = {  # per-axis values repeat over the rank; pads are [begin] + [end]
    "3 pad1": dict(k=3, pads=([1], [1])),
    "pointwise": dict(k=1),
    "pointwise stride2": dict(k=1, strides=[2]),
    "k3 s2 asym pads": dict(k=3, strides=[2], pads=([2], [0])),
    "stride > kernel": dict(k=2, strides=[3], pads=([1], [0])),
    "dilation 2": dict(k=3, dilations=[2], pads=([2], [1])),
    "groups 2": dict(k=3, group=2, pads=([1], [1])),
    "depthwise s2": dict(k=3, group=8, strides=[2], pads=([1], [1])),
    "same upper": dict(k=3, strides=[2], auto_pad="SAME_UPPER"),
    "same lower": dict(k=4, auto_pad="SAME_LOWER"),
    "valid": dict(k=3, strides=[2], auto_pad="VALID"),
}


def _conv_node(case: dict, rank: int, c: int, m: int, bias: bool):
    attrs = {k: v for k, v in case.items() if k != "k"}
    for key in ("strides", "dilations"):
        if key in attrs:
            attrs[key] = _per_axis(attrs[key], rank)
    if "pads" in attrs:
        begin, end = attrs["pads"]
        attrs["pads"] = _per_axis(begin, rank) + _per_axis(end, rank)
    g = attrs.get("group", 1)
    w = (m, c // g, *[case["k"]] * rank)
    return helper.make_node("Conv", ["x", "w"] + (["b"] if bias else []), ["y"], **attrs), w


@pytest.mark.parametrize("rank", [1, 2, 3])
@pytest.mark.parametrize("case", CONV)
def test_conv(case: str, rank: int) -> None:
    node, wshape = _conv_node(CONV[case], rank, 8, 8, bias=True)
    x = rand(2, 8, *_spatial(rank))
    check(node, {"x": x}, {"w": _w(*wshape), "b": rand(8)}, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("rank", [1, 3])
@pytest.mark.parametrize("dtype", [np.float64, np.float16])
def test_conv_dtypes(rank: int, dtype: Any) -> None:
    node, wshape = _conv_node(CONV["k3 s2 asym pads"], rank, 4, 6, bias=True)
    rtol, atol = TOL[dtype]
    check(node, {"x": rand(1, 4, *_spatial(rank), dtype=dtype)}, {"w": _w(*wshape, dtype=dtype),
          "b": rand(6, dtype=dtype)}, rtol=rtol, atol=atol)


@pytest.mark.parametrize("rank", [1, 3])
def test_conv_weights_and_bias_as_inputs(rank: int) -> None:
    node, wshape = _conv_node(CONV["groups 2"], rank, 4, 6, bias=True)
    check(node, {"x": rand(1, 4, *_spatial(rank)), "w": _w(*wshape), "b": rand(6)}, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("rank", [1, 3])
def test_conv_fused_residual_and_relu(rank: int) -> None:
    """FuseActivation folds the Add and the Relu into the Conv's epilogue: still right at ranks 1 and 3."""
    sp = _spatial(rank)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1] * 2 * rank),
             helper.make_node("Add", ["c", "r"], ["s"]), helper.make_node("Relu", ["s"], ["y"])]
    feeds = {"x": rand(2, 3, *sp), "r": rand(2, 5, *sp)}
    model = make_model(nodes, feeds, {"w": _w(5, 3, *[3] * rank), "b": rand(5)})
    compiled, _ = ctxrt.compiler.compile_model(model)
    assert [s.op for s in compiled.steps] == ["Conv"]
    check(nodes, feeds, {"w": _w(5, 3, *[3] * rank), "b": rand(5)}, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("attrs", [dict(pads=[1, 1]), dict(pads=[4, 2], strides=[3], dilations=[2]),
                                   dict(auto_pad="SAME_UPPER", group=4)])
def test_conv1d_long_signal_runs_in_column_blocks(attrs: dict) -> None:
    """A 1-D conv whose one im2col row exceeds the column budget runs the N-D kernel, blocked along the signal."""
    from ctxrt.backends.cpu.conv import convnd
    from ctxrt.backends.cpu.registry import KERNELS
    from ctxrt.backends.kernel import NodeSpec, TensorSpec

    g = attrs.get("group", 1)
    x, w, b = rand(2, 32, 24001), _w(16, 32 // g, 3), rand(16)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], **attrs), helper.make_node("Relu", ["c"], ["y"])]
    out = check(nodes, {"x": x}, {"w": w, "b": b}, rtol=1e-4, atol=1e-5)[0]
    ins = [TensorSpec(a.shape, a.dtype) for a in (x, w, b)]
    spec = NodeSpec("Conv", "c", attrs, ins, [TensorSpec(out.shape, out.dtype)], [None, w, b])
    kernel = KERNELS["Conv"](spec)
    assert isinstance(kernel, convnd.ConvND) and len(kernel.blocks) > 1


def test_conv3d_large_enough_for_several_column_blocks() -> None:
    node, wshape = _conv_node(CONV["3 pad1"], 3, 16, 8, bias=True)
    check(node, {"x": rand(1, 16, 12, 20, 22)}, {"w": _w(*wshape), "b": rand(8)}, rtol=1e-4, atol=1e-5)


CONV_TRANSPOSE = {  # per-axis values repeat over the rank; pads are [begin] + [end]
    "k3": dict(k=3),
    "k3 pad1": dict(k=3, pads=([1], [1])),
    "k2 s2 exact": dict(k=2, strides=[2]),
    "k3 s2 output_padding": dict(k=3, strides=[2], pads=([1], [1]), output_padding=[1]),
    "k4 s2 asym pads": dict(k=4, strides=[2], pads=([2], [1])),
    "stride > kernel": dict(k=2, strides=[3], output_padding=[2]),
    "dilation 2": dict(k=3, dilations=[2], pads=([1], [0])),
    "groups 2": dict(k=3, group=2, strides=[2], pads=([1], [1])),
    "depthwise": dict(k=3, group=4, pads=([1], [1])),
    "same upper": dict(k=3, strides=[2], auto_pad="SAME_UPPER"),
    "same lower": dict(k=3, strides=[2], auto_pad="SAME_LOWER"),
    "valid": dict(k=3, strides=[2], auto_pad="VALID"),
}


@pytest.mark.parametrize("rank", [1, 2, 3])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("case", CONV_TRANSPOSE)
def test_conv_transpose(case: str, bias: bool, rank: int) -> None:
    attrs = dict(CONV_TRANSPOSE[case])
    k, g = attrs.pop("k"), attrs.get("group", 1)
    for key in ("strides", "dilations", "output_padding"):
        if key in attrs:
            attrs[key] = _per_axis(attrs[key], rank)
    if "pads" in attrs:
        attrs["pads"] = _per_axis(attrs["pads"][0], rank) + _per_axis(attrs["pads"][1], rank)
    node = helper.make_node("ConvTranspose", ["x", "w"] + (["b"] if bias else []), ["y"], **attrs)
    inits = {"w": _w(4, 8 // g, *[k] * rank), **({"b": rand(8)} if bias else {})}
    # onnx.reference's grouped ConvTranspose fails (a reshape to the wrong group size): onnxruntime there.
    check(node, {"x": rand(2, 4, *_spatial(rank, (5, 6, 4)))}, inits, rtol=1e-4, atol=1e-5,
          oracle="onnxruntime" if g > 1 else "reference")


@pytest.mark.parametrize("rank", [1, 2, 3])
def test_conv_transpose_output_shape(rank: int) -> None:
    """An output_shape with an odd total padding: split as onnxruntime does (the reference crops the end)."""
    out = [(13, 11, 9)[a] for a in range(rank)]
    node = helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], strides=[2] * rank, output_shape=out)
    check(node, {"x": rand(1, 4, *_spatial(rank, (6, 5, 4)))}, {"w": _w(4, 3, *[3] * rank), "b": rand(3)},
          rtol=1e-4, atol=1e-5, oracle="onnxruntime")


@pytest.mark.parametrize("dtype", [np.float64, np.float16])
def test_conv_transpose_dtypes_and_inputs(dtype: Any) -> None:
    rtol, atol = TOL[dtype]
    node = helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], strides=[2, 2], pads=[1, 0, 0, 1])
    check(node, {"x": rand(1, 4, 5, 6, dtype=dtype), "w": _w(4, 3, 3, 3, dtype=dtype), "b": rand(3, dtype=dtype)},
          rtol=rtol, atol=atol)


def test_conv_transpose_several_column_blocks() -> None:
    # onnxruntime as the oracle: onnx.reference's 3-D ConvTranspose takes ~20 s at this size (0.2 s), same outputs
    node = helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], strides=[2, 2, 2], pads=[1] * 6)
    check(node, {"x": rand(1, 16, 12, 14, 16)}, {"w": _w(16, 32, 3, 3, 3), "b": rand(32)}, rtol=1e-4, atol=1e-5,
          oracle="onnxruntime")


POOLS = {  # (op, attributes): per-axis values repeat over the rank
    "max k3 s2": ("MaxPool", dict(kernel_shape=[3], strides=[2])),
    "max asym pads": ("MaxPool", dict(kernel_shape=[3], strides=[2], pads=([0], [1]))),
    "max ceil": ("MaxPool", dict(kernel_shape=[3], strides=[2], ceil_mode=1)),
    "max ceil pads": ("MaxPool", dict(kernel_shape=[2], strides=[2], pads=([1], [0]), ceil_mode=1)),
    "max dilated": ("MaxPool", dict(kernel_shape=[2], dilations=[2], pads=([1], [1]))),
    "max stride > kernel": ("MaxPool", dict(kernel_shape=[2], strides=[3])),
    "max same upper": ("MaxPool", dict(kernel_shape=[3], strides=[2], auto_pad="SAME_UPPER")),
    "max same lower": ("MaxPool", dict(kernel_shape=[2], auto_pad="SAME_LOWER")),
    "max valid": ("MaxPool", dict(kernel_shape=[3], strides=[2], auto_pad="VALID")),
    "avg exclude pad": ("AveragePool", dict(kernel_shape=[3], pads=([1], [1]))),
    "avg include pad": ("AveragePool", dict(kernel_shape=[3], strides=[2], pads=([1], [2]), count_include_pad=1)),
    "avg ceil": ("AveragePool", dict(kernel_shape=[3], strides=[2], ceil_mode=1)),
    "avg ceil include pad": ("AveragePool", dict(kernel_shape=[3], strides=[2], pads=([1], [1]), ceil_mode=1,
                                                 count_include_pad=1)),
    "avg stride > kernel": ("AveragePool", dict(kernel_shape=[2], strides=[3], pads=([1], [0]))),
    "avg same upper": ("AveragePool", dict(kernel_shape=[3], strides=[2], auto_pad="SAME_UPPER")),
    "lp p2": ("LpPool", dict(kernel_shape=[3], strides=[2])),
    "lp p2 pads": ("LpPool", dict(kernel_shape=[3], strides=[2], pads=([1], [2]))),
    "lp p1 dilated": ("LpPool", dict(kernel_shape=[2], dilations=[2], p=1)),
    "lp p3 ceil": ("LpPool", dict(kernel_shape=[3], strides=[2], ceil_mode=1, p=3)),
}
# onnx.reference is wrong here, onnxruntime is the oracle: its MaxPool with SAME_LOWER fails outright, and its
# LpPool averages over the part of a window inside the input then scales by the window size, so a window that
# ceil_mode lets hang past the end gets a larger sum than the spec's.
ORT_ORACLE = {"max same lower", "lp p3 ceil"}


def _pool_node(op: str, attrs: dict, rank: int, outputs: tuple[str, ...] = ("y",)):
    attrs = dict(attrs)
    for key in ("kernel_shape", "strides", "dilations"):
        if key in attrs:
            attrs[key] = _per_axis(attrs[key], rank)
    if "pads" in attrs:
        begin, end = attrs["pads"]
        attrs["pads"] = _per_axis(begin, rank) + _per_axis(end, rank)
    return helper.make_node(op, ["x"], list(outputs), **attrs)


@pytest.mark.parametrize("rank", [1, 2, 3])
@pytest.mark.parametrize("case", POOLS)
def test_pool(case: str, rank: int) -> None:
    op, attrs = POOLS[case]
    oracle = "onnxruntime" if case in ORT_ORACLE else "reference"
    check(_pool_node(op, attrs, rank), {"x": rand(2, 3, *_spatial(rank))}, opset=18, oracle=oracle)


@pytest.mark.parametrize("rank", [1, 2, 3])
@pytest.mark.parametrize("count_include_pad", [0, 1])
def test_avgpool_dilations_opset19(rank: int, count_include_pad: int) -> None:
    node = _pool_node("AveragePool", dict(kernel_shape=[3], dilations=[2], strides=[2], pads=([2], [1]),
                                          count_include_pad=count_include_pad), rank)
    check(node, {"x": rand(1, 3, *_spatial(rank))}, opset=19)


@pytest.mark.parametrize("rank", [1, 2, 3])
@pytest.mark.parametrize("dtype", [np.float64, np.float16])
def test_pool_dtypes(rank: int, dtype: Any) -> None:
    rtol, atol = TOL[dtype]
    for op, attrs in (POOLS["max asym pads"], POOLS["avg include pad"]):
        check(_pool_node(op, attrs, rank), {"x": rand(1, 3, *_spatial(rank), dtype=dtype)}, opset=18,
              rtol=rtol, atol=atol)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
@pytest.mark.parametrize("rank", [1, 2, 3])
def test_maxpool_integers(dtype: Any, rank: int) -> None:
    x = np.random.default_rng(rank).integers(np.iinfo(dtype).min, np.iinfo(dtype).max, (1, 3, *_spatial(rank)),
                                             dtype=dtype)
    check(_pool_node("MaxPool", dict(kernel_shape=[3], strides=[2], pads=([1], [1])), rank), {"x": x}, opset=18)


INDICES = ["max k3 s2", "max asym pads", "max dilated", "max stride > kernel", "max same upper", "max ceil"]


@pytest.mark.parametrize("rank, storage_order", [(1, 0), (2, 0), (2, 1), (3, 0), (3, 1)])  # one order in 1-D
@pytest.mark.parametrize("case", INDICES)
def test_maxpool_indices(case: str, rank: int, storage_order: int) -> None:
    _, attrs = POOLS[case]
    node = _pool_node("MaxPool", {**attrs, "storage_order": storage_order}, rank, ("y", "i"))
    check(node, {"x": rand(2, 3, *_spatial(rank))}, opset=18)


@pytest.mark.parametrize("rank", [1, 2, 3])
@pytest.mark.parametrize("op, attrs", [("GlobalMaxPool", {}), ("GlobalAveragePool", {}), ("GlobalLpPool", {}),
                                       ("GlobalLpPool", {"p": 1}), ("GlobalLpPool", {"p": 3})])
def test_global_pools(rank: int, op: str, attrs: dict) -> None:
    # onnx.reference has no GlobalLpPool and its GlobalMaxPool keeps one spatial axis too many outside 2-D.
    oracle = "reference" if op == "GlobalAveragePool" else "onnxruntime"
    check(helper.make_node(op, ["x"], ["y"], **attrs), {"x": rand(2, 5, *_spatial(rank))}, opset=18, oracle=oracle)


def test_bad_attribute_values_are_named() -> None:
    model = make_model(helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], storage_order=3, name="mp"),
                       {"x": rand(1, 2, 6, 6)}, opset=18)
    with pytest.raises(UnsupportedOpError, match="MaxPool node 'mp': attribute storage_order=3"):
        ctxrt.compile(model)


@pytest.mark.parametrize("opset", [19, 22])
@pytest.mark.parametrize("op", ["MaxPool", "AveragePool", "LpPool"])
def test_ceil_mode_drops_a_window_starting_in_the_end_padding(op: str, opset: int) -> None:
    """onnx shape inference before opset 22 counts a last window that starts in the end padding; the spec and
    onnxruntime drop it, and so does ctxrt (the frontend decides such a pool's shape), for its readers too."""
    pool = helper.make_node(op, ["x"], ["p"], kernel_shape=[2, 3], strides=[2, 3], pads=[1, 1, 1, 1], ceil_mode=1)
    got = check([pool, helper.make_node("Flatten", ["p"], ["y"])], {"x": rand(1, 2, 3, 4)}, opset=opset,
                oracle="onnxruntime")
    assert got[0].shape == (1, 2 * 2 * 2)


@pytest.mark.parametrize("op, attrs, ins", [
    ("Conv", dict(pads=[1, 1]), [rand(2, 8, 50), _w(8, 8, 3)]),
    ("Conv", dict(pads=[1] * 6, strides=[2, 1, 1]), [rand(1, 8, 9, 10, 11), _w(8, 8, 3, 3, 3), rand(8)]),
    ("MaxPool", dict(kernel_shape=[3, 3, 3], pads=[1] * 6), [rand(1, 8, 9, 10, 11)]),
    ("AveragePool", dict(kernel_shape=[3], pads=[1, 1], strides=[2]), [rand(2, 8, 50)]),
    ("LpPool", dict(kernel_shape=[2, 2], p=3), [rand(1, 8, 9, 10)]),
    ("ConvTranspose", dict(strides=[2, 2, 2], pads=[1] * 6), [rand(1, 8, 5, 6, 7), _w(8, 4, 3, 3, 3), rand(4)]),
    ("ConvTranspose", dict(strides=[2, 2]), [rand(1, 8, 9, 10), _w(8, 4, 2, 2), rand(4)]),
])
def test_no_allocation_per_launch(op: str, attrs: dict, ins: list[np.ndarray]) -> None:
    node = _run_shapes(op, attrs, ins)
    outs = [np.empty(s, np.float32) for s in node]
    consts = [None, ins[1], ins[2] if len(ins) > 2 else None][:len(ins)] if op.startswith("Conv") else None
    # NumPy's iterator over 4-D/5-D strided views takes ~5 KiB of its own, whatever the tensor size
    assert allocated(bind(op, ins, outs, attrs, consts)) < ITERATOR_BUFFER, op


def test_maxpool_indices_no_allocation_per_launch() -> None:
    x = rand(1, 8, 9, 10, 11)
    y, i = np.empty((1, 8, 5, 5, 6), np.float32), np.empty((1, 8, 5, 5, 6), np.int64)
    launch = bind("MaxPool", [x], [y, i], dict(kernel_shape=[3, 3, 3], strides=[2] * 3, pads=[1] * 6))
    assert allocated(launch) < ITERATOR_BUFFER


def _run_shapes(op: str, attrs: dict, ins: list[np.ndarray]) -> list[tuple[int, ...]]:
    """Output shapes from onnx shape inference (the harness's bind needs them)."""
    import onnx

    names = ["x", "w", "b"][:len(ins)]
    model = make_model(helper.make_node(op, names, ["y"], **attrs), dict(zip(names, ins, strict=True)))
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    return [tuple(d.dim_value for d in o.type.tensor_type.shape.dim) for o in inferred.graph.output]



DECONV = {  # a 2-D ConvTranspose between convs (values in oneDNN's layout on both sides): oneDNN's deconvolution
    "2x2 s2 (U-Net)": (dict(strides=[2, 2]), 2, 8, True),
    "3x3 s2 pads": (dict(strides=[2, 2], pads=[1, 1, 1, 1]), 3, 8, True),
    "4x4 s2 asym pads": (dict(strides=[2, 2], pads=[1, 2, 2, 1]), 4, 8, True),
    "3x3 s1 dilation 2": (dict(dilations=[2, 2], pads=[2, 2, 2, 2]), 3, 8, True),
    "groups 4, no bias": (dict(group=4, strides=[2, 2]), 3, 8, False),
    "stride 3 > kernel": (dict(strides=[3, 3]), 2, 16, True),  # NumPy's: oneDNN's weights format has no tag name
    "SAME_UPPER": (dict(strides=[2, 2], auto_pad="SAME_UPPER"), 3, 8, True),
    "SAME_LOWER": (dict(strides=[2, 2], auto_pad="SAME_LOWER"), 4, 8, True),
    "output_shape odd": (dict(strides=[2, 2], output_shape=[19, 18]), 3, 8, True),
    "output_padding": (dict(strides=[2, 2], output_padding=[1, 1]), 3, 8, True),  # past the window: NumPy's
}


@pytest.mark.parametrize("case", list(DECONV))
def test_conv_transpose_between_convs(case: str) -> None:
    """oneDNN's deconvolution in the layout of the convs around it (their values stay in it), against
    onnxruntime; output padding past what the window covers runs NumPy's kernel on plain tensors. An output_shape
    whose total padding is odd crops the extra one at the start, as the ONNX spec and onnxruntime do (ctxrt cropped
    it at the end before)."""
    import harness

    from ctxrt.backends.cpu.onednn import api

    attrs, k, m, bias = DECONV[case]
    g = attrs.get("group", 1)
    nodes = [helper.make_node("Conv", ["x", "w0"], ["h"], pads=[1, 1, 1, 1]),
             helper.make_node("ConvTranspose", ["h", "w"] + (["b"] if bias else []), ["t"], **attrs),
             helper.make_node("Conv", ["t", "w1"], ["y"])]
    inits = {"w0": _w(16, 8, 3, 3), "w": _w(16, m // g, k, k), "w1": _w(8, m, 1, 1), **({"b": rand(m)} if bias else {})}
    feeds = {"x": rand(2, 8, 9, 10)}
    check(nodes, feeds, inits, rtol=1e-4, atol=2e-5, oracle="onnxruntime")
    if harness.BACKEND == "cpu" and api.available():
        with ctxrt.compile(make_model(nodes, feeds, inits)) as ctx:
            (step,) = [s for s in ctx.graph().compiled.steps if s.op == "ConvTranspose"]
        numpy = case in ("output_padding", "stride 3 > kernel")
        assert step.algorithm.startswith("onednn:deconv") != numpy, step.algorithm


@pytest.mark.parametrize("k, stride", [(80, 4), (12, 3)])
def test_audio_front_end_conv(k: int, stride: int) -> None:
    """A 1-D conv over a waveform with a wide kernel and a stride (an audio front end's): windows copied at once
    (wide) or per column tap from a phase-split input (narrow), the same outputs."""
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], strides=[stride], pads=[k // 2 - 2, k // 2 - 2])
    check(node, {"x": rand(2, 1, 2000)}, {"w": _w(16, 1, k), "b": rand(16)}, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("group", [1, 2])
def test_conv_transpose_bias_add_batchnorm_relu_fold(group: int) -> None:
    """PP-OCR det's upsampling head (a Paddle export): ConvTranspose, Add of its bias, BatchNormalization, Relu. The
    Add and the BN fold into the ConvTranspose's weights and bias (per output channel, grouped too), the Relu into
    oneDNN's deconvolution: one step, onnxruntime's outputs. Output channels fewer than 8 stay NumPy's."""
    import harness

    from ctxrt.backends.cpu.onednn import api

    m = 16
    nodes = [helper.make_node("Conv", ["x", "w0"], ["h"], pads=[1, 1, 1, 1]),
             helper.make_node("ConvTranspose", ["h", "w"], ["t"], strides=[2, 2], group=group),
             helper.make_node("Add", ["t", "b"], ["a"]),
             helper.make_node("BatchNormalization", ["a", "g", "beta", "mean", "var"], ["n"]),
             helper.make_node("Relu", ["n"], ["r"]),
             helper.make_node("ConvTranspose", ["r", "w2"], ["y"], strides=[2, 2])]
    inits = {"w0": _w(16, 8, 3, 3), "w": _w(16, m // group, 2, 2), "b": rand(m, 1, 1), "g": rand(m) + 2,
             "beta": rand(m), "mean": rand(m), "var": rand(m) + 2, "w2": _w(m, 1, 2, 2)}
    feeds = {"x": rand(1, 8, 7, 9)}
    check(nodes, feeds, inits, rtol=1e-4, atol=2e-5, oracle="onnxruntime")
    if harness.BACKEND == "cpu" and api.available():
        with ctxrt.compile(make_model(nodes, feeds, inits)) as ctx:
            steps = ctx.graph().compiled.steps
        assert not [s.op for s in steps if s.op in ("Add", "BatchNormalization", "Relu")]
        first, last = [s for s in steps if s.op == "ConvTranspose"]
        assert first.algorithm.startswith("onednn:deconv") and first.attrs.get("activation") == "Relu"
        assert not last.algorithm.startswith("onednn")  # one output channel


def test_numpy_conv_transpose_refuses_a_fused_activation() -> None:
    """A ConvTranspose compiled with oneDNN's fused activation, built where NumPy's kernel must run it: one clear
    error, not its outputs without the activation."""
    from ctxrt.backends.cpu.conv.convtranspose import conv_transpose
    from ctxrt.backends.kernel import NodeSpec, TensorSpec

    w = _w(4, 3, 2, 2)
    spec = NodeSpec("ConvTranspose", "t", {"strides": [2, 2], "activation": "Relu"},
                    [TensorSpec((1, 4, 5, 5), np.dtype(np.float32)), TensorSpec(w.shape, w.dtype)],
                    [TensorSpec((1, 3, 10, 10), np.dtype(np.float32))], [None, w], 17, {})
    with pytest.raises(UnsupportedOpError, match="compile it again"):
        conv_transpose(spec)


CONV1D_NATIVE = {  # (input channels, output channels, length, taps, attributes): tails of 8 and of fewer per group
    "k3 pad1 relu": (16, 32, 125, 3, dict(pads=[1, 1]), "Relu"),
    "dilated": (16, 32, 125, 3, dict(pads=[2, 2], dilations=[2]), None),
    "groups 4, 8 a group": (32, 32, 31, 3, dict(pads=[1, 1], group=4), "Relu"),
    "20 a group (16 + 4)": (8, 40, 17, 5, dict(pads=[2, 1], group=2), None),
    "12 a group (8 + 4)": (6, 24, 9, 2, dict(strides=[2], group=2), "LeakyRelu"),
    "front end 80 taps stride 4": (1, 16, 2000, 80, dict(strides=[4], pads=[38, 38]), "Relu"),
    "few positions (a VAD's)": (129, 128, 3, 3, dict(pads=[1, 1]), "Relu"),
    "stft stride 128": (1, 258, 576, 256, dict(strides=[128]), None),
    "same upper": (4, 16, 10, 4, dict(auto_pad="SAME_UPPER", strides=[3]), "HardSigmoid"),
    "clip": (4, 16, 11, 3, dict(pads=[0, 2]), "Clip"),
}


@pytest.mark.parametrize("case", list(CONV1D_NATIVE))
@pytest.mark.parametrize("batch", [1, 3])
def test_native_conv1d(case: str, batch: int) -> None:
    """Small 1-D convs (an audio front end's, a VAD's) in one native call (csrc/dwconv.c ctxrt_conv1d): strides,
    dilations, pads, groups with 16, 8 and fewer channels left in a group, fused activations; the reference's
    outputs, and the native kernel is what ran."""
    import harness

    from ctxrt.backends.cpu import native

    c, m, length, k, attrs, act = CONV1D_NATIVE[case]
    g = attrs.get("group", 1)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], **attrs)]
    params = {"LeakyRelu": dict(alpha=0.2), "HardSigmoid": dict(alpha=0.3, beta=0.4), "Clip": {}}
    extra = {"lo": np.array(-0.3, np.float32), "hi": np.array(0.5, np.float32)} if act == "Clip" else {}
    nodes.append(helper.make_node(act, ["c", *extra], ["y"], **params.get(act, {})) if act else
                 helper.make_node("Identity", ["c"], ["y"]))
    inits = {"w": _w(m, c // g, k), "b": rand(m), **extra}
    feeds = {"x": rand(batch, c, length)}
    check(nodes, feeds, inits, rtol=1e-4, atol=1e-5)
    if harness.BACKEND == "cpu" and native.library() is not None:
        with ctxrt.compile(make_model(nodes, feeds, inits)) as ctx:
            steps = ctx.graph().compiled.steps
        (step,) = [s for s in steps if s.op == "Conv"]
        assert step.algorithm == "native:conv1d" and step.attrs["conv1d"] == 1
        if act == "Relu":  # fused into the kernel's epilogue (FuseActivation: others stay steps of their own)
            assert not [s for s in steps if s.op == act]


def test_native_conv1d_loads_without_the_extension(tmp_path, monkeypatch) -> None:
    """A binary whose 1-D conv was compiled for the native kernel (weights stored [G, C/G, K, M/G]), loaded where the
    extension is missing: NumPy's lifted kernel on the weights put back in ONNX's order (a copy of its own, counted
    in private_bytes), the same outputs."""
    from ctxrt.backends import get_backend
    from ctxrt.backends.cpu import native
    from ctxrt.compiler import compile_graphs, save_context

    if native.library() is None:
        pytest.skip("the native extension is not built here")
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1], group=2),
             helper.make_node("Relu", ["c"], ["y"])]
    inits, feeds = {"w": _w(24, 4, 3), "b": rand(24)}, {"x": rand(2, 8, 21)}
    model = make_model(nodes, feeds, inits)
    backend = get_backend("cpu")
    graphs, weights = compile_graphs([(model.SerializeToString(), {"x": feeds["x"].shape}, "main")], backend)
    path = save_context(tmp_path / "m.ctx", graphs, weights, backend, ["m.onnx"])
    with ctxrt.context_from_binary(path) as ctx:
        (step,) = ctx.graph().compiled.steps
        assert step.algorithm == "native:conv1d"
        want = ctx.graph().run(feeds)["y"]
    monkeypatch.setitem(native._STATE, "lib", None)
    with ctxrt.context_from_binary(path) as ctx:
        g = ctx.graph()
        (kernel,) = g._kernels
        got = g.run(feeds)["y"]
        assert kernel.private_bytes >= 24 * 4 * 3 * 4
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got, np.maximum(check(nodes[:1], feeds, inits, rtol=1e-4, atol=1e-5)[0], 0),
                               rtol=1e-4, atol=1e-5)


def test_large_gemm_conv_runs_on_onednns_gemm(monkeypatch) -> None:
    """A conv NumPy's kernel runs with a large GEMM (magika's 5 x 1 conv over 256 channels, smaller here, its output
    read by a Slice), in a program with oneDNN kernels (which holds BLAS at one thread): the GEMM runs on oneDNN's
    GEMM, on OpenMP's threads; in a program without them, on NumPy's (BLAS has the threads there). The reference's
    outputs either way."""
    import harness

    from ctxrt.backends.cpu.onednn import api

    ran = harness.count_sgemm(monkeypatch)
    conv = helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[5, 1])
    cut = helper.make_node("Slice", ["c", "s0", "s1", "ax"], ["y"])
    head = helper.make_node("MatMul", ["y", "m"], ["z"])
    feeds = {"x": rand(1, 64, 300, 1)}
    inits = {"w": _w(128, 64, 5, 1), "s0": np.array([1], np.int64), "s1": np.array([200], np.int64),
             "ax": np.array([2], np.int64), "m": rand(1, 32)}
    check([conv, cut], feeds, inits, rtol=1e-4, atol=1e-5)
    check([conv, cut, head], feeds, inits, rtol=1e-4, atol=1e-4)
    if harness.BACKEND != "cpu" or not api.available():
        return
    counts = []
    for nodes in ([conv, cut], [conv, cut, head]):  # two threads whatever the machine's load (else one pool)
        ran.clear()
        with ctxrt.compile(make_model(nodes, feeds, inits), num_threads=2) as ctx:
            ctx.graph().run(feeds)
        counts.append(len(ran))
    assert counts[0] == 0 and counts[1] > 0


DW_PLANAR_CASES = [  # (channels, height, width, kernel, stride, pad, dilation, bias, relu)
    (128, 20, 24, 3, 1, 1, 1, True, False), (48, 15, 14, 7, 1, 3, 1, True, True),
    (16, 13, 17, 3, 2, 1, 1, False, False), (8, 10, 9, 5, 2, 0, 1, True, False),
    (8, 12, 12, 3, 1, 2, 2, True, True), (5, 7, 30, 3, 3, 4, 1, True, False),
    (4, 9, 5, 5, 1, 0, 1, False, False), (3, 6, 6, 1, 1, 0, 1, True, False),
]


@pytest.mark.parametrize("case", DW_PLANAR_CASES)
def test_planar_depthwise_conv(case, monkeypatch) -> None:
    """A depthwise conv of planar images (the layout pass leaves it planar: SegFormer's Mix-FFN, ConvNeXt's first
    stage) runs csrc/dwconv.c's kernel where the extension is built (`native:dw_planar`, no scratch), and NumPy's
    loop over the taps where it is missing at run time: onnx's reference outputs either way, for windows, strides,
    pads, dilations, bias and a fused Relu; batch 2."""
    import harness

    from ctxrt.backends.cpu import native, nn

    c, h, w, k, s, p, d, bias, relu = case
    nodes = [helper.make_node("Conv", ["x", "w", *(["b"] if bias else [])], ["c" if relu else "y"], group=c,
                              kernel_shape=[k, k], strides=[s, s], pads=[p] * 4, dilations=[d, d])]
    if relu:
        nodes.append(helper.make_node("Relu", ["c"], ["y"]))
    feeds = {"x": rand(2, c, h, w)}
    inits = {"w": _w(c, 1, k, k), **({"b": rand(c)} if bias else {})}
    check(nodes, feeds, inits, rtol=1e-4, atol=1e-5)
    if harness.BACKEND != "cpu" or native.library() is None:
        return
    with ctxrt.compile(make_model(nodes, feeds, inits)) as ctx:
        (step,) = ctx.graph().compiled.steps
        assert step.algorithm == nn.DwPlanar.algorithm and step.attrs.get(nn.DW_PLANAR)
        want = ctx.graph().run(feeds)["y"]
    monkeypatch.setitem(native._STATE, "lib", None)  # a binary loaded where the extension is missing
    with ctxrt.compile(make_model(nodes, feeds, inits)) as ctx:
        assert not ctx.graph().compiled.steps[0].attrs.get(nn.DW_PLANAR)  # (compiled without it: NumPy's kernels)
    kernel = nn.DwPlanar(*_planar_spec(nodes[0], feeds, inits, (s, s, p, p, d, d)), relu)
    y = np.empty_like(want)
    kernel.bind([feeds["x"], inits["w"], *([inits["b"]] if bias else [])], [y], [])()
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)


def _planar_spec(node, feeds, inits, window):
    from ctxrt.backends.kernel import NodeSpec, TensorSpec

    ins = [TensorSpec(feeds["x"].shape, np.dtype(np.float32)), TensorSpec(inits["w"].shape, np.dtype(np.float32))]
    if "b" in inits:
        ins.append(TensorSpec(inits["b"].shape, np.dtype(np.float32)))
    return NodeSpec("Conv", node.name, {}, ins, [TensorSpec((1,), np.dtype(np.float32))]), window


@pytest.mark.parametrize("group, gemm", [(1, True), (16, False)])
def test_long_signal_conv_runs_on_onednns_gemm(monkeypatch, group: int, gemm: bool) -> None:
    """A 1-D conv over a long signal (the N-D im2col kernel: Wav2Vec2's feature extractor) in a program with
    oneDNN kernels, which holds BLAS at one thread: its GEMMs run on oneDNN's GEMM on OpenMP's threads (one BLAS
    thread made it 2x onnxruntime's), except where each group's GEMM is small (Wav2Vec2's positional conv, 16 groups:
    3x slower as 16 oneDNN calls). The reference's outputs either way."""
    import harness

    from ctxrt.backends.cpu.onednn import api

    ran = harness.count_sgemm(monkeypatch)
    conv = helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[3], strides=[2], group=group)
    head = helper.make_node("MatMul", ["c", "m"], ["z"])
    feeds = {"x": rand(1, 64, 12001)}
    inits = {"w": _w(128, 64 // group, 3), "b": rand(128), "m": rand(6000, 8)}
    check([conv, head], feeds, inits, rtol=1e-4, atol=1e-3)
    if harness.BACKEND != "cpu" or not api.available():
        return
    with ctxrt.compile(make_model([conv, head], feeds, inits), num_threads=2) as ctx:
        g = ctx.graph()
        assert g.compiled.steps[0].algorithm == "im2col_gemm"  # (the N-D kernel's, not nn.py's lifted one)
        g.run(feeds)
    assert bool(ran) == gemm


@pytest.mark.parametrize("act, alpha, beta", [("LeakyRelu", 0.2, 0.0), ("Clip", -0.3, 0.5), ("HardSigmoid", 0.3, 0.4),
                                              ("HardSwish", 1 / 6, 0.5), ("Gelu", 0.0, 0.0)])
def test_native_conv1d_epilogue_activations(act: str, alpha: float, beta: float) -> None:
    """The native 1-D kernel's fused activations (as a Conv's `activation` attributes record them): its epilogue's,
    and GELU's pass after it, against NumPy."""
    from ctxrt.backends.cpu import native
    from ctxrt.backends.cpu.registry import KERNELS
    from ctxrt.backends.kernel import NodeSpec, TensorSpec

    if native.library() is None:
        pytest.skip("the native extension is not built here")
    x, w, b = rand(2, 8, 19), _w(24, 4, 3), rand(24)
    attrs = {"pads": [1, 1], "group": 2, "activation": act, "activation_alpha": alpha, "activation_beta": beta}
    out = np.empty((2, 24, 19), np.float32)
    spec = NodeSpec("Conv", "c", attrs, [TensorSpec(a.shape, a.dtype) for a in (x, w, b)],
                    [TensorSpec(out.shape, out.dtype)], [None, w, b], options={"prefer": "speed"})
    kernel = KERNELS["Conv"](spec)
    assert kernel.algorithm == "native:conv1d"
    stored = kernel.constants[1]
    scratch = [np.zeros(int(n), np.uint8) for n in kernel.scratch]
    kernel.bind([x, stored, b], [out], scratch)()
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1)))
    ref = np.stack([np.einsum("ock,nckl->nol", w[12 * j:12 * j + 12],
                              np.stack([xp[:, 4 * j:4 * j + 4, t:t + 19] for t in range(3)], 2)) for j in range(2)], 1)
    ref = ref.reshape(2, 24, 19) + b[:, None]
    fn = {"LeakyRelu": lambda v: np.where(v >= 0, v, alpha * v), "Clip": lambda v: np.clip(v, alpha, beta),
          "HardSigmoid": lambda v: np.clip(alpha * v + beta, 0, 1),
          "HardSwish": lambda v: v * np.clip(alpha * v + beta, 0, 1),
          "Gelu": lambda v: 0.5 * v * (1 + np.vectorize(math.erf)(v / math.sqrt(2)))}[act]
    np.testing.assert_allclose(out, fn(ref), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("op, attrs", [
    ("MaxPool", dict(kernel_shape=[4], strides=[4])),
    ("MaxPool", dict(kernel_shape=[3], strides=[2], pads=[1, 1], dilations=[2], ceil_mode=1)),
    ("AveragePool", dict(kernel_shape=[2], strides=[2], ceil_mode=1)),
    ("AveragePool", dict(kernel_shape=[3], strides=[2], pads=[1, 2], count_include_pad=1)),
])
def test_native_pool1d(op: str, attrs: dict, monkeypatch) -> None:
    """float32 1-D pools (an audio net's, between its convs) in one native call (csrc/dwconv.c ctxrt_pool1d): the
    reference's outputs with pads, dilation, ceil_mode windows off the end and either divisor; NumPy's lifted
    kernel, the same outputs, where the extension is missing."""
    import harness

    from ctxrt.backends.cpu import native

    x = rand(2, 5, 31)
    node = helper.make_node(op, ["x"], ["y"], **attrs)
    want = check(node, {"x": x}, rtol=1e-5, atol=1e-6)[0]
    if harness.BACKEND != "cpu" or native.library() is None:
        return
    with ctxrt.compile(make_model(node, {"x": x})) as ctx:
        (step,) = ctx.graph().compiled.steps
        assert step.algorithm == "native:pool1d"
        np.testing.assert_array_equal(ctx.graph().run({"x": x})["y"], want)
    monkeypatch.setitem(native._STATE, "lib", None)
    with ctxrt.compile(make_model(node, {"x": x})) as ctx:
        np.testing.assert_allclose(ctx.graph().run({"x": x})["y"], want, rtol=1e-6, atol=1e-7)
