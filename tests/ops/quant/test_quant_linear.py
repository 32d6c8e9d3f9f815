"""QuantizeLinear, DequantizeLinear and DynamicQuantizeLinear against onnx.reference (opsets 19, 21) and onnxruntime
(opsets 10, 13, com.microsoft's 16-bit forms): per tensor, per axis on every axis, blocked with blocks that do not
divide the axis, every integer type (4-bit ones packed in the binary), float8, ties and saturation."""

from __future__ import annotations

import harness
import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto, helper
from quant_helpers import INT4, MS, UINT4, assert_ints, ints, ort_outputs, qmodel, run

import ctxrt
from ctxrt.errors import UnsupportedOpError

TYPES = [np.uint8, np.int8, np.uint16, np.int16, UINT4, INT4]


def _params(shape: tuple[int, ...], axis: int | None, block: int, zt: object) -> tuple[np.ndarray, np.ndarray]:
    if axis is None:
        ps: tuple[int, ...] = ()
    elif block:
        ps = tuple(-(-d // block) if k == axis % len(shape) else d for k, d in enumerate(shape))
    else:
        ps = (shape[axis],)
    lo, hi = {np.uint8: (0, 255), np.int8: (-128, 127)}.get(zt, (None, None))
    return harness.rand(*ps, low=0.01, high=0.08), ints(zt, *ps, lo=lo, hi=hi)


def _check_q_dq(x: np.ndarray, axis: int | None, block: int, zt: object, opset: int = 21) -> None:
    s, z = _params(x.shape, axis, block, zt)
    attrs = ({} if axis is None else {"axis": axis}) | ({"block_size": block} if block else {})
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], **attrs),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], **attrs)]
    model = qmodel(nodes, {"x": x}, {"s": s, "z": z}, opset, outputs=["q", "y"])
    (q_want, y_want), (q_got, y_got) = harness.reference(model, {"x": x}), run(model, {"x": x})
    assert_ints(q_got, q_want, name="q")
    np.testing.assert_array_equal(y_got, y_want)


@pytest.mark.parametrize("zt", TYPES, ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("axis", [None, 0, 1, 2, -1, -3])
def test_per_tensor_and_per_axis(zt: object, axis: int | None) -> None:
    x = harness.rand(2, 3, 5, low=-4.0, high=4.0)
    _check_q_dq(x, axis, 0, zt, opset=21 if zt not in (np.uint8, np.int8) else 19)


@pytest.mark.parametrize("zt", TYPES, ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("axis,block", [(0, 2), (1, 3), (2, 4), (-1, 2), (1, 7), (2, 5)])
def test_blocked(zt: object, axis: int, block: int) -> None:
    """Shape (3, 7, 5): blocks of 2 along 3, of 3 and 4 along 7 and 5 leave a shorter last block."""
    _check_q_dq(harness.rand(3, 7, 5, low=-3.0, high=3.0), axis, block, zt)


@pytest.mark.parametrize("opset", [10, 13])
@pytest.mark.parametrize("zt", [np.uint8, np.int8])
def test_old_opsets_against_onnxruntime(opset: int, zt: object) -> None:
    x = harness.rand(2, 4, 3, low=-5.0, high=5.0)
    axis = None if opset == 10 else 1
    s, z = _params(x.shape, axis, 0, zt)
    attrs = {} if axis is None else {"axis": axis}
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], **attrs),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], **attrs)]
    model = qmodel(nodes, {"x": x}, {"s": s, "z": z}, opset, outputs=["q", "y"])
    want, got = ort_outputs(model, {"x": x}, [zt, np.float32]), run(model, {"x": x})
    assert_ints(got[0], want[0], name="q")
    np.testing.assert_array_equal(got[1], want[1])


@pytest.mark.parametrize("zt", [np.uint8, np.int8, np.uint16, np.int16])
def test_ties_round_half_to_even_and_saturation(zt: object) -> None:
    x = np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 3.5, 1e6, -1e6, 1e30, -1e30, 0.0], np.float32)
    z = np.array(-3 if np.dtype(zt).kind == "i" else 3, zt)
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"])]
    model = qmodel(nodes, {"x": x}, {"s": np.float32(1.0), "z": z})
    got = run(model, {"x": x})[0]
    # onnx.reference casts x / scale to int32 before it clips (1e30 wraps): compared where that fits
    with np.errstate(invalid="ignore"):
        assert_ints(got[:9], harness.reference(model, {"x": x})[0][:9])
    assert_ints(got, ort_outputs(model, {"x": x}, [zt])[0])
    lo, hi = np.iinfo(zt).min, np.iinfo(zt).max
    zp = int(z)
    expect = [-2, -2, 0, 0, 2, 2, 4, hi - zp, lo - zp, hi - zp, lo - zp, 0]
    np.testing.assert_array_equal(got.astype(np.int64), np.clip(np.array(expect) + zp, lo, hi))


