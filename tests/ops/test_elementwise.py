"""Element-wise and logic kernels vs onnx.reference; Erf accuracy; no allocation per launch; in-place runs."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from harness import allocated, bind, check, make_model, rand, run_ctxrt
from onnx import TensorProto, helper

RNG = np.random.default_rng(7)






def check_mean(mean: Any, feeds: dict[str, np.ndarray]) -> None:
    """Mean vs NumPy: onnx.reference's accumulates into a copy of input 0, which fails when that broadcasts."""
    got = run_ctxrt(make_model(mean, feeds), feeds)[0]
    np.testing.assert_allclose(got, sum(np.broadcast_arrays(*feeds.values())) / len(feeds), rtol=1e-6)


def node(op: str, n_in: int = 1, **attrs: Any):
    return helper.make_node(op, [f"x{i}" for i in range(n_in)], ["y"], **attrs)


UNARY = ["Relu", "Tanh", "Sqrt", "Exp", "Log", "Neg", "Abs", "Reciprocal", "Floor", "Ceil", "Sign", "Round",
         "Sin", "Cos", "Sigmoid", "Softplus", "Erf"]


@pytest.mark.parametrize("op", UNARY)
def test_unary(op: str) -> None:
    low = 0.1 if op in ("Sqrt", "Log", "Reciprocal") else -4.0
    check(node(op), {"x0": rand(3, 7, low=low, high=4.0)}, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op, attrs", [("LeakyRelu", {}), ("LeakyRelu", {"alpha": 2.5}), ("LeakyRelu", {"alpha": -0.3}),
                                       ("HardSigmoid", {}), ("HardSigmoid", {"alpha": 0.5, "beta": 0.1})])
def test_unary_with_attributes(op: str, attrs: dict) -> None:
    check(node(op, **attrs), {"x0": rand(4, 9, low=-4, high=4)})


@pytest.mark.parametrize("shape", [(), (5,), (2, 3, 700), (2, 70000), (3, 8, 20, 20), (2, 600, 4, 4)])
def test_relu_shapes(shape) -> None:  # zeros blocks of several trailing shapes, or np.clip
    check(node("Relu"), {"x0": rand(*shape)})


def test_relu_int_and_sigmoid_extremes() -> None:
    check(node("Relu"), {"x0": np.arange(-5, 5, dtype=np.int32)})
    check(node("Sigmoid"), {"x0": np.array([-1000, -90, -20, 0, 20, 90, 1000], np.float32)})


@pytest.mark.parametrize("lo, hi", [(-0.5, 0.5), (-0.5, None), (None, 0.25), (None, None), (0.6, 0.2)])
def test_clip(lo, hi) -> None:
    names = ["x0", "lo" if lo is not None else "", "hi" if hi is not None else ""]
    while not names[-1]:
        names.pop()
    inits = {k: np.array(v, np.float32) for k, v in (("lo", lo), ("hi", hi)) if v is not None}
    check(helper.make_node("Clip", names, ["y"]), {"x0": rand(3, 5)}, inits, opset=13)


def test_clip_int_and_opset6_attributes() -> None:
    check(helper.make_node("Clip", ["x0", "lo", "hi"], ["y"]), {"x0": np.arange(-6, 6, dtype=np.int64)},
          {"lo": np.array(-2, np.int64), "hi": np.array(3, np.int64)}, opset=13)
    check(node("Clip", min=-0.2, max=0.3), {"x0": rand(2, 6)}, opset=6)


BROADCASTS = [((3, 4), (3, 4)), ((2, 3, 4), (4,)), ((2, 1, 4), (3, 1)), ((1,), (2, 3)), ((5, 1, 1), (1, 4, 3)),
              ((), (2, 3)), ((3, 4), (1, 3, 4))]


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sum", "Mean"])
@pytest.mark.parametrize("sa, sb", BROADCASTS)
def test_binary_broadcasting(op: str, sa, sb) -> None:
    low = 0.5 if op in ("Div", "Pow") else -2.0
    feeds = {"x0": rand(*sa, low=low, high=2.0), "x1": rand(*sb, low=low, high=2.0)}
    (check_mean if op == "Mean" else check)(node(op, 2), feeds)


