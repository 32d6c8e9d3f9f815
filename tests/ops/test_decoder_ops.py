"""Decoder pieces vs onnx.reference (onnxruntime where the reference is wrong or missing, said per test): TopK,
Trilu, CumSum, ScatterND, ScatterElements, OneHot, Einsum, ArgMax/ArgMin, Gather*, Mod, Neg, Not, comparisons,
Min/Max/Mean, Range; launches allocate nothing."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from harness import ITERATOR_BUFFER, allocated, bind, check, make_model, rand, run_ctxrt
from onnx import helper

import ctxrt
from ctxrt.errors import CtxrtError, UnsupportedOpError

RNG = np.random.default_rng(3)


def i64(*v) -> np.ndarray:
    return np.array(v, np.int64)


def ort_check(node: onnx.NodeProto, feeds: dict, inits: dict | None = None, opset: int = 18,
              types: list[type] | None = None) -> list[np.ndarray]:
    """ctxrt vs onnxruntime with the output types given (for nodes onnx.reference cannot run)."""
    import onnxruntime as ort

    model = make_model(node, feeds, inits, opset)
    for out, t in zip(model.graph.output, types or [np.float32] * len(model.graph.output), strict=True):
        out.type.tensor_type.elem_type = helper.np_dtype_to_tensor_dtype(np.dtype(t))
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    got = run_ctxrt(model, feeds)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    return got


# --- TopK ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("axis", [-1, 0, 1])
@pytest.mark.parametrize("largest", [1, 0])
@pytest.mark.parametrize("k", [1, 3, 5])
def test_topk_ties_go_to_the_lower_index(axis: int, largest: int, k: int) -> None:
    x = RNG.integers(0, 4, (5, 5, 6)).astype(np.float32)  # many ties; onnxruntime's order is the oracle
    x[0, 0, :2] = [-0.0, 0.0]
    check(helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=axis, largest=largest), {"x": x}, {"k": i64(k)},
          opset=11, oracle="onnxruntime")


@pytest.mark.parametrize("dtype", [np.float16, np.float64, np.int8, np.int32, np.int64, np.uint8, np.uint64])
@pytest.mark.parametrize("largest", [1, 0])
def test_topk_dtypes(dtype, largest: int) -> None:
    info = np.iinfo(dtype) if np.dtype(dtype).kind in "iu" else None
    lo, hi = (max(info.min, -50), min(info.max, 50)) if info else (-50, 50)
    x = RNG.integers(lo, hi, (4, 33)).astype(dtype) if dtype != np.uint64 else \
        RNG.permutation(2**64 - 1 - np.arange(33, dtype=np.uint64) * 2**58).reshape(1, 33)
    if info:  # the extremes of the type keep their order
        x[0, :2] = [info.min, info.max]
    # onnxruntime has no uint64 TopK: onnx.reference is the oracle there (distinct values: no ties to order)
    check(helper.make_node("TopK", ["x", "k"], ["v", "i"], largest=largest), {"x": x}, {"k": i64(7)}, opset=11,
          oracle="reference" if dtype == np.uint64 else "onnxruntime")


@pytest.mark.parametrize("axis", [-1, 0])
@pytest.mark.parametrize("largest", [1, 0])
@pytest.mark.parametrize("dtype, levels", [(np.float32, 5), (np.float32, None), (np.float64, 7), (np.int32, 4),
                                           (np.int64, None), (np.float16, 9), (np.uint8, 3)])
def test_topk_partial_selection_of_wide_rows(axis: int, largest: int, dtype, levels: int | None) -> None:
    """Wide rows (selection, or 32-bit packed keys for narrow types): ties across the k-th value keep the lower
    indices, in rows and along a leading axis."""
    shape = (2400, 3) if axis == 0 else (3, 2400)
    x = RNG.integers(0, levels, shape) if levels else RNG.standard_normal(shape) * 1000
    check(helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=axis, largest=largest), {"x": x.astype(dtype)},
          {"k": i64(17)}, opset=11, oracle="onnxruntime")


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("largest", [1, 0])
def test_topk_nan_of_either_sign_is_the_largest(dtype, largest: int) -> None:
    """As in onnxruntime: NaN (also with the sign bit set) above +inf, so first when largest, never when smallest."""
    x = RNG.standard_normal((3, 300)).astype(dtype)
    x[0, 7], x[1, 9], x[1, 200], x[2, :2] = np.nan, -np.nan, np.inf, [-0.0, 0.0]
    model = make_model(helper.make_node("TopK", ["x", "k"], ["v", "i"], largest=largest), {"x": x}, {"k": i64(6)},
                       opset=11)
    (_, got), (_, want) = run_ctxrt(model, {"x": x}), _ort(model, {"x": x})
    np.testing.assert_array_equal(got, want)


def _ort(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    import onnxruntime as ort

    model.graph.output[0].type.tensor_type.elem_type = model.graph.input[0].type.tensor_type.elem_type
    model.graph.output[1].type.tensor_type.elem_type = onnx.TensorProto.INT64
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def test_topk_whole_axis_and_unsorted() -> None:
    x = rand(3, 9, high=5.0)
    check(helper.make_node("TopK", ["x", "k"], ["v", "i"]), {"x": x}, {"k": i64(9)}, opset=11)
    # sorted=0 leaves the order to the runtime (onnxruntime's differs): the same elements, ctxrt's sorted
    v, i = run_ctxrt(make_model(helper.make_node("TopK", ["x", "k"], ["v", "i"], sorted=0), {"x": x},
                                {"k": i64(4)}, opset=11), {"x": x})
    want = np.sort(x, axis=1)[:, ::-1][:, :4]
    np.testing.assert_array_equal(v, want)
    np.testing.assert_array_equal(np.take_along_axis(x, i, 1), v)


def test_topk_k_must_be_known_at_compile_time() -> None:
    model = make_model(helper.make_node("TopK", ["x", "k"], ["v", "i"], name="top"),
                       {"x": rand(2, 5), "k": i64(2)}, opset=11)
    with pytest.raises(CtxrtError, match="top"):
        ctxrt.compile(model)


# --- Trilu, CumSum ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("upper", [1, 0])
@pytest.mark.parametrize("k", [None, -7, -2, 0, 1, 3, 9])
@pytest.mark.parametrize("k_const", [True, False])
def test_trilu(upper: int, k, k_const: bool) -> None:
    x = rand(2, 4, 6)
    node = helper.make_node("Trilu", ["x"] + ([] if k is None else ["k"]), ["y"], upper=upper)
    if k is None:
        check(node, {"x": x}, opset=14)
    elif k_const:
        check(node, {"x": x}, {"k": np.array(k, np.int64)}, opset=14)
    else:
        check(node, {"x": x, "k": np.array(k, np.int64)}, opset=14)


def test_trilu_in_place_and_integers() -> None:
    # the causal-mask pattern: Trilu of a tensor that dies there runs in place
    nodes = [helper.make_node("Add", ["x", "x"], ["t"]), helper.make_node("Trilu", ["t", "k"], ["y"], upper=0)]
    check(nodes, {"x": rand(5, 5)}, {"k": np.array(-1, np.int64)}, opset=14)
    check(helper.make_node("Trilu", ["x"], ["y"]), {"x": RNG.integers(-5, 5, (3, 4)).astype(np.int32)}, opset=14)
    check(helper.make_node("Trilu", ["x"], ["y"]), {"x": RNG.random((4, 4)) < 0.5}, opset=14)


@pytest.mark.parametrize("axis", [0, 1, -1, -3])
@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
def test_cumsum(axis: int, exclusive: int, reverse: int) -> None:
    node = helper.make_node("CumSum", ["x", "a"], ["y"], exclusive=exclusive, reverse=reverse)
    check(node, {"x": rand(3, 4, 5)}, {"a": np.array(axis, np.int64)}, opset=14, rtol=1e-5, atol=1e-6)
    ints = RNG.integers(-9, 9, (3, 4, 5))
    for dtype, adt in ((np.int32, np.int32), (np.int64, np.int64), (np.float64, np.int32)):
        check(node, {"x": ints.astype(dtype)}, {"a": np.array(axis, adt)}, opset=14)


# --- ScatterND, ScatterElements, OneHot -------------------------------------------------------------------

REDUCTIONS = ["none", "add", "mul", "max", "min"]


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("const", [False, True])
def test_scatter_nd(reduction: str, const: bool) -> None:
    # onnxruntime is the oracle: the reference rejects negative indices
    data = rand(4, 5, 3)
    dup = reduction != "none"  # duplicates only where they are defined (a reduction)
    idx = i64([1, 2], [-1, 0], [1, 2], [2, -5]) if dup else i64([1, 2], [-1, 0], [2, 4])
    feeds, inits = {"d": data, "u": rand(idx.shape[0], 3)}, {}
    (feeds if not const else inits)["i"] = idx
    check(helper.make_node("ScatterND", ["d", "i", "u"], ["y"], reduction=reduction), feeds, inits, opset=18,
          oracle="onnxruntime")
    slices = i64([0], [-1], [0]) if dup else i64([0], [-1])  # whole (5, 3) slices
    check(helper.make_node("ScatterND", ["d", "i", "u"], ["y"], reduction=reduction),
          {"d": data, "i": slices, "u": rand(slices.shape[0], 5, 3)}, opset=18, oracle="onnxruntime")


def test_scatter_nd_opset_13_and_16_and_in_place() -> None:
    idx = i64([[0, 1], [2, 2]], [[1, 0], [0, 0]])
    check(helper.make_node("ScatterND", ["d", "i", "u"], ["y"]), {"d": rand(3, 3), "i": idx, "u": rand(2, 2)},
          opset=13)
    check(helper.make_node("ScatterND", ["d", "i", "u"], ["y"], reduction="mul"),
          {"d": rand(3, 3), "i": idx, "u": rand(2, 2)}, opset=16)
    nodes = [helper.make_node("Relu", ["d"], ["t"]),
             helper.make_node("ScatterND", ["t", "i", "u"], ["y"], reduction="add")]
    check(nodes, {"d": rand(3, 3), "u": rand(2, 2)}, {"i": idx}, opset=16)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_scatter_elements(reduction: str, axis: int) -> None:
    data = rand(4, 5, 3)
    shape = (3, 2, 2)
    a = axis % 3
    if reduction == "none":  # distinct targets along the axis, some counted from the end
        idx = np.broadcast_to(np.arange(shape[a]).reshape([-1 if d == a else 1 for d in range(3)]) - 1, shape)
    else:
        idx = RNG.integers(-data.shape[a], data.shape[a], shape)
    idx = idx.astype(np.int64)
    node = helper.make_node("ScatterElements", ["d", "i", "u"], ["y"], axis=axis, reduction=reduction)
    check(node, {"d": data, "i": idx, "u": rand(*shape)}, opset=18, oracle="onnxruntime")
    check(node, {"d": data, "u": rand(*shape)}, {"i": idx}, opset=18, oracle="onnxruntime")


@pytest.mark.parametrize("axis", [-1, 0, 1, 2, -3])
def test_one_hot(axis: int) -> None:
    idx = i64([0, 3, -1], [-4, 5, 2])  # -1 -> 3, -4 -> 0, 5 is out of range: a row of off values
    node = helper.make_node("OneHot", ["i", "d", "v"], ["y"], axis=axis)
    check(node, {"i": idx}, {"d": np.array(4, np.int64), "v": np.array([0.5, 2.0], np.float32)}, opset=11)
    # onnx.reference fails on int64 values: onnxruntime is the oracle
    ort_check(node, {"i": idx, "v": np.array([3, -7], np.int64)}, {"d": np.array([4], np.int64)}, opset=11,
              types=[np.int64])


def test_one_hot_float_indices_and_depth() -> None:
    # onnx.reference cannot run float indices: onnxruntime is the oracle
    node = helper.make_node("OneHot", ["i", "d", "v"], ["y"])
    ort_check(node, {"i": np.array([[1.7, -1.2, 9.0]], np.float32)},
              {"d": np.array(5.0, np.float32), "v": np.array([0, 1], np.float32)}, opset=11)


# --- Einsum ---------------------------------------------------------------------------------------------

EINSUM = [
    ("bhqd,bhkd->bhqk", [(2, 3, 4, 5), (2, 3, 6, 5)]), ("bhqk,bhkd->bhqd", [(2, 3, 4, 6), (2, 3, 6, 5)]),
    ("bqhd,bkhd->bhqk", [(2, 4, 3, 5), (2, 6, 3, 5)]), ("bhqk,bkhd->bqhd", [(2, 3, 4, 6), (2, 6, 3, 5)]),
    ("bij,bjk->bik", [(3, 4, 5), (3, 5, 2)]), ("i,j->ij", [(4,), (5,)]), ("ij->ji", [(3, 4)]),
    ("ij->", [(3, 4)]), ("bij->bj", [(2, 3, 4)]), ("ii->", [(4, 4)]), ("ii->i", [(4, 4)]), ("ij,jk", [(3, 4), (4, 5)]),
    ("ij,jk,kl->il", [(3, 4), (4, 5), (5, 2)]), ("...ij,...jk->...ik", [(2, 1, 3, 4), (1, 5, 4, 2)]),
    ("bnd,dh->bnh", [(2, 3, 4), (4, 5)]), ("i,i->", [(5,), (5,)]), ("ij,ij->ij", [(3, 4), (3, 4)]),
    ("ijk,ikj->i", [(2, 3, 4), (2, 4, 3)]), ("ij,kj->ik", [(3, 4), (5, 4)]), ("ji,jk->ik", [(4, 3), (4, 5)]),
    ("...i,...i->...", [(2, 3, 4), (2, 3, 4)]), ("bij,bjk->", [(2, 3, 4), (2, 4, 5)]),
    ("ab,cd->abcd", [(2, 3), (4, 5)]), ("iij,jk->ik", [(3, 3, 4), (4, 2)]), ("bi,bi->b", [(3, 4), (3, 4)]),
    ("ijk->kji", [(2, 3, 4)]), ("i...->...", [(2, 3, 4)]), ("bcij,bcj->bci", [(2, 3, 4, 5), (2, 3, 5)]),
]


@pytest.mark.parametrize("equation, shapes", EINSUM)
def test_einsum(equation: str, shapes) -> None:
    feeds = {f"x{k}": rand(*s) for k, s in enumerate(shapes)}
    check(helper.make_node("Einsum", list(feeds), ["y"], equation=equation), feeds, opset=12, rtol=1e-5, atol=1e-5)


def test_einsum_constant_operand_and_integers() -> None:
    check(helper.make_node("Einsum", ["x", "w"], ["y"], equation="bnd,hd->bnh"), {"x": rand(2, 3, 4)},
          {"w": rand(5, 4)}, opset=12, rtol=1e-5, atol=1e-5)
    ints = {"a": np.arange(12, dtype=np.int64).reshape(3, 4), "b": np.arange(20, dtype=np.int64).reshape(4, 5)}
    check(helper.make_node("Einsum", ["a", "b"], ["y"], equation="ij,jk->ik"), ints, opset=12)


def test_einsum_attention_patterns_need_no_scratch() -> None:
    """The exporters' batched matmuls run as views: no transposed copy, the result written in place."""
    from ctxrt.backends.cpu.registry import KERNELS
    from ctxrt.backends.kernel import NodeSpec, TensorSpec

    for eq, (a, b), y in [("bhqd,bhkd->bhqk", ((2, 4, 8, 16), (2, 4, 8, 16)), (2, 4, 8, 8)),
                          ("bqhd,bkhd->bhqk", ((2, 8, 4, 16), (2, 8, 4, 16)), (2, 4, 8, 8)),
                          ("bhqk,bhkd->bqhd", ((2, 4, 8, 8), (2, 4, 8, 16)), (2, 8, 4, 16))]:
        spec = NodeSpec("Einsum", "e", {"equation": eq}, [TensorSpec(a, np.dtype(np.float32)),
                        TensorSpec(b, np.dtype(np.float32))], [TensorSpec(y, np.dtype(np.float32))], [None, None])
        assert KERNELS["Einsum"](spec).scratch == (), eq


