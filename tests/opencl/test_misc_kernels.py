"""OpenCL kernels of the transformer and shape ops (Softmax/LogSoftmax, LayerNormalization, ReduceX, ArgMax/ArgMin,
Transpose, Slice, Expand, Tile, DepthToSpace/SpaceToDepth, Pad, Concat, Split, Gather, GatherND).

A node that silently fell back to the CPU would pass the op tests without testing anything: every case here
asserts that its steps ran on the device, then compares with onnx.reference (or the NumPy backend where the
reference is wrong or refuses: Softmax before opset 13, negative pads) at odd sizes and edge attributes. Then:
a MatMul's bias, residual and activation fold into one GEMM launch, and every candidate of the new spaces computes
what the default does (in place too). Whole models: test_misc_models.py.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from harness import make_model, rand, read, reference
from onnx import helper

import ctxrt
from ctxrt.backends import get_backend
from ctxrt.backends.kernel import NodeSpec, TensorSpec
from ctxrt.backends.opencl.concat import Concat
from ctxrt.backends.opencl.gather import Gather
from ctxrt.backends.opencl.norm_layer import LayerNorm
from ctxrt.backends.opencl.reduce import Arg, Reduce, Softmax
from ctxrt.backends.opencl.rows import rows_of
from ctxrt.backends.opencl.shape_ops import Pad, StridedCopy, collapse
from ctxrt.tuning.profiler import Bench

pytestmark = pytest.mark.usefixtures("opencl")
F32, I64 = np.dtype(np.float32), np.dtype(np.int64)


def run_on_device(nodes, feeds, inits=None, opset=17, oracle="reference", rtol=1e-5, atol=1e-6,
                  placement=("opencl",)):
    """Run on OpenCL, assert the partitions, compare with the oracle ("reference" or "cpu", the NumPy backend)."""
    model = make_model(nodes, feeds, inits, opset)
    if oracle == "reference":
        want = reference(model, feeds)
    else:
        with ctxrt.compile(model, backend="cpu") as ctx:
            got = ctx.graph().run(feeds)
            want = [np.array(got[o.name]) for o in model.graph.output]
    with ctxrt.compile(model, backend="opencl") as ctx:
        g = ctx.graph()
        assert tuple(p["backend"] for p in g.partitions) == placement, g.partitions
        got = g.run(feeds)
        for out, w in zip(model.graph.output, want, strict=True):
            y = got[out.name]
            assert (y.shape, y.dtype) == (w.shape, w.dtype), out.name
            if w.dtype.kind in "biu":
                np.testing.assert_array_equal(y, w, err_msg=out.name)
            else:
                np.testing.assert_allclose(y, w, rtol=rtol, atol=atol, err_msg=out.name)


# ---- Softmax, LayerNormalization, reductions ----------------------------------------------------------------

@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("axis", [-1, 0, 1, 2])
def test_softmax_any_axis(op, axis) -> None:
    x = rand(3, 5, 37, low=-4, high=4)
    x[1, 2, :] += 80.0  # large rows: the max is subtracted before exp
    run_on_device(helper.make_node(op, ["x"], ["y"], axis=axis), {"x": x}, opset=13)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_softmax_before_opset_13_and_float64(dtype) -> None:
    """Before opset 13 the input is coerced to 2-D at axis (onnx.reference normalizes along the axis: the NumPy
    backend is the oracle); attention rows of 128 with a masked (-inf) column."""
    x = rand(2, 3, 4, 129).astype(dtype)
    run_on_device(helper.make_node("Softmax", ["x"], ["y"], axis=1), {"x": x}, opset=11, oracle="cpu")
    x[:, :, :, 5] = -np.inf
    run_on_device(helper.make_node("Softmax", ["x"], ["y"]), {"x": x}, opset=13)


@pytest.mark.parametrize("axis, stats", [(-1, (1, 1)), (1, (0, 1)), (0, (1, 0)), (2, (0, 0))])
def test_layernorm_axes_and_optional_outputs(axis, stats) -> None:
    x = rand(3, 5, 37, low=-3, high=5)
    norm = x.shape[axis % 3:]
    outs = ["y", "mean" if stats[0] else "", "inv" if stats[1] else ""]
    while not outs[-1]:
        outs.pop()
    node = helper.make_node("LayerNormalization", ["x", "g", "b"], outs, axis=axis, epsilon=1e-3)
    run_on_device(node, {"x": x}, {"g": rand(*norm), "b": rand(*norm)}, rtol=1e-5, atol=1e-5)


def test_layernorm_without_bias_float64_and_in_place() -> None:
    x = rand(7, 129).astype(np.float64)
    run_on_device(helper.make_node("LayerNormalization", ["x", "g"], ["y"]), {"x": x},
                  {"g": rand(129).astype(np.float64)})
    # Add -> LayerNorm -> Softmax -> Mul: both run in place on the Add's output (its input dies there)
    nodes = [helper.make_node("Add", ["x", "x"], ["a"]), helper.make_node("LayerNormalization", ["a", "g"], ["n"]),
             helper.make_node("Softmax", ["n"], ["s"]), helper.make_node("Mul", ["s", "x"], ["y"])]
    run_on_device(nodes, {"x": rand(9, 40)}, {"g": rand(40)}, rtol=1e-5, atol=1e-6)


_REDUCE = ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
           "ReduceSumSquare", "ReduceLogSumExp"]


@pytest.mark.parametrize("op", _REDUCE)
@pytest.mark.parametrize("axes", [[1], [0, 2], [2], [0, 1, 2], [-1, 0]])
def test_reductions_over_any_axes(op, axes) -> None:
    x = rand(3, 5, 37, low=0.5, high=1.2)
    for keep in (0, 1):
        node = helper.make_node(op, ["x", "axes"], ["y"], keepdims=keep)
        run_on_device(node, {"x": x}, {"axes": np.array(axes, np.int64)}, opset=18, rtol=1e-4)


RNG_INT = np.random.default_rng(7)


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1"])
def test_integer_reductions(op, dtype) -> None:
    x = RNG_INT.integers(-9, 9, size=(4, 6, 9)).astype(dtype)
    run_on_device(helper.make_node(op, ["x", "a"], ["y"], keepdims=1), {"x": x}, {"a": np.array([1], np.int64)},
                  opset=18)


def test_reduction_with_four_groups_and_nan() -> None:
    """Kept and reduced axes alternating (2 groups of each after merging), a NaN propagating through max."""
    x = rand(2, 3, 4, 5, 6)
    x[1, 0, 2, 0, 3] = np.nan
    for op in ("ReduceMax", "ReduceSum"):
        node = helper.make_node(op, ["x", "a"], ["y"], keepdims=0)
        run_on_device(node, {"x": x}, {"a": np.array([0, 2, 4], np.int64)}, opset=18, rtol=1e-5)


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("last", [0, 1])
def test_arg_ties_nan_and_integers(op, axis, last) -> None:
    x = np.round(rand(3, 5, 37) * 2)  # many ties
    x[2, 1, 7] = x[0, 3, 30] = np.nan
    run_on_device(helper.make_node(op, ["x"], ["y"], axis=axis, select_last_index=last, keepdims=axis != 1),
                  {"x": x})
    xi = RNG_INT.integers(-3, 3, size=(4, 7)).astype(np.int32)
    run_on_device(helper.make_node(op, ["x"], ["y"], axis=axis % 2, select_last_index=last), {"x": xi})


def test_declined_cases_fall_back_to_the_cpu() -> None:
    """What the OpenCL kernels do not cover runs in a CPU partition, correctly."""
    x = rand(4, 6)
    node = helper.make_node("LayerNormalization", ["x", "g"], ["y"], stash_type=11)  # float32 with double stats
    run_on_device(node, {"x": x}, {"g": rand(6)}, oracle="cpu", placement=("cpu",))
    node = helper.make_node("ReduceSum", ["x", "a"], ["y"], noop_with_empty_axes=1)
    run_on_device(node, {"x": x}, {"a": np.array([], np.int64)}, opset=18, placement=("cpu",))
    # float16 no longer falls back: computed in float32 between casts on the device (docs/opencl.md)
    run_on_device(helper.make_node("Softmax", ["x"], ["y"]), {"x": x.astype(np.float16)}, rtol=1e-3,
                  atol=1e-3, placement=("opencl",))


# ---- data movement ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("perm", [[0, 2, 1, 3], [0, 1, 3, 2], [3, 2, 1, 0], [1, 0, 2, 3], [0, 3, 1, 2], [2, 3, 0, 1]])
def test_transpose_any_permutation(perm) -> None:
    run_on_device(helper.make_node("Transpose", ["x"], ["y"], perm=perm), {"x": rand(3, 5, 7, 4)})


@pytest.mark.parametrize("dtype", [np.int64, np.bool_, np.float64, np.int8])
def test_transpose_other_dtypes_and_default_perm(dtype) -> None:
    x = (rand(12, 33, 7) * 100).astype(dtype)
    run_on_device(helper.make_node("Transpose", ["x"], ["y"]), {"x": x})


@pytest.mark.parametrize("starts, ends, axes, steps", [
    ([-1, 1], [-100, 7], [1, 2], [-2, 3]),  # backwards, clamped
    ([1, 0, 2], [2, 5, 100], None, None),  # default axes and steps, an end past the dim
    ([0], [9], [-1], [4]),
])
def test_slice_steps_and_clamping(starts, ends, axes, steps) -> None:
    inits = {"s": np.array(starts, np.int64), "e": np.array(ends, np.int64)}
    names = ["x", "s", "e"]
    if axes is not None:
        inits["a"], inits["t"] = np.array(axes, np.int64), np.array(steps, np.int64)
        names += ["a", "t"]
    run_on_device(helper.make_node("Slice", names, ["y"]), {"x": rand(3, 5, 7, 4)}, inits)


def test_expand_tile_depth_space() -> None:
    run_on_device(helper.make_node("Expand", ["x", "s"], ["y"]), {"x": rand(3, 1, 5)},
                  {"s": np.array([2, 1, 4, 1], np.int64)})
    run_on_device(helper.make_node("Tile", ["x", "r"], ["y"]), {"x": rand(3, 1, 5)},
                  {"r": np.array([2, 3, 2], np.int64)})
    for mode in ("DCR", "CRD"):
        run_on_device(helper.make_node("DepthToSpace", ["x"], ["y"], blocksize=2, mode=mode),
                      {"x": rand(2, 8, 3, 5)})
    run_on_device(helper.make_node("SpaceToDepth", ["x"], ["y"], blocksize=2), {"x": rand(2, 3, 4, 6)})


@pytest.mark.parametrize("mode", ["constant", "edge", "reflect", "wrap"])
def test_pad_modes(mode) -> None:
    inits = {"p": np.array([0, 2, 1, 1, 1, 3, 0, 2], np.int64), "v": np.array(1.5, np.float32)}
    run_on_device(helper.make_node("Pad", ["x", "p", "v"], ["y"], mode=mode), {"x": rand(3, 5, 7, 4)}, inits)
    inits["p"] = np.array([0, 2, -1, 1, 1, 3, 0, -2], np.int64)  # negative pads crop (reference refuses them)
    run_on_device(helper.make_node("Pad", ["x", "p", "v"], ["y"], mode=mode), {"x": rand(3, 5, 7, 4)}, inits,
                  opset=19, oracle="cpu")


def test_concat_split() -> None:
    run_on_device(helper.make_node("Concat", ["a", "b", "c"], ["y"], axis=1), {"a": rand(3, 2, 5), "c": rand(3, 7, 5)},
                  {"b": rand(3, 0, 5)})
    many = {f"x{k}": rand(2, k % 3 + 1, 3) for k in range(11)}  # two launches: groups of 8 and 3
    run_on_device(helper.make_node("Concat", list(many), ["y"], axis=-2), many)
    run_on_device(helper.make_node("Concat", ["a", "b"], ["y"], axis=0),
                  {"a": np.arange(6, dtype=np.int64).reshape(2, 3), "b": np.ones((1, 3), np.int64)})
    run_on_device(helper.make_node("Split", ["x", "s"], ["a", "b", "c"], axis=2), {"x": rand(3, 4, 10)},
                  {"s": np.array([3, 0, 7], np.int64)}, opset=13)
    run_on_device(helper.make_node("Split", ["x"], ["a", "b", "c"], axis=1, num_outputs=3), {"x": rand(3, 8, 10)},
                  opset=18)


def test_gather_and_gather_nd() -> None:
    idx32 = np.array([[0, -1], [4, 2], [-5, 3]], np.int32)
    run_on_device(helper.make_node("Gather", ["x", "i"], ["y"], axis=1), {"x": rand(3, 5, 7), "i": idx32})
    run_on_device(helper.make_node("Gather", ["x", "i"], ["y"]), {"x": rand(30, 7), "i": np.array([[0, -1, 29, 5]])})
    run_on_device(helper.make_node("Gather", ["x", "i"], ["y"], axis=2), {"x": rand(3, 5, 7), "i": np.array(-2)})
    run_on_device(helper.make_node("Gather", ["x", "i"], ["y"], axis=1), {"x": rand(3, 5, 7)}, {"i": np.array(3)})
    run_on_device(helper.make_node("Gather", ["x", "i"], ["y"]), {"x": np.arange(12, dtype=np.int64)},
                  {"i": np.array([[11, -12], [0, 3]], np.int64)})
    run_on_device(helper.make_node("GatherND", ["x", "i"], ["y"], batch_dims=1),
                  {"x": rand(2, 3, 4, 5), "i": np.array([[[1, -1]], [[2, 0]]])})
    run_on_device(helper.make_node("GatherND", ["x", "i"], ["y"]),
                  {"x": rand(3, 4, 5), "i": np.array([[1, -1, 2], [2, 0, 4]])})


def test_geometry_helpers() -> None:
    g = rows_of((2, 3, 4, 5, 6), [0, 2, 4])
    assert (g.kdims, g.kstr, g.rdims, g.rstr) == ((5, 3), (6, 120), (6, 4, 2), (1, 30, 360))
    assert not g.contig and g.rows == 15 and g.n == 48
    g = rows_of((1, 128, 384), [2])
    assert g.contig and (g.rows, g.n) == (128, 384)
    assert rows_of((), []).rows == rows_of((), []).n == 1
    assert collapse([2, 1, 3, 4], [12, 0, 4, 1]) == ([24], [1])
    assert collapse([3, 5], [1, 3]) == ([3, 5], [1, 3])


# ---- MatMul epilogues folded into the GEMM ------------------------------------------------------------------

@pytest.mark.parametrize("act", ["Relu", "Gelu", "GeluTanh", None])
@pytest.mark.parametrize("m, k, n, const_b", [(9, 33, 37, True), (1, 64, 70, True), (9, 33, 37, False),
                                              (5, 16, 48, False)])
def test_matmul_bias_residual_and_activation_fold_into_one_launch(act, m, k, n, const_b) -> None:
    """MatMul + constant bias + residual + Relu/Gelu: one OpenCL step (weights stored [N, K]: the NT dot
    products; B an input: the NN vector path), as onnx.reference computes the four nodes."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["hb"]),
             helper.make_node("Add", ["r", "hb"], ["s"])]
    if act == "Relu":
        nodes.append(helper.make_node("Relu", ["s"], ["y"]))
    elif act is not None:
        nodes.append(helper.make_node("Gelu", ["s"], ["y"], approximate="tanh" if act == "GeluTanh" else "none"))
    else:
        nodes[-1].output[0] = "y"
    feeds = {"x": rand(2, m, k), "r": rand(2, m, n)}
    inits = {"b": rand(n)}
    (feeds if not const_b else inits)["w"] = rand(k, n)
    model = make_model(nodes, feeds, inits, opset=20)
    with ctxrt.compile(model, backend="opencl") as ctx:
        assert ctx.graph().partitions == [{"backend": "opencl", "steps": 1, "ops": {"MatMul": 1}}]
    run_on_device(nodes, feeds, inits, opset=20, rtol=1e-5, atol=2e-6)


