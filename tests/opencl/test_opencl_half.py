"""float16 (and bfloat16) models on OpenCL: computed in float32 (ir/passes/half.py, run by the backend's `lower`),
the large weights kept half in the weights buffer and read by the Conv, depthwise and GEMM kernels with vload_half,
the casts at the graph's edges and the half tensors the pass leaves (a Gather from a half table) on the device.

Every case asserts where its steps ran (a node falling back to the CPU would still compute the right numbers), then
compares with ctxrt's CPU backend (the same float32 arithmetic from the same half weights: close), with
onnxruntime on the float16 file (float16 precision) and, for casts, bit for bit with NumPy's conversions."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from harness import make_model, rand
from onnx import helper
from onnxruntime.transformers.float16 import convert_float_to_float16

import ctxrt
from ctxrt.backends import get_backend, select_kernel
from ctxrt.backends.kernel import NodeSpec, TensorSpec
from ctxrt.cli import main as cli
from ctxrt.tuning.profiler import Settings, profile

pytestmark = pytest.mark.usefixtures("opencl")
F16, BF16 = np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)


def half(model: onnx.ModelProto, keep_io_types: bool = True) -> onnx.ModelProto:
    return convert_float_to_float16(model, keep_io_types=keep_io_types)


def run(model: onnx.ModelProto, feeds: dict[str, np.ndarray], backend: str, shapes: dict | None = None
        ) -> tuple[dict[str, np.ndarray], list[dict], dict]:
    """Outputs, partitions and stats of one run."""
    with ctxrt.compile(model, backend=backend, shapes=shapes) as ctx:
        g = ctx.graph()
        out = {k: np.array(v) for k, v in g.run(feeds).items()}
        return out, g.partitions, dict(ctx.stats)


def on_device(parts: list[dict]) -> None:
    assert [p["backend"] for p in parts] == ["opencl"], parts


def close_to_cpu(got: np.ndarray, want: np.ndarray, rtol: float = 1e-5) -> None:
    """Both backends compute in float32 from the same half weights; float16 outputs may differ by one rounding."""
    assert got.dtype == want.dtype and got.shape == want.shape
    scale = float(np.max(np.abs(want.astype(np.float32)))) + 1e-6
    tol = max(rtol, 2 ** -10 if got.dtype == F16 else 0) * scale
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=0, atol=tol)


def close_to_ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray], got: dict[str, np.ndarray]) -> None:
    """onnxruntime computes parts of the float16 model in float16: agreement within its precision."""
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for out, w in zip(sess.get_outputs(), sess.run(None, feeds), strict=True):
        scale = float(np.max(np.abs(w.astype(np.float32))))
        np.testing.assert_allclose(got[out.name].astype(np.float32), w.astype(np.float32), rtol=1e-2,
                                   atol=1e-2 * scale, err_msg=out.name)


# ---- whole models ------------------------------------------------------------------------------------------

def _cnn():
    from small_nets import cnn

    model, shape = cnn(c=32)  # w2 (32x32x3x3) stays half: a 3x3 conv reading half weights
    return model, {"x": np.random.default_rng(0).standard_normal(shape).astype(np.float32)}, None


def _encoder():
    from small_nets import encoder

    model, shape = encoder()  # the MLP's weights (64x128) stay half; 64x64 ones are stored widened
    return model, {"x": np.random.default_rng(0).standard_normal(shape).astype(np.float32)}, None


def _mobilenet():
    from exported import exported_feeds, exported_model

    feeds = exported_feeds("mobilenet_v3")
    model = onnx.load(str(exported_model("mobilenet_v3")))
    return model, feeds, {k: v.shape for k, v in feeds.items()}


MODELS = {"cnn": _cnn, "encoder": _encoder, "mobilenet_v3": _mobilenet}


@pytest.mark.parametrize("keep_io_types", [True, False], ids=["keep_io", "half_io"])
@pytest.mark.parametrize("name", list(MODELS))
def test_float16_models_run_on_the_device(name, keep_io_types) -> None:
    model, feeds, shapes = MODELS[name]()
    model16 = half(model, keep_io_types)
    if not keep_io_types:
        feeds = {k: v.astype(F16) for k, v in feeds.items()}
    got, parts, stats = run(model16, feeds, "opencl", shapes)
    on_device(parts)
    assert stats["weights_bytes_float16"] > 0  # half weights read on the device
    if not keep_io_types:  # the edges' casts
        casts = sum(p["ops"].get("Cast", 0) for p in parts if p["backend"] == "opencl")
        assert casts == len(model.graph.input) + len(model.graph.output)
    want, _, _ = run(model16, feeds, "cpu", shapes)
    for k, w in want.items():
        close_to_cpu(got[k], w)
    close_to_ort(model16, feeds, got)


@pytest.mark.parametrize("name", ["cnn", "encoder"])
def test_weights_stay_half_on_the_device(name) -> None:
    """The weights uploaded for the float16 model are about half the float32 model's (the pass stores small
    constants, biases and norms, widened: larger layers here, so that they weigh little)."""
    from small_nets import cnn, encoder

    model, shape = cnn(c=96, hw=8) if name == "cnn" else encoder(d=128, h=512)
    feeds = {"x": np.random.default_rng(0).standard_normal(shape).astype(np.float32)}
    got32, parts32, stats32 = run(model, feeds, "opencl")
    got16, parts16, stats16 = run(half(model), feeds, "opencl")
    on_device(parts32)
    on_device(parts16)
    assert stats16["weights_uploaded_bytes"] <= 0.55 * stats32["weights_uploaded_bytes"], (stats16, stats32)
    scale = float(np.max(np.abs(got32["y"])))
    np.testing.assert_allclose(got16["y"], got32["y"], rtol=0, atol=2e-2 * scale)  # half weights' rounding


def test_stored_float16_context_reads_its_half_weights(tmp_path) -> None:
    """A .ctx of a float16 model keeps the prepacked conv weights half; loaded, it computes the same outputs."""
    model, feeds, _ = _cnn()
    path, out = tmp_path / "cnn16.onnx", tmp_path / "cnn16.ctx"
    onnx.save(half(model, keep_io_types=False), path)
    feeds = {k: v.astype(F16) for k, v in feeds.items()}
    want, parts, _ = run(onnx.load(path), feeds, "opencl")
    on_device(parts)
    assert cli(["compile", str(path), "-o", str(out), "--backend", "opencl"]) == 0
    with ctxrt.context_from_binary(out, "opencl") as ctx:
        g = ctx.graph()
        on_device(g.partitions)
        convs = [s for s in g.compiled.steps if s.op == "Conv" and s.attrs.get("widen")]
        assert convs and all(s.attrs.get("kernel") == "opencl_conv" for s in convs)
        assert ctx.stats["weights_bytes_float16"] > 0
        got = g.run(feeds)
        for k, w in want.items():
            np.testing.assert_array_equal(got[k], w)


# ---- single ops with half weights --------------------------------------------------------------------------

def check_half_op(nodes, feeds, inits, steps: dict[str, int]) -> None:
    """The node's float16 model (weights half, float32 IO) on OpenCL: every step there, weights uploaded half,
    equal to the CPU backend's and to the float32 model's with the weights rounded to half."""
    model16 = half(make_model(nodes, feeds, inits))
    got, parts, stats = run(model16, feeds, "opencl")
    on_device(parts)
    assert parts[0]["ops"] == steps, parts
    assert stats["weights_bytes_float16"] >= min(w.size for w in inits.values() if w.size > 4096) * 2
    want, _, _ = run(model16, feeds, "cpu")
    rounded = {k: v.astype(F16).astype(np.float32) for k, v in inits.items()}
    exact, _, _ = run(make_model(nodes, feeds, rounded), feeds, "cpu")
    for k in want:
        close_to_cpu(got[k], want[k])
        close_to_cpu(got[k], exact[k])


CONVS = {  # (input, weights, attributes): weights of more than 4096 elements stay half
    "3x3": ((1, 32, 11, 13), (48, 32, 3, 3), {"pads": [1, 1, 1, 1]}),
    "3x3_stride2": ((1, 24, 12, 9), (40, 24, 3, 3), {"pads": [1, 0, 1, 1], "strides": [2, 2]}),
    "1x1": ((2, 64, 7, 5), (96, 64, 1, 1), {}),
    "1x1_narrow": ((1, 1024, 3, 3), (5, 1024, 1, 1), {}),
    "grouped": ((1, 64, 6, 7), (64, 16, 3, 3), {"group": 4, "pads": [1, 1, 1, 1]}),
    "depthwise": ((1, 520, 9, 7), (520, 1, 3, 3), {"group": 520, "pads": [1, 1, 1, 1]}),
    "depthwise_5x5": ((1, 200, 10, 11), (200, 1, 5, 5), {"group": 200, "pads": [2, 2, 2, 2], "strides": [2, 2]}),
}


@pytest.mark.parametrize("relu", [False, True], ids=["plain", "relu"])
@pytest.mark.parametrize("name", list(CONVS))
def test_conv_reads_half_weights(name, relu) -> None:
    x, w, attrs = CONVS[name]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c" if relu else "y"], **attrs)]
    if relu:
        nodes.append(helper.make_node("Relu", ["c"], ["y"]))
    inits = {"w": rand(*w, low=-0.2, high=0.2), "b": rand(w[0])}
    check_half_op(nodes, {"x": rand(*x)}, inits, {"Conv": 1})


GEMMS = {  # (A, B, transB, with C): B of more than 4096 elements stays half
    "matmul_nn": ((2, 7, 96), (96, 72), 0, False),  # VN vectors of B [K, N]
    "matmul_narrow": ((3, 512), (512, 9), 0, False),  # N < 16: scalar loads
    "gemm_nt": ((5, 64), (80, 64), 1, True),  # KV vectors along K of B [N, K]
    "gemv": ((1, 96), (70, 96), 1, True),
    "gemm_nn_bias": ((6, 100), (100, 50), 0, True),
}


@pytest.mark.parametrize("name", list(GEMMS))
def test_gemm_reads_half_weights(name) -> None:
    a, b, trans_b, with_c = GEMMS[name]
    n = b[0] if trans_b else b[1]
    inits = {"w": rand(*b, low=-0.2, high=0.2)}
    if with_c:
        inits["c"] = rand(n)
        nodes = [helper.make_node("Gemm", ["x", "w", "c"], ["y"], transB=trans_b)]
    else:
        nodes = [helper.make_node("MatMul", ["x", "w"], ["y"])]
    check_half_op(nodes, {"x": rand(*a)}, inits, {nodes[0].op_type: 1})


def test_matmul_epilogue_and_elementwise_half_constant() -> None:
    """A MatMul with half weights takes its bias and Relu in its epilogue; an Add of a large half constant reads it
    as half (element-wise: every input may be half)."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["a"]),
             helper.make_node("Relu", ["a"], ["r"]), helper.make_node("Add", ["r", "pos"], ["y"])]
    inits = {"w": rand(64, 96, low=-0.2, high=0.2), "b": rand(96), "pos": rand(50, 96)}
    check_half_op(nodes, {"x": rand(50, 64)}, inits, {"MatMul": 1, "Add": 1})


