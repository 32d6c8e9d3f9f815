"""OpenCL kernels: every entry of the element-wise table and the GEMM against onnx.reference at odd sizes, with
broadcasting, asserting that they ran on the device; the tunable spaces (pruning, defaults valid on PoCL and
on a GPU, other configurations computing the same)."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import pytest
from harness import make_model, rand, reference
from onnx import helper

import ctxrt
from ctxrt.backends import get_backend
from ctxrt.backends.kernel import NodeSpec, TensorSpec
from ctxrt.backends.opencl.elementwise import TABLE, Elementwise, collapse
from ctxrt.backends.opencl.gemm import Gemm
from ctxrt.errors import UnsupportedOpError

pytestmark = pytest.mark.usefixtures("opencl")


def run_on_device(nodes, feeds, inits=None, backend="opencl", rtol=1e-5, atol=1e-6, opset=17):
    """Run on OpenCL, check against onnx.reference, and check that every step ran on the device."""
    model = make_model(nodes, feeds, inits, opset)
    want = reference(model, feeds)
    with ctxrt.compile(model, backend=backend) as ctx:
        g = ctx.graph()
        assert [p["backend"] for p in g.partitions] == ["opencl"], g.partitions
        got = g.run(feeds)
        for out, w in zip(model.graph.output, want, strict=True):
            y = got[out.name]
            assert (y.shape, y.dtype) == (w.shape, w.dtype), out.name
            if w.dtype.kind in "biu":
                np.testing.assert_array_equal(y, w)
            else:
                np.testing.assert_allclose(y, w, rtol=rtol, atol=atol)


# ---- element-wise: one case per table entry, odd sizes, both operands broadcasting --------------------------

A, B = (3, 1, 7), (5, 1)  # -> (3, 5, 7): each side broadcasts along a dim the other has
_FLOAT_UNARY = {"Sigmoid": (-4, 4), "Tanh": (-3, 3), "Exp": (-3, 3), "Log": (0.1, 4), "Sqrt": (0.1, 4),
                "Sin": (-3, 3), "Cos": (-3, 3), "Reciprocal": (0.5, 3), "Floor": (-3, 3), "Ceil": (-3, 3),
                "Round": (-3, 3), "Erf": (-3, 3), "Softplus": (-3, 3), "IsNaN": (-1, 1), "Neg": (-2, 2),
                "Abs": (-2, 2), "Sign": (-2, 2), "Relu": (-2, 2), "Tan": (-1.4, 1.4), "Asin": (-0.99, 0.99),
                "Acos": (-0.99, 0.99), "Atan": (-5, 5), "Sinh": (-4, 4), "Cosh": (-4, 4), "Asinh": (-5, 5),
                "Acosh": (1, 5), "Atanh": (-0.99, 0.99)}
_BINARY_FLOAT = {"Add", "Sub", "Mul", "Div", "Max", "Min", "Equal", "Less", "Greater", "LessOrEqual",
                 "GreaterOrEqual"}


def _case(op: str):
    """(nodes, feeds) exercising one table entry."""
    if op in _FLOAT_UNARY:
        lo, hi = _FLOAT_UNARY[op]
        x = rand(3, 5, 7, low=lo, high=hi)
        if op == "Round":
            x[0, 0, :4] = [0.5, 1.5, -0.5, 2.5]  # half to even
        return helper.make_node(op, ["a"], ["y"]), {"a": x}
    if op in _BINARY_FLOAT:
        return helper.make_node(op, ["a", "b"], ["y"]), {"a": rand(*A), "b": rand(*B)}
    bools = {"a": rand(*A) > 0, "b": rand(*B) > 0}
    ints = {"a": np.arange(21, dtype=np.int32).reshape(A), "b": np.array([[3], [5], [6], [9], [12]], np.int32)}
    cases = {
        "Gelu": (helper.make_node("Gelu", ["a"], ["y"]), {"a": rand(3, 5, 7, low=-5, high=5)}),
        "GeluTanh": (helper.make_node("Gelu", ["a"], ["y"], approximate="tanh"), {"a": rand(3, 5, 7, low=-5, high=5)}),
        "LeakyRelu": (helper.make_node("LeakyRelu", ["a"], ["y"], alpha=0.2), {"a": rand(3, 5, 7)}),
        "HardSigmoid": (helper.make_node("HardSigmoid", ["a"], ["y"], alpha=0.3, beta=0.4),
                        {"a": rand(3, 5, 7, low=-4, high=4)}),
        "HardSwish": (helper.make_node("HardSwish", ["a"], ["y"]), {"a": rand(3, 5, 7, low=-5, high=5)}),
        "Clip": None,  # needs constant bounds: below
        "Not": (helper.make_node("Not", ["a"], ["y"]), {"a": bools["a"]}),
        "Cast": (helper.make_node("Cast", ["a"], ["y"], to=onnx.TensorProto.INT64),
                 {"a": rand(3, 5, 7, low=-9, high=9)}),
        "CastBool": (helper.make_node("Cast", ["a"], ["y"], to=onnx.TensorProto.BOOL),
                     {"a": rand(3, 5, 7, low=-2, high=2).round()}),
        "Pow": (helper.make_node("Pow", ["a", "b"], ["y"]), {"a": rand(*A, low=0.5, high=2), "b": rand(*B, high=3)}),
        "And": (helper.make_node("And", ["a", "b"], ["y"]), bools),
        "Or": (helper.make_node("Or", ["a", "b"], ["y"]), bools),
        "Xor": (helper.make_node("Xor", ["a", "b"], ["y"]), bools),
        "BitwiseAnd": (helper.make_node("BitwiseAnd", ["a", "b"], ["y"]), ints),
        "BitwiseOr": (helper.make_node("BitwiseOr", ["a", "b"], ["y"]), ints),
        "BitwiseXor": (helper.make_node("BitwiseXor", ["a", "b"], ["y"]), ints),
        "Where": (helper.make_node("Where", ["c", "a", "b"], ["y"]),
                  {"c": rand(3, 1, 1) > 0, "a": rand(1, 5, 7), "b": rand(7)}),
    }
    return cases[op]


@pytest.mark.parametrize("op", sorted(set(TABLE) - {"Clip"}))
def test_table_entry_on_the_device(op: str) -> None:
    nodes, feeds = _case(op)
    opset = 18 if op.startswith("Bitwise") else 20 if op.startswith("Gelu") else 17
    run_on_device(nodes, feeds, atol=2e-6, opset=opset)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64])
def test_clip_with_constant_bounds_and_integers(dtype) -> None:
    x = (rand(4, 9, low=-10, high=10)).astype(dtype)
    inits = {"lo": np.array(-3, dtype), "hi": np.array(4, dtype)}
    run_on_device(helper.make_node("Clip", ["a", "lo", "hi"], ["y"]), {"a": x}, inits)
    run_on_device(helper.make_node("Clip", ["a", "lo"], ["y"]), {"a": x}, {"lo": inits["lo"]})


@pytest.mark.parametrize("shapes", [
    [(1000003,), (1000003,)],  # long, not a multiple of any work-group or vector width
    [(2, 1, 4, 1, 3), (5, 4, 1, 1)],  # both broadcast, several dims
    [(2, 3, 1, 5, 1, 7, 1, 2), (3, 4, 1, 6, 1, 1, 2)],  # rank 8 before collapsing
    [(), (4, 3)],  # a scalar
])
def test_add_broadcasting_shapes(shapes) -> None:
    feeds = {"a": rand(*shapes[0]), "b": rand(*shapes[1])}
    run_on_device(helper.make_node("Add", ["a", "b"], ["y"]), feeds)


def test_collapse_merges_contiguous_dims() -> None:
    assert collapse((2, 3, 4, 5), [(2, 3, 4, 5), (4, 5)]) == ([6, 20], [[20, 1], [0, 1]])
    assert collapse((2, 3, 4, 5), [(2, 3, 4, 5), (4, 5), (3, 1, 1)]) == \
        ([2, 3, 20], [[60, 20, 1], [0, 0, 1], [0, 1, 0]])
    assert collapse((1, 7, 1), [(7, 1), ()]) == ([7], [[1], [0]])


def test_float64_and_declines_fall_back() -> None:
    run_on_device(helper.make_node("Mul", ["a", "b"], ["y"]), {"a": rand(3, 5).astype(np.float64),
                                                            "b": rand(5).astype(np.float64)})
    # integer Div (truncation rules) and three-input Sum have no OpenCL kernel: they run in a CPU partition
    model = make_model([helper.make_node("Div", ["a", "b"], ["t"]), helper.make_node("Sum", ["t", "a", "b"], ["y"])],
                       {"a": np.arange(1, 13, dtype=np.int32), "b": np.full(12, 5, np.int32)})
    with ctxrt.compile(model, backend="opencl") as ctx:
        assert [p["backend"] for p in ctx.graph().partitions] == ["cpu"]


# ---- GEMM --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("a, b", [
    ((37, 53), (53, 71)), ((1, 300), (300, 129)), ((2, 3, 37, 53), (3, 53, 19)), ((1, 3, 5, 7), (2, 1, 7, 4)),
    ((7,), (3, 7, 4)), ((2, 5, 7), (7,)), ((2, 4, 16, 16), (2, 4, 16, 16)),
])
def test_matmul_odd_and_batched(a, b) -> None:
    run_on_device(helper.make_node("MatMul", ["a", "b"], ["y"]), {"a": rand(*a), "b": rand(*b)}, rtol=1e-5,
                  atol=1e-5)


@pytest.mark.parametrize("k", [1, 13, 64, 301])
def test_matmul_against_constant_weights_stored_nt(k) -> None:
    """A constant right-hand matrix is stored [N, K] (TransposeMatMulWeights): the dot-product variant."""
    run_on_device(helper.make_node("MatMul", ["a", "w"], ["y"]), {"a": rand(2, 9, k)}, {"w": rand(k, 65)},
                  atol=1e-5)


@pytest.mark.parametrize("ta, tb, c", [(0, 0, (17,)), (1, 1, (9, 1)), (0, 1, (9, 17)), (1, 0, ()), (0, 0, None)])
def test_gemm_transposes_bias_alpha_beta(ta, tb, c) -> None:
    a = rand(13, 9) if ta else rand(9, 13)
    b = rand(17, 13) if tb else rand(13, 17)
    feeds = {"a": a, "b": b, **({} if c is None else {"c": rand(*c)})}
    node = helper.make_node("Gemm", ["a", "b"] + ([] if c is None else ["c"]), ["y"], transA=ta, transB=tb,
                            alpha=0.5, beta=2.0)
    run_on_device(node, feeds, atol=1e-5)


def test_gemm_fused_relu_epilogue() -> None:
    nodes = [helper.make_node("Gemm", ["a", "w", "c"], ["h"], transB=1), helper.make_node("Relu", ["h"], ["y"])]
    model = make_model(nodes, {"a": rand(5, 33)}, {"w": rand(21, 33), "c": rand(21)})
    with ctxrt.compile(model, backend="opencl") as ctx:
        assert ctx.graph().partitions == [{"backend": "opencl", "steps": 1, "ops": {"Gemm": 1}}]
    run_on_device(nodes, {"a": rand(5, 33)}, {"w": rand(21, 33), "c": rand(21)}, atol=1e-5)


# ---- tunable spaces -----------------------------------------------------------------------------------------

def _spec(m=37, n=29, k=53, tb=False) -> NodeSpec:
    f32 = np.dtype(np.float32)
    ins = [TensorSpec((m, k), f32), TensorSpec((n, k) if tb else (k, n), f32)]
    return NodeSpec("MatMul", "mm", {"transB": int(tb)}, ins, [TensorSpec((m, n), f32)], [None, None])


def _gpu(info):
    """A typical GPU's limits, to check that the defaults fit one."""
    return dataclasses.replace(info, type="gpu", max_work_group_size=256, max_work_item_sizes=(256, 256, 64),
                               local_memory=32768)