def test_int32_input_saturates() -> None:
    x = np.array([2**31 - 1, -(2**31), 1000, -7, 3], np.int32)
    model = qmodel(helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]), {"x": x},
                   {"s": np.float32(2.0), "z": np.int8(-5)})
    assert_ints(run(model, {"x": x})[0], harness.reference(model, {"x": x})[0])


@pytest.mark.parametrize("dt", [np.float16, ml_dtypes.bfloat16, np.float32], ids=["float16", "bfloat16", "float32"])
def test_float16_bfloat16_and_no_zero_point(dt: object) -> None:
    x = harness.rand(3, 4, low=-300.0, high=300.0).astype(dt)
    nodes = [helper.make_node("QuantizeLinear", ["x", "s"], ["q"], axis=0),
             helper.make_node("DequantizeLinear", ["q", "s"], ["y"], axis=0)]
    model = qmodel(nodes, {"x": x}, {"s": np.array([0.5, 1.25, 2.0], dt)}, outputs=["q", "y"])
    want, got = harness.reference(model, {"x": x}), run(model, {"x": x})
    assert got[0].dtype == np.uint8
    assert_ints(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])


@pytest.mark.parametrize("out", [TensorProto.INT8, TensorProto.UINT16, TensorProto.INT4])
def test_output_dtype_attribute(out: int) -> None:
    x = harness.rand(4, 6, low=-3.0, high=3.0)
    model = qmodel(helper.make_node("QuantizeLinear", ["x", "s"], ["q"], output_dtype=out), {"x": x},
                   {"s": np.float32(0.1)}, outputs=["q"])
    assert_ints(run(model, {"x": x})[0], harness.reference(model, {"x": x})[0])


FLOAT8 = [TensorProto.FLOAT8E4M3FN, TensorProto.FLOAT8E4M3FNUZ, TensorProto.FLOAT8E5M2, TensorProto.FLOAT8E5M2FNUZ]


@pytest.mark.parametrize("saturate", [0, 1])
@pytest.mark.parametrize("f8", FLOAT8)
def test_float8(f8: int, saturate: int) -> None:
    x = np.array([0.0, 0.3, -1.7, 100.0, -1e5, 1e9, 2.5, -0.001], np.float32)
    nodes = [helper.make_node("QuantizeLinear", ["x", "s"], ["q"], output_dtype=f8, saturate=saturate),
             helper.make_node("DequantizeLinear", ["q", "s"], ["y"])]
    model = qmodel(nodes, {"x": x}, {"s": np.float32(0.5)}, outputs=["q", "y"])
    want, got = harness.reference(model, {"x": x}), run(model, {"x": x})
    assert got[0].dtype == want[0].dtype
    np.testing.assert_array_equal(got[0].astype(np.float32), want[0].astype(np.float32))
    np.testing.assert_array_equal(got[1], want[1])


@pytest.mark.parametrize("wt", [INT4, UINT4, np.int8, np.uint16])
@pytest.mark.parametrize("shape,axis,block", [((3, 5), 1, 0), ((7, 3), 0, 2), ((1, 9), 1, 4), ((5,), 0, 0)])
def test_constant_weights_stay_integers(tmp_path, wt: object, shape: tuple[int, ...], axis: int, block: int) -> None:
    """DequantizeLinear of an initializer runs as the model runs (never folded to float); 4-bit weights of odd
    element counts are stored packed and survive a context binary."""
    from ctxrt.backends import get_backend
    from ctxrt.compiler import compile_graphs, save_context

    w = ints(wt, *shape)
    s, z = _params(shape, axis, block, wt)
    attrs = {"axis": axis} | ({"block_size": block} if block else {})
    x = harness.rand(2, shape[0])
    nodes = [helper.make_node("DequantizeLinear", ["w", "s", "z"], ["wf"], **attrs),
             helper.make_node("MatMul", ["x", "wf"], ["y"])]
    model = qmodel(nodes, {"x": x}, {"w": w, "s": s, "z": z})
    want = harness.reference(model, {"x": x})[0]
    np.testing.assert_allclose(run(model, {"x": x})[0], want, rtol=1e-6, atol=1e-6)
    backend = get_backend("cpu")
    graphs, weights = compile_graphs([(model, None, "main")], backend)
    assert graphs[0].steps[0].op == "DequantizeLinear"
    path = save_context(tmp_path / "m.ctx", graphs, weights, backend, ["m"])
    entry = ctxrt.read_metadata(path)["weights"]["w"]
    n = int(np.prod(shape))
    assert entry[1:] == [(n + 1) // 2 if np.dtype(wt).itemsize == 1 and np.dtype(wt).kind == "V" else w.nbytes,
                         {INT4: "int4", UINT4: "uint4"}.get(np.dtype(wt), np.dtype(wt).str), list(shape)]
    with ctxrt.context_from_binary(path) as ctx:
        np.testing.assert_allclose(ctx.graph().run({"x": x})["y"], want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("zt", [np.uint16, np.int16, np.uint8, np.int8])
def test_com_microsoft_forms(zt: object) -> None:
    """onnxruntime's quantizer writes com.microsoft QuantizeLinear / DequantizeLinear for 16-bit types."""
    x = harness.rand(2, 3, 4, low=-2.0, high=2.0)
    s, z = _params(x.shape, 1, 0, zt)
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], axis=1, domain=MS),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], axis=1, domain=MS)]
    model = qmodel(nodes, {"x": x}, {"s": s, "z": z}, opset=17, outputs=["q", "y"])
    want, got = ort_outputs(model, {"x": x}, [zt, np.float32]), run(model, {"x": x})
    assert_ints(got[0], want[0], name="q")
    np.testing.assert_array_equal(got[1], want[1])