def test_a_half_table_is_gathered_as_stored() -> None:
    """Gather from a large half table (an embedding) runs in half, as stored (a byte copy), its rows cast to
    float32 on the device; the table is uploaded half."""
    table = rand(1000, 48)
    nodes = [helper.make_node("Gather", ["table", "ids"], ["e"]), helper.make_node("Relu", ["e"], ["y"])]
    feeds = {"ids": np.array([[3, 999, 0, -1, 512]], np.int64)}
    model16 = half(make_model(nodes, feeds, {"table": table}))
    got, parts, stats = run(model16, feeds, "opencl")
    on_device(parts)
    assert parts[0]["ops"] == {"Gather": 1, "Cast": 1, "Relu": 1}
    assert stats["weights_bytes_float16"] == table.size * 2
    want = np.maximum(table.astype(F16)[feeds["ids"]].astype(np.float32), 0)
    np.testing.assert_array_equal(got["y"], want)


def test_nodes_that_cannot_read_half_constants_decline() -> None:
    """A Concat with a large half constant (its kernel copies bytes: it would copy half into float32) runs on the
    CPU, which widens the constant; the rest stays on the device."""
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Concat", ["r", "k"], ["c"], axis=0),
             helper.make_node("Sigmoid", ["c"], ["y"])]
    feeds, k = {"x": rand(3, 80)}, rand(64, 80)
    model16 = half(make_model(nodes, feeds, {"k": k}))
    got, parts, _ = run(model16, feeds, "opencl")
    assert [(p["backend"], p["ops"]) for p in parts] == [
        ("opencl", {"Relu": 1}), ("cpu", {"Concat": 1}), ("opencl", {"Sigmoid": 1})], parts
    want = 1 / (1 + np.exp(-np.concatenate([np.maximum(feeds["x"], 0), k.astype(F16).astype(np.float32)])))
    np.testing.assert_allclose(got["y"], want, rtol=1e-6, atol=1e-6)


