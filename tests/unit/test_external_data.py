"""A model whose weights live in an ONNX external data file is compiled without copying them: every weight read as
it is stored (not transposed, not prepacked) is a view of the mapped file (`weights_mapped_bytes`), the compile
allocates a fraction of the weights' bytes, and outputs equal onnxruntime's, through `ctxrt.compile` and through
an InferenceSession's range program. A location outside the model's folder or a data file too short for its
tensors is one ModelError naming the tensor."""

from __future__ import annotations

import tracemalloc

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import ctxrt
from ctxrt.errors import ModelError

WIDTH, HIDDEN = 512, 1024  # 2 MiB matrices: read as stored (smaller ones oneDNN prepacks)
DOMAIN = np.lib.tracemalloc_domain


def _mlp() -> onnx.ModelProto:
    """x[batch, 512] -> MatMul 512 x 1024 + b -> Relu -> MatMul 1024 x 512: 4 MiB of weights."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal((WIDTH, HIDDEN)) / 16).astype(np.float32), "w1"),
             numpy_helper.from_array(rng.standard_normal(HIDDEN).astype(np.float32), "b1"),
             numpy_helper.from_array((rng.standard_normal((HIDDEN, WIDTH)) / 32).astype(np.float32), "w2")]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Add", ["h", "b1"], ["hb"]),
             helper.make_node("Relu", ["hb"], ["r"]), helper.make_node("MatMul", ["r", "w2"], ["y"])]
    g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", WIDTH])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", WIDTH])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _save(model: onnx.ModelProto, path, location: str = "mlp.onnx.data"):
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location=location,
                    size_threshold=0)
    return path


WEIGHT_BYTES = (WIDTH * HIDDEN * 2 + HIDDEN) * 4


def _x(batch: int) -> np.ndarray:
    return np.random.default_rng(batch).standard_normal((batch, WIDTH)).astype(np.float32)


def test_weights_are_read_in_place_from_the_data_file(tmp_path) -> None:
    path = _save(_mlp(), tmp_path / "mlp.onnx")
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": _x(3)})[0]
    ctxrt.compile(path, shapes={"x": (3, WIDTH)}).free()  # what a first compile imports and caches
    tracemalloc.start()
    try:
        ctx = ctxrt.compile(path, shapes={"x": (3, WIDTH)})
        allocated = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    try:
        # the matrices are read where they are stored; at most the bias is copied (it joins the GEMM's epilogue)
        assert ctx.stats["weights_mapped_bytes"] >= WIDTH * HIDDEN * 2 * 4
        assert ctx.stats["weights_prepacked_bytes"] == 0
        assert allocated < WEIGHT_BYTES / 4, f"the compile allocated {allocated} bytes for {WEIGHT_BYTES} of weights"
        np.testing.assert_allclose(ctx.graph().run({"x": _x(3)})["y"], want, rtol=1e-4, atol=1e-5)
    finally:
        ctx.free()


def test_a_range_program_reads_them_in_place_too(tmp_path) -> None:
    path = _save(_mlp(), tmp_path / "mlp.onnx")
    theirs = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    with ctxrt.InferenceSession(path, dim_ranges={"batch": (1, 8)}) as sess:
        for batch in (1, 5, 8):
            got = sess.run(None, {"x": _x(batch)})[0]
            np.testing.assert_allclose(got, theirs.run(None, {"x": _x(batch)})[0], rtol=1e-4, atol=1e-5)
        stats = sess.stats
        assert stats["shape_variants_compiled"] == 1
        assert stats["weights_mapped_bytes"] >= WIDTH * HIDDEN * 2 * 4


def test_a_location_outside_the_folder_is_one_error(tmp_path) -> None:
    (tmp_path / "inner").mkdir()
    _save(_mlp(), tmp_path / "mlp.onnx")
    model = onnx.load(str(tmp_path / "mlp.onnx"), load_external_data=False)
    for t in model.graph.initializer:
        for e in t.external_data:
            if e.key == "location":
                e.value = "../mlp.onnx.data"
    (tmp_path / "inner" / "mlp.onnx").write_bytes(model.SerializeToString())
    with pytest.raises(ModelError, match="w1.*not a file inside the model's folder"):
        ctxrt.compile(tmp_path / "inner" / "mlp.onnx", shapes={"x": (1, WIDTH)})


def test_a_data_file_too_short_is_one_error(tmp_path) -> None:
    path = _save(_mlp(), tmp_path / "mlp.onnx")
    data = tmp_path / "mlp.onnx.data"
    data.write_bytes(data.read_bytes()[:WEIGHT_BYTES // 2])
    with pytest.raises(ModelError, match="external data .* does not hold"):
        ctxrt.compile(path, shapes={"x": (1, WIDTH)})


def _mapped_rss(path) -> int:
    """Resident bytes of this process's mappings of `path` (Linux: /proc/self/smaps)."""
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if head and "-" in head[0] and len(head) >= 5:
                inside = line.rstrip().endswith(str(path))
            elif inside and head and head[0] == "Rss:":
                total += int(head[1]) * 1024
    return total