@pytest.mark.parametrize("case", ["random", "zeros", "positive", "negative", "ties"])
def test_dynamic_quantize_linear(case: str) -> None:
    x = {"random": harness.rand(3, 7, low=-2.0, high=5.0), "zeros": np.zeros((2, 3), np.float32),
         "positive": harness.rand(4, 4, low=0.5, high=3.0), "negative": harness.rand(5, low=-9.0, high=-1.0),
         "ties": np.array([-1.0, 0.0, 1.0, 2.5, 255 / 2, 254.0, 255.0], np.float32)}[case]
    model = qmodel(helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "s", "z"]), {"x": x}, opset=13)
    want = ort_outputs(model, {"x": x}, [np.uint8, np.float32, np.uint8])
    got = run(model, {"x": x})
    assert_ints(got[0], want[0], name="y")
    np.testing.assert_array_equal(got[1], want[1])
    assert_ints(got[2], want[2], name="zero point")


def test_only_implemented_com_microsoft_ops_and_no_other_domain() -> None:
    x = harness.rand(2, 3)
    for node, name in [(helper.make_node("FusedGemm", ["x", "x"], ["y"], domain=MS), "com.microsoft.FusedGemm"),
                       (helper.make_node("Relu", ["x"], ["y"], domain="ai.example"), "ai.example.Relu")]:
        model = qmodel(node, {"x": x})
        if node.domain != MS:
            model.opset_import.append(helper.make_opsetid("ai.example", 1))
        with pytest.raises(UnsupportedOpError, match=f"unsupported operators: {name}"):
            ctxrt.compile(model, backend=harness.BACKEND)


def test_dequantize_ml_dtypes_int4_input() -> None:
    """A 4-bit graph input (one value a byte, as ml_dtypes holds it) dequantized."""
    x = ints(INT4, 3, 5)
    model = qmodel(helper.make_node("DequantizeLinear", ["x", "s", "z"], ["y"], axis=0), {"x": x},
                   {"s": harness.rand(3, low=0.1, high=1.0), "z": np.array([-8, 0, 7], ml_dtypes.int4)})
    np.testing.assert_array_equal(run(model, {"x": x})[0], harness.reference(model, {"x": x})[0])


@pytest.mark.parametrize("opset", [23, 25])
def test_later_opsets_precision_and_output_dtype(opset: int) -> None:
    """float16 x and float32 scales (separate types from 23), division in `precision`, DequantizeLinear's
    `output_dtype`."""
    x = harness.rand(3, 8, low=-4.0, high=4.0).astype(np.float16)
    attrs = {"axis": 1, "block_size": 3}
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], precision=TensorProto.FLOAT, **attrs),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], output_dtype=TensorProto.FLOAT16, **attrs)]
    s, z = harness.rand(3, 3, low=0.01, high=0.1), ints(np.int16, 3, 3, lo=-9, hi=9)
    model = qmodel(nodes, {"x": x}, {"s": s, "z": z}, opset, outputs=["q", "y"])
    want, got = harness.reference(model, {"x": x}), run(model, {"x": x})
    assert_ints(got[0], want[0])
    assert got[1].dtype == np.float16
    np.testing.assert_array_equal(got[1], want[1])


