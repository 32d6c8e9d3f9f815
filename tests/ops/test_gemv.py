"""The native GEMV (csrc/gemv.c, backends/cpu/gemv.py): a GEMM of a few rows against constant weights stored
[K, N] or [N, K], with its epilogue (bias, residual, Relu or GELU), on one thread and shared among threads, against
NumPy in float64; and in the programs that use it (a range program's token steps, a fixed program's GEMVs) against
onnxruntime."""

from __future__ import annotations

import math

import numpy as np
import pytest
from harness import native_avx512

from ctxrt.backends.cpu import gemv, native, threads

needs_native = pytest.mark.skipif(native.library() is None, reason="the native extension is not built here")
RNG = np.random.default_rng(7)


def _reference(a, wkn, bias, residual, act, alpha=0.0, beta=0.0):
    y = a.astype(np.float64) @ wkn.astype(np.float64)
    if bias is not None:
        y = y + bias
    if residual is not None:
        y = y + residual
    if act == "Relu":
        y = np.maximum(y, 0)
    elif act == "Gelu":
        y = 0.5 * y * (1 + np.vectorize(math.erf)(y / math.sqrt(2)))
    elif act == "Gelu_tanh":
        y = 0.5 * y * (1 + np.tanh(math.sqrt(2 / math.pi) * (y + 0.044715 * y ** 3)))
    elif act == "Swish":
        y = y / (1 + np.exp(-y))
    elif act == "HardSwish":
        y = y * np.clip(alpha * y + beta, 0, 1)
    elif act == "Clip":
        y = np.clip(y, alpha, beta)
    elif act == "LeakyRelu":
        y = np.where(y < 0, alpha * y, y)
    elif act == "HardSigmoid":
        y = np.clip(alpha * y + beta, 0, 1)
    return y


@needs_native
@pytest.mark.parametrize("trans", [True, False], ids=["NK", "KN"])
@pytest.mark.parametrize("m,k,n", [(1, 256, 1024), (3, 77, 130), (7, 1024, 96), (1, 33, 5000), (2, 5, 3),
                                   (1, 300, 4100), (8, 128, 352), (13, 61, 100), (16, 256, 1031)])
@pytest.mark.parametrize("nthreads", [1, 2, 3])
def test_gemv_shapes_and_threads(trans, m, k, n, nthreads, monkeypatch) -> None:
    monkeypatch.setattr(gemv, "THREADED_BYTES", 0)  # every size shared among the threads asked for
    monkeypatch.setattr(threads, "usable_cores", lambda: 4)
    a = RNG.standard_normal((m, k)).astype(np.float32)
    wkn = RNG.standard_normal((k, n)).astype(np.float32)
    w = np.ascontiguousarray(wkn.T) if trans else wkn
    bias = RNG.standard_normal(n).astype(np.float32)
    y = np.full((m, n), np.nan, np.float32)
    run = gemv.launch(a, w, trans, y, bias)
    if not gemv.takes(m, trans):  # [N, K] weights at 8 or more rows: oneDNN's or NumPy's GEMM
        assert run is None
        return
    monkeypatch.setattr(threads._CURRENT, "idle", nthreads, raising=False)
    run()
    np.testing.assert_allclose(y, _reference(a, wkn, bias, None, None), rtol=1e-4, atol=1e-4 * math.sqrt(k))


