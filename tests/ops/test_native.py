"""ctxrt's native kernels (csrc/, the extension ctxrt._native) against onnxruntime and against the NumPy kernels
they stand in for: MatMulNBits with 4-bit weights at a token's rows (float32, and int8 activations at
accuracy_level 4, as onnxruntime computes them), GroupQueryAttention's token steps and RMS normalizations
(tests/ops/test_genai_ops.py runs every attribute through them; here the NumPy paths they replace run the same
cases)."""

from __future__ import annotations

import os
import platform
import shutil

import harness
import numpy as np
import onnx
import pytest
from onnx import helper
from quant_helpers import MS, ort_outputs, qmodel
from test_genai_ops import ATTRS, STEPS, compare, gqa

import ctxrt
from ctxrt.backends import get_backend
from ctxrt.backends.cpu import native
from ctxrt.compiler import compile_graphs, save_context

BUILT = native.library() is not None
needs_native = pytest.mark.skipif(not BUILT, reason="the native extension is not built here")


def test_the_extension_is_built_where_a_compiler_is() -> None:
    """setup.py builds it on install wherever a C compiler is (scripts/setup.sh installs one with apt): a CI run
    without it would test only the NumPy fallbacks."""
    if os.environ.get("CTXRT_NATIVE") == "0":
        pytest.skip("CTXRT_NATIVE=0 turns the native kernels off")
    if platform.system() == "Linux" and shutil.which("cc"):
        assert BUILT


