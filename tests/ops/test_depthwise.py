"""The direct depthwise conv kernel (backends/cpu/conv/depthwise.py) against onnx.reference: strides, dilations,
asymmetric pads, batch 2, a bias read at run time, a fused residual and Relu, bands of a few rows."""

from __future__ import annotations

import numpy as np
import pytest
from harness import check, native_avx512, rand
from onnx import helper

from ctxrt.backends.cpu import nn
from ctxrt.backends.cpu.conv import depthwise
from ctxrt.backends.kernel import NodeSpec, TensorSpec

# (N, C, H, W, kernel, stride, dilation, pads): outputs of at most depthwise.MAX_PIXELS pixels
CASES = {
    "3x3 s1": (1, 136, 7, 7, 3, 1, 1, [1, 1, 1, 1]),
    "3x3 s2": (1, 64, 28, 28, 3, 2, 1, [1, 1, 1, 1]),
    "5x5 asym pads": (1, 5, 9, 11, 5, 1, 1, [2, 0, 1, 3]),
    "dilated s2": (2, 8, 13, 12, 3, 2, 2, [0, 1, 2, 0]),
    "stride 3 batch 2": (2, 16, 10, 10, 3, 3, 1, [1, 1, 1, 1]),
}


def _spec(n, c, h, w, k, s, d, pads) -> NodeSpec:
    oh = (h + pads[0] + pads[2] - d * (k - 1) - 1) // s + 1
    ow = (w + pads[1] + pads[3] - d * (k - 1) - 1) // s + 1
    f32 = np.dtype(np.float32)
    return NodeSpec("Conv", "c", {"group": c, "pads": pads, "strides": [s, s], "dilations": [d, d]},
                    [TensorSpec((n, c, h, w), f32), TensorSpec((c, 1, k, k), f32)],
                    [TensorSpec((n, c, oh, ow), f32)], [None, rand(c, 1, k, k)])


@pytest.mark.parametrize("case", CASES)
def test_direct_depthwise_conv(case: str) -> None:
    n, c, h, w, k, s, d, pads = CASES[case]
    assert nn.conv(_spec(*CASES[case])).algorithm == "direct_depthwise"
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], group=c, strides=[s, s], dilations=[d, d], pads=pads)
    check(node, {"x": rand(n, c, h, w)}, {"w": rand(c, 1, k, k), "b": rand(c)}, rtol=1e-4, atol=1e-5)


def test_direct_depthwise_with_bias_input_residual_and_relu_in_bands(monkeypatch) -> None:
    monkeypatch.setattr(depthwise, "_BAND_BUDGET", 1)  # one output row per band
    c = 24
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], group=c, pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c", "r"], ["s"]), helper.make_node("Relu", ["s"], ["y"])]
    check(nodes, {"x": rand(2, c, 12, 9), "b": rand(c), "r": rand(2, c, 12, 9)}, {"w": rand(c, 1, 3, 3)},
          rtol=1e-4, atol=1e-5)


def test_large_outputs_keep_the_batched_gemm() -> None:
    """Above MAX_PIXELS output pixels NumPy's two passes per tap lose to im2col + one GEMM per channel."""
    assert nn.conv(_spec(1, 136, 28, 28, 3, 1, 1, [1, 1, 1, 1])).algorithm == "im2col_gemm"


# -- csrc/dwconv.c: a range program's depthwise convs over channels-last images --------------------------------
def _dw_reference(x, w, bias, residual, window, act, alpha, beta, oh, ow):
    """float64 depthwise conv of x [n, h, w, c] by w [kh, kw, c], then the epilogue."""
    sh, sw, ph, pw, dh, dw = window
    n, h, wd, c = x.shape
    kh, kw, _ = w.shape
    pad = np.zeros((n, h + 2 * (ph + kh * dh), wd + 2 * (pw + kw * dw), c))
    pad[:, ph:ph + h, pw:pw + wd] = x
    y = np.zeros((n, oh, ow, c)) + (0 if bias is None else bias)
    for ky in range(kh):
        for kx in range(kw):
            y += pad[:, ky * dh:ky * dh + sh * oh:sh, kx * dw:kx * dw + sw * ow:sw][:, :oh, :ow] * w[ky, kx]
    if residual is not None:
        y += residual
    return _epilogue(y, act, alpha, beta)


def _epilogue(y, act, alpha, beta):
    """csrc/gemv.h's activation `act` (1 Relu, 7 HardSwish, 8 Clip, 4 SiLU) of y, in float64."""
    if act == 1:
        y = np.maximum(y, 0)
    elif act == 7:
        y = y * np.clip(alpha * y + beta, 0, 1)
    elif act == 8:
        y = np.clip(y, alpha, beta)
    elif act == 4:
        y = y / (1 + np.exp(-y))
    return y


