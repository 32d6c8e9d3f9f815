"""InferenceSession's exact-shape variants (what default_dim_max=0, or a model that cannot be a range program,
compiles; range programs: test_ranges.py): every variant shares one copy of the model's weights (in
memory and in `cache_dir`), the compile cache's key covers external-data files and options, freed variants
leave nothing behind in the tensor cache, and a session that keeps compiling says so once; on every backend."""

from __future__ import annotations

import gc
import os
import tracemalloc
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import ctxrt
from ctxrt.backends import get_backend
from ctxrt.backends.cpu.backend import CpuBackend
from ctxrt.backends.cpu.onednn import api as onednn_api
from ctxrt.errors import CtxrtWarning, FormatError
from ctxrt.format import KERNELS, read_head, read_metadata

WIDTH, HIDDEN = 64, 256
DOMAIN = np.lib.tracemalloc_domain


def _mlp(seed: int = 0) -> onnx.ModelProto:
    """x[batch, 64] -> MatMul(64 x 256) + b -> Relu -> MatMul(256 x 64): 129 KiB of weights, batch dynamic."""
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array((rng.standard_normal((WIDTH, HIDDEN)) / 8).astype(np.float32), "w1"),
             numpy_helper.from_array(rng.standard_normal(HIDDEN).astype(np.float32), "b1"),
             numpy_helper.from_array((rng.standard_normal((HIDDEN, WIDTH)) / 16).astype(np.float32), "w2")]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Add", ["h", "b1"], ["hb"]),
             helper.make_node("Relu", ["hb"], ["r"]), helper.make_node("MatMul", ["r", "w2"], ["y"])]
    g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", WIDTH])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", WIDTH])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _cnn() -> onnx.ModelProto:
    """x[batch, 16, 12, 12] -> Conv 3x3 (32) -> Relu -> Conv 3x3 (32): kernels that prepack their weights."""
    rng = np.random.default_rng(1)
    inits = [numpy_helper.from_array((rng.standard_normal((32, 16, 3, 3)) / 12).astype(np.float32), "k1"),
             numpy_helper.from_array((rng.standard_normal((32, 32, 3, 3)) / 17).astype(np.float32), "k2")]
    nodes = [helper.make_node("Conv", ["x", "k1"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Conv", ["r", "k2"], ["y"], pads=[1, 1, 1, 1])]
    g = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16, 12, 12])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _x(batch: int, shape: tuple[int, ...] = (WIDTH,)) -> np.ndarray:
    return np.random.default_rng(batch).standard_normal((batch, *shape)).astype(np.float32)


def _write(model: onnx.ModelProto, path, external: bool = False):
    if external:  # onnx appends to an existing data file: start it afresh
        (path.parent / f"{path.name}.data").unlink(missing_ok=True)
        onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                        location=f"{path.name}.data", size_threshold=0)
    else:
        path.write_bytes(model.SerializeToString())
    return path


def _backends(backend: str) -> list:
    """The backend, and on the CPU each kernel choice that makes other prepacked constants (NumPy's Winograd
    and transposed weights, oneDNN's reordered ones)."""
    if backend != "cpu":
        return [backend]
    return [CpuBackend(onednn=False)] + ([CpuBackend(onednn=True)] if onednn_api.available() else [])


def _ort(path, x: np.ndarray) -> np.ndarray:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
def test_variants_share_one_copy_of_the_weights(backend, kind, tmp_path) -> None:
    """Six batch sizes, six variants: the weights (initializers and kernels' prepacked constants) stay 1x."""
    path = _write(_mlp() if kind == "mlp" else _cnn(), tmp_path / f"{kind}.onnx")
    shape = (WIDTH,) if kind == "mlp" else (16, 12, 12)
    for be in _backends(backend):
        with ctxrt.InferenceSession(path, be, max_shape_variants=10, default_dim_max=0) as sess:
            sess.run(None, {"x": _x(1, shape)})
            one = sess.stats
            for batch in range(2, 7):
                got = sess.run(None, {"x": _x(batch, shape)})[0]
                np.testing.assert_allclose(got, _ort(path, _x(batch, shape)), rtol=1e-4, atol=1e-4)
            s = sess.stats
            assert s["shape_variants_compiled"] == 6 and s["shape_variants_freed"] == 0
            assert one["weights_bytes"] >= (54 << 10 if kind == "cnn" else 129 << 10)
            assert s["weights_bytes"] == one["weights_bytes"]
            assert s["weights_prepacked_bytes"] == one["weights_prepacked_bytes"]
            assert s["weights_stored"] == one["weights_stored"] and s["weights_shared"] == 5 * one["weights_stored"]
            assert s["alloc_weights_bytes"] == one["alloc_weights_bytes"]  # OpenCL: uploaded once
            assert s["weights_uploaded_bytes"] == one["weights_uploaded_bytes"]
            if kind == "cnn" and backend == "cpu":  # Winograd's or oneDNN's weights, made at compile time
                assert one["weights_prepacked_bytes"] > 0
        assert sess.stats["weights_bytes"] == 0 and sess._compiler.store.nbytes == 0  # closed: all let go


