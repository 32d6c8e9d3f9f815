"""OpenCL integer matrix products (backends/opencl/quant/gemm.py, kernels/qgemm.cl): QLinearMatMul, QGemm,
MatMulInteger, MatMulIntegerToFloat.

Each case asserts that the node ran on the device (a node that silently fell back to the CPU would pass without
testing anything), then compares with the CPU backend's NumPy kernels bit for bit (the same int32 sums, the same
float32 requantization steps) and with onnxruntime within one quantization step (its u8 x s8 kernels without
VNNI sum pairs in saturating int16: activations stay in [0, 127] where it is compared). Sizes are odd (a token,
7 and 33 rows; K of 1, 17, 300; 5, 64 and 129 columns) so every tile has a ragged edge, in both layouts of a
constant B (packed [N, K] for a few rows, [K, N] from 32) and for run-time B (attention's products), batched with
broadcasting. Then: what declines runs on the CPU, every layout and vector width computes what the default does,
a context binary keeps the packed 8-bit weights, and a quantized encoder (QDQ and dynamic) runs its integer
products on the device.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from harness import rand
from onnx import helper
from quant_helpers import MS, assert_ints, ints, ort_outputs, qmodel

import ctxrt
from ctxrt.backends import get_backend
from ctxrt.backends.cpu.backend import CpuBackend
from ctxrt.backends.kernel import NodeSpec, TensorSpec
from ctxrt.backends.opencl.quant.gemm import QGemmKernel
from ctxrt.compiler import compile_graphs, save_context
from ctxrt.tuning.profiler import Bench

pytestmark = pytest.mark.usefixtures("opencl")
U8, S8 = np.uint8, np.int8
QLM = ["a", "as", "az", "b", "bs", "bz", "ys", "yz"]


def _cpu(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The CPU backend's exact integer kernels (not oneDNN's int8 matmul, which adds a bias after scaling and may
    round a value a step apart)."""
    with ctxrt.compile(model, backend=CpuBackend(onednn=False)) as ctx:
        got = ctx.graph().run(feeds)
        return [np.array(got[o.name]) for o in model.graph.output]


def on_device(model: onnx.ModelProto, feeds: dict[str, np.ndarray], placement: tuple[str, ...] = ("opencl",)
              ) -> list[np.ndarray]:
    """Run on OpenCL, assert where it ran and that the CPU backend gives the same bytes; the outputs."""
    want = _cpu(model, feeds)
    with ctxrt.compile(model, backend="opencl") as ctx:
        g = ctx.graph()
        assert tuple(p["backend"] for p in g.partitions) == placement, g.partitions
        got = g.run(feeds)
        got = [np.array(got[o.name]) for o in model.graph.output]
    for y, w in zip(got, want, strict=True):
        assert (y.shape, y.dtype) == (w.shape, w.dtype)
        np.testing.assert_array_equal(y, w)
    return got


def _zp(dt: object, *shape: int) -> np.ndarray:
    signed = np.dtype(dt).kind == "i"
    return ints(dt, *shape, lo=-9 if signed else 100, hi=9 if signed else 150)


def _params(ta: object, tb: object, ty: object, n: int, per_col: bool, ys: float = 0.4) -> dict[str, np.ndarray]:
    c = n if per_col else 1
    return {"as": np.float32(0.02), "az": _zp(ta), "bs": rand(c, low=0.002, high=0.01), "bz": _zp(tb, c),
            "ys": np.float32(ys), "yz": _zp(ty)}


def qlinear_matmul(a: np.ndarray, b: np.ndarray, params: dict[str, np.ndarray], const_b: bool = True,
                   ort_within: int | None = 1) -> np.ndarray:
    feeds = {"a": a} if const_b else {"a": a, "b": b}
    inits = {**params, **({"b": b} if const_b else {})}
    model = qmodel(helper.make_node("QLinearMatMul", QLM, ["y"]), feeds, inits, 21)
    (got,) = on_device(model, feeds)
    if ort_within is not None:
        assert_ints(got, ort_outputs(model, feeds, [params["yz"].dtype])[0], within=ort_within, name="onnxruntime")
    return got