# --- existing ops the decoders use ----------------------------------------------------------------------

@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.float64])
def test_arg_other_types(op: str, dtype) -> None:
    x = RNG.integers(-2, 2, (3, 4, 5)).astype(dtype)
    for axis, keep, last in ((0, 1, 1), (-1, 0, 0), (1, 0, 1)):
        check(helper.make_node(op, ["x"], ["y"], axis=axis, keepdims=keep, select_last_index=last), {"x": x},
              opset=13)


@pytest.mark.parametrize("fmod, dtype", [(0, np.int32), (0, np.int64), (1, np.int32), (1, np.int64),
                                         (1, np.float32), (1, np.float64)])
def test_mod_signs(fmod: int, dtype) -> None:
    a = RNG.integers(-20, 20, (3, 4)).astype(dtype)
    b = (RNG.integers(1, 7, (4,)) * np.where(RNG.random(4) < 0.5, -1, 1)).astype(dtype)
    check(helper.make_node("Mod", ["a", "b"], ["y"], fmod=fmod), {"a": a, "b": b}, opset=13)


def test_neg_not_and_comparisons() -> None:
    check(helper.make_node("Neg", ["x"], ["y"]), {"x": RNG.integers(-5, 5, (3, 4)).astype(np.int64)})
    check(helper.make_node("Not", ["x"], ["y"]), {"x": RNG.random((3, 4)) < 0.5})
    for op in ("Less", "Greater", "LessOrEqual", "GreaterOrEqual"):
        for dtype in (np.float32, np.int64):
            a, b = RNG.integers(0, 3, (2, 3, 4)).astype(dtype), RNG.integers(0, 3, (3, 1)).astype(dtype)
            check(helper.make_node(op, ["a", "b"], ["y"]), {"a": a, "b": b}, opset=16)