def test_cache_dir_stores_the_weights_once(backend, tmp_path) -> None:
    path, cache = _write(_mlp(), tmp_path / "mlp.onnx"), tmp_path / "cache"
    weights = 2 * WIDTH * HIDDEN * 4  # w1 and w2 (b1, under 4 KiB, stays inside each binary)
    with ctxrt.InferenceSession(path, backend, cache_dir=cache, max_shape_variants=10, default_dim_max=0) as sess:
        for batch in range(1, 6):
            sess.run(None, {"x": _x(batch)})
        s = sess.stats
    binaries = sorted(cache.glob("*.ctx"))
    kernels = sum(s.length for b in binaries for k, s in read_head(b).sections.items() if k == KERNELS)  # OpenCL
    total = sum(f.stat().st_size for f in cache.rglob("*") if f.is_file()) - kernels
    assert len(binaries) == 5 and total < weights + 5 * (16 << 10)  # before: five full copies of the weights
    assert len(list(cache.glob("*.value_inputs.json"))) == 1  # the model's value inputs: one file
    blobs = sorted((cache / "weights").glob("*.bin"))
    assert sum(b.stat().st_size for b in blobs) == weights
    assert s["compile_cache_misses"] == 5 and s["weights_written_bytes"] == weights
    assert s["weights_bytes"] < weights + (8 << 10)
    for b in binaries:
        meta = read_metadata(b)
        assert meta["format_version"] == 2 and len(meta["external_weights"]) == 2
    with pytest.raises(FormatError, match="kept outside it"):
        ctxrt.context_from_binary(binaries[0], backend)
    with ctxrt.InferenceSession(path, backend, cache_dir=cache, max_shape_variants=10, default_dim_max=0) as sess:
        for batch in range(1, 6):
            np.testing.assert_allclose(sess.run(None, {"x": _x(batch)})[0], _ort(path, _x(batch)), rtol=1e-4,
                                       atol=1e-4)
        s = sess.stats
        assert s["compile_cache_hits"] == 5 and s["compile_cache_misses"] == 0 and s["weights_written_bytes"] == 0
        assert s["weights_stored"] == 2 and s["weights_bytes"] < weights + (8 << 10)
    blobs[0].write_bytes(blobs[0].read_bytes()[:-4] + b"\0\0\0\1")  # a damaged weight: compiled and written again
    with ctxrt.InferenceSession(path, backend, cache_dir=cache, default_dim_max=0) as sess:
        np.testing.assert_allclose(sess.run(None, {"x": _x(2)})[0], _ort(path, _x(2)), rtol=1e-4, atol=1e-4)
        assert sess.stats["compile_cache_damaged"] == 1 and 0 < sess.stats["weights_written_bytes"] < weights


def test_cache_dir_key_covers_external_data_and_options(backend, tmp_path) -> None:
    """Changing the external weights file (same size, mtime put back) gives a new entry: the new outputs."""
    path, cache = _write(_mlp(0), tmp_path / "ext.onnx", external=True), tmp_path / "cache"
    data = tmp_path / "ext.onnx.data"
    assert data.is_file() and path.stat().st_size < 1024
    with ctxrt.InferenceSession(path, backend, cache_dir=cache, default_dim_max=0) as sess:
        np.testing.assert_allclose(sess.run(None, {"x": _x(2)})[0], _ort(path, _x(2)), rtol=1e-4, atol=1e-4)
    before, model = data.stat(), path.read_bytes()
    _write(_mlp(1), tmp_path / "ext.onnx", external=True)  # other weights, same names and sizes
    os.utime(data, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert path.read_bytes() == model and data.stat().st_size == before.st_size  # only the weights file changed
    want = _ort(path, _x(2))
    with ctxrt.InferenceSession(path, backend, cache_dir=cache, default_dim_max=0) as sess:
        got = sess.run(None, {"x": _x(2)})[0]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)  # before: the old weights' outputs
        assert sess.stats["compile_cache_misses"] == 1 and sess.stats["compile_cache_hits"] == 0
    with ctxrt.InferenceSession(path, backend, cache_dir=cache, default_dim_max=0) as sess:
        np.testing.assert_allclose(sess.run(None, {"x": _x(2)})[0], want, rtol=1e-4, atol=1e-4)
        assert sess.stats["compile_cache_hits"] == 1
    if backend == "cpu":  # another backend configuration is another entry
        with ctxrt.InferenceSession(path, CpuBackend(layout="nChw8c"), cache_dir=cache) as sess:
            sess.run(None, {"x": _x(2)})
            assert sess.stats["compile_cache_misses"] == 1