# ---- QLinearMatMul ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("types", [(U8, S8, U8), (U8, U8, U8), (S8, S8, S8)], ids=["u8s8u8", "u8u8u8", "s8s8s8"])
@pytest.mark.parametrize("per_col", [False, True], ids=["tensor", "column"])
@pytest.mark.parametrize("m, k, n", [(1, 300, 129), (7, 17, 64), (33, 300, 5), (33, 17, 129), (40, 1, 64)])
def test_qlinear_matmul_constant_b(types, per_col, m, k, n) -> None:
    """Weights: packed [N, K] below 32 rows (dot products along K), [K, N] from 32 (vectors along N), per tensor and
    per column, zero points on both sides."""
    ta, tb, ty = types
    a, b = ints(ta, m, k, lo=0 if ta == U8 else None, hi=127), ints(tb, k, n)
    qlinear_matmul(a, b, _params(ta, tb, ty, n, per_col))


@pytest.mark.parametrize("sa, sb", [((2, 3, 33, 17), (2, 1, 17, 64)), ((12, 7, 64), (12, 64, 33)),
                                    ((3, 1, 5, 9), (1, 2, 9, 20)), ((4, 33, 1), (4, 1, 7)), ((2, 1, 16), (16,))])
def test_qlinear_matmul_run_time_b_batched(sa, sb) -> None:
    """Both operands activations (a QDQ BERT's Q K^T and P V), batches broadcast both ways, a 1-D B."""
    a, b = ints(U8, *sa, hi=127), ints(U8, *sb)
    qlinear_matmul(a, b, _params(U8, U8, U8, 1, False, ys=2.0), const_b=False)


def test_qlinear_matmul_batched_a_constant_b() -> None:
    """A [2, 3, 11, 40] against 2-D weights: the batch folds into M (66 rows: the [K, N] layout)."""
    a, b = ints(U8, 2, 3, 11, 40, hi=127), ints(S8, 40, 24)
    qlinear_matmul(a, b, _params(U8, S8, U8, 24, True))


@pytest.mark.parametrize("m", [3, 40])
def test_qlinear_matmul_saturates(m) -> None:
    """A y_scale far too small: most outputs clip to the type's ends, both ways."""
    a, b = ints(S8, m, 50), ints(S8, 50, 21)
    params = _params(S8, S8, S8, 21, True, ys=1e-3)
    got = qlinear_matmul(a, b, params)
    assert (got == -128).mean() > 0.2 and (got == 127).mean() > 0.2


def test_qlinear_matmul_large_k_sums_in_chunks() -> None:
    """K = 3000 with zero points at the types' ends: the float32 partial sums are cut into chunks that stay exact
    (below 2^24) and added as integers."""
    a, b = np.full((9, 3000), 255, U8), np.full((3000, 40), -128, S8)
    a[:, ::7] = 0
    params = {"as": np.float32(1e-3), "az": np.uint8(0), "bs": np.float32(1e-3), "bz": np.int8(127),
              "ys": np.float32(0.5), "yz": np.uint8(0)}
    qlinear_matmul(a, b, params, ort_within=None)
    qlinear_matmul(a, b, params, const_b=False, ort_within=None)
    qlinear_matmul(np.tile(a, (4, 1)), b, params, ort_within=None)


# ---- QGemm ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("trans", [(0, 0), (0, 1), (1, 0), (1, 1)], ids=["nn", "nt", "tn", "tt"])
@pytest.mark.parametrize("c_shape", [None, (64,), (1, 64), (33, 64), (33, 1), ()], ids=str)
@pytest.mark.parametrize("quantized", [True, False], ids=["u8", "float"])
def test_qgemm(trans, c_shape, quantized) -> None:
    ta, tb = trans
    m, k, n = 33, 17, 64
    a = ints(U8, *((k, m) if ta else (m, k)), hi=127)
    b = ints(S8, *((n, k) if tb else (k, n)))
    inits = {"as": np.float32(0.02), "az": np.uint8(120), "b": b, "bs": rand(n, low=0.002, high=0.01),
             "bz": np.zeros(n, S8)}
    names = ["a", "as", "az", "b", "bs", "bz", "c" if c_shape is not None else ""]
    if c_shape is not None:
        inits["c"] = ints(np.int32, *c_shape, lo=-3000, hi=3000) if c_shape else np.int32(77)
    if quantized:
        inits.update(ys=np.float32(0.05), yz=np.uint8(100))
        names += ["ys", "yz"]
    model = qmodel(helper.make_node("QGemm", names, ["y"], domain=MS, transA=ta, transB=tb, alpha=0.75),
                   {"a": a}, inits)
    (got,) = on_device(model, {"a": a})
    (want,) = ort_outputs(model, {"a": a}, [U8 if quantized else np.float32])
    if quantized:
        assert_ints(got, want, within=1)
    else:
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("m", [1, 7, 40])
def test_qgemm_run_time_b_per_tensor(m) -> None:
    """B an input (transB), s8 activations, one scale: the dot-product path on a B that is not packed."""
    a, b = ints(S8, m, 77), ints(S8, 5, 77)
    inits = {"as": np.float32(0.01), "az": np.int8(3), "bs": np.float32(0.02), "bz": np.int8(-2),
             "c": ints(np.int32, 5, lo=-500, hi=500), "ys": np.float32(0.1), "yz": np.int8(-4)}
    model = qmodel(helper.make_node("QGemm", ["a", "as", "az", "b", "bs", "bz", "c", "ys", "yz"], ["y"], domain=MS,
                                    transB=1), {"a": a, "b": b}, inits)
    on_device(model, {"a": a, "b": b})


