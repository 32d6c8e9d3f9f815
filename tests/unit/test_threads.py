"""One thread setting for every pool a run drives (BLAS through threadpoolctl, OpenMP through oneDNN), the
default measured from the cores other processes leave idle, and the caller's limits restored after a run."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from threadpoolctl import threadpool_info

import ctxrt
from ctxrt.backends.cpu import threads
from ctxrt.backends.cpu.backend import CpuBackend
from ctxrt.backends.cpu.registry import KERNELS
from ctxrt.backends.kernel import FnKernel


class SpyBackend(CpuBackend):
    """Its Relu records every pool's thread limit while the run is under way."""

    seen: list[dict[str, int]]

    def __init__(self) -> None:
        super().__init__(onednn=True)  # oneDNN loads libgomp: an OpenMP pool to hold too
        self.seen = []

        def relu(spec):
            inner = KERNELS["Relu"](spec)

            def run(i, o, s):
                self.seen.append({p["filepath"]: p["num_threads"] for p in threadpool_info()})
                inner.bind(i, o, s)()
            return FnKernel(run)
        self.kernels = {**KERNELS, "Relu": relu}


def _model():
    """Conv (oneDNN, with its fused Relu) -> MaxPool (oneDNN) -> Reshape -> Relu (NumPy: the spy)."""
    w = np.random.default_rng(0).standard_normal((16, 8, 3, 3)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["a"]),
             helper.make_node("MaxPool", ["a"], ["r"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Reshape", ["r", "s"], ["f"]), helper.make_node("Relu", ["f"], ["y"])]
    g = helper.make_graph(nodes, "t", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 12, 12])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.array([1, -1], np.int64), "s")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


class _Monitor:
    """A core monitor of 2 cores that says `idle` of them are idle."""

    cores = 2

    def __init__(self, idle: int) -> None:
        self.idle = idle

    def available(self) -> int:
        return self.idle


@pytest.mark.parametrize("n", [1, 2, 3])
def test_every_pool_holds_the_thread_count_during_a_run_and_gets_it_back_after(n: int) -> None:
    be = SpyBackend()
    x = np.ones((1, 8, 12, 12), np.float32)
    with ctxrt.compile(_model(), backend=be, num_threads=n) as ctx:
        before = {p["filepath"]: p["num_threads"] for p in threadpool_info()}
        ctx.graph().run({"x": x})
        after = {p["filepath"]: p["num_threads"] for p in threadpool_info()}
    assert be.seen, "the spy Relu did not run"
    apis = {p["filepath"]: p["user_api"] for p in threadpool_info()}
    assert {"blas", "openmp"} <= set(apis.values()), apis
    cap = threads.openmp_cap()
    assert cap == threads.usable_cores()  # the primitives were made for this machine's cores
    for limits in be.seen:
        for path, value in limits.items():
            # OpenMP never above what oneDNN's primitives were made for (their scratch is sized by it); BLAS
            # at one thread beside oneDNN (its spinning workers would take a core from oneDNN's threads)
            assert value == (threads.openmp_count(n) if apis[path] == "openmp" else 1), (path, limits)
    assert after == before


@pytest.mark.parametrize("n", [1, 2])
def test_without_onednn_kernels_blas_gets_the_thread_count(n: int) -> None:
    """A context whose kernels are all NumPy's gives BLAS every thread it asks for."""
    class NumPySpy(SpyBackend):
        def __init__(self) -> None:
            super().__init__()
            self.onednn = False
    be = NumPySpy()
    with ctxrt.compile(_model(), backend=be, num_threads=n) as ctx:
        assert not any(s.algorithm.startswith("onednn") for s in ctx.graph().compiled.steps)
        ctx.graph().run({"x": np.ones((1, 8, 12, 12), np.float32)})
    apis = {p["filepath"]: p["user_api"] for p in threadpool_info()}
    blas = [v for limits in be.seen for k, v in limits.items() if apis[k] == "blas"]
    assert blas and all(v == n for v in blas), be.seen


def test_session_options_set_the_threads_like_onnxruntime() -> None:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    model = _model().SerializeToString()
    x = {"x": np.ones((1, 8, 12, 12), np.float32)}
    for sess in (ctxrt.InferenceSession(model, so),
                 ctxrt.InferenceSession(model, sess_options=ctxrt.SessionOptions(2))):
        sess.run(None, x)
    assert ctxrt.InferenceSession(model, so)._current.contexts[0].num_threads == 1
    assert ctxrt.InferenceSession(model)._current.contexts[0].num_threads is None  # the default: measured
    with pytest.raises(ctxrt.CtxrtError, match="intra_op_num_threads"):
        ctxrt.InferenceSession(model, sess_options=ctxrt.SessionOptions(-1))