@pytest.mark.skipif(not __import__("os").path.exists("/proc/self/smaps"), reason="reads /proc/self/smaps")
def test_loading_a_binary_leaves_its_weights_out_of_the_resident_set(tmp_path) -> None:
    """The weights section's checksum reads every page once; they are then handed back (still in the page
    cache): a loaded context binary is resident only where kernels read it."""
    path = _save(_mlp(), tmp_path / "mlp.onnx")
    binary = tmp_path / "mlp.ctx"
    ctxrt.compile(path, shapes={"x": (1, WIDTH)}).free()
    from ctxrt.cli import main as cli

    assert cli(["compile", str(path), "-o", str(binary), "--shape", f"x=1x{WIDTH}", "-q"]) == 0
    ctx = ctxrt.context_from_binary(binary)
    try:
        assert _mapped_rss(binary.resolve()) < WEIGHT_BYTES / 4
        want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": _x(1)})[0]
        np.testing.assert_allclose(ctx.graph().run({"x": _x(1)})["y"], want, rtol=1e-4, atol=1e-5)
    finally:
        ctx.free()


def test_large_matmul_weights_are_read_as_stored_small_ones_prepacked() -> None:
    """oneDNN reads a MatMul's weights of 2 MiB or more in their stored (N, K) layout (memory-bound: no second
    copy), smaller ones in its blocked format (faster at a few rows); the outputs equal onnxruntime's either way."""
    from ctxrt.backends.cpu.onednn import api

    if not api.available():
        pytest.skip("oneDNN is not installed")
    for width, prepacked in ((512, False), (128, True)):
        rng = np.random.default_rng(width)
        w = numpy_helper.from_array((rng.standard_normal((width, HIDDEN)) / 16).astype(np.float32), "w")
        g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [16, width])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [16, HIDDEN])], [w])
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()
        x = rng.standard_normal((16, width)).astype(np.float32)
        with ctxrt.compile(m) as ctx:
            step = next(s for s in ctx.graph().compiled.steps if s.op == "MatMul")
            assert step.attrs["kernel"] == "onednn"
            assert (ctx.stats["weights_prepacked_bytes"] > 0) is prepacked, width
            want = ort.InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
            np.testing.assert_allclose(ctx.graph().run({"x": x})["y"], want, rtol=1e-4, atol=1e-4)


def test_a_binary_stores_them_transposed_a_compile_in_memory_does_not(tmp_path) -> None:
    """Run from memory, mapped MatMul weights keep their (K, N) layout (no copy); written to a binary they are
    stored (N, K), the layout a token's GEMVs read faster, and the binary is mapped in turn."""
    from ctxrt.cli import main as cli

    path = _save(_mlp(), tmp_path / "mlp.onnx")
    binary = tmp_path / "mlp.ctx"
    assert cli(["compile", str(path), "-o", str(binary), "--shape", f"x=2x{WIDTH}", "-q"]) == 0
    in_memory = ctxrt.compile(path, shapes={"x": (2, WIDTH)})
    loaded = ctxrt.context_from_binary(binary)
    try:
        def transposed(ctx) -> list[bool]:
            return [bool(s.attrs.get("transB")) for s in ctx.graph().compiled.steps if s.op == "MatMul"]

        assert transposed(in_memory) == [False, False] and transposed(loaded) == [True, True]
        np.testing.assert_allclose(loaded.graph().run({"x": _x(2)})["y"], in_memory.graph().run({"x": _x(2)})["y"],
                                   rtol=1e-4, atol=1e-5)
    finally:
        in_memory.free()
        loaded.free()


def test_embedded_weights_are_read_from_the_model_file_without_parsing_them(tmp_path) -> None:
    """A model file of 1 MiB or more with its weights inside: parsed without their bytes (external data in the
    model file itself), each read once into an aligned read-only array that the session's weight store holds as
    it is (no copy, no transposed copy); outputs equal onnxruntime's; its own file is not an external data file."""
    from ctxrt.frontend.external import external_data_files, load_in_place, tensor_array
    from ctxrt.mapped import frozen

    model = _mlp()
    model.graph.initializer.append(helper.make_tensor("typed", TensorProto.FLOAT, [2], [1.5, 2.5]))  # float_data
    path = tmp_path / "embedded.onnx"
    onnx.save_model(model, str(path))
    m = load_in_place(path)
    want = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(path)).graph.initializer}
    for t in m.graph.initializer:
        got = tensor_array(t)
        np.testing.assert_array_equal(got, want[t.name])
        if t.name == "typed":
            assert t.data_location != TensorProto.EXTERNAL and list(t.float_data) == [1.5, 2.5]
        else:
            assert t.data_location == TensorProto.EXTERNAL and not t.raw_data
            assert frozen(got)
    assert external_data_files(path) == []
    x = np.random.default_rng(1).standard_normal((3, WIDTH)).astype(np.float32)
    ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    with ctxrt.InferenceSession(path) as sess:
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], ref, rtol=1e-4, atol=1e-4)
        assert sess.stats["weights_bytes"] >= 2 * WIDTH * HIDDEN * 4
    data = path.read_bytes()
    path.write_bytes(data[:len(data) - 1000])  # cut inside a weight: one clear error, as onnx.load's
    with pytest.raises(ModelError):
        ctxrt.InferenceSession(path).run(None, {"x": x})