def test_other_configurations_read_half_weights() -> None:
    """The GPU paths (tiles staged in local memory) and other vector widths read half weights too: every
    candidate tried computes the default's output."""
    be = get_backend("opencl")
    rng = np.random.default_rng(0)
    f32 = np.dtype(np.float32)
    conv = NodeSpec("Conv", "conv", {"pads": [1, 1, 1, 1], "widen": [1]},
                    [TensorSpec((1, 13, 9, 11), f32), TensorSpec((37, 13, 3, 3), F16), TensorSpec((37,), f32)],
                    [TensorSpec((1, 37, 9, 11), f32)],
                    [None, rng.uniform(-1, 1, (37, 13, 3, 3)).astype(F16), rng.uniform(-1, 1, 37).astype(f32)])
    gemm = NodeSpec("MatMul", "matmul", {"widen": [1]}, [TensorSpec((21, 40), f32), TensorSpec((40, 33), BF16)],
                    [TensorSpec((21, 33), f32)], [None, rng.uniform(-1, 1, (40, 33)).astype(BF16)])
    for spec, extra in ((conv, {"VW": 8, "WM": 2, "RM": 2, "RN": 8}), (gemm, {})):
        kernel, _ = select_kernel(be, spec)  # the node as the compiler records it: its prepacked constants
        consts, ins = list(spec.consts), list(spec.inputs)
        for i, array in kernel.constants.items():
            consts[i], ins[i] = array, TensorSpec(array.shape, array.dtype)
        kernel, where = select_kernel(be, NodeSpec(spec.op, spec.name, {**spec.attrs, **kernel.attrs}, ins,
                                                   spec.outputs, consts))
        assert where == "opencl" and kernel.wtype > 0
        cands = list(kernel.space.candidates(kernel.problem(), be.info))
        picks = [cands[i] for i in rng.choice(len(cands), min(6, len(cands)), replace=False)]
        picks.append({**kernel.space.defaults["gpu"], **extra})
        default, trials, _ = profile(be, kernel, picks, Settings(min_runs=1, min_total_s=0.0))
        assert default.error is None
        assert all(t.error is None for t in trials), [(t.params, t.error) for t in trials if t.error]


