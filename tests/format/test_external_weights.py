"""Format version 2: a context binary that names weights kept outside it (by the SHA-256 and CRC-32 of their
bytes), as an InferenceSession's compile cache writes; version 1 files are unchanged. Loading one needs the
weights from a WeightStore; every malformed entry is a FormatError."""

from __future__ import annotations

import struct
import zlib
from typing import Any

import msgpack
import numpy as np
import pytest
from harness import spy

from ctxrt.backends import get_backend
from ctxrt.compiler.program import CONST, INPUT, OUTPUT, CompiledGraph, Step, TensorInfo
from ctxrt.errors import FormatError
from ctxrt.format import ContextFile, context_bytes, read_metadata, write_context
from ctxrt.format.weights import ExternalWeight, content_key
from ctxrt.runtime.loader import context_from_binary
from ctxrt.runtime.weightstore import WeightStore

F32 = "<f4"
INFO = {"backend": "cpu", "hardware": "x86_64", "producer": "test", "alignment": 64}
W = (np.arange(64 * 64, dtype=np.float32).reshape(64, 64) / 1000).astype(np.float32)
B = np.ones(64, np.float32)


def _graph() -> CompiledGraph:
    from ctxrt.compiler.program import Ref

    steps = [Step("Gemm", "gemm", {}, [Ref(INPUT, "x", 0, (2, 64), F32), Ref(CONST, "w", 0, (64, 64), F32),
                                       Ref(CONST, "b", 0, (64,), F32)], [Ref(OUTPUT, "y", 0, (2, 64), F32)], [])]
    return CompiledGraph("main", 17, [TensorInfo("x", (2, 64), F32)], [TensorInfo("y", (2, 64), F32)], steps,
                         0, 0, 64, "greedy_by_size", [], ["b", "w"])


def _external() -> dict[str, ExternalWeight]:
    raw = W.reshape(-1).view(np.uint8)
    return {"w": ExternalWeight(content_key(raw), W.nbytes, F32, W.shape, zlib.crc32(raw))}


def test_a_context_naming_outside_weights_is_version_2_and_reads_back(tmp_path) -> None:
    path = tmp_path / "v2.ctx"
    write_context(path, [_graph()], {"b": B}, INFO, external=_external())
    data = path.read_bytes()
    assert struct.unpack_from("<I", data, 8)[0] == 2
    meta = read_metadata(path)
    assert meta["format_version"] == 2 and meta["weights_size"] == 256 and list(meta["weights"]) == ["b"]
    assert meta["external_weights"] == {"w": _external()["w"].as_list()}
    with ContextFile.open(path) as f:
        assert f.external_weights() == _external()
        assert [r.key for r in f.graphs()[0].steps[0].inputs[1:]] == ["w", "b"]  # refs checked against both
    plain = context_bytes([_graph()], {"b": B, "w": W}, INFO)  # nothing outside: version 1, as before
    assert struct.unpack_from("<I", plain, 8)[0] == 1 and "external_weights" not in read_metadata(plain)


def test_loading_takes_the_outside_weights_from_a_store(tmp_path) -> None:
    path, folder, be = tmp_path / "v2.ctx", tmp_path / "weights", get_backend("cpu")
    store = WeightStore(be, folder)
    inside, outside = store.save({"b": B, "w": W})
    assert list(inside) == ["b"] and outside == _external()
    assert [p.name for p in folder.iterdir()] == [f"{outside['w'].key}.bin"]
    write_context(path, [_graph()], inside, INFO, external=outside)
    with pytest.raises(FormatError, match="kept outside it"):
        context_from_binary(path, be)
    x = np.random.default_rng(0).standard_normal((2, 64)).astype(np.float32)
    with context_from_binary(path, be, store=store) as a, context_from_binary(path, be, store=store) as b:
        np.testing.assert_allclose(a.graph().run({"x": x})["y"], x @ W + B, rtol=1e-5, atol=1e-5)
        assert store.nbytes == W.nbytes and store.stats["weights_shared"] == 1  # mapped once for both
        assert a.held_weights()[0].keys() & b.held_weights()[0].keys()
    assert store.nbytes == 0 and store.stats["weights_released"] == 1
    blob = folder / f"{outside['w'].key}.bin"
    blob.write_bytes(blob.read_bytes()[:-1] + b"\x7f")
    with pytest.raises(FormatError, match="damaged"):
        context_from_binary(path, be, store=WeightStore(be, folder))
    blob.write_bytes(blob.read_bytes()[:100])
    with pytest.raises(FormatError, match="has 100"):
        context_from_binary(path, be, store=WeightStore(be, folder))
    blob.unlink()
    with pytest.raises(FormatError, match="cannot read a cached weight"):
        context_from_binary(path, be, store=WeightStore(be, folder))
    assert store.save({"w": W})[1] == outside and blob.read_bytes() == W.tobytes()  # written again


