"""Conv kernels chosen by shape: Winograd F(2x2, 3x3) and F(4x4, 3x3) (both product layouts, banded), and
the constant bias folded into the GEMM (im2col, widening 1x1), against onnx.reference."""

from __future__ import annotations

import numpy as np
import pytest
from harness import check, rand
from onnx import helper

from ctxrt.backends.cpu import nn
from ctxrt.backends.cpu.conv import winograd
from ctxrt.backends.kernel import NodeSpec, TensorSpec

COMPILING = {"prefer": "speed"}  # kernels choose Winograd and fold biases at compile time only


def _w(*shape: int) -> np.ndarray:
    return (rand(*shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32)


def _spec(x: tuple[int, ...], w: np.ndarray, pads: list[int], bias: np.ndarray | None = None) -> NodeSpec:
    n, _, h, wd = x
    oh, ow = h + pads[0] + pads[2] - 2, wd + pads[1] + pads[3] - 2
    ins = [TensorSpec(x, np.dtype(np.float32)), TensorSpec(w.shape, w.dtype)]
    consts = [None, w]
    if bias is not None:
        ins.append(TensorSpec(bias.shape, bias.dtype))
        consts.append(bias)
    return NodeSpec("Conv", "c", {"kernel_shape": [3, 3], "pads": pads}, ins,
                    [TensorSpec((n, w.shape[0], oh, ow), np.dtype(np.float32))], consts, options=COMPILING)


# (x, w, pads): shapes the policy sends to Winograd, odd and even sizes, padding 0, 1 and asymmetric.
WINOGRAD_CASES = {
    "f4 56x56": ((1, 64, 56, 56), (64, 64), [1, 1, 1, 1]),
    "f4 odd 27x27": ((1, 32, 27, 27), (48, 32), [1, 1, 1, 1]),
    "f2 14x14 wide": ((1, 64, 14, 14), (160, 64), [1, 1, 1, 1]),
    "f2 odd 13x11 no pad": ((1, 40, 13, 11), (64, 40), [0, 0, 0, 0]),
    "asymmetric pads": ((1, 32, 30, 25), (40, 32), [2, 0, 1, 3]),
    "batch 2": ((2, 32, 20, 21), (36, 32), [1, 1, 1, 1]),
}


@pytest.mark.parametrize("case", WINOGRAD_CASES)
@pytest.mark.parametrize("bias", [True, False])
def test_winograd_conv(case: str, bias: bool) -> None:
    x_shape, (k, c), pads = WINOGRAD_CASES[case]
    x, w = rand(*x_shape), _w(k, c, 3, 3)
    spec = _spec(x_shape, w, pads, rand(k) if bias else None)
    assert nn.conv(spec).algorithm.startswith("winograd"), "the case no longer takes the Winograd path"
    inits = {"w": w, **({"b": rand(k)} if bias else {})}
    node = helper.make_node("Conv", ["x", "w"] + (["b"] if bias else []), ["y"], pads=pads)
    check(node, {"x": x}, inits, rtol=1e-4, atol=1e-5)


def test_winograd_conv_with_residual_and_relu_fused() -> None:
    """Conv + Add + Relu: FuseActivation makes one Winograd conv with a residual epilogue."""
    x, r, w, b = rand(1, 64, 28, 28), rand(1, 64, 28, 28), _w(64, 64, 3, 3), rand(64)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c", "r"], ["s"]), helper.make_node("Relu", ["s"], ["y"])]
    check(nodes, {"x": x, "r": r}, {"w": w, "b": b}, rtol=1e-4, atol=1e-5)


def test_winograd_policy_on_resnet50_shapes() -> None:
    """Which ResNet-50 3x3 stride-1 convs take which path (measured; see winograd.choose)."""
    f32 = np.dtype(np.float32)
    assert winograd.choose(64, 64, 56, 56, f32) == 4
    assert winograd.choose(128, 128, 28, 28, f32) == 4
    assert winograd.choose(256, 256, 14, 14, f32) == 2
    assert winograd.choose(512, 512, 7, 7, f32) is None
    assert winograd.choose(16, 64, 55, 55, f32) is None  # too few channels: im2col
    assert winograd.choose(64, 64, 56, 56, np.dtype(np.float16)) is None


@pytest.mark.parametrize("m", [2, 4])
@pytest.mark.parametrize("tn", [False, True])
@pytest.mark.parametrize("budget", [1, 1 << 30])  # one tile row per band (where it has 64 tiles) / whole
def test_winograd_kernel_layouts_and_bands(m: int, tn: bool, budget: int) -> None:
    """Every (m, product layout, banding) against im2col, on garbage scratch and NaN-filled outputs."""
    n, c, k, h, wd, pads = 2, 12, 10, 61, 19, (1, 2)
    oh, ow = h + 2 * pads[0] - 2, wd + 2 * pads[1] - 2
    x, w, b = rand(n, c, h, wd), _w(k, c, 3, 3), rand(k)
    res = rand(n, k, oh, ow)
    spec = _spec((n, c, h, wd), w, [pads[0], pads[1], pads[0], pads[1]], b)
    spec.attrs.update(residual=1, activation="Relu")
    spec.inputs.append(TensorSpec(res.shape, res.dtype))
    spec.consts.append(None)
    ref_kernel = nn.conv(spec)  # 12 channels: im2col
    assert ref_kernel.algorithm == "im2col_gemm"
    want = np.empty((n, k, oh, ow), np.float32)
    ref_kernel.bind([x, w, b, res], [want], [np.zeros(s, np.uint8) for s in ref_kernel.scratch])()
    u = winograd.prepack(w, m, np.dtype(np.float32), tn)
    kernel = winograd.WinogradConv(m, n, c, h, wd, k, oh, ow, pads, u, b, True, True, True, np.dtype(np.float32),
                                   tn=tn, budget=budget)
    assert budget > 1 or kernel.band < kernel.th
    got = np.full_like(want, np.nan)
    run = kernel.bind([x, w, b, res], [got], [np.full(s, 255, np.uint8) for s in kernel.scratch])
    run()
    run()  # a second run over its own leftovers
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("shape", [(1, 8, 64, 64, 64, 1), (2, 16, 48, 48, 128, 1), (1, 3, 130, 129, 64, 3),
                                   (1, 3, 135, 140, 64, 7)])
def test_conv_constant_bias_folded_into_the_gemm(shape) -> None:
    """1x1 convs that widen at least 2x and im2col convs carry a constant bias in the GEMM (outputs of 1 MiB
    and up); the stride-2 ones, 65 and 70 columns wide, read their windows from a phase-split input."""
    n, c, h, wd, k, kk = shape
    x, w, b = rand(n, c, h, wd), _w(k, c, kk, kk), rand(k)
    if kk == 1:  # the folded 1x1 copies its input above a row of ones: one scratch buffer
        spec = NodeSpec("Conv", "c", {"kernel_shape": [1, 1]}, [TensorSpec(x.shape, x.dtype),
                        TensorSpec(w.shape, w.dtype), TensorSpec(b.shape, b.dtype)],
                        [TensorSpec((n, k, h, wd), x.dtype)], [None, w, b], options=COMPILING)
        kernel = nn.conv(spec)
        assert len(kernel.scratch) == 1 and kernel.attrs["kernel"] == "im2col_fold"
        assert kernel.constants[1].shape == (1, k, c + 1) and kernel.constants[2] is None
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[kk // 2] * 4, strides=[1, 1] if kk == 1 else [2, 2])
    check(node, {"x": x}, {"w": w, "b": b}, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_winograd_conv_with_bias_as_graph_input(dtype) -> None:
    """The bias is read from its input at run time (added to M[1, 1]); float64 weights transform exactly."""
    x, w, b = rand(1, 48, 30, 30, dtype=dtype), _w(64, 48, 3, 3).astype(dtype), rand(64, dtype=dtype)
    tol = 1e-4 if dtype == np.float32 else 1e-9
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1])
    check(node, {"x": x, "b": b}, {"w": w}, rtol=tol, atol=tol / 10)
