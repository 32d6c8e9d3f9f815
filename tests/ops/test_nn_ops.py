"""Conv, pooling, normalization and GEMM ops against onnx.reference (onnxruntime where the reference is
wrong), on random inputs with the edge attributes the real models use."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from harness import check, make_model, rand, run_ctxrt
from onnx import TensorProto, helper


def _w(*shape: int) -> np.ndarray:
    return (rand(*shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32)


CONV_CASES = {
    "3x3 pad1": dict(x=(1, 4, 9, 9), w=(6, 4, 3, 3), pads=[1, 1, 1, 1]),
    "1x1 pointwise": dict(x=(1, 8, 7, 7), w=(5, 8, 1, 1)),
    "1x1 stride2": dict(x=(1, 8, 9, 9), w=(5, 8, 1, 1), strides=[2, 2]),
    "7x7 s2 asym pads": dict(x=(1, 3, 17, 15), w=(4, 3, 7, 7), strides=[2, 2], pads=[3, 2, 1, 3]),
    "dilation 2": dict(x=(1, 3, 12, 12), w=(4, 3, 3, 3), dilations=[2, 2], pads=[2, 2, 2, 2]),
    "groups 2": dict(x=(1, 8, 8, 8), w=(6, 4, 3, 3), group=2, pads=[1, 1, 1, 1]),
    "depthwise s2": dict(x=(1, 6, 9, 9), w=(6, 1, 3, 3), group=6, strides=[2, 2], pads=[1, 1, 1, 1]),
    "grouped 1x1": dict(x=(1, 8, 5, 5), w=(8, 2, 1, 1), group=4),
    "batch 2 rect kernel": dict(x=(2, 3, 8, 10), w=(4, 3, 2, 5), strides=[1, 2]),
    "same upper": dict(x=(1, 3, 7, 8), w=(4, 3, 3, 3), strides=[2, 2], auto_pad="SAME_UPPER"),
    "same lower": dict(x=(1, 3, 7, 8), w=(4, 3, 4, 4), auto_pad="SAME_LOWER"),
    "valid": dict(x=(1, 3, 7, 8), w=(4, 3, 3, 3), auto_pad="VALID"),
}


@pytest.mark.parametrize("case", CONV_CASES)
@pytest.mark.parametrize("bias", [True, False])
def test_conv(case: str, bias: bool) -> None:
    attrs = dict(CONV_CASES[case])
    x, w = rand(*attrs.pop("x")), _w(*attrs.pop("w"))
    inits = {"w": w, **({"b": rand(w.shape[0])} if bias else {})}
    node = helper.make_node("Conv", ["x", "w"] + (["b"] if bias else []), ["y"], **attrs)
    check(node, {"x": x}, inits, rtol=1e-4, atol=1e-5)


def test_conv_with_weights_as_activation_input() -> None:
    node = helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 0, 0, 1])
    check(node, {"x": rand(1, 3, 6, 6), "w": _w(4, 3, 3, 3)}, rtol=1e-4, atol=1e-5)


POOL_CASES = {
    "max 3x3 s2": ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2])),
    "max asym pads": ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[0, 0, 1, 1])),
    "max ceil": ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)),
    "max dilated": ("MaxPool", dict(kernel_shape=[2, 2], dilations=[2, 2], pads=[1, 1, 1, 1])),
    "max same upper": ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_UPPER")),
    "avg exclude pad": ("AveragePool", dict(kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1])),
    "avg include pad": ("AveragePool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1],
                                            count_include_pad=1)),
    "avg 7x7 pads 0011": ("AveragePool", dict(kernel_shape=[7, 7], pads=[0, 0, 1, 1])),
    "avg ceil": ("AveragePool", dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)),
    "avg ceil include pad": ("AveragePool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1],
                                                 ceil_mode=1, count_include_pad=1)),
}


@pytest.mark.parametrize("case", POOL_CASES)
def test_pool(case: str) -> None:
    op, attrs = POOL_CASES[case]
    shape = (1, 3, 6, 6) if "7x7" in case else (2, 3, 10, 11)
    check(helper.make_node(op, ["x"], ["y"], **attrs), {"x": rand(*shape)}, opset=17, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op", ["GlobalAveragePool"])
def test_global_pool(op: str) -> None:
    check(helper.make_node(op, ["x"], ["y"]), {"x": rand(2, 5, 7, 3)})


@pytest.mark.parametrize("size, bias, alpha", [(5, 1.0, 1e-4), (3, 2.0, 5e-4), (7, 1.0, 1e-2)])
def test_lrn(size: int, bias: float, alpha: float) -> None:
    # onnx.reference's LRN differs from onnxruntime's (by 1e-3 here): onnxruntime is the oracle (odd sizes only).
    node = helper.make_node("LRN", ["x"], ["y"], size=size, bias=bias, alpha=alpha, beta=0.75)
    check(node, {"x": rand(1, 7, 5, 5, high=3.0)}, opset=9, rtol=1e-5, atol=1e-6, oracle="onnxruntime")


@pytest.mark.parametrize("ta, tb", [(0, 0), (0, 1), (1, 0), (1, 1)])
@pytest.mark.parametrize("c_shape", [None, (7,), (1, 7), (5, 7)])
def test_gemm(ta: int, tb: int, c_shape) -> None:
    a = rand(6, 5) if ta else rand(5, 6)
    b = rand(7, 6) if tb else rand(6, 7)
    inits = {"b": b, **({"c": rand(*c_shape)} if c_shape else {})}
    node = helper.make_node("Gemm", ["a", "b"] + (["c"] if c_shape else []), ["y"], transA=ta, transB=tb,
                            alpha=0.5, beta=2.0)
    check(node, {"a": a}, inits, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("sa, sb", [((3, 4), (4, 5)), ((2, 3, 4), (4, 5)), ((2, 1, 3, 4), (5, 4, 6)),
                                    ((4,), (4, 3)), ((2, 3, 4), (4,)), ((1, 12, 8, 4), (1, 12, 4, 8))])
def test_matmul(sa, sb) -> None:
    check(helper.make_node("MatMul", ["a", "b"], ["y"]), {"a": rand(*sa), "b": rand(*sb)}, rtol=1e-5, atol=1e-5)


def test_batchnorm_opset9_and_15() -> None:
    params = {"s": rand(4, low=0.5, high=1.5), "b": rand(4), "m": rand(4), "v": rand(4, low=0.5, high=1.5)}
    for opset in (9, 15):
        node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], epsilon=1e-3)
        check(node, {"x": rand(2, 4, 3, 3)}, params, opset=opset, rtol=1e-5, atol=1e-5, oracle="onnxruntime")


@pytest.mark.parametrize("axis", [-1, 1, 2])
@pytest.mark.parametrize("with_bias", [True, False])
def test_layernorm(axis: int, with_bias: bool) -> None:
    shape = (2, 3, 8)
    norm = shape[axis:] if axis >= 0 else shape[axis:]
    inits = {"s": rand(*norm), **({"b": rand(*norm)} if with_bias else {})}
    node = helper.make_node("LayerNormalization", ["x", "s"] + (["b"] if with_bias else []), ["y"], axis=axis,
                            epsilon=1e-5)
    check(node, {"x": rand(*shape)}, inits, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("opset, axis", [(13, -1), (13, 1), (13, 0), (9, 2), (11, -1)])
def test_softmax(opset: int, axis: int) -> None:
    check(helper.make_node("Softmax", ["x"], ["y"], axis=axis), {"x": rand(3, 4, 5, high=5.0)}, opset=opset)


def test_softmax_opset9_coerces_to_2d_like_onnxruntime() -> None:
    # onnx.reference applies opset-13 semantics to old opsets; onnxruntime (and ctxrt) flatten at `axis`.
    x = rand(3, 4, 5)
    model = make_model(helper.make_node("Softmax", ["x"], ["y"], axis=1), {"x": x}, opset=9)
    model.graph.output[0].type.tensor_type.elem_type = TensorProto.FLOAT
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    got = run_ctxrt(model, {"x": x})
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got[0].reshape(3, -1).sum(1), 1.0, rtol=1e-5)


@pytest.mark.parametrize("sa, sb, transpose", [((2, 300, 256), (2, 256, 96), False), ((3, 300, 64), (3, 300, 64), True),
                                               ((1, 2, 200, 300), (300, 128), False)])
def test_large_activation_products_run_on_onednns_gemm(monkeypatch, sa, sb, transpose) -> None:
    """MatMul of two activations whose products are large (attention over a long sequence: Whisper's encoder,
    1500 x 1500 by 64 per head), in a program with oneDNN kernels, which holds BLAS at one thread: each product on
    oneDNN's GEMM on OpenMP's threads (one BLAS thread made it half the encoder's run), keys read through their
    Transpose in place (dnnl_sgemm's "T"), a broadcast operand per product; the reference's outputs."""
    import harness

    import ctxrt
    from ctxrt.backends.cpu.onednn import api

    ran = harness.count_sgemm(monkeypatch)
    nodes = [helper.make_node("Transpose", ["b"], ["bt"], perm=[0, 2, 1])] if transpose else []
    nodes += [helper.make_node("MatMul", ["a", "bt" if transpose else "b"], ["p"]),
              helper.make_node("MatMul", ["p", "w"], ["y"])]  # (a oneDNN kernel: BLAS held at one thread)
    n = sb[1] if transpose else sb[-1]
    feeds = {"a": rand(*sa), "b": rand(*sb)}
    inits = {"w": rand(n, 16)}
    check(nodes, feeds, inits, rtol=1e-4, atol=1e-3)
    if harness.BACKEND != "cpu" or not api.available():
        return
    with ctxrt.compile(make_model(nodes, feeds, inits), num_threads=2) as ctx:
        ctx.graph().run(feeds)
    assert ran


@pytest.mark.parametrize("ta, tb", [(False, False), (False, True), (True, False), (True, True)])
def test_onednn_sgemm_reads_transposed_operands(ta: bool, tb: bool) -> None:
    """oneDNN's GEMM call on views of rows (its "N") or of transposed rows ("T"), inside larger rows (a leading
    dimension past the width): NumPy's product; None for an output it cannot write as rows."""
    from ctxrt.backends.cpu.onednn import api

    if not api.available():
        pytest.skip("oneDNN is not installed")
    a0, b0 = rand(40, 70), rand(70, 50)
    a = np.pad(a0.T.copy(), ((0, 0), (0, 3)))[:, :40].T if ta else np.pad(a0, ((0, 0), (0, 5)))[:, :70]
    b = np.pad(b0.T.copy(), ((0, 0), (0, 2)))[:, :70].T if tb else b0
    y = np.zeros((40, 50), np.float32)
    call = api.sgemm(a, b, y)
    assert call is not None
    call()
    np.testing.assert_allclose(y, a0 @ b0, rtol=1e-4, atol=1e-4)
    assert api.sgemm(a, b, np.zeros((50, 40), np.float32).T) is None