# ---- tunable spaces: defaults valid, every configuration computes the same ---------------------------------

def _t(shape, dt=F32) -> TensorSpec:
    return TensorSpec(tuple(shape), np.dtype(dt))


SPECS = {
    "softmax": (Softmax, NodeSpec("Softmax", "s", {"axis": -1}, [_t((3, 4, 67))], [_t((3, 4, 67))], opset=13)),
    "softmax_strided": (Softmax, NodeSpec("Softmax", "s", {"axis": 1}, [_t((3, 17, 9))], [_t((3, 17, 9))], opset=13)),
    "layernorm": (LayerNorm, NodeSpec("LayerNormalization", "l", {}, [_t((5, 77)), _t((77,)), _t((77,))],
                                      [_t((5, 77)), _t((5, 1)), _t((5, 1))])),
    "reduce": (Reduce, NodeSpec("ReduceMax", "r", {"axes": [0, 2], "keepdims": 0}, [_t((4, 5, 33))], [_t((5,))])),
    "reduce_rows": (Reduce, NodeSpec("ReduceL2", "r", {"axes": [1], "keepdims": 1}, [_t((6, 45))], [_t((6, 1))])),
    "arg": (Arg, NodeSpec("ArgMax", "a", {"axis": 1}, [_t((4, 33, 5))], [_t((4, 5), I64)])),
    "transpose": (StridedCopy, NodeSpec("Transpose", "t", {"perm": [0, 2, 1]}, [_t((3, 37, 19))], [_t((3, 19, 37))])),
    "pad": (Pad, NodeSpec("Pad", "p", {"pads": [1, 0, 2, 3], "mode": "reflect"}, [_t((5, 7))], [_t((8, 10))])),
    "concat": (Concat, NodeSpec("Concat", "c", {"axis": 1}, [_t((3, 5)), _t((3, 2))], [_t((3, 7))])),
    "gather": (Gather, NodeSpec("Gather", "g", {"axis": 0}, [_t((40, 9)), _t((3, 2), I64)], [_t((3, 2, 9))],
                                [None, np.array([[1, -1], [39, 0]], np.int64)])),
}
IN_PLACE = {"softmax", "softmax_strided", "layernorm"}