# ---- casts -------------------------------------------------------------------------------------------------

def _specials() -> np.ndarray:
    """float32 values whose float16 rounding is an edge: infinities, NaN, signed zeros, overflow, the largest
    half, subnormals and ties (to even) at every scale, and random values."""
    tiny = 2.0 ** -24  # the smallest float16 subnormal
    values = [np.inf, -np.inf, np.nan, 0.0, -0.0, 65504.0, 65519.99, 65520.0, -65520.0, 1e10, 6.1035156e-05,
              tiny, tiny / 2, tiny * 1.5, tiny * 2.5, tiny * 0.49, tiny * 1023.5, 1 + 2.0 ** -11, 1 + 3 * 2.0 ** -11,
              -(1 + 2.0 ** -11), 2048 + 1, 2048 + 3, 0.1, 1 / 3, 3e-8, -3e-8]
    halves = np.arange(1 << 16, dtype=np.uint16).view(F16).astype(np.float32)
    finite = np.isfinite(halves[:-1]) & np.isfinite(halves[1:])  # neighbours in the bit order (each sign's run)
    mids = halves[:-1][finite] + (halves[1:][finite] - halves[:-1][finite]) / 2  # exact ties
    rand_ = np.random.default_rng(0).standard_normal(4000).astype(np.float32) * 10.0 ** np.arange(-6, 5).repeat(
        400)[:4000]
    return np.concatenate([np.array(values, np.float32), mids.astype(np.float32), rand_]).astype(np.float32)