# ---- MatMulInteger, MatMulIntegerToFloat ------------------------------------------------------------------------

@pytest.mark.parametrize("types", [(U8, S8), (U8, U8), (S8, S8)], ids=["u8s8", "u8u8", "s8s8"])
@pytest.mark.parametrize("sa, sb, const", [((1, 300), (300, 129), True), ((2, 3, 7, 17), (17, 5), True),
                                           ((33, 300), (300, 64), True), ((2, 1, 4, 9), (3, 9, 20), False),
                                           ((17,), (17, 4), False)])
def test_matmul_integer(types, sa, sb, const) -> None:
    ta, tb = types
    a, b = ints(ta, *sa, hi=127), ints(tb, *sb)
    per_col = const and len(sb) == 2
    inits = {"az": _zp(ta), "bz": _zp(tb, sb[-1]) if per_col else _zp(tb)}
    feeds = {"a": a} if const else {"a": a, "b": b}
    if const:
        inits["b"] = b
    model = qmodel(helper.make_node("MatMulInteger", ["a", "b", "az", "bz"], ["y"]), feeds, inits, opset=10)
    (got,) = on_device(model, feeds)
    np.testing.assert_array_equal(got, ort_outputs(model, feeds, [np.int32])[0])


def test_matmul_integer_without_zero_points() -> None:
    a, b = ints(S8, 7, 40), ints(S8, 40, 19)
    model = qmodel(helper.make_node("MatMulInteger", ["a", "b"], ["y"]), {"a": a}, {"b": b}, opset=10)
    (got,) = on_device(model, {"a": a})
    np.testing.assert_array_equal(got, a.astype(np.int32) @ b.astype(np.int32))


@pytest.mark.parametrize("per_col", [False, True], ids=["tensor", "column"])
@pytest.mark.parametrize("bias", [False, True], ids=["", "bias"])
@pytest.mark.parametrize("m", [4, 40])
def test_matmul_integer_to_float(per_col, bias, m) -> None:
    """Float output: acc * (a_scale * b_scale) then + bias, two roundings (no fused multiply-add)."""
    a, b = ints(U8, 3, m, 30, hi=127), ints(S8, 30, 21)
    c = 21 if per_col else 1
    inits = {"b": b, "as": np.float32(0.03), "bs": rand(c, low=0.01, high=0.02), "az": np.uint8(60),
             "bz": ints(S8, c, lo=-3, hi=3), "bias": rand(21)}
    node = helper.make_node("MatMulIntegerToFloat", ["a", "b", "as", "bs", "az", "bz", "bias" if bias else ""], ["y"],
                            domain=MS)
    model = qmodel(node, {"a": a}, inits)
    (got,) = on_device(model, {"a": a})
    np.testing.assert_allclose(got, ort_outputs(model, {"a": a}, [np.float32])[0], rtol=1e-6, atol=1e-6)


# ---- what declines, every variant, context binaries -------------------------------------------------------------

def test_what_declines_runs_on_the_cpu() -> None:
    """16-bit operands and per-row A parameters: CPU partitions, the same results."""
    a, b = ints(np.uint16, 5, 12, hi=3000), ints(np.int16, 12, 6, lo=-300, hi=300)
    params = {"as": np.float32(0.02), "az": np.uint16(1000), "bs": np.float32(0.01), "bz": np.int16(0),
              "ys": np.float32(50.0), "yz": np.uint16(30000)}
    model = qmodel(helper.make_node("QLinearMatMul", QLM, ["y"]), {"a": a}, {**params, "b": b}, 21)
    on_device(model, {"a": a}, placement=("cpu",))
    a8 = ints(U8, 5, 12)
    model = qmodel(helper.make_node("MatMulInteger", ["a", "b", "az"], ["y"]), {"a": a8},
                   {"b": ints(S8, 12, 6), "az": _zp(U8, 5)}, opset=10)
    on_device(model, {"a": a8}, placement=("cpu",))