@pytest.mark.parametrize("op", ["Min", "Max", "Mean", "Sum"])
def test_variadic_broadcasting(op: str) -> None:
    # onnx.reference's Mean accumulates in place and fails to broadcast: onnxruntime is the oracle
    run = ort_check if op == "Mean" else check
    node = helper.make_node(op, ["a", "b", "c"], ["y"])
    run(node, {"a": rand(3, 1), "b": rand(4), "c": rand(2, 1, 1)}, opset=13)
    run(node, {"a": rand(1, 4), "b": rand(1, 4), "c": rand(3, 1)}, opset=13)
    check(helper.make_node(op, ["a"], ["y"]), {"a": rand(3, 4)}, opset=13)


def test_gather_elements_and_nd_negative_indices() -> None:
    d = rand(3, 4, 5)
    check(helper.make_node("GatherElements", ["d", "i"], ["y"], axis=-1),
          {"d": d, "i": RNG.integers(-5, 5, (3, 4, 5)).astype(np.int64)}, opset=13)
    for bd, ishape in ((0, (2, 3)), (1, (3, 2, 2)), (2, (3, 4, 1))):
        dims = d.shape[bd:bd + ishape[-1]]
        idx = np.stack([RNG.integers(-n, n, ishape[:-1]) for n in dims], -1).astype(np.int64)
        check(helper.make_node("GatherND", ["d", "i"], ["y"], batch_dims=bd), {"d": d, "i": idx}, opset=13)