def _gpu(info):
    return dataclasses.replace(info, type="gpu", max_work_group_size=256, max_work_item_sizes=(256, 256, 64),
                               local_memory=32768)


@pytest.mark.parametrize("name", sorted(SPECS))
def test_defaults_are_valid_here_and_on_a_gpu(name) -> None:
    be = get_backend("opencl")
    cls, spec = SPECS[name]
    kernel = cls(spec, be)
    for info in (be.info, _gpu(be.info)):
        p = cls.space.default(info, kernel.variant())
        assert cls.space.why_invalid(p, kernel.problem(), info) is None, (name, info.type, p)


@pytest.mark.parametrize("name", sorted(SPECS))
def test_every_algorithm_computes_what_the_default_does(name) -> None:
    """What a tuner relies on: candidates build, launch (returning an event) and agree with the default, in place
    too for the kernels the compiler runs in place. One candidate per distinct algorithm and vector width (the
    work-group size only reshapes the launch), plus the largest and smallest work-groups."""
    be = get_backend("opencl")
    cls, spec = SPECS[name]
    default = cls(spec, be)
    cands = list(cls.space.candidates(default.problem(), be.info))
    shapes = {tuple((k, v) for k, v in p.items() if k != "WGS"): p for p in cands}
    picks = [*shapes.values(), cands[0], cands[-1]]
    bench = Bench(be, default)
    try:
        want, _ = bench.run_once(bench.kernel(default.params))
        for params in picks:
            kernel = bench.kernel(params)
            be.programs.prepare(kernel.programs, be.stats)
            got, event = bench.run_once(kernel)
            assert event is not None
            for g, w in zip(got, want, strict=True):
                np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6, err_msg=str(params))
            if name in IN_PLACE:
                be.copy_in(bench.outs[0], read(be, bench.ins[0]))
                kernel.bind([bench.outs[0], *bench.ins[1:]], bench.outs, [])().wait()
                np.testing.assert_allclose(read(be, bench.outs[0]), want[0], rtol=1e-5, atol=1e-6,
                                           err_msg=f"in place {params}")
    finally:
        bench.close()