def _spec(m: int, k: int, n: int, const_b: bool, ta: object = U8, tb: object = S8) -> NodeSpec:
    b = ints(tb, k, n)
    shapes = [(m, k), (), (), (k, n), (n,), (n,), (), ()]
    dts = [ta, np.float32, ta, tb, np.float32, tb, np.float32, U8]
    consts = [None, np.float32(0.02), _zp(ta), b if const_b else None, rand(n, low=0.002, high=0.01), _zp(tb, n),
              np.float32(0.3), _zp(U8)]
    return NodeSpec("QLinearMatMul", "q", {}, [TensorSpec(s, np.dtype(d)) for s, d in zip(shapes, dts, strict=True)],
                    [TensorSpec((m, n), np.dtype(U8))], consts, 21)


@pytest.mark.parametrize("m, k, n, const_b", [(7, 37, 45, True), (40, 37, 45, True), (40, 37, 45, False)],
                         ids=["nt", "nn-packed", "nn"])
def test_every_variant_computes_what_the_default_does(m, k, n, const_b) -> None:
    """What a tuner relies on: other tiles, vector widths and the scalar path agree with the default (a packed B
    is the same layout for all of them)."""
    be = get_backend("opencl")
    spec = _spec(m, k, n, const_b)
    default = QGemmKernel(spec, be)
    inputs = list(spec.consts)
    inputs[0] = ints(U8, m, k)
    if const_b and default.constants:
        inputs[3] = next(iter(default.constants.values()))
    elif not const_b:
        inputs[3] = ints(S8, k, n)
    picks = [{"TM": 16, "TN": 16, "WM": 2, "WN": 2, "KV": 1, "VN": 1}, {"TM": 8, "TN": 8, "WM": 1, "WN": 1,
                                                                         "KV": 1, "VN": 1}]
    if default.b_t:
        picks += [{"TM": 4, "TN": 32, "WM": 2, "WN": 2, "KV": kv, "VN": 1} for kv in (4, 8, 16)]
    else:
        picks += [{"TM": 32, "TN": 32, "WM": 8, "WN": 2, "KV": 1, "VN": 16},
                  {"TM": 16, "TN": 16, "WM": 4, "WN": 1, "KV": 1, "VN": 8},
                  {"TM": 8, "TN": 16, "WM": 2, "WN": 2, "KV": 1, "VN": 4}]
    bench = Bench(be, default, inputs)
    try:
        want, _ = bench.run_once(bench.kernel(default.params))  # on the bench's (profiling) queue
        for params in picks:
            assert QGemmKernel.space.why_invalid(params, default.problem(), be.info) is None, params
            kernel = bench.kernel(params)
            be.programs.prepare(kernel.programs, be.stats)
            got, event = bench.run_once(kernel)
            assert event is not None
            np.testing.assert_array_equal(got[0], want[0], err_msg=str(params))
    finally:
        bench.close()


@pytest.mark.parametrize("m", [3, 40])
def test_context_binary_keeps_packed_8bit_weights(tmp_path: Path, m: int) -> None:
    """A .ctx made for OpenCL stores the packed int8 B (the same bytes' count) and its layout; loaded, it builds
    nothing from source and gives the same bytes."""
    a, b = ints(U8, m, 300, hi=127), ints(S8, 300, 129)
    model = qmodel(helper.make_node("QLinearMatMul", QLM, ["y"]), {"a": a}, {**_params(U8, S8, U8, 129, True),
                                                                             "b": b}, 21)
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    (want,) = on_device(model, {"a": a})
    backend = get_backend("opencl")
    graphs, weights = compile_graphs([(str(path), None, "main")], backend)
    binary = save_context(tmp_path / "m.ctx", graphs, weights, backend, [str(path)])
    meta = ctxrt.read_metadata(binary)
    assert meta["weights_size"] < 2 * b.nbytes, meta["weights_size"]
    with ctxrt.context_from_binary(binary) as ctx:
        g = ctx.graph()
        assert [p["backend"] for p in g.partitions] == ["opencl"]
        assert ctx.stats["programs_built_from_source"] == 0
        assert ctx.stats["weights_uploaded_bytes"] < 2 * b.nbytes
        np.testing.assert_array_equal(g.run({"a": a})["y"], want)