def test_bad_thread_counts_are_clear_errors() -> None:
    for bad in (-1, 1.5, "2", True):
        with pytest.raises(ctxrt.CtxrtError, match="num_threads"):
            ctxrt.compile(_model(), num_threads=bad)


def test_default_takes_away_the_cores_other_processes_use(monkeypatch) -> None:
    """Four cores; the machine busy for 1.6 core-seconds per second more than this process: 2 left."""
    mon = threads.CoreMonitor(period=0.0)
    mon.cores = 4
    samples = iter([(10.0, 100.0, 5.0), (11.0, 102.6, 6.0), (12.0, 103.7, 7.0), (13.0, 104.0, 7.3)])
    monkeypatch.setattr(mon, "_sample", lambda: next(samples))
    mon._last = mon._sample()
    assert mon.available() == 2  # others: 2.6 - 1.0 = 1.6 cores
    assert mon.available() == 4  # others: 1.1 - 1.0 = 0.1 core
    assert mon.available() == 4  # others: 0.3 - 0.3 = 0


def test_a_burst_that_has_ended_does_not_take_a_core_after_a_long_gap(monkeypatch) -> None:
    """Two cores; another process busy for 4 of the 5 seconds since the last sample: where nothing else runs now
    (/proc/loadavg counts this thread only), both cores; where something does, one; a short gap keeps the
    average."""
    mon = threads.CoreMonitor(period=0.0)
    mon.cores = 2
    samples = iter([(10.0, 100.0, 5.0), (15.0, 104.5, 5.5), (20.0, 109.0, 5.5), (20.5, 109.5, 5.5)])
    running = iter([1, 3])
    monkeypatch.setattr(mon, "_sample", lambda: next(samples))
    monkeypatch.setattr(mon, "_running", lambda: next(running))
    mon._last = mon._sample()
    assert mon.available() == 2  # others 0.8 core on average, but only this thread runs now
    assert mon.available() == 1  # others 0.9 core, and two more tasks run now
    assert mon.available() == 1  # a short gap: others 1.0 core on average, /proc/loadavg not read


def test_busy_ticks_leave_out_idle_iowait_steal_and_guest() -> None:
    """A neighbour on the hypervisor (steal) is not a process on this machine, and guest time is in user."""
    line = b"cpu  100 5 20 9000 40 3 2 700 50 1".split()  # user nice system idle iowait irq softirq steal guest gnice
    assert threads.busy_ticks(line) == 100 + 5 + 20 + 3 + 2
    assert threads.busy_ticks(b"cpu  100 5 20".split()) is None  # too short
    assert threads.busy_ticks(b"cpu0 1 2 3 4 5".split()) is None  # not the machine's line
    assert threads.busy_ticks(b"cpu 1 2 x 4 5".split()) is None


def test_default_thread_scope_uses_the_monitor(monkeypatch) -> None:
    monkeypatch.setitem(threads._STATE, "monitor", _Monitor(1))
    scope = threads.ThreadScope(None)
    with scope:
        assert all(p.get() == 1 for p in threads.pools())
    assert scope.last == 1


def test_onednn_primitives_keep_the_thread_count_they_were_compiled_for(monkeypatch) -> None:
    """Compiled where 1 core was usable, loaded where 2 are: the primitives are made for 1 thread, as compiled
    (their scratch was planned for that), and OpenMP gets no more than 1 in a run asking for 2."""
    monkeypatch.setitem(threads._STATE, "openmp_cap", None)  # the cap is process-wide: restored after the test
    from ctxrt.compiler import compile_graphs
    from ctxrt.runtime.loader import compile_to_context

    be = SpyBackend()
    monkeypatch.setattr(threads, "usable_cores", lambda: 1)
    graphs, weights = compile_graphs([(_model(), None, "main")], be)
    assert {s.attrs.get("threads") for s in graphs[0].steps if s.algorithm.startswith("onednn")} == {1}
    monkeypatch.setattr(threads, "usable_cores", lambda: 2)
    with compile_to_context(graphs, weights, be, num_threads=2) as ctx:
        ctx.graph().run({"x": np.ones((1, 8, 12, 12), np.float32)})
    assert all(v == 1 for limits in be.seen for k, v in limits.items()), be.seen  # OpenMP capped; BLAS beside it


def test_openmp_counts_are_the_cap_or_powers_of_two_below_it(monkeypatch) -> None:
    monkeypatch.setitem(threads._STATE, "openmp_cap", 8)
    assert [threads.openmp_count(n) for n in (1, 2, 3, 5, 7, 8, 12)] == [1, 2, 2, 4, 4, 8, 8]
    monkeypatch.setitem(threads._STATE, "openmp_cap", 6)
    assert [threads.openmp_count(n) for n in (1, 3, 5, 6, 9)] == [1, 2, 4, 6, 6]


