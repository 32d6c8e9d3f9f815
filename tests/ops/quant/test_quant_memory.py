"""The quantized kernels allocate nothing in steady state: every temporary (float64 operands, int32 sums, float32
requantization, unpacked 4-bit values) is planned scratch."""

from __future__ import annotations

import harness
import numpy as np
import pytest
from harness import ITERATOR_BUFFER, steady_state_allocation
from onnx import helper
from quant_helpers import INT4, MS, ints, qmodel

import ctxrt


def _f(*shape: int) -> np.ndarray:
    return harness.rand(*shape)


def _case(name: str) -> tuple[list, dict, dict]:
    u8, s8 = np.uint8, np.int8
    q = {"xs": np.float32(0.05), "xz": np.uint8(128), "ys": np.float32(0.03), "yz": np.uint8(120)}
    if name == "dequantize int4 blocked weight":
        return ([helper.make_node("DequantizeLinear", ["w", "s", "z"], ["wf"], axis=0, block_size=16),
                 helper.make_node("MatMul", ["x", "wf"], ["y"])], {"x": _f(4, 40)},
                {"w": ints(INT4, 40, 33), "s": harness.rand(3, 33, low=0.01, high=0.1), "z": ints(INT4, 3, 33)})
    if name == "quantize per axis":
        return [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["y"], axis=1)], {"x": _f(2, 5, 300)}, \
            {"s": harness.rand(5, low=0.01, high=0.1), "z": ints(u8, 5)}
    if name == "dynamic quantize":
        return [helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "s", "z"])], {"x": _f(3, 700)}, {}
    if name == "matmul integer":
        return [helper.make_node("MatMulInteger", ["a", "b", "az", "bz"], ["y"])], {"a": ints(u8, 2, 8, 64)}, \
            {"b": ints(s8, 64, 48), "az": np.uint8(3), "bz": ints(s8, 48)}
    if name == "qlinear matmul":
        return [helper.make_node("QLinearMatMul", ["a", "xs", "xz", "b", "bs", "bz", "ys", "yz"], ["y"])], \
            {"a": ints(u8, 8, 64)}, {**q, "b": ints(s8, 64, 48), "bs": harness.rand(48, low=0.01, high=0.1),
                                     "bz": np.zeros(48, s8)}
    if name == "dynamic quantize matmul":
        return [helper.make_node("DynamicQuantizeMatMul", ["a", "b", "bs", "bz"], ["y"], domain=MS)], \
            {"a": _f(8, 64)}, {"b": ints(s8, 64, 48), "bs": harness.rand(48, low=0.01, high=0.1), "bz": np.int8(0)}
    if name == "qgemm":
        return [helper.make_node("QGemm", ["a", "xs", "xz", "b", "bs", "bz", "c", "ys", "yz"], ["y"], domain=MS,
                                 transB=1)], {"a": ints(u8, 8, 64)}, \
            {**q, "b": ints(s8, 48, 64), "bs": np.float32(0.01), "bz": np.int8(0), "c": ints(np.int32, 48, lo=-99,
                                                                                                hi=99)}
    if name == "qlinear conv":
        return [helper.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"], ["y"],
                                 pads=[1, 1, 1, 1])], {"x": ints(u8, 1, 8, 12, 12)}, \
            {**q, "w": ints(s8, 16, 8, 3, 3), "ws": harness.rand(16, low=0.01, high=0.1), "wz": np.zeros(16, s8),
             "b": ints(np.int32, 16, lo=-99, hi=99)}
    if name == "qlinear add":
        return [helper.make_node("QLinearAdd", ["a", "xs", "xz", "b", "ys", "yz", "xs", "xz"], ["y"], domain=MS)], \
            {"a": ints(u8, 4, 300), "b": ints(u8, 300)}, q
    if name == "qlinear sigmoid":
        return [helper.make_node("QLinearSigmoid", ["x", "xs", "xz", "ys", "yz"], ["y"], domain=MS)], \
            {"x": ints(u8, 3, 7000)}, q
    if name == "qlinear softmax":
        return [helper.make_node("QLinearSoftmax", ["x", "xs", "xz", "ys", "yz"], ["y"], domain=MS, opset=13)], \
            {"x": ints(u8, 4, 12, 64)}, q
    if name == "qlinear concat":
        return [helper.make_node("QLinearConcat", ["ys", "yz", "a", "xs", "xz", "b", "xs", "xz"], ["y"], domain=MS,
                                 axis=1)], {"a": ints(u8, 2, 30, 5), "b": ints(u8, 2, 7, 5)}, q
    if name == "qlinear pools":
        return [helper.make_node("QLinearAveragePool", ["x", "xs", "xz", "ys", "yz"], ["p"], domain=MS,
                                 kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
                helper.make_node("QLinearGlobalAveragePool", ["p", "ys", "yz", "xs", "xz"], ["y"], domain=MS)], \
            {"x": ints(u8, 1, 8, 10, 10)}, q
    k, n, block = 96, 40, 32
    return [helper.make_node("MatMulNBits", ["a", "b", "s"], ["y"], domain=MS, K=k, N=n, bits=4, block_size=block)], \
        {"a": _f(3, k)}, {"b": ints(u8, n, k // block, block // 2), "s": harness.rand(n, k // block, low=0.01)}


CASES = ["dequantize int4 blocked weight", "quantize per axis", "dynamic quantize", "matmul integer", "qlinear matmul",
         "dynamic quantize matmul", "qgemm", "qlinear conv", "qlinear add", "qlinear sigmoid", "qlinear softmax",
         "qlinear concat", "qlinear pools", "matmul nbits"]


@pytest.mark.parametrize("case", CASES)
def test_steady_state_allocates_nothing(case: str) -> None:
    nodes, feeds, inits = _case(case)
    ctx = ctxrt.compile(qmodel(nodes, feeds, inits, opset=21), backend=harness.BACKEND)
    try:
        g = ctx.graph()
        outs = {o.name: np.empty(o.shape, np.dtype(o.dtype)) for o in g.outputs}
        peak, growth = steady_state_allocation(lambda: g.execute(feeds, outs))
        assert growth < 1024 and peak < ITERATOR_BUFFER, (peak, growth)
    finally:
        ctx.free()
