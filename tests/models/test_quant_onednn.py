"""oneDNN's int8 primitives for QLinearConv, QLinearMatMul and QGemm (backends/cpu/onednn/int8.py): chosen where
the weights are constant int8, within one step of the NumPy integer kernels (exact int32 sums, onnxruntime's
float32 requantization) and of onnxruntime; the weights prepacked when the kernel is built, the binary keeping
them as the model gives them.

Activations stay in [0, 127] and weights in [-64, 63]: oneDNN's and onnxruntime's u8 x s8 kernels on AVX2 without
VNNI sum pairs of products in saturating int16, exact only there (reduce_range's 7-bit weights).
"""

from __future__ import annotations

import harness  # tests/ops is on sys.path (tests/conftest.py)
import numpy as np
import pytest
from onnx import helper
from quant_helpers import MS, assert_ints, ints, ort_outputs, qmodel

import ctxrt
from ctxrt.backends.cpu.backend import CpuBackend
from ctxrt.backends.cpu.onednn import api

pytestmark = pytest.mark.skipif(not api.available(), reason="oneDNN is not installed")


def _run(model, feeds: dict[str, np.ndarray], onednn: bool) -> tuple[np.ndarray, list[str]]:
    ctx = ctxrt.compile(model, backend=CpuBackend(onednn=onednn))
    try:
        g = ctx.graph()
        return g.run(feeds)[g.outputs[0].name], [s.algorithm for s in g.compiled.steps]
    finally:
        ctx.free()


def _check(model, feeds: dict[str, np.ndarray], ty: object, onednn: bool = True) -> None:
    got, algorithms = _run(model, feeds, onednn=True)
    assert any(a.startswith("onednn:int8") for a in algorithms) == onednn, algorithms
    numpy, _ = _run(model, feeds, onednn=False)
    assert_ints(got, numpy, within=1, rare=0.02, name="oneDNN vs NumPy")
    assert_ints(got, ort_outputs(model, feeds, [ty])[0], within=1, rare=0.02, name="oneDNN vs onnxruntime")


def _scales(n: int, per_channel: bool) -> np.ndarray:
    return harness.rand(n if per_channel else 1, low=0.002, high=0.01)


@pytest.mark.parametrize("group", [1, 2, 16])
@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("types", [(np.uint8, np.uint8), (np.int8, np.int8)], ids=["u8", "s8"])
def test_qlinear_conv_int8(group: int, per_channel: bool, types: tuple[object, object]) -> None:
    tx, ty = types
    c = m = 16
    x = ints(tx, 1, c, 10, 9, lo=0, hi=127)
    node = helper.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"], ["y"],
                            pads=[1, 1, 1, 1], strides=[1, 2], group=group)
    inits = {"xs": np.float32(0.05), "xz": np.array(7 if tx == np.uint8 else -3, tx),
             "w": ints(np.int8, m, c // group, 3, 3, lo=-64, hi=63), "ws": _scales(m, per_channel),
             "wz": np.zeros(m if per_channel else 1, np.int8), "ys": np.float32(0.2),
             "yz": np.array(120 if ty == np.uint8 else 5, ty), "b": ints(np.int32, m, lo=-999, hi=999)}
    # s8 inputs with a zero point and padding came out up to 4 steps off on AVX2: left to NumPy
    _check(qmodel(node, {"x": x}, inits), {"x": x}, ty, onednn=tx == np.uint8)


def test_full_range_weights_without_vnni_stay_with_numpy() -> None:
    a = ints(np.uint8, 9, 32)
    node = helper.make_node("QLinearMatMul", ["a", "as", "az", "b", "bs", "bz", "ys", "yz"], ["y"])
    b = ints(np.int8, 32, 8, lo=-128, hi=127)
    b[0, 0] = -128
    inits = {"as": np.float32(0.04), "az": np.uint8(9), "b": b, "bs": np.float32(0.01), "bz": np.int8(0),
             "ys": np.float32(0.3), "yz": np.uint8(100)}
    got, algorithms = _run(qmodel(node, {"a": a}, inits), {"a": a}, onednn=True)
    assert any(a.startswith("onednn") for a in algorithms) == api.has_vnni(), algorithms
    exact, _ = _run(qmodel(node, {"a": a}, inits), {"a": a}, onednn=False)  # (onnxruntime saturates here too)
    assert_ints(got, exact, within=1, rare=0.02)


@pytest.mark.parametrize("op", ["QLinearMatMul", "QGemm"])
@pytest.mark.parametrize("per_column", [False, True])
def test_qlinear_matmul_and_qgemm_int8(op: str, per_column: bool) -> None:
    k, n = 48, 24
    a = ints(np.uint8, 2, 9, k, lo=0, hi=127) if op == "QLinearMatMul" else ints(np.uint8, 9, k, lo=0, hi=127)
    common = {"as": np.float32(0.04), "az": np.uint8(9), "bs": _scales(n, per_column), "ys": np.float32(0.3),
              "yz": np.uint8(100)}
    if op == "QLinearMatMul":
        node = helper.make_node(op, ["a", "as", "az", "b", "bs", "bz", "ys", "yz"], ["y"])
        inits = {**common, "b": ints(np.int8, k, n, lo=-64, hi=63), "bz": np.zeros(n if per_column else 1, np.int8)}
    else:
        node = helper.make_node(op, ["a", "as", "az", "b", "bs", "bz", "c", "ys", "yz"], ["y"], domain=MS, transB=1)
        inits = {**common, "b": ints(np.int8, n, k, lo=-64, hi=63), "bz": np.zeros(n if per_column else 1, np.int8),
                 "c": ints(np.int32, n, lo=-999, hi=999)}
    _check(qmodel(node, {"a": a}, inits), {"a": a}, np.uint8)


def test_asymmetric_weights_stay_with_numpy() -> None:
    a = ints(np.uint8, 9, 32, lo=0, hi=127)
    node = helper.make_node("QLinearMatMul", ["a", "as", "az", "b", "bs", "bz", "ys", "yz"], ["y"])
    inits = {"as": np.float32(0.04), "az": np.uint8(9), "b": ints(np.int8, 32, 8, lo=-64, hi=63),
             "bs": np.float32(0.01), "bz": np.int8(3), "ys": np.float32(0.3), "yz": np.uint8(100)}
    _, algorithms = _run(qmodel(node, {"a": a}, inits), {"a": a}, onednn=True)
    assert not any(a.startswith("onednn") for a in algorithms), algorithms
