"""Activations vs onnx.reference: every attribute at opsets 13-21, float16/32/64, edge values (large, NaN),
in-place runs, no allocation per launch, and the SiLU / HardSwish fusions."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from harness import allocated, bind, check, make_model, rand, run_ctxrt
from onnx import helper

import ctxrt
from ctxrt.backends import get_backend
from ctxrt.compiler import lower
from ctxrt.errors import UnsupportedOpError

EDGES = np.array([0.0, -0.0, 1e-8, -1e-8, 3.0, -3.0, 6.0, -6.0, 30.0, -30.0, 90.0, -90.0, 1e4, -1e4, np.nan])


def inputs(dtype: Any, shape: tuple[int, ...] = (3, 5, 41)) -> np.ndarray:
    """Random values in [-8, 8] with the edge values in front (large enough to leave every block partial)."""
    x = rand(*shape, low=-8.0, high=8.0).astype(np.float64)
    x.reshape(-1)[:EDGES.size] = EDGES
    with np.errstate(over="ignore"):
        return x.astype(dtype)


UNARY = [
    ("HardSwish", {}, 14), ("HardSigmoid", {}, 13), ("HardSigmoid", {"alpha": 0.3, "beta": 0.6}, 13),
    ("LeakyRelu", {}, 16), ("LeakyRelu", {"alpha": 1.7}, 16), ("LeakyRelu", {"alpha": -0.2}, 16),
    ("Elu", {}, 13), ("Elu", {"alpha": 0.4}, 13), ("Selu", {}, 13), ("Selu", {"alpha": 1.2, "gamma": 0.9}, 13),
    ("Celu", {}, 13), ("Celu", {"alpha": 2.5}, 13), ("Mish", {}, 18), ("Softplus", {}, 13), ("Softsign", {}, 13),
    ("ThresholdedRelu", {}, 13), ("ThresholdedRelu", {"alpha": -0.5}, 13), ("Sigmoid", {}, 13),
    ("Gelu", {}, 20), ("Gelu", {"approximate": "tanh"}, 20), ("Swish", {}, 24), ("Swish", {"alpha": 0.7}, 24),
]
TOL = {np.float16: (3e-3, 3e-3), np.float32: (1e-5, 1e-6), np.float64: (1e-12, 1e-13)}


@pytest.mark.parametrize("op, attrs, opset, dtype", [
    (*case, dtype) for case in UNARY for dtype in (np.float32, np.float64, np.float16)
    if case[0] != "Celu" or dtype == np.float32], ids=str)  # Celu is typed for float32 only
def test_unary_activation(op: str, attrs: dict, opset: int, dtype: Any) -> None:
    rtol, atol = TOL[dtype]
    if op == "Gelu" and dtype == np.float64:
        rtol, atol = 1e-6, 1e-6  # computed in float32 (a table-based erf, see elementwise.py)
    check(helper.make_node(op, ["x"], ["y"], **attrs), {"x": inputs(dtype)}, opset=opset, rtol=rtol, atol=atol)


def test_hard_swish_runs_on_onednn_where_installed() -> None:
    """float32 HardSwish is one oneDNN pass (edge values and NaN as onnx.reference); float64 stays NumPy's."""
    from ctxrt.backends.cpu.onednn import api

    if not api.available():
        pytest.skip("oneDNN is not installed")
    for dtype, onednn in ((np.float32, True), (np.float64, False)):
        node = helper.make_node("HardSwish", ["x"], ["y"])
        feeds = {"x": inputs(dtype)}
        check(node, feeds, opset=14, rtol=TOL[dtype][0], atol=TOL[dtype][1])
        g = ctxrt.compile(make_model([node], feeds, opset=14)).graph()
        assert g._kernels[0].algorithm.startswith("onednn:eltwise") == onednn


@pytest.mark.parametrize("slope_shape", [(1,), (5, 1, 1), (1, 5, 1, 1), (7,), (4, 5, 6, 7), (6, 1)])
@pytest.mark.parametrize("const", [True, False])
def test_prelu_broadcasting(slope_shape: tuple[int, ...], const: bool) -> None:
    x, slope = inputs(np.float32, (4, 5, 6, 7)), rand(*slope_shape, low=-2.0, high=2.0)
    node = helper.make_node("PRelu", ["x", "s"], ["y"])
    if const:
        check(node, {"x": x}, {"s": slope}, opset=16)
    else:
        check(node, {"x": x, "s": slope}, opset=16)


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_prelu_dtypes_and_blocks(dtype: Any) -> None:
    """A per-channel slope over a tensor larger than one block (boxes along the channel axis)."""
    rtol, atol = TOL[dtype]
    check(helper.make_node("PRelu", ["x", "s"], ["y"]), {"x": inputs(dtype, (2, 24, 30, 31))},
          {"s": rand(24, 1, 1, dtype=dtype)}, opset=16, rtol=rtol, atol=atol)