DW_CASES = {  # (n, h, w, c, kernel, stride, dilation, pads before)
    "3x3 s1 c16": (2, 7, 7, 16, 3, 1, 1, 1),
    "3x3 s2 c17": (3, 9, 13, 17, 3, 2, 1, 1),
    "5x5 s1 small image": (2, 4, 4, 240, 5, 1, 1, 2),
    "5x5 s2 c40": (1, 11, 10, 40, 5, 2, 1, 2),
    "3x3 s2 no pad c24": (2, 16, 19, 24, 3, 2, 1, 0),
    "dilated c1": (2, 12, 12, 1, 3, 1, 2, 2),
    "7x7 no pad c33": (1, 15, 9, 33, 7, 1, 1, 0),
    "wide row c8": (4, 3, 37, 8, 3, 1, 1, 1),
    "3x3 s3 c16": (1, 10, 10, 16, 3, 3, 1, 1),
}


@pytest.mark.parametrize("case", list(DW_CASES), ids=list(DW_CASES))
@pytest.mark.parametrize("act,alpha,beta", [(0, 0.0, 0.0), (1, 0.0, 0.0), (7, 1 / 6, 0.5), (8, -0.5, 0.5),
                                            (4, 0.0, 0.0)], ids=["none", "relu", "hardswish", "clip", "silu"])
def test_native_dwconv_against_numpy(case, act, alpha, beta) -> None:
    """Borders, strides 1-3, dilation, no padding, windows 3, 5 and 7 wide, channel tails (1, 8, 17, 24, 33, 40,
    240 channels), rows of up to 37 pixels (groups of 8 and 4 and their tails), bias and residual, the activations
    with a vector form and one applied after (SiLU), on OpenMP's team of the run, on AVX-512's window-row kernels
    (strides 1 and 2 by windows 3 and 5), its one-pixel kernel (the others) and the portable loop."""
    from ctxrt.backends.cpu import native
    from ctxrt.backends.cpu.onednn import api

    if native.library() is None:
        pytest.skip("the native extension is not built here")
    api.library()
    native.openmp_team()
    n, h, w, c, k, s, d, p = DW_CASES[case]
    oh = (h + 2 * p - d * (k - 1) - 1) // s + 1
    ow = (w + 2 * p - d * (k - 1) - 1) // s + 1
    rng = np.random.default_rng(11)
    x = rng.standard_normal((n, h, w, c)).astype(np.float32)
    wt = rng.standard_normal((k, k, c)).astype(np.float32) / k
    bias = rng.standard_normal(c).astype(np.float32)
    window = (s, s, p, p, d, d)
    for residual in (None, rng.standard_normal((n, oh, ow, c)).astype(np.float32)):
        want = _dw_reference(x.astype(np.float64), wt, bias, residual, window, act, alpha, beta, oh, ow)
        for avx512 in (True, False):
            y = np.full((n, oh, ow, c), np.nan, np.float32)
            with native_avx512(avx512):
                run = native.dwconv(x, wt, y, bias, residual, window, act, alpha, beta)
                assert run is not None
                run()
            np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)


def test_native_dwconv_declines_what_it_cannot_read() -> None:
    from ctxrt.backends.cpu import native

    if native.library() is None:
        pytest.skip("the native extension is not built here")
    x, w, y = np.ones((1, 4, 4, 8), np.float32), np.ones((3, 3, 8), np.float32), np.empty((1, 4, 4, 8), np.float32)
    window = (1, 1, 1, 1, 1, 1)
    assert native.dwconv(x, w, y, None, None, window, 0, 0.0, 0.0) is not None
    assert native.dwconv(x.astype(np.float64), w, y, None, None, window, 0, 0.0, 0.0) is None
    assert native.dwconv(x, np.ones((3, 3, 4), np.float32), y, None, None, window, 0, 0.0, 0.0) is None
    assert native.dwconv(x, w, np.empty((1, 4, 8, 8), np.float32)[:, :, ::2], None, None, window, 0, 0.0, 0.0) is None
    assert native.dwconv(x, w, y, np.ones(4, np.float32), None, window, 0, 0.0, 0.0) is None


def _planar_reference(x, w, bias, window, act, alpha, beta, oh, ow):
    """float64 conv of planar x [n, c, h, w] by w [c, kh, kw, m] into channels-last [n, oh, ow, m], the epilogue."""
    sh, sw, ph, pw, dh, dw = window
    n, c, h, wd = x.shape
    _, kh, kw, m = w.shape
    pad = np.zeros((n, c, h + 2 * (ph + kh * dh) + sh * oh, wd + 2 * (pw + kw * dw) + sw * ow))
    pad[:, :, ph:ph + h, pw:pw + wd] = x
    y = np.zeros((n, oh, ow, m)) + (0 if bias is None else bias)
    for ky in range(kh):
        for kx in range(kw):
            patch = pad[:, :, ky * dh:ky * dh + sh * oh:sh, kx * dw:kx * dw + sw * ow:sw][:, :, :oh, :ow]
            y += np.einsum("ncij,cm->nijm", patch, w[:, ky, kx, :].astype(np.float64))
    return _epilogue(y, act, alpha, beta)