@needs_native
@pytest.mark.parametrize("trans", [True, False], ids=["NK", "KN"])
@pytest.mark.parametrize("act", [None, "Relu", "Gelu", "Gelu_tanh", "Swish"])
@pytest.mark.parametrize("epilogue", ["none", "bias", "residual", "both", "in_place"])
@pytest.mark.parametrize("m", [1, 2, 11])
def test_gemv_epilogues(trans, act, epilogue, m, monkeypatch) -> None:
    """Every epilogue on the GEMV (1 row), and where W is [K, N] on the register blocks of a few rows (2, 11:
    blocks of 6 rows and fewer, 16 and 8 columns, and a scalar tail), shared among the threads."""
    if not gemv.takes(m, trans):
        pytest.skip("[N, K] weights at 8 or more rows are oneDNN's or NumPy's")
    monkeypatch.setattr(threads._CURRENT, "idle", 2, raising=False)
    k, n = 512, 643  # 1.25 MiB: shared among the threads
    a = RNG.standard_normal((m, k)).astype(np.float32) / 8
    wkn = RNG.standard_normal((k, n)).astype(np.float32) / 8
    w = np.ascontiguousarray(wkn.T) if trans else wkn
    bias = RNG.standard_normal(n).astype(np.float32) if epilogue in ("bias", "both") else None
    residual = RNG.standard_normal((m, n)).astype(np.float32) if epilogue in ("residual", "both", "in_place") else None
    expect = _reference(a, wkn, bias, residual, act)
    y = residual if epilogue == "in_place" else np.full((m, n), np.nan, np.float32)
    gemv.launch(a, w, trans, y, bias, residual, act)()
    np.testing.assert_allclose(y, expect, rtol=1e-5, atol=2e-5)


def test_gemv_declines_what_it_cannot_read() -> None:
    """Non-contiguous rows, a residual overlapping the output elsewhere than exactly, other dtypes, too many rows:
    None (the caller runs NumPy's GEMV)."""
    a = np.ones((1, 64), np.float32)
    w = np.ones((64, 32), np.float32)
    y = np.empty((1, 32), np.float32)
    assert gemv.launch(a, w, False, y, act="Mish") is None
    assert gemv.launch(np.ones((1, 128), np.float32)[:, ::2], w, False, y) is None
    assert gemv.launch(a, w.astype(np.float64), False, y) is None
    assert gemv.launch(np.ones((17, 64), np.float32), w, False, np.empty((17, 32), np.float32)) is None
    assert gemv.launch(np.ones((8, 64), np.float32), np.ones((32, 64), np.float32), True,
                       np.empty((8, 32), np.float32)) is None  # [N, K] at 8 rows: a GEMM's business
    both = np.zeros((1, 33), np.float32)
    assert gemv.launch(a, w, False, both[:, 1:], residual=both[:, :32]) is None
    if native.library() is not None:
        assert gemv.launch(a, w, False, y) is not None


MANY_ACTS = [(None, 0.0, 0.0), ("Relu", 0.0, 0.0), ("Gelu", 0.0, 0.0), ("Swish", 0.0, 0.0),
             ("HardSwish", 1 / 6, 0.5), ("Clip", -0.25, 0.5), ("LeakyRelu", 0.1, 0.0), ("HardSigmoid", 0.2, 0.5)]


def _team(monkeypatch, n: int) -> None:
    """Runs from now on as a run of `n` OpenMP threads (threads.openmp_now), oneDNN's libgomp loaded."""
    from ctxrt.backends.cpu.onednn import api

    api.library()
    monkeypatch.setattr(threads._CURRENT, "n", n, raising=False)
    monkeypatch.setattr(threads._CURRENT, "idle", n, raising=False)


@needs_native
@pytest.mark.parametrize("m,k,n", [(17, 16, 16), (29, 3, 5), (100, 72, 24), (250, 24, 88), (1111, 16, 72),
                                   (12, 40, 240), (3073, 40, 33), (64, 200, 17), (130, 1, 31)])
@pytest.mark.parametrize("nthreads", [1, 2, 3])
def test_many_rows_gemm_shapes_and_threads(m, k, n, nthreads, monkeypatch) -> None:
    """Many rows by W [K, N] (`many`, a 1x1 convolution's pixels): register blocks of up to 12 rows (AVX-512) or
    6 (AVX2) and the rows past the last whole block, 32 / 16 columns and masked or scalar tails, on OpenMP's team
    (1, 2 or 3 threads) and on ctxrt's pool where the library has no team."""
    from ctxrt.backends.cpu.onednn import api

    _team(monkeypatch, nthreads)
    monkeypatch.setattr(gemv, "MANY_SHARED_WORK", 0)  # every size shared
    assert native.openmp_team() == api.available()  # libgomp found where oneDNN loaded it
    a = RNG.standard_normal((m, k)).astype(np.float32)
    w = RNG.standard_normal((k, n)).astype(np.float32)
    bias = RNG.standard_normal(n).astype(np.float32)
    expect = _reference(a, w, bias, None, "Relu")
    lib = native.library()
    for team, avx512 in ((True, True), (False, True), (True, False)):
        if not team:  # the library without OpenMP's entry points: the pool shares the rows
            lib.ctxrt_openmp(None, None, None, None)
        y = np.full((m, n), np.nan, np.float32)
        try:  # (not avx512: the AVX2 blocks, 6 rows by 16 columns, where the CPU has AVX-512 too)
            with native_avx512(avx512):
                run = gemv.launch(a, w, False, y, bias, act="Relu", many=True)
                assert run is not None
                run()
        finally:
            lib.ctxrt_openmp(*native._STATE.get("openmp_entries", (None,) * 4))
        np.testing.assert_allclose(y, expect, rtol=1e-4, atol=1e-4 * math.sqrt(k))