def test_defaults_are_valid_on_this_device_and_on_a_gpu() -> None:
    be = get_backend("opencl")
    for info in (be.info, _gpu(be.info)):
        for kernel, variants in ((Gemm, ("", "nt", "gemv", "scalar")), (Elementwise, ("",))):
            for v in variants:
                p = kernel.space.default(info, v)
                problem = {"M": 37, "N": 29, "K": 53, "a_t": 0, "b_t": int(v in ("nt", "gemv")), "itemsize": 4}
                assert kernel.space.why_invalid(p, problem, info) is None, (kernel, v, info.type)


def test_space_prunes_by_work_group_and_local_memory() -> None:
    be = get_backend("opencl")
    gpu = _gpu(be.info)
    problem = {"M": 64, "N": 64, "K": 64, "a_t": 0, "b_t": 0, "itemsize": 4}
    found = list(Gemm.space.candidates(problem, gpu))
    assert found and all((p["TM"] // p["WM"]) * (p["TN"] // (p["WN"] * p["VN"])) <= 256 for p in found)
    assert all(p["LOCAL"] * p["TK"] * (p["TM"] + p["TN"]) * 4 <= 32768 for p in found)
    assert all(p["KV"] == 1 for p in found)  # the dot-product variant needs B stored [N, K]
    assert "work-group" in Gemm.space.why_invalid(dict(Gemm.space.default(gpu), TM=128, WM=1), problem, gpu)
    with pytest.raises(UnsupportedOpError, match="not one of"):
        Gemm(_spec(), be, dict(Gemm.space.default(be.info), TM=3))
    assert len(Gemm.space.digest()) == 16 and Gemm.space.digest() != Elementwise.space.digest()


@pytest.mark.parametrize("tb", [False, True])
def test_other_configurations_compute_the_same(tb) -> None:
    """What a tuner relies on: any candidate builds, launches (returning an event) and agrees with the default."""
    be = get_backend("opencl")
    spec = _spec(tb=tb)
    problem = Gemm(spec, be).problem()
    cands = list(Gemm.space.candidates(problem, be.info))
    rng = np.random.default_rng(0)
    picks = [cands[i] for i in rng.choice(len(cands), 6, replace=False)]
    picks.append(Gemm.space.default(be.info, "nt" if tb else ""))
    a, b = rand(37, 53), (rand(29, 53) if tb else rand(53, 29))
    want = a @ (b.T if tb else b)
    for params in picks:
        k = Gemm(spec, be, params)
        be.programs.prepare(k.programs, be.stats)
        bufs = [be.alloc_device(x.nbytes) for x in (a, b, want)]
        ts = [be.view(buf, 0, x.shape, np.float32) for buf, x in zip(bufs, (a, b, want), strict=True)]
        be.copy_in(ts[0], a)
        be.copy_in(ts[1], b)
        event = k.bind(ts[:2], ts[2:], [])()
        event.wait()
        got = np.empty_like(want)
        be.copy_out(got, ts[2])
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=str(params))