@pytest.mark.parametrize("op", ["Sum", "Mean", "Max", "Min"])
@pytest.mark.parametrize("shapes", [[(2, 3)], [(2, 3), (3,), (2, 1)], [(4,), (3, 1), (2, 1, 1), (4,)]])
def test_variadic(op: str, shapes) -> None:
    feeds = {f"x{i}": rand(*s) for i, s in enumerate(shapes)}
    (check_mean if op == "Mean" else check)(node(op, len(shapes)), feeds)


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_integer_div_truncates_toward_zero(dtype) -> None:
    a = np.array([[7, -7, 7, -7, 0, 9, -9, 1]], dtype)
    b = np.array([[2, 2, -2, -2, 3, 3, 4, -5]], dtype)
    check(node("Div", 2), {"x0": a, "x1": b})
    check(node("Div", 2), {"x0": a.T * 5, "x1": b})


@pytest.mark.parametrize("fmod, dtype", [(0, np.int64), (1, np.int32), (1, np.float32)])
def test_mod(fmod: int, dtype) -> None:
    a = np.array([7, -7, 7, -7, 5, -4], dtype)
    b = np.array([3, 3, -3, -3, 5, 3], dtype)
    check(node("Mod", 2, fmod=fmod), {"x0": a, "x1": b})


@pytest.mark.parametrize("e", [2.0, 0.5, 3.0, -1.0, 1.0])
def test_pow_constant_exponent(e: float) -> None:
    check(node("Pow", 2), {"x0": rand(3, 4, low=0.1, high=3)}, {"x1": np.array(e, np.float32)})


def test_pow_mixed_types() -> None:
    x = rand(3, 4, low=0.5, high=2)
    check(node("Pow", 2), {"x0": x, "x1": np.array([1, 2, 3, 0], np.int64)})  # float ** int tensor
    check(node("Pow", 2), {"x0": x}, {"x1": np.array([3], np.int32)})
    base = np.array([[1, 2, 3, -2]], np.int32)
    check(node("Pow", 2), {"x0": base, "x1": np.array([3, 2, 1, 3], np.int64)})  # int ** int
    check(node("Pow", 2), {"x0": base, "x1": np.array([0.5, 2.0, 1.5, 2.0], np.float32)})  # int ** float


@pytest.mark.parametrize("op", ["Equal", "Less", "Greater", "GreaterOrEqual", "LessOrEqual"])
@pytest.mark.parametrize("dtype", [np.int64, np.float32])
def test_comparisons(op: str, dtype) -> None:
    a = RNG.integers(-3, 3, size=(2, 3, 4)).astype(dtype)
    b = RNG.integers(-3, 3, size=(3, 1)).astype(dtype)
    check(node(op, 2), {"x0": a, "x1": b})


@pytest.mark.parametrize("op", ["And", "Or", "Xor"])
def test_logic(op: str) -> None:
    check(node(op, 2), {"x0": RNG.random((2, 5)) > 0.5, "x1": RNG.random((5,)) > 0.5})


def test_not_and_bitwise() -> None:
    check(node("Not"), {"x0": RNG.random((3, 4)) > 0.5})
    a, b = RNG.integers(0, 255, (3, 4)).astype(np.int32), RNG.integers(0, 255, (4,)).astype(np.int32)
    for op in ("BitwiseAnd", "BitwiseOr", "BitwiseXor"):
        check(node(op, 2), {"x0": a, "x1": b}, opset=18)
    check(node("BitwiseNot"), {"x0": a}, opset=18)


@pytest.mark.parametrize("neg, pos", [(1, 1), (1, 0), (0, 1), (0, 0)])
def test_isnan_isinf(neg: int, pos: int) -> None:
    x = np.array([[0.0, np.inf, -np.inf, np.nan, 1e38, -2.0]], np.float32)
    check(node("IsInf", detect_negative=neg, detect_positive=pos), {"x0": x})
    check(node("IsNaN"), {"x0": x})


