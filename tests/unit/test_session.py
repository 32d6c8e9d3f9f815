"""InferenceSession (DESIGN.md §8): onnxruntime's API, device tensors, the tensor cache and pinning,
asserted from counters; outputs against onnxruntime; on every backend."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import zoo
from harness import ITERATOR_BUFFER, run_in_threads, steady_state_allocation
from test_group import _mlp
from test_models import Run, assert_close

import ctxrt
from ctxrt.cli import main as cli
from ctxrt.errors import CtxrtError, LifecycleError, RegistrationError, ShapeError

SEQ = 16


@pytest.fixture(scope="module")
def bert():
    return zoo.bert_model(layers=2, hidden=64, heads=4, seq=SEQ)


@pytest.fixture
def mlp(tmp_path):
    model, fn = _mlp(16, 0)  # x[4, 16] -> y[4, 16]: input and output of one shape
    path = tmp_path / "mlp.onnx"
    path.write_bytes(model.SerializeToString())
    return path, fn


def _x(seed=0):
    return np.random.default_rng(seed).standard_normal((4, 16)).astype(np.float32)


def test_api_mirrors_onnxruntime(backend, squeezenet) -> None:
    path, feeds, want = squeezenet
    theirs = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    with ctxrt.InferenceSession(path, backend) as sess:
        for ours, ref in ((sess.get_inputs(), theirs.get_inputs()), (sess.get_outputs(), theirs.get_outputs())):
            assert [(a.name, a.shape, a.type) for a in ours] == [(b.name, b.shape, b.type) for b in ref]
        got = sess.run(None, feeds)
        assert isinstance(got, list) and len(got) == 1
        assert_close(Run(want, {"softmaxout_1": got[0]}, 0, 0))
        again = sess.run(["softmaxout_1"], feeds)[0]
        assert again is not got[0] and np.array_equal(again, got[0])  # a new array each run
        got[0][...] = 0
        assert np.array_equal(sess.run(None, feeds)[0], again)


@pytest.mark.parametrize("default_dim_max", [16, 0], ids=["range-program", "exact-shapes"])
def test_dynamic_dims_compile_once_and_reuse(backend, bert, default_dim_max) -> None:
    """No shapes given: get_inputs shows the symbolic dims. By default one compile (a range program) serves every
    shape, each new shape's kernels made once; with default_dim_max=0 each new shape compiles an exact-shape
    variant once. Either way a shape met again replays what was recorded for it and makes no tensor."""
    theirs = ort.InferenceSession(str(bert), providers=["CPUExecutionProvider"])
    with ctxrt.InferenceSession(bert, backend, default_dim_max=default_dim_max) as sess:
        assert [i.shape for i in sess.get_inputs()] == [["batch", "seq"], ["batch", "seq"]]
        created = []
        for seq, batch in [(16, 1), (8, 2), (16, 1), (8, 2), (16, 1)]:
            feeds = zoo.bert_feeds(seq, batch=batch)
            got = sess.run(None, feeds)
            want = theirs.run(None, feeds)
            assert_close(Run(dict(enumerate(want)), dict(enumerate(got)), 0, 0))
            created.append(sess.stats["tensors_created"])
        s = sess.stats
        ranged = default_dim_max > 0
        assert s["shape_variants_compiled"] == (1 if ranged else 2)
        assert s["range_programs_compiled"] == s["range_specializations"] / 2 == int(ranged)
        assert s["recordings"] == 2  # one per shape, replayed on every return to it
        assert created[2:] == [created[1]] * 3  # no tensor made once both shapes were seen
        assert s["tensor_cache_misses"] == created[-1]


def test_steady_loop_counters(backend, mlp) -> None:
    path, fn = mlp
    with ctxrt.InferenceSession(path, backend) as sess:
        sess.run(None, {"x": _x()})
        first = sess.stats
        assert first["tensors_created"] == first["tensor_cache_misses"] == 2
        assert first["recordings"] == 1 and first["plans"] == 1
        for k in range(10):
            y = sess.run(None, {"x": _x(k)})[0]
            np.testing.assert_allclose(y, fn(_x(k)), rtol=1e-4, atol=1e-5)
        s = sess.stats
        assert s["tensors_created"] == 2 and s["tensor_cache_hits"] == 20
        assert s["recordings"] == 1 and s["plans"] == 1 and s["mem_handles_registered"] == 2
        assert s["copies_in"] == s["copies_out"] == 11
        assert s["alloc_io_bytes"] == 0  # compiled with memhandle IO: no internal IO buffers
        assert s["tensor_cache_bytes_held"] == 2 * 4 * 16 * 4


def test_without_pinning_or_cache_tensors_and_recordings_churn(backend, mlp) -> None:
    path, fn = mlp
    with ctxrt.InferenceSession(path, backend, enable_pinning=False) as sess:
        for k in range(6):
            np.testing.assert_allclose(sess.run(None, {"x": _x(k)})[0], fn(_x(k)), rtol=1e-4, atol=1e-5)
        s = sess.stats
        assert s["tensors_created"] == 2  # still cached...
        assert s["recordings"] > 3  # ...but input and output swap tensors, so the graph re-records
    with ctxrt.InferenceSession(path, backend, enable_tensor_cache=False) as sess:
        for k in range(6):
            np.testing.assert_allclose(sess.run(None, {"x": _x(k)})[0], fn(_x(k)), rtol=1e-4, atol=1e-5)
        s = sess.stats
        assert s["tensors_created"] == s["tensors_destroyed"] == 12 and s["recordings"] == 6
        assert s["tensor_cache_bytes_held"] == 0


def test_io_binding_with_tensors_copies_nothing(backend, squeezenet) -> None:
    path, feeds, want = squeezenet
    with ctxrt.InferenceSession(path, backend) as sess:
        b = sess.io_binding()
        x = ctxrt.Tensor.from_numpy(feeds["data_0"], sess)
        y = ctxrt.Tensor.empty((1, 1000, 1, 1), np.float32, sess)
        assert (x.shape, x.dtype, y.nbytes) == ((1, 3, 224, 224), np.float32, 4000)
        b.bind_input("data_0", x)
        b.bind_output("softmaxout_1", y)
        for _ in range(3):
            sess.run_with_iobinding(b)
        assert b.get_outputs()[0] is y
        assert_close(Run(want, {"softmaxout_1": y.numpy()}, 0, 0))
        s = sess.stats
        assert s["copies_in"] == s["copies_out"] == s["bytes_in"] == s["bytes_out"] == 0
        assert s["tensors_created"] == 0 and s["recordings"] == 1
        # an ndarray input and a session-made output: copied in, pinned, read back with get_outputs()
        b.bind_input("data_0", feeds["data_0"])
        b.bind_output("softmaxout_1")
        sess.run_with_iobinding(b)
        sess.run_with_iobinding(b)
        out = b.copy_outputs_to_cpu()[0]
        assert_close(Run(want, {"softmaxout_1": out}, 0, 0))
        s = sess.stats
        assert s["copies_in"] == 2 and s["tensors_created"] == 2 and s["recordings"] == 2


def test_steady_state_allocates_nothing_beyond_results(backend, squeezenet) -> None:
    """Measured against the bare graph execute on the same handles (its kernels' transient NumPy buffers
    are not the session's): run adds the returned array and a few small objects, bound Tensors nothing."""
    path, feeds, _ = squeezenet
    with ctxrt.InferenceSession(path, backend) as sess:
        peak, growth = steady_state_allocation(lambda: sess.run(None, feeds), tries=3)
        assert growth < 2048
        assert peak < 4000 + ITERATOR_BUFFER  # the returned 1000-float array and NumPy's small buffers
        run_peak = peak
        b = sess.io_binding()
        x = ctxrt.Tensor.from_numpy(feeds["data_0"], sess)
        y = ctxrt.Tensor.empty((1, 1000, 1, 1), np.float32, sess)
        b.bind_input("data_0", x)
        b.bind_output("softmaxout_1", y)
        created = sess.stats["tensors_created"]
        peak, growth = steady_state_allocation(lambda: sess.run_with_iobinding(b), tries=3)
        assert growth < 1024 and peak < ITERATOR_BUFFER
        assert sess.stats["tensors_created"] == created
        (ctx,), graph = sess._current.contexts, sess._current.stages[0].graph
        ins, outs = {"data_0": x.handle(ctx)}, {"softmaxout_1": y.handle(ctx)}
        bare, _ = steady_state_allocation(lambda: graph.execute(ins, outs), tries=3)
        assert peak - bare < 1024  # counters' ints only: no tensor, dict, list or array per run
        assert run_peak - bare < 4000 + 2048  # the result (1000 floats) + its list and ndarray header
        assert sess.stats["recordings"] == 2  # one for the cached tensors, one for the bound ones


def test_binding_per_run_reuses_tensors(backend, mlp) -> None:
    """A new IOBinding every iteration (usual with onnxruntime): a deleted binding's session tensors go
    back to the cache at the next run, so nothing is created after the first iteration."""
    path, fn = mlp
    with ctxrt.InferenceSession(path, backend) as sess:
        for k in range(10):
            b = sess.io_binding()
            b.bind_input("x", _x(k))
            b.bind_output("y")
            sess.run_with_iobinding(b)
            np.testing.assert_allclose(b.copy_outputs_to_cpu()[0], fn(_x(k)), rtol=1e-4, atol=1e-5)
            del b
        s = sess.stats
        assert s["tensors_created"] == 2 and s["bindings_returned"] == 9
        assert s["tensor_cache_bytes_held"] == 2 * 4 * 16 * 4 and s["recordings"] == 1
        b = sess.io_binding()  # kept: its output tensor stays its own while it lives
        b.bind_input("x", _x(1))
        b.bind_output("y")
        sess.run_with_iobinding(b)
        held = b.get_outputs()[0]
        sess.run(None, {"x": _x(2)})
        np.testing.assert_allclose(held.numpy(), fn(_x(1)), rtol=1e-4, atol=1e-5)
        # the binding keeps its output tensor, its input copy went back at once: run makes one tensor
        assert sess.stats["tensors_created"] == 3


def test_run_takes_session_tensors_as_feeds(backend, mlp) -> None:
    """run() binds a Tensor feed in place (as onnxruntime's run takes an OrtValue): no copy in."""
    path, fn = mlp
    with ctxrt.InferenceSession(path, backend) as sess, ctxrt.InferenceSession(path, backend) as other:
        x = ctxrt.Tensor.from_numpy(_x(3), sess)
        for _ in range(3):
            np.testing.assert_allclose(sess.run(None, {"x": x})[0], fn(_x(3)), rtol=1e-4, atol=1e-5)
        s = sess.stats
        assert s["copies_in"] == 0 and s["copies_out"] == 3
        assert s["tensors_created"] == 1 and s["recordings"] == 1  # only the output came from the cache
        assert s["tensor_cache_bytes_held"] == 4 * 16 * 4  # the user's Tensor is not the cache's
        np.testing.assert_allclose(sess.run(None, {"x": _x(4)})[0], fn(_x(4)), rtol=1e-4, atol=1e-5)
        assert sess.stats["recordings"] == 2 and sess.stats["tensors_created"] == 2
        with pytest.raises(RegistrationError, match="another session"):
            sess.run(None, {"x": ctxrt.Tensor.from_numpy(_x(), other)})
        with pytest.raises(ShapeError, match=r"expects float32\[4, 16\], got .*float32\[2, 16\]"):
            sess.run(None, {"x": ctxrt.Tensor.empty((2, 16), np.float32, sess)})
        x.destroy()
        with pytest.raises(LifecycleError, match="destroyed"):
            sess.run(None, {"x": x})


def test_failed_run_returns_its_tensors(backend, mlp, monkeypatch) -> None:
    """An allocation failing halfway through a run leaves no tensor lent: the next run reuses them."""
    path, fn = mlp
    with ctxrt.InferenceSession(path, backend) as sess:
        real, calls = sess.backend.alloc_shared, []

        def alloc_once(nbytes, alignment):
            calls.append(nbytes)
            if len(calls) > 1:
                raise MemoryError("device out of memory")
            return real(nbytes, alignment)

        monkeypatch.setattr(sess.backend, "alloc_shared", alloc_once)
        with pytest.raises(MemoryError):
            sess.run(None, {"x": _x()})  # the input tensor is made, the output's allocation fails
        monkeypatch.undo()
        s = sess.stats
        assert s["tensors_created"] == 1 and s["tensor_cache_bytes_held"] == 4 * 16 * 4
        assert not sess._cache._lent  # nothing stays lent to the failed run
        np.testing.assert_allclose(sess.run(None, {"x": _x(1)})[0], fn(_x(1)), rtol=1e-4, atol=1e-5)
        s = sess.stats
        assert s["tensors_created"] == 2 and s["tensor_cache_hits"] == 1


def test_close_releases_every_tensor(backend, mlp) -> None:
    path, _ = mlp
    sess = ctxrt.InferenceSession(path, backend)
    sess.run(None, {"x": _x()})
    mine = ctxrt.Tensor.empty((4, 16), np.float32, sess)
    b = sess.io_binding()
    b.bind_input("x", mine)
    sess.run_with_iobinding(b)
    assert sess.stats["tensor_cache_bytes_held"] > 0
    sess.close()
    s = sess.stats
    assert s["tensor_cache_bytes_held"] == 0 and s["tensors_destroyed"] == s["tensors_created"]
    assert s["mem_handles_deregistered"] == s["mem_handles_registered"]
    assert mine.destroyed and mine.buffer.released
    with pytest.raises(LifecycleError, match="session is closed"):
        sess.run(None, {"x": _x()})
    with pytest.raises(LifecycleError, match="destroyed"):
        mine.numpy()
    sess.close()  # twice is harmless


def test_byte_cap_evicts_least_recently_used(backend, bert) -> None:
    one = 2 * 16 * 8 + 16 * 64 * 4 + 64 * 4  # ids, mask, last_hidden_state, pooler at seq 16
    # exact-shape variants: a range program run on arrays makes no session tensor per shape
    with ctxrt.InferenceSession(bert, backend, tensor_cache_bytes=one, default_dim_max=0) as sess:
        sess.run(None, zoo.bert_feeds(16))
        assert sess.stats["tensors_evicted"] == 0 and sess.stats["tensor_cache_bytes_held"] == one
        sess.run(None, zoo.bert_feeds(8))  # other shapes: the seq-16 tensors are the least recently used
        s = sess.stats
        assert s["tensors_evicted"] >= 3 and s["tensor_cache_bytes_held"] <= one
        sess.run(None, zoo.bert_feeds(16))  # made again
        assert sess.stats["tensors_created"] > s["tensors_created"]


def test_errors_are_clear(backend, mlp, squeezenet, tmp_path) -> None:
    path, _ = mlp
    with ctxrt.InferenceSession(path, backend) as sess, ctxrt.InferenceSession(path, backend) as other:
        with pytest.raises(ShapeError, match=r"missing \['x'\], unknown \['z'\]"):
            sess.run(None, {"z": _x()})
        with pytest.raises(ShapeError, match="expects float32"):
            sess.run(None, {"x": _x().astype(np.float64)})
        with pytest.raises(ShapeError, match="no output 'nope'"):
            sess.run(["nope"], {"x": _x()})
        b = sess.io_binding()
        with pytest.raises(RegistrationError, match="another session"):
            b.bind_input("x", ctxrt.Tensor.empty((4, 16), np.float32, other))
        with pytest.raises(ShapeError, match="no input 'q'"):
            b.bind_input("q", _x())
        with pytest.raises(ShapeError, match="inputs not bound"):
            sess.run_with_iobinding(b)
        with pytest.raises(RegistrationError, match="another session"):
            other.run_with_iobinding(b)
        with pytest.raises(ShapeError, match="Tensor or None"):
            b.bind_output("y", _x())
    ctx = tmp_path / "sq.ctx"
    assert cli(["compile", str(squeezenet[0]), "-o", str(ctx), "--backend", backend]) == 0
    with ctxrt.InferenceSession(ctx, backend) as sess, pytest.raises(ShapeError, match="fixed shapes"):
        sess.run(None, {"data_0": np.zeros((2, 3, 224, 224), np.float32)})
    with pytest.raises(CtxrtError, match="no such model file"):
        ctxrt.InferenceSession(tmp_path / "missing.onnx", backend)
    with ctxrt.InferenceSession(path, backend) as sess:  # an ONNX model with fixed dims: named, not compiled
        with pytest.raises(ShapeError, match=r"input 'x' expects float32\[4, 16\], got float32\[3, 16\]"):
            sess.run(None, {"x": np.zeros((3, 16), np.float32)})
        with pytest.raises(ShapeError, match=r"expects float32\[4, 16\], got float32\[4\]"):
            sess.run(None, {"x": np.zeros(4, np.float32)})
        assert sess.stats["shape_variants_compiled"] == 0
        b = sess.io_binding()
        t = ctxrt.Tensor.empty((4, 16), np.float32, sess)
        b.bind_input("x", t)
        b.bind_output("y", ctxrt.Tensor.empty((2, 16), np.float32, sess))
        with pytest.raises(ShapeError, match=r"output 'y' expects float32\[4, 16\], got a Tensor"):
            sess.run_with_iobinding(b)
        b.bind_output("y")
        t.destroy()
        with pytest.raises(LifecycleError, match=r"destroy\(\) was called"):
            sess.run_with_iobinding(b)


@pytest.mark.parametrize("kind", ["ctx-raw", "ctx-memhandle", "epcontext", "split", "onnx-bytes", "ctx-bytes"])
def test_every_model_source(backend, squeezenet, kind, tmp_path, capsys) -> None:
    path, feeds, want = squeezenet
    ctx = tmp_path / "sq.ctx"
    if kind == "split":
        assert cli(["compile", str(path), "--split", "2", "-o", str(tmp_path / "s"), "--backend", backend]) == 0
        source = tmp_path / "s" / f"{path.stem}_ctx.onnx"
    elif kind == "onnx-bytes":
        source = path.read_bytes()
    else:
        mem = "memhandle" if kind == "ctx-memhandle" else "raw"
        assert cli(["compile", str(path), "-o", str(ctx), "--io-mem-type", mem, "--epcontext",
                    "--backend", backend]) == 0
        source = {"epcontext": tmp_path / "sq_ctx.onnx", "ctx-bytes": ctx.read_bytes()}.get(kind, ctx)
    with ctxrt.InferenceSession(source, backend) as sess:
        for _ in range(3):
            got = sess.run(None, feeds)[0]
        assert_close(Run(want, {"softmaxout_1": got}, 0, 0))
        s = sess.stats
        assert s["tensors_created"] == 2 and s["copies_in"] == 3
        # once per graph for the session's tensors, then replayed (+1 at finalize when prepared raw)
        assert s["recordings"] == {"ctx-memhandle": 1, "onnx-bytes": 1}.get(kind, 2)
        assert s["lazy_allocs"] == 0  # the session binds tensors: never a raw run


def test_compile_cache_dir(backend, mlp, tmp_path) -> None:
    path, fn = mlp
    cache = tmp_path / "cache"
    with ctxrt.InferenceSession(path, backend, cache_dir=cache) as sess:
        assert sess.stats["compile_cache_misses"] == 1
    files = list(cache.glob("*.ctx"))
    assert len(files) == 1
    mtime = files[0].stat().st_mtime_ns
    with ctxrt.InferenceSession(path, backend, cache_dir=cache) as sess:
        assert sess.stats["compile_cache_hits"] == 1 and sess.stats["compile_cache_misses"] == 0
        np.testing.assert_allclose(sess.run(None, {"x": _x()})[0], fn(_x()), rtol=1e-4, atol=1e-5)
    assert files[0].stat().st_mtime_ns == mtime
    for hits in (0, 1):  # other options, another entry; then a hit on it
        with ctxrt.InferenceSession(path, backend, cache_dir=cache, shapes={"x": (4, 16)}) as sess:
            assert sess.stats["compile_cache_hits"] == hits
    assert len(list(cache.glob("*.ctx"))) == 2
    files[0].write_bytes(files[0].read_bytes()[:100])  # a damaged entry is compiled again and replaced
    with ctxrt.InferenceSession(path, backend, cache_dir=cache) as sess:
        assert sess.stats["compile_cache_damaged"] == 1 and sess.stats["compile_cache_misses"] == 1
        np.testing.assert_allclose(sess.run(None, {"x": _x()})[0], fn(_x()), rtol=1e-4, atol=1e-5)


def test_one_session_from_threads(backend, squeezenet) -> None:
    path, _, _ = squeezenet
    theirs = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    inputs = [np.random.default_rng(k).standard_normal((1, 3, 224, 224)).astype(np.float32) for k in range(4)]
    wants = [theirs.run(None, {"data_0": x})[0] for x in inputs]
    with ctxrt.InferenceSession(path, backend) as sess:
        def work(k: int) -> None:
            for _ in range(5):
                got = sess.run(None, {"data_0": inputs[k]})[0]
                assert_close(Run({"y": wants[k]}, {"y": got}, 0, 0))

        run_in_threads(work, 4)
        assert sess.stats["session_runs"] == 20 and sess.stats["tensors_created"] == 2

        def mixed(k: int) -> None:  # run and each thread's own binding, interleaved
            b = sess.io_binding()
            b.bind_input("data_0", inputs[k] if k % 2 else ctxrt.Tensor.from_numpy(inputs[k], sess))
            b.bind_output("softmaxout_1")
            for _ in range(4):
                sess.run_with_iobinding(b)
                assert_close(Run({"y": wants[k]}, {"y": b.copy_outputs_to_cpu()[0]}, 0, 0))
                assert_close(Run({"y": wants[k]}, {"y": sess.run(None, {"data_0": inputs[k]})[0]}, 0, 0))

        run_in_threads(mixed, 4)
        assert sess.stats["session_runs"] == 20 + 32


def test_shape_variants_are_bounded(backend, bert) -> None:
    theirs = ort.InferenceSession(str(bert), providers=["CPUExecutionProvider"])
    with ctxrt.InferenceSession(bert, backend, max_shape_variants=1, default_dim_max=0) as sess:
        for seq in (16, 8, 16):
            feeds = zoo.bert_feeds(seq)
            assert_close(Run(dict(enumerate(theirs.run(None, feeds))), dict(enumerate(sess.run(None, feeds))), 0, 0))
        s = sess.stats
        assert s["shape_variants_compiled"] == 3 and s["shape_variants_freed"] == 2
        assert s["recordings"] == 3  # counters of freed variants are kept
        # a user's Tensors outlive the variants they were bound to: registered again in the new context, the
        # freed context's handles let go
        f16 = zoo.bert_feeds(16)
        ts = {k: ctxrt.Tensor.from_numpy(v, sess) for k, v in f16.items()}
        want = dict(enumerate(theirs.run(None, f16)))
        for seq in (16, 8, 16):
            got = sess.run(None, ts if seq == 16 else zoo.bert_feeds(8))
            if seq == 16:
                assert_close(Run(want, dict(enumerate(got)), 0, 0))
        assert all(len(t._handles) == 1 and next(iter(t._handles.values())).registered for t in ts.values())
    with pytest.raises(CtxrtError, match="max_shape_variants"):
        ctxrt.InferenceSession(bert, backend, max_shape_variants=0)