CLIP = [  # (input names, constants, attributes, opset): min/max as inputs or attributes, either absent
    (["x", "lo", "hi"], {"lo": 0.0, "hi": 6.0}, {}, 13),  # ReLU6
    (["x", "", "hi"], {"hi": 6.0}, {}, 13), (["x", "lo"], {"lo": -0.5}, {}, 13), (["x"], {}, {}, 13),
    (["x", "lo", "hi"], {"lo": 2.0, "hi": -1.0}, {}, 13),  # min > max: every value becomes max
    (["x"], {}, {"min": 0.0, "max": 6.0}, 6), (["x"], {}, {"max": 1.5}, 6), (["x"], {}, {"min": -1.5}, 6),
]


@pytest.mark.parametrize("names, consts, attrs, opset", CLIP)
def test_clip_forms(names: list[str], consts: dict, attrs: dict, opset: int) -> None:
    inits = {k: np.array(v, np.float32) for k, v in consts.items()}
    check(helper.make_node("Clip", names, ["y"], **attrs), {"x": inputs(np.float32)}, inits, opset=opset)


def test_clip_integer_and_non_constant_bound() -> None:
    check(helper.make_node("Clip", ["x", "lo", "hi"], ["y"]), {"x": np.arange(-300, 300, dtype=np.int16)},
          {"lo": np.array(-7, np.int16), "hi": np.array(100, np.int16)}, opset=13)
    x = rand(3, 4)
    model = make_model(helper.make_node("Clip", ["x", "lo"], ["y"]), {"x": x, "lo": np.array(0.0, np.float32)},
                       opset=13)
    ctx = ctxrt.compile(model)  # a bound that is an input is read at run time (tests/ops/test_runtime_inputs.py)
    try:
        for lo in (0.0, 0.5):
            y = ctx.graph().run({"x": x, "lo": np.array(lo, np.float32)})["y"]
            np.testing.assert_array_equal(y, np.maximum(x, np.float32(lo)))
    finally:
        ctx.free()


def test_unsupported_attribute_value_is_named() -> None:
    model = make_model(helper.make_node("Gelu", ["x"], ["y"], approximate="erf", name="g1"), {"x": rand(3)},
                       opset=20)
    with pytest.raises(UnsupportedOpError, match="Gelu node 'g1'.*approximate='erf'"):
        ctxrt.compile(model)


def _ops_after_passes(model) -> list[str]:
    return [n.op for n in lower(model, None, get_backend("cpu")).nodes]