@pytest.mark.parametrize("sc, sa, sb", [((4, 5), (4, 5), (4, 5)), ((4, 1), (4, 5), (5,)), ((5,), (), (4, 1))])
def test_where(sc, sa, sb) -> None:
    check(node("Where", 3), {"x0": RNG.random(sc) > 0.5, "x1": rand(*sa), "x2": rand(*sb)})


CASTS = [(np.float32, TensorProto.INT64), (np.float32, TensorProto.INT32), (np.float32, TensorProto.BOOL),
         (np.float32, TensorProto.FLOAT16), (np.float32, TensorProto.DOUBLE), (np.int64, TensorProto.FLOAT),
         (np.int64, TensorProto.INT32), (np.bool_, TensorProto.FLOAT), (np.bool_, TensorProto.INT64),
         (np.float64, TensorProto.FLOAT), (np.float32, TensorProto.FLOAT), (np.int32, TensorProto.BOOL)]


@pytest.mark.parametrize("src, to", CASTS)
def test_cast(src, to: int) -> None:
    x = rand(3, 4, low=-3, high=3)
    x = (x > 0) if src == np.bool_ else x.astype(src)
    check(node("Cast", to=to), {"x0": x}, opset=13)


def test_cast_like() -> None:
    check(node("CastLike", 2), {"x0": rand(3, 4, low=-3, high=3), "x1": np.zeros(1, np.int32)}, opset=15)


def test_erf_within_2e7_of_math_erf() -> None:
    x = np.concatenate([np.linspace(-5, 5, 100_001), np.geomspace(1e-30, 4.5, 2001), -np.geomspace(1e-30, 4.5, 2001),
                        [0.0, -0.0, 3.99, 4.0, 4.01, 1e30, -1e30, np.inf, -np.inf]]).astype(np.float32)
    y = np.empty_like(x)
    bind("Erf", [x], [y])()
    want = np.array([math.erf(v) for v in x.astype(np.float64)])
    assert np.max(np.abs(y - want)) <= 2e-7
    assert np.array_equal(np.signbit(y), np.signbit(x))  # erf(-0) = -0
    tiny = np.abs(x) < 1e-3
    np.testing.assert_allclose(y[tiny], want[tiny], rtol=1e-6)  # relative accuracy near 0 too
    nan = np.full(3, np.nan, np.float32)
    bind("Erf", [nan], [nan])()
    assert np.isnan(nan).all()


@pytest.mark.parametrize("dtype", [np.float64, np.float16])
def test_erf_other_float_types(dtype) -> None:
    check(node("Erf"), {"x0": rand(5, 7, low=-3, high=3).astype(dtype)}, atol=1e-3 if dtype == np.float16 else 2e-7)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gelu(approximate: str, dtype) -> None:
    check(node("Gelu", approximate=approximate), {"x0": rand(2, 20000, low=-6, high=6).astype(dtype)}, opset=20,
          rtol=1e-5, atol=2e-6)


def test_gelu_keeps_relative_accuracy_in_both_tails() -> None:
    x = np.concatenate([np.linspace(-10, 10, 50_001), np.geomspace(1e-30, 10, 2001), -np.geomspace(1e-30, 10, 2001)])
    x = x.astype(np.float32)
    y = np.empty_like(x)
    bind("Gelu", [x], [y], {"approximate": "none"}, opset=20)()
    want = np.array([v * 0.5 * math.erfc(-v / math.sqrt(2)) for v in x.astype(np.float64)])
    np.testing.assert_allclose(y, want, rtol=2e-6, atol=1e-12)
    special = np.array([np.inf, -np.inf, 1e38, -1e38], np.float32)
    bind("Gelu", [special], [special], {"approximate": "none"}, opset=20)()
    np.testing.assert_array_equal(special, np.array([np.inf, 0, 1e38, 0], np.float32))


# --- launches allocate nothing ------------------------------------------------------------------------