@needs_native
@pytest.mark.parametrize("act,alpha,beta", MANY_ACTS, ids=[str(a[0]) for a in MANY_ACTS])
@pytest.mark.parametrize("epilogue", ["none", "bias", "residual", "both", "in_place"])
def test_many_rows_gemm_epilogues(act, alpha, beta, epilogue, monkeypatch) -> None:
    """Every epilogue of many rows, with each fused activation a Conv has (the parameterized ones: HardSwish,
    Clip, LeakyRelu, HardSigmoid), values on both sides of their bends; 2 threads; and a few rows (the register
    blocks of gemm_rows) and one row (the GEMV) with the same parameters."""
    _team(monkeypatch, 2)
    k, n = 37, 70
    for m in (203, 9, 1):
        a = RNG.standard_normal((m, k)).astype(np.float32) / 4
        w = RNG.standard_normal((k, n)).astype(np.float32) / 4
        bias = RNG.standard_normal(n).astype(np.float32) if epilogue in ("bias", "both") else None
        residual = RNG.standard_normal((m, n)).astype(np.float32) if epilogue in ("residual", "both", "in_place") \
            else None
        expect = _reference(a, w, bias, residual, act, alpha, beta)
        for avx512 in (True, False):
            y = residual.copy() if epilogue == "in_place" else np.full((m, n), np.nan, np.float32)
            with native_avx512(avx512):
                run = gemv.launch(a, w, False, y, bias, y if epilogue == "in_place" else residual, act, alpha,
                                  beta, many=True)
                assert run is not None
                run()
            np.testing.assert_allclose(y, expect, rtol=1e-5, atol=2e-5)


def test_many_rows_gemm_declines_what_it_cannot_read() -> None:
    """`many` takes W [K, N] only, float32 C-contiguous rows, activations it knows."""
    a, w, y = np.ones((40, 8), np.float32), np.ones((8, 16), np.float32), np.empty((40, 16), np.float32)
    assert gemv.launch(a, np.ones((16, 8), np.float32), True, y, many=True) is None
    assert gemv.launch(a, w, False, y, act="Tanh", many=True) is None
    assert gemv.launch(np.ones((40, 16), np.float32)[:, ::2], w, False, y, many=True) is None
    assert gemv.launch(a, w, False, np.empty((40, 16), np.float64), many=True) is None
    if native.library() is not None:
        assert gemv.launch(a, w, False, y, many=True) is not None
        assert gemv.launch(a, w, False, y) is None  # 40 rows without `many`: a GEMM's business


def _counting(monkeypatch) -> list[bool]:
    """Per gemv.launch call from now on: whether it gave a native launch."""
    made: list[bool] = []
    real = gemv.launch

    def counting(*args, **kwargs):
        run = real(*args, **kwargs)
        made.append(run is not None)
        return run
    monkeypatch.setattr(gemv, "launch", counting)
    return made