def _onednn_kernels(ctx: ctxrt.Context) -> list:
    from ctxrt.backends.cpu.onednn.kernels import OneDnnKernel

    ks = [k for k in ctx.graph()._kernels if isinstance(k, OneDnnKernel)]
    assert ks, "no oneDNN kernels"
    return ks


def test_a_run_with_fewer_threads_runs_primitives_made_for_that_count(monkeypatch) -> None:
    """Made for 2 threads (a Conv's splits its work at creation and opens `omp parallel num_threads(2)` whatever
    OpenMP's limit): a 1-thread run (num_threads=1, or the default beside a busy core) makes each node's variant
    for 1 thread once, on first need, and runs it; the outputs are the same, and the cap of the process stays."""
    monkeypatch.setitem(threads._STATE, "openmp_cap", None)
    monkeypatch.setattr(threads, "usable_cores", lambda: 2)
    x = np.random.default_rng(1).standard_normal((1, 8, 12, 12)).astype(np.float32)
    be = SpyBackend()
    with ctxrt.compile(_model(), backend=be, num_threads=2) as ctx:
        want = ctx.graph().run({"x": x})["y"]
        kernels = _onednn_kernels(ctx)
        assert all(set(k._variants) == {2} for k in kernels)  # none made before a run needs it
        ctx.num_threads = 1
        be.seen.clear()
        for _ in range(2):
            got = ctx.graph().run({"x": x})["y"]
            np.testing.assert_array_equal(got, want)
        assert be.seen and all(v == 1 for limits in be.seen for v in limits.values())  # OpenMP and BLAS
        assert threads.openmp_now() == 0  # outside a run
        for k in kernels:
            assert k._variants[1] is not None and k._variants[1] is not k.prim, k.algorithm
        assert threads.openmp_cap() == 2  # a variant for 1 thread does not hold later runs to 1
        ctx.num_threads = 2
        np.testing.assert_array_equal(ctx.graph().run({"x": x})["y"], want)
        assert all(set(k._variants) == {1, 2} for k in kernels)


def test_a_variant_that_cannot_be_made_leaves_the_first_primitive_running(monkeypatch) -> None:
    from ctxrt.errors import UnsupportedOpError

    monkeypatch.setitem(threads._STATE, "openmp_cap", None)
    monkeypatch.setattr(threads, "usable_cores", lambda: 2)
    x = np.ones((1, 8, 12, 12), np.float32)
    with ctxrt.compile(_model(), backend=CpuBackend(onednn=True), num_threads=2) as ctx:
        want = ctx.graph().run({"x": x})["y"]
        kernels = _onednn_kernels(ctx)

        def refuse(n: int):
            raise UnsupportedOpError("no variant here")
        for k in kernels:
            monkeypatch.setattr(k, "_variant", refuse)
        ctx.num_threads = 1
        np.testing.assert_array_equal(ctx.graph().run({"x": x})["y"], want)
        assert all(k._variants.get(1, "absent") is None for k in kernels)


def _conv(c: int, hw: int) -> object:
    w = np.random.default_rng(1).standard_normal((c, c, 3, 3)).astype(np.float32) * 0.05
    g = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], "c",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, hw, hw])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, c, hw, hw])],
                          [numpy_helper.from_array(w, "w")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _convs(c: int, hw: int, count: int, batch: int | str = 1) -> object:
    """`count` 3x3 convs of c channels in a row, each under SMALL_WORK (c * c * 9 * hw * hw multiply-adds)."""
    rng = np.random.default_rng(1)
    ws = [numpy_helper.from_array(rng.standard_normal((c, c, 3, 3)).astype(np.float32) * 0.05, f"w{i}")
          for i in range(count)]
    nodes = [helper.make_node("Conv", ["x" if i == 0 else f"c{i - 1}", f"w{i}"], [f"c{i}" if i < count - 1 else "y"],
                              pads=[1, 1, 1, 1]) for i in range(count)]
    g = helper.make_graph(nodes, "c", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, c, hw, hw])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, c, hw, hw])], ws)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_splits_needs_work_and_work_per_kernel() -> None:
    from ctxrt.runtime import work

    assert not work.splits(work.SPLIT_TOTAL - 1, 1)  # too little work
    assert work.splits(work.SPLIT_TOTAL, 1)
    # a Qwen2-style decoder: 7.1 M multiply-adds over 175 steps (40 K each: a barrier each) stays on one thread
    assert not work.splits(7_100_000, 175)
    assert work.splits(9_500_000, 31)  # MobileNetV3 at batch 4: 31 steps of 305 K on average