# ---- a quantized encoder ------------------------------------------------------------------------------------------

def _encoder(tmp_path: Path, kind: str) -> tuple[str, dict[str, np.ndarray]]:
    from onnxruntime import quantization as q
    from small_nets import encoder

    model, shape = encoder()
    src, out = tmp_path / "encoder.onnx", tmp_path / f"encoder-{kind}.onnx"
    onnx.save(model, str(src))

    def feeds(seed: int) -> dict[str, np.ndarray]:
        return {"x": np.random.default_rng(seed).standard_normal(shape).astype(np.float32)}

    if kind == "qdq":
        class Reader(q.CalibrationDataReader):
            def __init__(self) -> None:
                self.data = iter([feeds(3 + i) for i in range(8)])

            def get_next(self) -> dict[str, np.ndarray] | None:
                return next(self.data, None)

        q.quantize_static(str(src), str(out), Reader(), quant_format=q.QuantFormat.QDQ, per_channel=True,
                          reduce_range=True, activation_type=q.QuantType.QUInt8, weight_type=q.QuantType.QInt8)
    else:
        q.quantize_dynamic(str(src), str(out), weight_type=q.QuantType.QInt8)
    return str(out), feeds(11)


def _device_ops(g: ctxrt.Graph) -> dict[str, dict[str, int]]:
    ops: dict[str, dict[str, int]] = {"cpu": {}, "opencl": {}}
    for p in g.partitions:
        for op, n in p["ops"].items():
            ops[p["backend"]][op] = ops[p["backend"]].get(op, 0) + n
    return ops


@pytest.mark.parametrize("kind", ["qdq", "dynamic"])
def test_quantized_encoder_products_on_the_device(tmp_path: Path, kind: str) -> None:
    pytest.importorskip("onnxruntime.quantization")
    path, feeds = _encoder(tmp_path, kind)
    with ctxrt.compile(path, backend="cpu") as ctx:
        want = ctx.graph().run(feeds)
    with ctxrt.compile(path, backend="opencl") as ctx:
        g = ctx.graph()
        ops = _device_ops(g)
        got = g.run(feeds)
    products = {"qdq": ("QLinearMatMul", "QGemm"), "dynamic": ("MatMulInteger", "MatMulIntegerToFloat")}[kind]
    assert not set(products) & set(ops["cpu"]), ops
    assert sum(ops["opencl"].get(op, 0) for op in products) >= 6, ops  # Q, K, V, scores, output, MLP
    for name, w in want.items():
        w, y = np.asarray(w), np.asarray(got[name])
        if kind == "qdq":
            model = onnx.load(path)
            made = {o: node for node in model.graph.node for o in node.output}
            inits = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
            node = made.get(name)
            step = float(np.max(inits[node.input[1]])) if node is not None and node.op_type == "DequantizeLinear" \
                else 1e-5
            assert np.abs(y - w).max() <= step * 1.001, (np.abs(y - w).max(), step)
        else:
            np.testing.assert_allclose(y, w, rtol=1e-4, atol=1e-4 * np.abs(w).max())


@pytest.mark.parametrize("x_kind", ["random", "positive", "zeros"])
@pytest.mark.parametrize("shape", [(2, 6, 24), (40, 24), (1, 24)], ids=str)
@pytest.mark.parametrize("bt", [S8, U8])
def test_dynamic_quantize_matmul(x_kind, shape, bt) -> None:
    """A quantized on the device (its range, then its values: two launches before the product), the same bytes as
    the NumPy kernel's."""
    a = {"random": rand(*shape, low=-2.0, high=3.0), "positive": rand(*shape, low=0.1, high=1.0),
         "zeros": np.zeros(shape, np.float32)}[x_kind]
    b = ints(bt, 24, 9, lo=-64 if bt == S8 else 0, hi=63 if bt == S8 else 255)
    inits = {"b": b, "bs": rand(9, low=0.01, high=0.02), "bz": ints(bt, 9, lo=0, hi=3), "bias": rand(9)}
    model = qmodel(helper.make_node("DynamicQuantizeMatMul", ["a", "b", "bs", "bz", "bias"], ["y"], domain=MS),
                   {"a": a}, inits)
    (got,) = on_device(model, {"a": a})
    np.testing.assert_allclose(got, ort_outputs(model, {"a": a}, [np.float32])[0], rtol=1e-6, atol=1e-6)