def _mlp_model(gelu: str | None):
    """x[1, seq, 256] -> MatMul 256 x 512 + bias -> Gelu (opset 20, `gelu`) -> MatMul 512 x 256 + bias + x: the
    GEMMs fuse bias, activation and residual; at fewer than 8 rows of seq they are GEMVs."""
    from onnx import TensorProto, helper, numpy_helper

    w1 = RNG.standard_normal((256, 512)).astype(np.float32) / 16
    w2 = RNG.standard_normal((512, 256)).astype(np.float32) / 16
    b1 = RNG.standard_normal(512).astype(np.float32)
    b2 = RNG.standard_normal(256).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h0"]), helper.make_node("Add", ["h0", "b1"], ["h1"])]
    last = "h1"
    if gelu == "silu":  # torch's SiLU: x * sigmoid(x), fused into Swish, then into the GEMM
        nodes += [helper.make_node("Sigmoid", ["h1"], ["s"]), helper.make_node("Mul", ["h1", "s"], ["h2"])]
        last = "h2"
    elif gelu is not None:
        nodes.append(helper.make_node("Gelu", ["h1"], ["h2"], approximate=gelu))
        last = "h2"
    nodes += [helper.make_node("MatMul", [last, "w2"], ["h3"]), helper.make_node("Add", ["h3", "b2"], ["h4"]),
              helper.make_node("Add", ["h4", "x"], ["y"])]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "seq", 256])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "seq", 256])],
                              [numpy_helper.from_array(v, n) for n, v in
                               (("w1", w1), ("w2", w2), ("b1", b1), ("b2", b2))])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])


@needs_native
@pytest.mark.parametrize("gelu", [None, "none", "tanh", "silu"])
def test_range_program_token_steps_run_the_native_gemv(gelu, monkeypatch) -> None:
    """A range program's steps at 1-7 rows launch the native GEMV (GELU fused where the graph has one), at up to 16
    rows by [K, N] weights the native GEMM of a few rows, and equal onnxruntime; past that oneDNN's GEMM runs."""
    import onnxruntime as ort

    import ctxrt

    made = _counting(monkeypatch)
    model = _mlp_model(gelu).SerializeToString()
    ref = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    with ctxrt.InferenceSession(model, dim_ranges={"seq": (1, 16)}) as sess:
        tb = None
        for seq in (1, 3, 7, 12, 16, 9):
            x = RNG.standard_normal((1, seq, 256)).astype(np.float32)
            before = len(made)
            np.testing.assert_allclose(sess.run(None, {"x": x})[0], ref.run(None, {"x": x})[0], rtol=1e-4,
                                       atol=1e-4)
            if tb is None:  # how the program stores the weights: [N, K] ("ba"), [K, N] ("ab"), or blocked, as
                # oneDNN prefers them at the upper bound (BA16a64b on AVX-512: its primitives then run every size)
                steps = next(iter(sess._variants.values())).ranged.compiled.steps
                tag = {s.attrs.get("weights_tag") for s in steps if s.op == "MatMul"}.pop()
                tb = tag == "ba"
            if tag in ("ab", "ba") and gemv.takes(seq, tb):
                assert made[before:] == [True, True], made[before:]  # both GEMMs, native
            else:
                assert len(made) == before