PLANAR_CASES = {  # (n, c, h, w, m, (kh, kw), (sh, sw, ph, pw, dh, dw))
    "3x3 s2 c3 m16 (a MobileNet's stem)": (2, 3, 17, 19, 16, (3, 3), (2, 2, 1, 1, 1, 1)),
    "3x3 s1 c3 m32 (two blocks)": (1, 3, 12, 20, 32, (3, 3), (1, 1, 1, 1, 1, 1)),
    "7x7 s2 c3 m64 (a ResNet's stem)": (1, 3, 23, 37, 64, (7, 7), (2, 2, 3, 3, 1, 1)),
    "5x5 dilated c1 m8": (2, 1, 15, 26, 8, (5, 5), (1, 1, 4, 4, 2, 2)),
    "3x3 s3 no pad c4 m40": (1, 4, 20, 30, 40, (3, 3), (3, 3, 0, 0, 1, 1)),
    "narrow row c3 m17": (1, 3, 5, 6, 17, (3, 3), (1, 1, 1, 1, 1, 1)),
    "1x1 c2 m16": (3, 2, 4, 40, 16, (1, 1), (1, 1, 0, 0, 1, 1)),
    "3x1 strides 1x2 pads 0x1 c7 m24": (1, 7, 9, 18, 24, (3, 1), (1, 2, 0, 1, 1, 1)),
}


@pytest.mark.parametrize("case", list(PLANAR_CASES), ids=list(PLANAR_CASES))
@pytest.mark.parametrize("act,alpha,beta", [(0, 0.0, 0.0), (1, 0.0, 0.0), (7, 1 / 6, 0.5), (8, -0.5, 0.5),
                                            (4, 0.0, 0.0)], ids=["none", "relu", "hardswish", "clip", "silu"])
def test_native_planar_conv_against_numpy(case, act, alpha, beta) -> None:
    """csrc/dwconv.c's conv of few planar input channels into channels-last output (a range program's first conv,
    on the graph's NCHW input): strides 1-3 and one apart per axis, padding, dilation, windows 1 to 7, output
    channel tails and one or two blocks of 16 a pass, rows of few pixels (the one-pixel path only) and many (groups
    of 8, the last overlapping), with and without a bias, the activations with a vector form and one applied after
    (SiLU), on OpenMP's team of the run, on AVX-512 and the portable loop."""
    from ctxrt.backends.cpu import native
    from ctxrt.backends.cpu.onednn import api

    if native.library() is None:
        pytest.skip("the native extension is not built here")
    api.library()
    native.openmp_team()
    n, c, h, w, m, (kh, kw), window = PLANAR_CASES[case]
    sh, sw, ph, pw, dh, dw = window
    oh, ow = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1, (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    rng = np.random.default_rng(12)
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    wt = (rng.standard_normal((c, kh, kw, m)) / np.sqrt(c * kh * kw)).astype(np.float32)
    for bias in (rng.standard_normal(m).astype(np.float32), None):
        want = _planar_reference(x.astype(np.float64), wt, bias, window, act, alpha, beta, oh, ow)
        for avx512 in (True, False):
            y = np.full((n, oh, ow, m), np.nan, np.float32)
            with native_avx512(avx512):
                run = native.planar_conv(x, wt, y, bias, window, act, alpha, beta)
                assert run is not None
                run()
            np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)


def test_native_planar_conv_declines_what_it_cannot_read() -> None:
    from ctxrt.backends.cpu import native

    if native.library() is None:
        pytest.skip("the native extension is not built here")
    x, w, y = np.ones((1, 3, 4, 4), np.float32), np.ones((3, 3, 3, 8), np.float32), np.empty((1, 4, 4, 8), np.float32)
    window = (1, 1, 1, 1, 1, 1)
    assert native.planar_conv(x, w, y, None, window, 0, 0.0, 0.0) is not None
    assert native.planar_conv(x.astype(np.float64), w, y, None, window, 0, 0.0, 0.0) is None
    assert native.planar_conv(x, np.ones((2, 3, 3, 8), np.float32), y, None, window, 0, 0.0, 0.0) is None
    assert native.planar_conv(x, w, np.empty((1, 4, 4, 4), np.float32), None, window, 0, 0.0, 0.0) is None
    assert native.planar_conv(x, w, np.empty((1, 4, 8, 8), np.float32)[:, :, ::2], None, window, 0, 0.0, 0.0) is None
    assert native.planar_conv(x, w, y, np.ones(4, np.float32), window, 0, 0.0, 0.0) is None
    assert native.planar_conv(x, w, np.empty((1, 0, 4, 8), np.float32), None, window, 0, 0.0, 0.0) is None