def _rebuild(data: bytes, edit: Any, version: int | None = None) -> bytes:
    """The file with its META edited (`edit(meta)`), laid out again with fresh checksums."""
    count = struct.unpack_from("<I", data, 16)[0]
    sections = {}
    for i in range(count):
        kind, align, offset, length, _, _ = struct.unpack_from("<IIQQII", data, 64 + 32 * i)
        sections[kind] = (align, data[offset:offset + length])
    meta = msgpack.unpackb(sections[1][1])
    edit(meta)
    sections[1] = (sections[1][0], msgpack.packb(meta))
    pos, entries, chunks = 64 + 32 * count, [], []
    for kind in sorted(sections):
        align, body = sections[kind]
        offset = -(-pos // align) * align
        chunks.append(bytes(offset - pos) + body)
        entries.append(struct.pack("<IIQQII", kind, align, offset, len(body), zlib.crc32(body), 0))
        pos = offset + len(body)
    table = b"".join(entries)
    version = struct.unpack_from("<I", data, 8)[0] if version is None else version
    head = struct.pack("<8sIIIIQQI16sI", b"CTXRTBIN", version, 64, count, 32, 64, pos, 0, bytes(16), 0)[:60]
    return head + struct.pack("<I", zlib.crc32(head + table)) + table + b"".join(chunks)


def _field(index: int, value: Any) -> Any:
    def edit(m: dict[str, Any]) -> None:
        m["external_weights"]["w"][index] = value
    return edit


def _entry(value: Any) -> Any:
    return lambda m: m["external_weights"].update(w=value)


def _also_inside(m: dict[str, Any]) -> None:
    m["weights"]["w"] = m["weights"]["b"]


HOSTILE = {
    "key not hex": (_field(0, "g" * 64), "SHA-256 as 64 lowercase hex digits"),
    "key short": (_field(0, "ab"), "SHA-256"),
    "key upper case": (_field(0, "A" * 64), "SHA-256"),
    "key not a str": (_field(0, 7), "key"),
    "nbytes wrong": (_field(1, 100), "nbytes 100 is not that of"),
    "dtype object": (_field(2, "|O"), "dtype"),
    "crc negative": (_field(4, -1), "crc"),
    "crc too big": (_field(4, 2**32), "crc"),
    "entry of four": (_entry(["a" * 64, 16384, F32, [64, 64]]), "a list of 5"),
    "entry a map": (_entry({"key": "a" * 64}), "a list of 5"),
    "name in both tables": (_also_inside, "also in META weights"),
    "version 2 without the table": (lambda m: m.pop("external_weights"), "external_weights"),
    "table a list": (lambda m: m.update(external_weights=[]), "external_weights"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_malformed_outside_weights_are_refused(tmp_path, case: str) -> None:
    edit, match = HOSTILE[case]
    valid = context_bytes([_graph()], {"b": B}, INFO, external=_external())
    assert ContextFile.open(_rebuild(valid, lambda m: None)).metadata["format_version"] == 2
    bad = _rebuild(valid, edit)
    for source in (bad, tmp_path / "bad.ctx"):
        (tmp_path / "bad.ctx").write_bytes(bad)
        with pytest.raises(FormatError, match=match):
            read_metadata(source)


def test_version_1_with_outside_weights_and_mismatched_versions_are_refused() -> None:
    valid = context_bytes([_graph()], {"b": B}, INFO, external=_external())
    with pytest.raises(FormatError, match="needs format version 2, the file is 1"):
        read_metadata(_rebuild(valid, lambda m: m.update(format_version=1), version=1))
    with pytest.raises(FormatError, match="does not match the header's 1"):
        read_metadata(_rebuild(valid, lambda m: None, version=1))
    with pytest.raises(FormatError, match="SHA-256"):  # the writer runs the reader's checks first
        context_bytes([_graph()], {"b": B}, INFO, external={"w": ExternalWeight("xyz", W.nbytes, F32, W.shape, 0)})


def test_weights_read_from_a_model_file_are_named_by_where_they_were_read(tmp_path, monkeypatch) -> None:
    """A model's inline weights, read into blocks of their own, are named in a weight store by the file version and
    region they were read from, not hashed (a 12 MiB model's ~8 ms at each compile): two compiles of the same file
    share them; after the file changes (same size, another content) they are other weights."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from ctxrt.compiler import compile_graphs
    from ctxrt.runtime import weightstore

    hashed = spy(monkeypatch, weightstore, "content_key", lambda raw: raw.nbytes)

    def save(w: np.ndarray) -> None:  # a file of 1 MiB or more: its initializers read from it in place
        nodes = [helper.make_node("Add", ["x", "w"], ["y"])]
        graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [512, 512])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [512, 512])],
                                  initializer=[numpy_helper.from_array(w, "w")])
        onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "m.onnx")

    be = get_backend("cpu")
    big = np.random.default_rng(0).standard_normal((512, 512)).astype(np.float32)
    save(big)
    store = WeightStore(be)

    def intern() -> list[str]:
        graphs, weights = compile_graphs([(str(tmp_path / "m.onnx"), {"x": [512, 512]}, "main")], be)
        return store.intern(weights)[2]
    first, second = intern(), intern()
    assert first == second and any(k.startswith("read:") for k in first) and not [n for n in hashed if n >= 1024]
    assert store.stats["weights_shared"] == len(second)
    save(big[::-1].copy())  # the same size, other bytes
    third = intern()
    assert set(third).isdisjoint(k for k in first if k.startswith("read:"))