def test_range_folds_when_constant_and_is_refused_otherwise() -> None:
    nodes = [helper.make_node("Range", ["s", "l", "d"], ["r"]), helper.make_node("Add", ["r", "x"], ["y"])]
    consts = {"s": np.array(2, np.int64), "l": np.array(9, np.int64), "d": np.array(2, np.int64)}
    check(nodes, {"x": np.ones(4, np.int64)}, consts, opset=13)
    model = make_model(nodes, {"s": consts["s"], "x": np.ones(4, np.int64)}, {k: consts[k] for k in "ld"}, opset=13)
    with pytest.raises(CtxrtError, match="Range"):
        ctxrt.compile(model)


# --- launches allocate nothing -----------------------------------------------------------------------

def _launches():
    x = rand(16, 300)
    yield bind("TopK", [x], [np.empty((16, 20), np.float32), np.empty((16, 20), np.int64)], {"k": 20})
    yield bind("TopK", [x.astype(np.float64)], [np.empty((16, 5), np.float64), np.empty((16, 5), np.int64)],
               {"k": 5, "largest": 0})
    yield bind("Trilu", [x, np.array(3, np.int64)], [np.empty_like(x)], {"upper": 0})
    yield bind("CumSum", [x], [np.empty_like(x)], {"axis": 1, "exclusive": 1, "reverse": 1})
    yield bind("ScatterND", [x, i64([[3], [-1], [3]]), rand(3, 300)], [np.empty_like(x)], {"reduction": "add"})
    yield bind("ScatterElements", [x, RNG.integers(-16, 16, (4, 300)), rand(4, 300)], [np.empty_like(x)],
               {"reduction": "max"})
    yield bind("OneHot", [RNG.integers(-5, 10, (8, 30)), None, np.array([0, 1], np.float32)],
               [np.empty((8, 30, 10), np.float32)], {"depth": 10})
    yield bind("Einsum", [rand(2, 4, 30, 16), rand(2, 4, 30, 16)], [np.empty((2, 4, 30, 30), np.float32)],
               {"equation": "bhqd,bhkd->bhqk"})


def test_launches_allocate_nothing() -> None:
    for launch in _launches():
        assert allocated(launch) < ITERATOR_BUFFER


def test_unsupported_values_name_op_node_and_attribute() -> None:
    node = helper.make_node("ScatterElements", ["d", "i", "u"], ["y"], name="sc", reduction="sum")
    with pytest.raises(UnsupportedOpError, match=r"ScatterElements node 'sc'.*'reduction' value 'sum'"):
        ctxrt.compile(make_model(node, {"d": rand(3, 3), "i": i64([0]), "u": rand(1, 1)}, opset=18))
