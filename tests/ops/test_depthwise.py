"""The direct depthwise conv kernel (backends/cpu/depthwise.py) against onnx.reference: strides, dilations,
asymmetric pads, batch 2, a bias read at run time, a fused residual and Relu, bands of a few rows."""

from __future__ import annotations

import numpy as np
import pytest
from harness import check, rand
from onnx import helper

from ctxrt.backends.cpu import depthwise, nn
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