def test_cache_dir_hashes_an_unchanged_model_once_across_processes(tmp_path, monkeypatch) -> None:
    """A warm cache's session reads the model's digest from the folder's memo (compile_cache.DIGESTS) instead of
    hashing it again in each process, while the files' size, times, inode and device are unchanged; a file written
    within RACY_NS of its hashing is not kept (a change within the clock's resolution could keep its stamp); a
    rewrite of the same size with its mtime put back changes its ctime: hashed again, the new outputs."""
    from ctxrt.runtime import compile_cache

    path, cache = _write(_mlp(0), tmp_path / "ext.onnx", external=True), tmp_path / "cache"
    data = tmp_path / "ext.onnx.data"

    def session_run() -> tuple[np.ndarray, int]:
        with ctxrt.InferenceSession(path, "cpu", cache_dir=cache, default_dim_max=0) as sess:
            return sess.run(None, {"x": _x(2)})[0], sess.stats["compile_cache_bytes_hashed"]
    out, hashed = session_run()  # just written: hashed, not remembered
    assert hashed > 0 and not (cache / compile_cache.DIGESTS).exists()
    assert session_run()[1] > 0
    monkeypatch.setattr(compile_cache, "RACY_NS", 0)  # as if the files were written long ago
    assert session_run()[1] > 0  # hashed, and now remembered
    assert (cache / compile_cache.DIGESTS).is_file()
    again, hashed = session_run()  # a new session, as a new process: nothing hashed
    assert hashed == 0
    np.testing.assert_array_equal(again, out)
    before = data.stat()
    _write(_mlp(1), tmp_path / "ext.onnx", external=True)  # other weights, same size, mtime put back
    os.utime(data, ns=(before.st_atime_ns, before.st_mtime_ns))
    got, hashed = session_run()
    assert hashed > 0
    np.testing.assert_allclose(got, _ort(path, _x(2)), rtol=1e-4, atol=1e-4)


def test_a_warm_cache_dir_session_does_not_parse_the_model(tmp_path, monkeypatch) -> None:
    """With cache_dir, what a session reads of the model before compiling (its declared IO, whether it holds
    EPContext nodes) is kept under the model's key: a new session finds it there without parsing the model, with
    the same get_inputs/get_outputs; a damaged memo is computed again."""
    from ctxrt.frontend import epcontext, io_types
    from ctxrt.runtime import compile_cache

    monkeypatch.setattr(compile_cache, "RACY_NS", 0)
    path, cache = _write(_mlp(0), tmp_path / "m.onnx"), tmp_path / "cache"

    def shapes(sess: ctxrt.InferenceSession) -> list:
        return [(t.name, t.type, t.shape) for t in [*sess.get_inputs(), *sess.get_outputs()]]
    with ctxrt.InferenceSession(path, "cpu", cache_dir=cache, default_dim_max=0) as sess:
        want, out = shapes(sess), sess.run(None, {"x": _x(2)})[0]
    assert len(list(cache.glob("*.io.json"))) == len(list(cache.glob("*.epcontext.json"))) == 1

    def parsed(*a, **k):
        raise AssertionError("the model was parsed")
    with monkeypatch.context() as m:
        m.setattr(io_types, "declared_io", parsed)
        m.setattr(epcontext, "is_epcontext", parsed)
        with ctxrt.InferenceSession(path, "cpu", cache_dir=cache, default_dim_max=0) as sess:
            assert shapes(sess) == want
            np.testing.assert_array_equal(sess.run(None, {"x": _x(2)})[0], out)
    for memo in cache.glob("*.io.json"):
        memo.write_text('{"value": [[["x", 7, []]], []]}')  # not a memo of declared_io's
    with ctxrt.InferenceSession(path, "cpu", cache_dir=cache, default_dim_max=0) as sess:
        assert shapes(sess) == want
    for memo in [*cache.glob("*.io.json"), *cache.glob("*.epcontext.json"), *cache.glob("*.value_inputs.json"),
                 cache / compile_cache.DIGESTS]:
        memo.write_text("[" * 100_000)  # nested past the JSON reader's recursion: computed again, no crash
    with ctxrt.InferenceSession(path, "cpu", cache_dir=cache, default_dim_max=0) as sess:
        assert shapes(sess) == want
        np.testing.assert_array_equal(sess.run(None, {"x": _x(2)})[0], out)