def _same_bits(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    nan = np.isnan(want.astype(np.float32))
    np.testing.assert_array_equal(np.isnan(got.astype(np.float32)), nan)
    bits = np.dtype(f"u{want.dtype.itemsize}")
    np.testing.assert_array_equal(got[~nan].view(bits), want[~nan].view(bits))


@pytest.mark.parametrize("to", [F16, BF16], ids=["float16", "bfloat16"])
def test_cast_from_float32_rounds_to_nearest_even(to) -> None:
    x = _specials()
    node = helper.make_node("Cast", ["x"], ["y"], to=helper.np_dtype_to_tensor_dtype(to))
    got, parts, _ = run(make_model(node, {"x": x}), {"x": x}, "opencl")
    on_device(parts)
    with np.errstate(over="ignore"):
        _same_bits(got["y"], x.astype(to))


@pytest.mark.parametrize("src", [F16, BF16], ids=["float16", "bfloat16"])
def test_cast_to_float32_is_exact(src) -> None:
    """Every bit pattern of the half type (NaNs stay NaN)."""
    x = np.arange(1 << 16, dtype=np.uint16).view(src).reshape(256, 256)
    node = helper.make_node("Cast", ["x"], ["y"], to=onnx.TensorProto.FLOAT)
    got, parts, _ = run(make_model(node, {"x": x}), {"x": x}, "opencl")
    on_device(parts)
    _same_bits(got["y"], x.astype(np.float32))


def test_casts_between_half_and_integers() -> None:
    x = (np.random.default_rng(1).standard_normal(300) * 300).astype(F16)
    i = np.random.default_rng(2).integers(-70000, 70000, 300).astype(np.int32)
    nodes = [helper.make_node("Cast", ["x"], ["xi"], to=onnx.TensorProto.INT32),
             helper.make_node("Cast", ["i"], ["ih"], to=onnx.TensorProto.FLOAT16)]
    feeds = {"x": x, "i": i}
    got, parts, _ = run(make_model(nodes, feeds, outputs=["xi", "ih"]), feeds, "opencl")
    on_device(parts)
    np.testing.assert_array_equal(got["xi"], x.astype(np.int32))
    with np.errstate(over="ignore"):
        _same_bits(got["ih"], i.astype(F16))


def test_bfloat16_weights() -> None:
    """A bfloat16 model's weights are read as the high half of a float (Conv, depthwise and MatMul): Casts to
    bfloat16 compute in float32, as on the CPU."""
    bf = onnx.TensorProto.BFLOAT16
    nodes = [helper.make_node("Cast", ["x"], ["xb"], to=bf),
             helper.make_node("Conv", ["xb", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["c", "d"], ["cd"], pads=[5, 5, 5, 5], group=40),
             helper.make_node("Reshape", ["cd", "shape"], ["r"]), helper.make_node("MatMul", ["r", "m"], ["yb"]),
             helper.make_node("Cast", ["yb"], ["y"], to=onnx.TensorProto.FLOAT)]
    feeds = {"x": rand(1, 24, 6, 5)}
    inits = {"w": rand(40, 24, 3, 3, dtype=BF16), "d": rand(40, 1, 11, 11, dtype=BF16),
             "shape": np.array([1, 1200], np.int64), "m": rand(1200, 17, dtype=BF16)}
    model = make_model(nodes, feeds, inits)
    got, parts, stats = run(model, feeds, "opencl")
    on_device(parts)
    assert stats["weights_bytes_bfloat16"] == sum(v.nbytes for v in inits.values() if v.dtype == BF16)
    want, _, _ = run(model, feeds, "cpu")
    close_to_cpu(got["y"], want["y"])
    wide = {k: v.astype(np.float32) if v.dtype == BF16 else v for k, v in inits.items()}
    plain = [nodes[1], nodes[2], nodes[3], helper.make_node("MatMul", ["r", "m"], ["y"])]
    plain[0].input[0] = "x"
    exact, _, _ = run(make_model(plain, feeds, wide), feeds, "cpu")
    close_to_cpu(got["y"], exact["y"])