@needs_native
def test_pool_serves_concurrent_callers_and_forked_children(monkeypatch) -> None:
    """ctxrt's pool runs one job at a time: GEMVs launched from several Python threads at once (a second caller
    runs its chunks alone) and from a forked child (whose pool starts new workers) all give the right sums."""
    import multiprocessing as mp
    import threading

    monkeypatch.setattr(gemv, "THREADED_BYTES", 0)
    k, n = 512, 1024
    w = RNG.standard_normal((n, k)).astype(np.float32)
    cases = [RNG.standard_normal((1, k)).astype(np.float32) for _ in range(4)]
    expect = [_reference(a, w.T, None, None, "Relu") for a in cases]
    failures = []

    def caller(i: int) -> None:
        threads._CURRENT.idle = 2
        y = np.empty((1, n), np.float32)
        run = gemv.launch(cases[i], w, True, y, act="Relu")
        for _ in range(200):
            y.fill(np.nan)
            run()
            if not np.allclose(y, expect[i], rtol=1e-4, atol=1e-3):
                failures.append(i)
                return
    workers = [threading.Thread(target=caller, args=(i,)) for i in range(4)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    assert failures == []
    caller(0)  # the pool's workers now exist in this process

    def child() -> None:
        caller(1)
        raise SystemExit(1 if failures else 0)
    p = mp.get_context("fork").Process(target=child)
    p.start()
    p.join(60)
    assert p.exitcode == 0 and failures == []


@needs_native
@pytest.mark.parametrize("op", ["MatMul", "Gemm"])
def test_fixed_programs_run_their_gemvs_natively(op, monkeypatch) -> None:
    """A fixed-shape program's MatMul or Gemm at one row by constant weights (a classifier's head at batch 1)
    runs the native GEMV (with the Gemm's bias and a fused Relu), equal to onnxruntime."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    import ctxrt

    made = _counting(monkeypatch)
    w = RNG.standard_normal((300, 500)).astype(np.float32) / 16
    b = RNG.standard_normal(500).astype(np.float32)
    if op == "Gemm":
        nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["h"], transB=1), helper.make_node("Relu", ["h"], ["y"])]
        inits = [numpy_helper.from_array(np.ascontiguousarray(w.T), "w"), numpy_helper.from_array(b, "b")]
    else:
        nodes = [helper.make_node("MatMul", ["x", "w"], ["y"])]
        inits = [numpy_helper.from_array(w, "w")]
    graph = helper.make_graph(nodes, "head", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 300])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 500])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    x = RNG.standard_normal((1, 300)).astype(np.float32)
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    with ctxrt.InferenceSession(model) as sess:
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], want, rtol=1e-4, atol=1e-4)
    assert made and all(made)
    onnx.checker.check_model(onnx.load_from_string(model))


@needs_native
@pytest.mark.parametrize("gelu", [None, "none", "silu"])
@pytest.mark.parametrize("seq", [8, 16])
def test_fixed_programs_run_a_few_rows_natively(gelu, seq, monkeypatch) -> None:
    """A fixed-shape program's oneDNN GEMMs at 8-16 rows by [K, N] weights (a small decoder's prompt) bind the
    native GEMM of a few rows on the stored weights, with bias, activation and residual fused, equal to
    onnxruntime; with the extension off, oneDNN's primitive gives the same."""
    import onnxruntime as ort

    import ctxrt
    from ctxrt.backends.cpu.onednn import api

    if not api.available():
        pytest.skip("oneDNN is not installed")
    made = _counting(monkeypatch)
    model = _mlp_model(gelu).SerializeToString()
    x = RNG.standard_normal((1, seq, 256)).astype(np.float32)
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    with ctxrt.InferenceSession(model, shapes={"x": [1, seq, 256]}) as sess:
        got = sess.run(None, {"x": x})[0]
        steps = next(iter(sess._variants.values())).stages[0].graph.compiled.steps
        tags = {s.attrs.get("weights_tag") for s in steps if s.op == "MatMul"}
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    if tags == {"ab"}:
        assert made == [True, True]
    monkeypatch.setattr(native, "library", lambda: None)
    with ctxrt.InferenceSession(model, shapes={"x": [1, seq, 256]}) as sess:
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], want, rtol=1e-4, atol=1e-4)


@needs_native
@pytest.mark.parametrize("m", [8, 11, 16])
def test_wide_takes_nk_weights_up_to_16_rows(m, monkeypatch) -> None:
    """`wide` (a range program's GEMM by (N, K) weights of at most WIDE_BYTES: a classifier in a batch loop): 8-16
    rows on the native GEMV, equal to NumPy; larger weights, or without `wide`, left to the caller."""
    monkeypatch.setattr(threads._CURRENT, "idle", 2, raising=False)
    k, n = 96, 128
    a = RNG.standard_normal((m, k)).astype(np.float32)
    wkn = RNG.standard_normal((k, n)).astype(np.float32)
    bias = RNG.standard_normal(n).astype(np.float32)
    y = np.full((m, n), np.nan, np.float32)
    assert gemv.launch(a, np.ascontiguousarray(wkn.T), True, y, bias, act="Relu") is None
    run = gemv.launch(a, np.ascontiguousarray(wkn.T), True, y, bias, act="Relu", wide=True)
    assert run is not None
    run()
    np.testing.assert_allclose(y, _reference(a, wkn, bias, None, "Relu"), rtol=1e-5, atol=1e-5)
    big = np.zeros((gemv.WIDE_BYTES // (4 * k) + 1, k), np.float32)
    assert gemv.launch(a, big, True, np.empty((m, big.shape[0]), np.float32), wide=True) is None