@pytest.mark.parametrize(("model", "want"), [(_model, 1), (lambda: _conv(64, 56), 2), (lambda: _convs(32, 16, 4), 2)],
                         ids=["small", "large_conv", "many_medium_convs"])
def test_a_program_of_small_kernels_runs_on_one_thread_a_large_conv_on_the_idle_cores(monkeypatch, model,
                                                                                     want) -> None:
    monkeypatch.setitem(threads._STATE, "monitor", _Monitor(2))
    m = model()
    shape = [d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim]
    x = np.random.default_rng(2).standard_normal(shape).astype(np.float32)
    ctx = ctxrt.compile(m.SerializeToString(), backend=CpuBackend(onednn=True))
    g = ctx.graph()
    assert g.thread_cap == (1 if want == 1 else None)
    outputs = {}
    for n in (None, 1, 2):  # the default, then each count by hand: the same outputs
        ctx.num_threads = n
        outputs[n] = next(iter(g.run({"x": x}).values()))
        if n is None:
            assert ctx.threads.last == want
    tol = 1e-4 * np.abs(outputs[None]).max() + 1e-5  # another thread count sums in another order
    assert np.abs(outputs[1] - outputs[None]).max() <= tol and np.abs(outputs[2] - outputs[None]).max() <= tol
    ctx.free()


def test_a_token_s_gemvs_get_blas_threads_a_prompt_s_gemms_leave_them_to_openmp(monkeypatch) -> None:
    """A range program at one row runs its large GEMMs as GEMVs (memory-bound: faster on every idle core): the
    native GEMV on ctxrt's pool with the run's threads, or, without the extension, NumPy's, and that run gives BLAS
    the threads; at many rows they are oneDNN's, and BLAS keeps one thread (its workers would spin on the cores
    oneDNN's threads need). An embedding's Gather counts the rows it picks, not its table."""
    from ctxrt.backends.cpu import native
    from ctxrt.backends.cpu.onednn import api

    if not api.available():
        pytest.skip("oneDNN is not installed")

    monkeypatch.setitem(threads._STATE, "monitor", _Monitor(2))
    rng = np.random.default_rng(3)
    table = numpy_helper.from_array(rng.standard_normal((50000, 1024)).astype(np.float32), "table")
    w = numpy_helper.from_array((rng.standard_normal((1024, 4096)) / 32).astype(np.float32), "w")
    g = helper.make_graph([helper.make_node("Gather", ["table", "ids"], ["x"]),
                           helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                          [helper.make_tensor_value_info("ids", TensorProto.INT64, ["seq"])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["seq", 4096])], [table, w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    theirs = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    with ctxrt.InferenceSession(m.SerializeToString(), CpuBackend(onednn=True), dim_ranges={"seq": (1, 32)}) as sess:
        gemv_on_blas = native.library() is None
        for seq, blas in ((1, gemv_on_blas), (32, False), (1, gemv_on_blas)):
            ids = rng.integers(0, 50000, seq)
            np.testing.assert_allclose(sess.run(None, {"ids": ids})[0], theirs.run(None, {"ids": ids})[0],
                                       rtol=1e-4, atol=1e-4)
            ctx = next(iter(sess._variants.values())).contexts[0]
            assert ctx.threads.blas is blas, seq


def test_a_range_program_takes_the_idle_cores_at_the_batches_whose_kernels_together_pay() -> None:
    """Convs each under SMALL_WORK at every batch of the range: batch 1 (2.4 M multiply-adds) runs on one thread,
    batch 4 (9.4 M, 2.4 M a conv) on the idle cores; the outputs are onnxruntime's at both."""
    from ctxrt.runtime import work

    m = _convs(16, 16, 4, batch="n")
    one = 16 * 16 * 9 * 16 * 16  # a conv at batch 1
    assert 4 * one < work.SMALL_WORK and not work.splits(4 * one, 4) and work.splits(4 * 4 * one, 4)
    theirs = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(4)
    saved = threads._STATE.get("monitor")
    threads._STATE["monitor"] = _Monitor(2)
    try:
        with ctxrt.InferenceSession(m.SerializeToString(), CpuBackend(onednn=True), dim_ranges={"n": (1, 4)}) as sess:
            for n, want in ((1, 1), (4, 2), (1, 1)):
                x = rng.standard_normal((n, 16, 16, 16)).astype(np.float32)
                np.testing.assert_allclose(sess.run(None, {"x": x})[0], theirs.run(None, {"x": x})[0],
                                           rtol=1e-4, atol=1e-4)
                ctx = next(iter(sess._variants.values())).contexts[0]
                assert ctx.threads.last == want, n
    finally:
        threads._STATE["monitor"] = saved