def test_a_model_file_changed_after_parsing_is_one_error(tmp_path) -> None:
    """Embedded weights are read after the model is parsed: a file replaced meanwhile is refused, not read at the
    old offsets (silent wrong weights)."""
    import os

    from ctxrt.frontend.external import load_in_place, tensor_array

    path = tmp_path / "embedded.onnx"
    onnx.save_model(_mlp(), str(path))
    m = load_in_place(path)
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    with pytest.raises(ModelError, match="changed after it was parsed"):
        tensor_array(m.graph.initializer[0])


def _embedding(rows: int = 4096, width: int = 1024) -> onnx.ModelProto:
    """ids[n] -> Gather(table[4096, 1024], 16 MiB) -> * 2: an embedding lookup."""
    table = np.random.default_rng(1).standard_normal((rows, width)).astype(np.float32)
    nodes = [helper.make_node("Gather", ["table", "ids"], ["e"]),
             helper.make_node("Mul", ["e", "two"], ["y"])]
    g = helper.make_graph(nodes, "emb", [helper.make_tensor_value_info("ids", TensorProto.INT64, ["n"])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", width])],
                          [numpy_helper.from_array(table, "table"),
                           numpy_helper.from_array(np.array(2, np.float32), "two")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("source", ["binary", "data file"])
def test_an_embedding_table_is_read_from_its_file_not_mapped_in(tmp_path, source: str) -> None:
    """A gathered table of 4 MiB or more whose bytes are a mapped file's (a context binary's weights, an external
    data file) has its rows read from the file: 256 rows of a 16 MiB table leave the mapping's resident set
    under 256 KiB (mapped, each row's fault maps a whole page-cache folio in: ~0.5 MiB a row on Linux 6.18);
    negative ids count from the end, as onnxruntime's."""
    path = _save(_embedding(), tmp_path / "emb.onnx", "emb.onnx.data")
    ids = np.concatenate([np.random.default_rng(2).integers(0, 4096, 254), [-1, -4096]]).astype(np.int64)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"ids": ids})[0]
    if source == "binary":
        from ctxrt.cli import main as cli

        mapped = tmp_path / "emb.ctx"
        assert cli(["compile", str(path), "-o", str(mapped), "--shape", "ids=256", "-q"]) == 0
        sess = ctxrt.InferenceSession(mapped)
    else:
        mapped = tmp_path / "emb.onnx.data"
        sess = ctxrt.InferenceSession(path)
    with sess:
        np.testing.assert_array_equal(sess.run(None, {"ids": ids})[0], want)
        np.testing.assert_array_equal(sess.run(None, {"ids": ids[::-1].copy()})[0], want[::-1])
        assert _mapped_rss(mapped.resolve()) < 256 * 1024


def test_a_model_structure_is_parsed_once_while_its_file_is_unchanged(tmp_path, monkeypatch) -> None:
    """Opening a session reads a model's structure and declared IO more than once: parsed once per file version,
    each caller given its own proto; the file written again (another model) is parsed again, never served old."""
    from ctxrt.frontend import external
    from ctxrt.frontend.io_types import declared_io

    monkeypatch.setattr(external, "_RACY_NS", -1)  # (a file written now is kept too: no wait for the clock)
    parsed = []
    real = external._without_raw_data
    monkeypatch.setattr(external, "_without_raw_data", lambda p: parsed.append(p) or real(p))
    path = tmp_path / "m.onnx"
    onnx.save_model(_mlp(), str(path))
    a, b = external.structure(path), external.structure(path)
    assert len(parsed) == 1 and a is not b and a == b
    a.graph.output[0].name = "changed"  # a caller's change stays its own
    assert external.structure(path).graph.output[0].name == "y"
    assert declared_io(path)[1][0][0] == "y"
    declared_io(path)[1].clear()  # (nor the declared IO's lists)
    assert declared_io(path)[1][0][0] == "y"
    other = _mlp()
    other.graph.output[0].name = "z"
    other.graph.node[-1].output[0] = "z"
    onnx.save_model(other, str(path))
    assert external.structure(path).graph.output[0].name == "z" and len(parsed) == 2
    assert declared_io(path)[1][0][0] == "z"
    x = _x(2)
    with ctxrt.InferenceSession(path) as sess:
        assert [o.name for o in sess.get_outputs()] == ["z"] and sess.run(None, {"x": x})[0].shape == (2, WIDTH)