@pytest.mark.parametrize("dt", [np.uint8, np.int8], ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("zero_point", [True, False])
def test_quantize_native_equals_numpy(dt, zero_point, monkeypatch) -> None:
    """QuantizeLinear per tensor from float32 to 8 bits on the native kernel (csrc/qelem.c): the same bytes as the
    NumPy kernel, half-way values (x / scale = k + 0.5) and saturation included."""
    from onnx import numpy_helper

    from ctxrt.backends.cpu import native
    from ctxrt.backends.cpu.quant import linear

    if native.library() is None:
        pytest.skip("the native extension is not built here")
    rng = np.random.default_rng(11)
    x = np.concatenate([np.arange(-300, 300, 0.5, dtype=np.float32) * 0.25,
                        rng.standard_normal(4000).astype(np.float32) * 40])
    inits = [numpy_helper.from_array(np.array(0.25, np.float32), "s")]
    names = ["x", "s"]
    if zero_point:
        inits.append(numpy_helper.from_array(np.array(3 if dt == np.int8 else 131, dt), "z"))
        names.append("z")
    out_type = helper.np_dtype_to_tensor_dtype(np.dtype(dt))
    graph = helper.make_graph([helper.make_node("QuantizeLinear", names, ["y"])], "q",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
                              [helper.make_tensor_value_info("y", out_type, list(x.shape))], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    calls = []
    real = linear._native_quantize
    monkeypatch.setattr(linear, "_native_quantize", lambda *a: calls.append(1) or real(*a))
    got = ctxrt.compile(model).graph().run({"x": x})["y"]
    assert calls
    monkeypatch.setattr(linear, "_native_quantize", lambda *a: None)
    np.testing.assert_array_equal(got, ctxrt.compile(model).graph().run({"x": x})["y"])


@pytest.mark.parametrize("dt", [np.uint8, np.int8], ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("zero_point", [True, False])
def test_dequantize_native_equals_numpy(dt, zero_point, monkeypatch) -> None:
    """DequantizeLinear per tensor from 8 bits to float32 on the native kernel (csrc/qelem.c): the same values as
    the NumPy kernel, every input value."""
    from onnx import numpy_helper

    from ctxrt.backends.cpu import native
    from ctxrt.backends.cpu.quant import linear

    if native.library() is None:
        pytest.skip("the native extension is not built here")
    x = np.arange(256).astype(np.uint8).view(np.dtype(dt)).reshape(16, 16)
    inits = [numpy_helper.from_array(np.array(0.0371, np.float32), "s")]
    names = ["x", "s"]
    if zero_point:
        inits.append(numpy_helper.from_array(np.array(-3 if dt == np.int8 else 131, dt), "z"))
        names.append("z")
    graph = helper.make_graph([helper.make_node("DequantizeLinear", names, ["y"])], "dq",
                              [helper.make_tensor_value_info("x", helper.np_dtype_to_tensor_dtype(np.dtype(dt)),
                                                             [16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [16, 16])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    used = []
    real = linear._native_dequantize
    monkeypatch.setattr(linear, "_native_dequantize", lambda *a: used.append(real(*a)) or used[-1])
    got = ctxrt.compile(model).graph().run({"x": x})["y"]
    assert used and all(u is not None for u in used)
    monkeypatch.setattr(linear, "_native_dequantize", lambda *a: None)
    np.testing.assert_array_equal(got, ctxrt.compile(model).graph().run({"x": x})["y"])


def test_dynamic_quantize_native_equals_numpy(monkeypatch) -> None:
    """DynamicQuantizeLinear's quantization pass on the native kernel (csrc/qelem.c): the same bytes, scale and
    zero point as without the extension, for data of both signs, all positive, and half-way values."""
    from ctxrt.backends.cpu import native

    if native.library() is None:
        pytest.skip("the native extension is not built here")
    rng = np.random.default_rng(17)
    graph = helper.make_graph([helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "s", "z"])], "dq",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 130])],
                              [helper.make_tensor_value_info("y", TensorProto.UINT8, [64, 130]),
                               helper.make_tensor_value_info("s", TensorProto.FLOAT, []),
                               helper.make_tensor_value_info("z", TensorProto.UINT8, [])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    cases = [rng.standard_normal((64, 130)).astype(np.float32) * 3, rng.uniform(0.5, 9, (64, 130)).astype(np.float32),
             np.linspace(-2.55, 2.55, 64 * 130, dtype=np.float32).reshape(64, 130)]
    odd = rng.standard_normal((64, 130)).astype(np.float32)
    odd[3, 7], odd[60, 1] = np.nan, -np.inf  # the range's reduction (native too) as NumPy's: NaN propagates
    cases.append(odd)
    with_native = [ctxrt.compile(model).graph().run({"x": x}) for x in cases]
    monkeypatch.setitem(native._STATE, "lib", None)
    for x, got in zip(cases, with_native, strict=True):
        want = ctxrt.compile(model).graph().run({"x": x})
        for k in ("y", "s", "z"):
            np.testing.assert_array_equal(got[k], want[k])