def _nbits_model(k: int, n: int, block: int, rows: int, zero_points: str, bias: bool, accuracy: int):
    kb = -(-k // block)
    inits = {"b": harness.RNG.integers(0, 256, (n, kb, block // 2)).astype(np.uint8),
             "s": harness.rand(n, kb, low=0.001, high=0.05)}
    names = ["a", "b", "s"]
    if zero_points == "packed":
        inits["z"] = harness.RNG.integers(0, 256, (n, -(-kb // 2))).astype(np.uint8)
    elif zero_points == "float":
        inits["z"] = harness.rand(n, kb, low=0.0, high=15.0)
    names.append("z" if zero_points != "none" else "")
    if bias:
        inits["bias"] = harness.rand(n)
        names += ["", "bias"]
    while not names[-1]:
        names.pop()
    a = harness.rand(rows, k, low=-3, high=3)
    node = helper.make_node("MatMulNBits", names, ["y"], domain=MS, K=k, N=n, bits=4, block_size=block,
                            accuracy_level=accuracy)
    return qmodel(node, {"a": a}, inits), a


def _algorithm(model, a) -> str:
    with ctxrt.compile(model, backend=harness.BACKEND) as ctx:
        g = ctx.graph()
        return next(k.algorithm for s, k in zip(g.compiled.steps, g._kernels, strict=True) if s.op == "MatMulNBits")


# K, N, block: K a multiple of 8 blocks, not one (a tail of blocks in plain C), K past the last block's end
SIZES = {"K 768 block 32": (768, 48, 32), "K 100 block 32": (100, 37, 32), "K 200 block 16": (200, 20, 16),
         "K 640 block 64": (640, 24, 64), "K 1000 block 128": (1000, 9, 128)}


@pytest.mark.parametrize("rows", [1, 3, 8, 20])
@pytest.mark.parametrize("zero_points", ["none", "packed", "float"])
@pytest.mark.parametrize("accuracy", [0, 4])
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("kernels", ["native", "numpy"])
def test_matmul_nbits_equals_onnxruntime(monkeypatch: pytest.MonkeyPatch, kernels: str, size: str, accuracy: int,
                                         zero_points: str, rows: int) -> None:
    """Within float32 rounding of onnxruntime in both of its ways to compute: int8 activations where it uses them
    (accuracy_level 4 without float zero points: the native kernel's int32 dot products at up to NATIVE_ROWS rows,
    the NumPy tiles' A rounded to int8 first), float32 elsewhere."""
    from ctxrt.backends.cpu.quant import nbits

    if kernels == "numpy":
        monkeypatch.setitem(native._STATE, "lib", None)
    elif not BUILT:
        pytest.skip("the native extension is not built here")
    k, n, block = SIZES[size]
    model, a = _nbits_model(k, n, block, rows, zero_points, bias=zero_points == "packed", accuracy=accuracy)
    int8 = accuracy == 4 and zero_points != "float"
    on_native = kernels == "native" and rows <= nbits.NATIVE_ROWS
    assert _algorithm(model, a) == (("native_4bit_int8" if int8 else "native_4bit_f32") if on_native
                                    else "dequantize_tiles_4bit")
    got = harness.run_ctxrt(model, {"a": a})[0]
    want = ort_outputs(model, {"a": a}, [np.float32])[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-5 * float(np.abs(want).max()))


@needs_native
@pytest.mark.parametrize("compiled_with", ["native", "numpy"])
def test_binaries_load_with_and_without_the_extension(monkeypatch: pytest.MonkeyPatch, tmp_path,
                                                      compiled_with: str) -> None:
    """A binary's scratch plan fits both kernels of MatMulNBits and GroupQueryAttention (their work buffers are
    sized for native.MAX_THREADS threads, whichever runs): compiled where the extension is built, it loads
    where it is not, and the other way round, with the same outputs."""
    model, a = _nbits_model(256, 24, 32, 1, "none", bias=False, accuracy=4)
    node, feeds = gqa("token-shared-buffer", do_rotary=1)
    from test_genai_ops import ms_model

    attention = ms_model(node, feeds)
    if compiled_with == "numpy":
        monkeypatch.setitem(native._STATE, "lib", None)
    backend, paths = get_backend("cpu"), []
    for i, (m, f) in enumerate(((model, {"a": a}), (attention, feeds))):
        onnx.save(m, tmp_path / f"{i}.onnx")
        graphs, weights = compile_graphs([(str(tmp_path / f"{i}.onnx"), {k: v.shape for k, v in f.items()}, "main")],
                                         backend)
        paths.append(save_context(tmp_path / f"{i}.ctx", graphs, weights, backend, [str(tmp_path / f"{i}.onnx")]))
    monkeypatch.setitem(native._STATE, "lib", None if compiled_with == "native" else native._load())
    outs = []
    for path, f in zip(paths, ({"a": a}, feeds), strict=True):
        with ctxrt.context_from_binary(path) as ctx:
            outs.append(ctx.graph().run(f))
    want = ort_outputs(model, {"a": a}, [np.float32])[0]
    np.testing.assert_allclose(outs[0]["y"], want, rtol=1e-5, atol=2e-5 * float(np.abs(want).max()))
    assert outs[1]["out"].shape == (2, 1, 64)


@pytest.mark.parametrize("step", [s for s in STEPS if STEPS[s][1] > 0])
@pytest.mark.parametrize("variant", ["plain", *ATTRS])
def test_gqa_numpy_path_equals_onnxruntime(monkeypatch: pytest.MonkeyPatch, step: str, variant: str) -> None:
    """The NumPy GroupQueryAttention (prompts of more than NATIVE_TOKENS tokens, and where the extension is not
    built) on the steps the native kernel takes elsewhere."""
    monkeypatch.setitem(native._STATE, "lib", None)
    attrs = ATTRS.get(variant, {})
    compare(*gqa(step, packed=variant != "rotary-interleaved", **attrs), padding="padded" in step)


@needs_native
def test_gqa_token_steps_run_the_native_kernel() -> None:
    from ctxrt.backends.cpu.genai.gqa import NATIVE_TOKENS, GroupQueryAttention
    from ctxrt.backends.kernel import NodeSpec, TensorSpec

    node, feeds = gqa("token-shared-buffer", do_rotary=1)
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    spec = lambda s: NodeSpec("com.microsoft.GroupQueryAttention", "gqa", attrs,  # noqa: E731
                              [TensorSpec((2, s, 128), np.dtype(np.float32)), None, None,
                               *(TensorSpec(feeds[x].shape, feeds[x].dtype) for x in ("pk", "pv", "seqlens", "total",
                                                                                      "cos", "sin"))],
                              [TensorSpec((2, s, 64), np.dtype(np.float32)),
                               *(TensorSpec(feeds[x].shape, np.dtype(np.float32)) for x in ("pk", "pv")),
                               TensorSpec((), np.dtype(np.int64))], 17)
    assert GroupQueryAttention(spec(1)).lib is not None
    assert GroupQueryAttention(spec(NATIVE_TOKENS + 1)).lib is None


@pytest.mark.parametrize("skip_shape", [(2, 3, 16), (1, 1, 16)])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("outputs", [["y"], ["y", "", "", "sum"]])
def test_rms_norm_native_and_numpy_agree(monkeypatch: pytest.MonkeyPatch, skip_shape: tuple[int, ...], bias: bool,
                                         outputs: list[str]) -> None:
    """SkipSimplifiedLayerNormalization (a skip of every row, or one row for all) and SimplifiedLayerNormalization:
    the native rows (csrc/norms.c) and NumPy's code agree (test_genai_ops.py compares both with onnxruntime)."""
    from test_genai_ops import ctxrt_run, ms_model

    feeds = {"x": harness.rand(2, 3, 16), "skip": harness.rand(*skip_shape)}
    inits = {"gamma": harness.rand(16), "bias": harness.rand(16)}
    node = helper.make_node("SkipSimplifiedLayerNormalization", ["x", "skip", "gamma"] + (["bias"] if bias else []),
                            outputs, domain=MS, epsilon=1e-5)
    plain = helper.make_node("SimplifiedLayerNormalization", ["x", "gamma"], ["y"], axis=-1, epsilon=1e-5)
    models = [ms_model(node, feeds, inits), ms_model(plain, {"x": feeds["x"]}, {"gamma": inits["gamma"]})]
    fed = [feeds, {"x": feeds["x"]}]
    got = [ctxrt_run(m, f) for m, f in zip(models, fed, strict=True)]
    monkeypatch.setitem(native._STATE, "lib", None)
    want = [ctxrt_run(m, f) for m, f in zip(models, fed, strict=True)]
    for g, w in zip(got, want, strict=True):
        for a, b in zip(g, w, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_a_prompt_of_dequantized_tiles_gives_blas_the_threads() -> None:
    """The tiles' GEMMs are BLAS calls (Kernel.blas): a program whose large kernels all are runs BLAS on the idle
    cores even beside oneDNN kernels (runtime/work.py, blas_run); a token's native GEMVs are OpenMP's."""
    from ctxrt.backends.cpu.quant import nbits

    model, a = _nbits_model(768, 2048, 32, 128, "none", bias=False, accuracy=4)
    with ctxrt.compile(model, backend="cpu") as ctx:
        assert ctx.graph()._blas
    model, a = _nbits_model(768, 2048, 32, 1, "none", bias=False, accuracy=4)
    with ctxrt.compile(model, backend="cpu") as ctx:
        assert ctx.graph()._blas == (not BUILT)
    assert nbits.NATIVE_ROWS < 128


def test_devices_says_whether_the_native_kernels_run(monkeypatch: pytest.MonkeyPatch) -> None:
    from ctxrt.backends.cpu.backend import CpuBackend

    provider = CpuBackend.describe()["provider"]
    assert ("native kernels avx2" in provider or "native kernels c" in provider) if BUILT else \
        "native kernels off or not built" in provider
    monkeypatch.setitem(native._STATE, "lib", None)
    assert "native kernels off or not built" in CpuBackend.describe()["provider"]


@needs_native
def test_the_extension_brings_no_openmp_runtime() -> None:
    """The native kernels' threads are ctxrt's own pool (csrc/pool.c, no barrier): loading the extension loads no
    OpenMP runtime, whose spin count and thread pool would otherwise have to be set before it loads."""
    import subprocess
    import sys

    code = ("from ctxrt.backends.cpu import native; assert native.library() is not None; "
            "print(any('libgomp' in line or 'libomp' in line for line in open('/proc/self/maps')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "False"


@pytest.mark.parametrize("rows", [3, 300])
def test_small_softmax_and_layernorm_run_native_rows(rows, monkeypatch) -> None:
    """A fixed program's small Softmax and LayerNormalization (oneDNN's nodes) run csrc/norms_kernel.h's rows in
    one call, a large one oneDNN's primitive; both equal onnxruntime, masked rows included."""
    import onnxruntime as ort
    from onnx import TensorProto, numpy_helper

    from ctxrt.backends.cpu.onednn import api, kernels

    if native.library() is None or not api.available():
        pytest.skip("needs the native extension and oneDNN")
    monkeypatch.setattr(kernels, "NATIVE_ROWS_MAX", 64 * 40)  # 3 rows of 40 natively, 300 rows by oneDNN
    rng = np.random.default_rng(2)
    inits = [numpy_helper.from_array(rng.standard_normal(40).astype(np.float32), n) for n in ("g", "b")]
    nodes = [helper.make_node("LayerNormalization", ["x", "g", "b"], ["n"], epsilon=1e-4),
             helper.make_node("Add", ["n", "m"], ["s"]), helper.make_node("Softmax", ["s"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, 40]),
                                       helper.make_tensor_value_info("m", TensorProto.FLOAT, [rows, 40])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
                           helper.make_tensor_value_info("n", TensorProto.FLOAT, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    x = (rng.standard_normal((rows, 40)) * 3 + 1).astype(np.float32)
    mask = np.where(rng.random((rows, 40)) < 0.25, -np.inf, 0).astype(np.float32)
    feeds = {"x": x, "m": mask}
    want = ort.InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, feeds)
    with ctxrt.InferenceSession(m) as sess:
        got = sess.run(None, feeds)
        built = [type(k).__name__ for k in next(iter(sess._variants.values())).stages[0].graph._kernels]
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert built.count("_NativeRows") == (2 if rows == 3 else 0), built


@pytest.mark.parametrize("shape", [(1, 1, 1), (3, 49, 17), (12, 256, 16), (2, 16, 240)])
def test_global_average_pool_of_channels_last_images(shape) -> None:
    """csrc/gemv.c's ctxrt_gap (a range program's GlobalAveragePool, onednn.kernels._gap_launch) and the NumPy
    loop it falls back to where the extension is missing: the mean over pixels of [n, pixels, c]."""
    from ctxrt.backends.cpu.onednn.kernels import _gap_launch

    rng = np.random.default_rng(2)
    n, p, c = shape
    x = rng.standard_normal((n, 1, p, c)).astype(np.float32)
    want = x.astype(np.float64).mean(axis=(1, 2))
    y = np.full((n, c, 1, 1), np.nan, np.float32)
    _gap_launch([x], [y])()
    np.testing.assert_allclose(y.reshape(n, c), want, rtol=1e-5, atol=1e-6)
    if native.library() is not None:
        assert native.gap(x.reshape(n, p, c), y.reshape(n, c)) is not None
        assert p == 1 or native.gap(x.reshape(n, p, c)[:, ::2], y.reshape(n, c)) is None  # not contiguous
        y[:] = np.nan
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(native, "library", lambda: None)
            _gap_launch([x], [y])()
        np.testing.assert_allclose(y.reshape(n, c), want, rtol=1e-5, atol=1e-6)