@pytest.mark.parametrize("order", ["x*s", "s*x"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_silu_fused_into_swish(order: str, dtype: Any) -> None:
    mul_in = ["x", "s"] if order == "x*s" else ["s", "x"]
    nodes = [helper.make_node("Add", ["a", "b"], ["x"]), helper.make_node("Sigmoid", ["x"], ["s"]),
             helper.make_node("Mul", mul_in, ["y"])]
    feeds = {"a": inputs(dtype), "b": inputs(dtype)}
    assert _ops_after_passes(make_model(nodes, feeds)) == ["Add", "Swish"]
    rtol, atol = TOL[dtype]
    check(nodes, feeds, rtol=rtol, atol=atol)


@pytest.mark.parametrize("alpha, beta", [(1 / 6, 0.5), (0.2, 0.5), (0.25, 0.4)])
def test_hard_sigmoid_times_x_fused_into_hard_swish(alpha: float, beta: float) -> None:
    nodes = [helper.make_node("HardSigmoid", ["x"], ["h"], alpha=alpha, beta=beta),
             helper.make_node("Mul", ["h", "x"], ["y"])]
    feeds = {"x": inputs(np.float32)}
    assert _ops_after_passes(make_model(nodes, feeds, opset=13)) == ["HardSwish"]
    check(nodes, feeds, opset=13)


def test_gate_with_other_readers_is_not_fused() -> None:
    nodes = [helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Mul", ["x", "s"], ["m"]),
             helper.make_node("Add", ["m", "s"], ["y"])]
    feeds = {"x": inputs(np.float32)}
    assert _ops_after_passes(make_model(nodes, feeds)) == ["Sigmoid", "Mul", "Add"]
    check(nodes, feeds)


def test_activations_run_in_place_inside_a_graph() -> None:
    """A chain whose intermediates die at each activation: each runs in its input's memory."""
    chain = ["HardSwish", "Elu", "Selu", "Mish", "Softsign", "ThresholdedRelu", "Celu"]
    nodes = [helper.make_node("Add", ["a", "b"], ["t0"])]
    nodes += [helper.make_node(op, [f"t{i}"], [f"t{i + 1}"]) for i, op in enumerate(chain)]
    nodes += [helper.make_node("PRelu", [f"t{len(chain)}", "s"], ["t_p"]),
              helper.make_node("Sigmoid", ["t_p"], ["g"]), helper.make_node("Mul", ["t_p", "g"], ["y"])]
    feeds = {"a": inputs(np.float32, (2, 8, 9, 10)), "b": inputs(np.float32, (2, 8, 9, 10))}
    model = make_model(nodes, feeds, {"s": rand(8, 1, 1)}, opset=18)
    compiled, _ = ctxrt.compiler.compile_model(model)
    arena_tensors = {r.key for s in compiled.steps for r in s.outputs if r.space == "arena"}
    assert len(arena_tensors) == 1, arena_tensors  # every step wrote into t0's memory
    check(nodes, feeds, {"s": rand(8, 1, 1)}, opset=18)


@pytest.mark.parametrize("op, attrs", [(op, attrs) for op, attrs, _ in UNARY if op not in ("Gelu",)])
def test_in_place_launch_matches(op: str, attrs: dict) -> None:
    x = inputs(np.float32, (3, 7000))
    want = np.empty_like(x)
    bind(op, [x], [want], attrs)()
    y = x.copy()
    bind(op, [y], [y], attrs)()
    np.testing.assert_array_equal(y, want)


@pytest.mark.parametrize("op, attrs", [(op, attrs) for op, attrs, _ in UNARY] + [("PRelu", {})])
def test_no_allocation_per_launch(op: str, attrs: dict) -> None:
    x = inputs(np.float32, (2, 16, 40, 40))
    ins = [x, rand(16, 1, 1)] if op == "PRelu" else [x]
    assert allocated(bind(op, ins, [np.empty_like(x)], attrs)) < 4096, op


def test_fused_model_matches_onnxruntime() -> None:
    """Conv -> SiLU and Conv -> HardSigmoid * x, as the two torch exporters write them, against onnxruntime."""
    from harness import onnxruntime_outputs

    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Sigmoid", ["c"], ["s"]), helper.make_node("Mul", ["c", "s"], ["m"]),
             helper.make_node("HardSigmoid", ["m"], ["h"], alpha=1 / 6), helper.make_node("Mul", ["m", "h"], ["y"])]
    feeds = {"x": rand(1, 3, 12, 12)}
    inits = {"w": rand(8, 3, 3, 3), "b": rand(8)}
    model = make_model(nodes, feeds, inits, opset=13)
    want = onnxruntime_outputs(model, feeds)[0]
    np.testing.assert_allclose(run_ctxrt(model, feeds)[0], want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("op", ["Sigmoid", "Tanh"])
def test_sigmoid_and_tanh_in_one_native_pass(op: str) -> None:
    """float32 Sigmoid and Tanh (an LSTM cell written out as ops, silero VAD's) in one native pass (csrc/vmath.h
    act8's codes 11 and 12): within 4e-7 relative of float64 across the range, tanh's series near 0 (no
    cancellation: 1e-8 stays 1e-8), the limits at +-inf and past exp's range, NaN kept; NumPy's passes where the
    extension is missing."""
    from ctxrt.backends.cpu import native
    from ctxrt.backends.cpu.elementwise import NativeAct
    from ctxrt.backends.cpu.registry import KERNELS
    from ctxrt.backends.kernel import NodeSpec, TensorSpec

    x = np.concatenate([np.linspace(-100, 100, 20001), np.linspace(-0.3, 0.3, 6001),
                        [1e-8, -1e-30, 88.5, -88.5, 1e30, np.inf, -np.inf, np.nan]]).astype(np.float32)
    spec = NodeSpec(op, "a", {}, [TensorSpec(x.shape, x.dtype)], [TensorSpec(x.shape, x.dtype)])
    kernel = KERNELS[op](spec)
    assert isinstance(kernel, NativeAct) and kernel.act == {"Sigmoid": 11, "Tanh": 12}[op]
    ref = (1 / (1 + np.exp(-x.astype(np.float64))) if op == "Sigmoid" else np.tanh(x.astype(np.float64)))
    for lib in ([native.library()] if native.library() is not None else []) + [None]:
        native._STATE["lib"], keep = lib, native._STATE.get("lib")
        try:
            y = np.empty_like(x)
            kernel.bind([x], [y], [np.zeros(int(n), np.uint8) for n in kernel.scratch])()
        finally:
            native._STATE["lib"] = keep
        big = np.abs(ref) > 1e-30
        np.testing.assert_allclose(y[big], ref[big], rtol=4e-7, atol=0)
        assert np.isnan(y[-1]) and (y[-3:-1] == ([1, 0] if op == "Sigmoid" else [1, -1])).all()


@pytest.mark.parametrize("code", [3, 4, 11, 12])
def test_native_activations_hold_their_exponential(code: int) -> None:
    """The epilogue activations computed through e^t (GELU by tanh, SiLU, Sigmoid, Tanh: csrc/vmath.h) take one exp
    held to [e^-87, e^88]: within 4e-7 relative of float64 wherever the result is above 1e-30, within 1e-35 of it
    below (SiLU of -1e30 is -0, not -1e30 / e^88), the limits at +-inf, NaN kept."""
    from ctxrt.backends.cpu import native

    if native.library() is None:
        pytest.skip("the native extension is not built here")
    x = np.concatenate([np.linspace(-120, 120, 24001), [-88.5, 88.5, 1e-8, 1e30, -1e30, np.inf, -np.inf, np.nan]]
                       ).astype(np.float32)
    v = x.astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        ref = {3: 0.5 * v * (1 + np.tanh(0.7978845608028654 * (v + 0.044715 * v ** 3))),
               4: v / (1 + np.exp(-v)), 11: 1 / (1 + np.exp(-v)), 12: np.tanh(v)}[code]
    ref[np.isinf(v) & (v > 0)] = {3: np.inf, 4: np.inf, 11: 1, 12: 1}[code]
    ref[np.isinf(v) & (v < 0)] = {3: -0.0, 4: -0.0, 11: 0, 12: -1}[code]
    y = np.empty_like(x)
    native.act(x, y, code)()
    fin = np.isfinite(ref)
    if code == 3:  # (its 1 + tanh cancels in the negative tail: within 3e-7 absolute there, as before; x^3 of -inf
        fin &= np.isfinite(v)  # makes its -inf NaN, as before)
        np.testing.assert_allclose(y[fin], ref[fin], rtol=2e-6, atol=3e-7)
        return
    else:
        big = fin & (np.abs(ref) > 1e-30)
        np.testing.assert_allclose(y[big], ref[big], rtol=4e-7, atol=0)
        assert np.all(np.abs(y[fin & ~big] - ref[fin & ~big]) <= 1e-35)
    assert np.isnan(y[-1])
    np.testing.assert_array_equal(y[-3:-1], ref[-3:-1].astype(np.float32))


@pytest.mark.parametrize("n", [32767, 32768, 32769, 100003])
@pytest.mark.parametrize("code", [5, 6, 11, 12])
def test_native_activation_on_openmp_team_equals_one_thread(n: int, code: int) -> None:
    """From ACT_TEAM_MIN elements on, an activation is shared on OpenMP's team (csrc/gemv.c, a GELU of 256 x 8000
    in Wav2Vec2's feature extractor on one core was 3.5x onnxruntime's): each thread's share of whole 16-float
    lines, the tail to the last, in place or not, gives every element bit for bit what one thread gives."""
    from ctxrt.backends.cpu import native, threads
    from ctxrt.backends.cpu.onednn import api

    if native.library() is None:
        pytest.skip("the native extension is not built here")
    api.library()  # (libgomp, where oneDNN is installed: the team)
    x = rand(n, low=-9.0, high=9.0).astype(np.float32)
    one, step = np.empty_like(x), native.ACT_TEAM_MIN - 16  # below the threshold: the caller's thread alone (on
    for a in range(0, n, step):  # whole lines: the vector and tail paths take the same elements as the team's)
        native.act(x[a:a + step], one[a:a + step], code)()
    for nthreads in (2, 3):
        with threads.ThreadScope(nthreads):
            y = np.empty_like(x)
            native.act(x, y, code)()
            z = x.copy()
            native.act(z, z, code)()
        np.testing.assert_array_equal(y, one)
        np.testing.assert_array_equal(z, one)