def _no_alloc_cases() -> list[tuple[str, list[np.ndarray], np.ndarray, dict]]:
    x, row, c = rand(2, 128, 768), rand(768), rand(2, 128, 1) > 0
    return [
        ("Add", [x, row], np.empty_like(x), {}), ("Mul", [row, x], np.empty_like(x), {}),
        ("Erf", [x], np.empty_like(x), {}), ("Gelu", [x], np.empty_like(x), {}),
        ("Where", [c, x, row], np.empty_like(x), {}), ("Cast", [x], np.empty(x.shape, np.int64), {}),
        ("Cast", [x], np.empty(x.shape, np.bool_), {}), ("Sigmoid", [x], np.empty_like(x), {}),
        ("Relu", [x], np.empty_like(x), {}), ("Clip", [x], np.empty_like(x), {"min": -0.5, "max": 0.5}),
        ("LeakyRelu", [x], np.empty_like(x), {}), ("Sum", [x, row, x], np.empty_like(x), {}),
        ("Div", [x.astype(np.int64), np.array([3], np.int64)], np.empty(x.shape, np.int64), {}),
        ("Less", [x, row], np.empty(x.shape, np.bool_), {}),
    ]


@pytest.mark.parametrize("case", range(len(_no_alloc_cases())))
def test_launch_allocates_nothing(case: int) -> None:
    op, ins, out, attrs = _no_alloc_cases()[case]
    assert allocated(bind(op, ins, [out], attrs)) < 4096, op


# --- in place: output 0 is the memory of an input ---------------------------------------------------

INPLACE_UNARY = [("Relu", {}), ("LeakyRelu", {}), ("Sigmoid", {}), ("Tanh", {}), ("Erf", {}), ("Sqrt", {}),
                 ("Exp", {}), ("Log", {}), ("Neg", {}), ("Abs", {}), ("Reciprocal", {}), ("Gelu", {}),
                 ("Clip", {"min": -0.3, "max": 0.4}), ("HardSigmoid", {}), ("Softplus", {}), ("Cast", {})]


@pytest.mark.parametrize("op, attrs", INPLACE_UNARY)
def test_unary_in_place(op: str, attrs: dict) -> None:
    x = rand(3, 20000, low=0.1 if op in ("Sqrt", "Log") else -3, high=3)
    want = np.empty_like(x)
    bind(op, [x], [want], attrs)()
    bind(op, [x], [x], attrs)()
    np.testing.assert_array_equal(x, want)


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sum", "Mean"])
@pytest.mark.parametrize("k", [0, 1])
def test_binary_in_place(op: str, k: int) -> None:
    ins = [rand(3, 4, 5, low=0.5, high=2), rand(3, 4, 5, low=0.5, high=2)]
    ins[1 - k] = ins[1 - k][:1, :1]  # the other input broadcasts
    want = np.empty((3, 4, 5), np.float32)
    bind(op, ins, [want])()
    bind(op, ins, [ins[k]])()
    np.testing.assert_array_equal(ins[k], want)


def test_in_place_input_with_another_view_shape() -> None:
    a, b = rand(4, 768), rand(1, 4, 768)
    want = a + b
    out = a.reshape(1, 4, 768)  # the planner hands the output as its own view of input 0's memory
    launch = bind("Add", [a, b], [out])
    assert allocated(launch) < 4096  # an overlapping (not identical) operand would be copied
    a[:] = want[0] - b[0]
    launch()
    np.testing.assert_allclose(out, want, rtol=1e-6)


@pytest.mark.parametrize("op", ["Sum", "Max", "Min", "Mean"])
@pytest.mark.parametrize("k", [0, 1, 2])
def test_variadic_in_place(op: str, k: int) -> None:
    ins = [rand(2, 3), rand(3), rand(2, 3)]
    ins[k] = rand(2, 3)
    want = np.empty((2, 3), np.float32)
    bind(op, ins, [want])()
    bind(op, ins, [ins[k]])()
    np.testing.assert_allclose(ins[k], want, rtol=1e-6)


@pytest.mark.parametrize("k", [1, 2])
@pytest.mark.parametrize("cond_shape", [(4, 6), (4, 1), (6,)])
def test_where_in_place(k: int, cond_shape) -> None:
    ins = [RNG.random(cond_shape) > 0.5, rand(4, 6), rand(4, 6)]
    want = np.empty((4, 6), np.float32)
    bind("Where", ins, [want])()
    bind("Where", ins, [ins[k]])()
    np.testing.assert_array_equal(ins[k], want)