def _numpy_held() -> int:
    snap = tracemalloc.take_snapshot().filter_traces([tracemalloc.DomainFilter(True, DOMAIN)])
    return sum(s.size for s in snap.statistics("filename"))


def test_freed_variants_leave_nothing_behind(backend, tmp_path) -> None:
    """Variants come and go (two kept): the tensor cache holds only tensors of kept variants, no tensor keeps a
    freed context's handle, the weights of freed variants are let go, and close() returns the rest."""
    path = _write(_mlp(), tmp_path / "mlp.onnx")
    n = 100 if backend == "cpu" else 24
    # process-wide caches filled first
    with ctxrt.InferenceSession(path, backend, max_shape_variants=2, default_dim_max=0) as warm:
        warm.run(None, {"x": _x(1)})
    gc.collect()
    tracemalloc.start()
    try:
        start = _numpy_held()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", CtxrtWarning)
            sess = ctxrt.InferenceSession(path, backend, max_shape_variants=2, default_dim_max=0)
            mine = ctxrt.Tensor.from_numpy(_x(5), sess)  # a user's tensor, bound to variants that are freed
            held = []
            for batch in [*range(3, 11), 1, 2, *range(11, n + 1), 1, 2]:
                feed = mine if batch == 5 else _x(batch)
                np.testing.assert_allclose(sess.run(None, {"x": feed})[0], _ort(path, _x(batch)), rtol=1e-4,
                                           atol=1e-4)
                if batch == 2:  # the same two variants kept: held memory compared
                    gc.collect()
                    held.append(_numpy_held())
        # what stays allocated does not grow with the variants that came and went (before: each freed
        # variant's weights and the tensors cached for it stayed, >= 130 KiB a variant)
        assert held[1] - held[0] < 16 << 10, held
        s = sess.stats
        assert s["tensor_cache_bytes_held"] == 2 * (1 + 2) * WIDTH * 4  # x and y of batches 1 and 2
        assert s["shape_variants_compiled"] == n + 2 and s["shape_variants_freed"] == n
        assert s["tensor_cache_stale_handles"] == 0 and s["tensors_pruned"] > 0
        live = set().union(*(v.io_keys() for v in sess._variants.values()))
        cache = sess._cache
        assert {(t.shape, t.dtype.str) for t in cache._free.values()} <= live and not cache._lent
        assert not any(not h.registered for h in mine._handles.values())
        store = sess._compiler.store
        assert s["weights_bytes"] == store.nbytes < 2 * (129 << 10)  # what the two kept variants read
        sess.close()
        gc.collect()
        s = sess.stats
        assert s["weights_bytes"] == 0 and store.nbytes == 0 and s["weights_released"] == s["weights_stored"]
        assert _numpy_held() - start < 16 << 10, _numpy_held() - start
    finally:
        tracemalloc.stop()


def test_a_session_that_keeps_compiling_warns_once(backend, tmp_path) -> None:
    path = _write(_mlp(), tmp_path / "mlp.onnx")
    with ctxrt.InferenceSession(path, get_backend(backend), default_dim_max=0) as sess, \
            warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for batch in range(1, 13):
            sess.run(None, {"x": _x(batch)})
            if batch == 7:
                assert not [w for w in seen if issubclass(w.category, CtxrtWarning)]
    said = [str(w.message) for w in seen if issubclass(w.category, CtxrtWarning)]
    assert len(said) == 1, said
    assert "compiled 8 shape variants" in said[0] and "input 'x' axis 0 (batch) took 8 sizes from 1 to 8" in said[0]
    assert "shapes={'x': [8, 64]}" in said[0] and "max_shape_variants=4" in said[0]
