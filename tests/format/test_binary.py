"""Context binary round trips: graphs, metadata, deduplicated zero-copy weights, bounded metadata reads."""

from __future__ import annotations

import mmap
import os
import struct

import numpy as np
import pytest

from ctxrt.compiler.program import ARENA, CONST, INPUT, OUTPUT, CompiledGraph, Interval, Ref, Step, TensorInfo
from ctxrt.errors import FormatError
from ctxrt.format import ContextFile, ContextWriter, context_bytes, read_head, read_metadata, write_context
from ctxrt.format import writer as writer_module

F32 = "<f4"
TUNED = {"graph": "g0", "signature": "0" * 32, "label": "Gemm MatMul 4x8 @ 8x8 float32", "op": "MatMul",
         "kernel": "Gemm", "nodes": ["mm"], "params": {"TM": 4, "TN": 8}, "default_params": {"TM": 8, "TN": 8},
         "default_time_us": 2.5, "best_time_us": 1.25, "tried": 3, "failed": 0, "source": "profiled",
         "complete": True, "note": ""}
INFO = {"backend": "cpu", "hardware": "x86_64", "producer": "ctxrt 0.1.0", "source_models": ["a.onnx", "b.onnx"],
        "alignment": 64, "tuning": {"tuning_mode": True, "device": {"tier": "acme/gpu/1.0"}, "kernels_profiled": 1,
                                    "kernels_from_cache": 0, "kernels": [TUNED]}}
ATTRS = {
    "int": 3, "negative": -(2**40), "float": 0.1, "str": "same_upper", "bool": True, "none": None,
    "bytes": b"\x00\xff", "ints": [1, 2, 3], "floats": [0.5, -1.25], "strs": ["a", "b"], "nested": {"k": [1, {"j": 2}]},
    "array": np.arange(6, dtype=np.float32).reshape(2, 3), "int_array": np.array([[-1, 2**40]], dtype=np.int64),
    "bool_array": np.array([True, False]), "scalar": np.float16(1.5), "empty": np.zeros((0, 4), np.uint8),
}


def _matmul_graph(name: str, weight: str, bias: str, rows: int = 4) -> CompiledGraph:
    """x @ weight + bias -> y through one arena tensor; sizes chosen so every Ref fits its place."""
    x, y = TensorInfo("x", (rows, 8), F32, "memhandle"), TensorInfo("y", (rows, 8), F32)
    t = Ref(ARENA, "t", 0, (rows, 8), F32)
    steps = [
        Step("MatMul", f"{name}/mm", dict(ATTRS), [Ref(INPUT, "x", 0, (rows, 8), F32),
                                                   Ref(CONST, weight, 0, (8, 8), F32)], [t],
             [Ref(ARENA, f"{name}/mm#scratch0", 256, (128,), "|u1")], "blocked"),
        Step("Add", f"{name}/add", {"broadcast": 1}, [t, None, Ref(CONST, bias, 0, (8,), F32)],
             [Ref(OUTPUT, "y", 0, (rows, 8), F32)], []),
    ]
    intervals = [Interval("t", 0, 128 * rows // 4, 0, 1), Interval(f"{name}/mm#scratch0", 256, 128, 0, 0)]
    return CompiledGraph(name, 17, [x], [y], steps, 384, 256, 64, "greedy_by_size", intervals,
                         sorted({weight, bias}))


def _weights() -> dict[str, np.ndarray]:
    w = np.arange(64, dtype=np.float32).reshape(8, 8)
    return {"w": w, "w_copy": w.copy(), "b1": np.ones(8, np.float32), "b2": np.full(8, 2, np.float32)}


def _graphs() -> list[CompiledGraph]:
    return [_matmul_graph("first", "w", "b1"), _matmul_graph("second", "w_copy", "b2", rows=2)]


def _same(a: object, b: object) -> bool:
    if isinstance(a, np.ndarray | np.generic):
        return type(a) is type(b) and a.dtype == b.dtype and np.array_equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return isinstance(b, list) and len(a) == len(b) and all(map(_same, a, b))
    return type(a) is type(b) and a == b


def _assert_graphs_equal(got: list[CompiledGraph], want: list[CompiledGraph]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        for s, t in zip(g.steps, w.steps, strict=True):
            assert _same(s.attrs, t.attrs), (s.attrs, t.attrs)
            assert (s.op, s.name, s.inputs, s.outputs, s.scratch, s.algorithm) == \
                   (t.op, t.name, t.inputs, t.outputs, t.scratch, t.algorithm)
        strip = [dict(vars(x), steps=None) for x in (g, w)]
        assert strip[0] == strip[1]


@pytest.fixture
def ctx_path(tmp_path):
    path = tmp_path / "model.ctx"
    write_context(path, _graphs(), _weights(), INFO)
    return path


def test_graphs_round_trip_with_every_attribute_type(ctx_path) -> None:
    with ContextFile.open(ctx_path) as cf:
        _assert_graphs_equal(cf.graphs(), _graphs())
        assert cf.graphs()[0].io_bytes == _graphs()[0].io_bytes


def test_metadata_holds_everything_inspect_needs(ctx_path) -> None:
    meta = read_metadata(ctx_path)
    assert {k: meta[k] for k in INFO} == INFO
    assert meta["format_version"] == 1
    assert meta["max_spillfill_size"] == 384
    with ContextFile.open(ctx_path) as cf:
        assert cf.metadata == meta
        assert meta["weights_size"] == os.path.getsize(ctx_path) - cf.weights_section()[1]
    first = meta["graphs"][0]
    assert first == {"name": "first", "opset": 17, "spillfill_size": 384, "lower_bound": 256, "io_bytes": 256,
                     "strategy": "greedy_by_size",
                     "partitions": [{"backend": "cpu", "steps": 2, "ops": {"MatMul": 1, "Add": 1}}],
                     "inputs": [{"name": "x", "dtype": F32, "shape": [4, 8], "mem_type": "memhandle"}],
                     "outputs": [{"name": "y", "dtype": F32, "shape": [4, 8], "mem_type": "raw"}]}
    assert set(meta["weights"]) == {"w", "w_copy", "b1", "b2"}


def test_identical_weights_are_stored_once(tmp_path) -> None:
    big = np.random.default_rng(0).standard_normal((256, 1024)).astype(np.float32)  # 1 MiB
    one, two = tmp_path / "one.ctx", tmp_path / "two.ctx"
    graph = [_matmul_graph("g", "w", "b1")]
    small = {"w": _weights()["w"], "b1": _weights()["b1"]}
    write_context(one, graph, {**small, "big": big}, INFO)
    write_context(two, graph, {**small, "big": big, "big_again": big.copy(), "as_int": big.view(np.int32)}, INFO)
    size_one, size_two = os.path.getsize(one), os.path.getsize(two)
    # Same bytes with the same dtype and shape: no second copy. A different dtype is a different tensor.
    assert size_two - size_one < big.nbytes + 4096
    assert size_two - size_one >= big.nbytes
    meta = read_metadata(two)
    assert meta["weights"]["big"] == meta["weights"]["big_again"] != meta["weights"]["as_int"]
    with ContextFile.open(two) as cf:
        w = cf.weights()
        assert np.shares_memory(w["big"], w["big_again"])
        np.testing.assert_array_equal(w["as_int"], big.view(np.int32))


def _root(arr: np.ndarray) -> object:
    while isinstance(arr, np.ndarray):
        arr = arr.base
    return arr.obj if isinstance(arr, memoryview) else arr


def test_weights_are_read_only_zero_copy_views_into_the_map(ctx_path) -> None:
    with ContextFile.open(ctx_path) as cf:
        weights = cf.weights()
        block = cf.weights_block()
        for name, want in _weights().items():
            got = weights[name]
            np.testing.assert_array_equal(got, want)
            assert got.dtype == want.dtype and not got.flags.writeable
            assert np.shares_memory(got, block)
            assert isinstance(_root(got), mmap.mmap)
        with pytest.raises(ValueError):
            weights["w"][0, 0] = 1


def test_weights_section_starts_on_a_page_and_each_weight_on_64_bytes(ctx_path) -> None:
    data = ctx_path.read_bytes()
    with ContextFile.open(ctx_path) as cf:
        section, offset = cf.weights_section()
        assert offset % 4096 == 0
        assert bytes(section) == data[offset:]
        assert all(entry[0] % 64 == 0 for entry in cf.metadata["weights"].values())
        assert section.readonly


def test_metadata_read_is_bounded_by_the_metadata_not_the_weights(tmp_path, monkeypatch) -> None:
    sizes = {}
    for mb in (1, 90):
        path = tmp_path / f"{mb}.ctx"
        big = np.zeros(mb * 2**20, np.uint8)
        big[::4097] = 7  # not all zeros, not trivially compressible by any reader trick
        write_context(path, [_matmul_graph("g", "w", "b1")], {**_weights(), "big": big}, INFO)
        monkeypatch.setattr(mmap, "mmap", None)  # read_head must use plain reads, never map the file
        head = read_head(path)
        monkeypatch.undo()
        assert head.metadata["weights_size"] >= mb * 2**20
        sizes[mb] = head.bytes_read
    assert sizes[1] == sizes[90] < 4096


def test_bytes_and_memoryview_sources_match_the_file(ctx_path) -> None:
    data = context_bytes(_graphs(), _weights(), INFO)
    assert data == ctx_path.read_bytes()
    for source in (data, memoryview(bytearray(data))):
        with ContextFile.open(source) as cf:
            _assert_graphs_equal(cf.graphs(), _graphs())
            assert not cf.weights()["w"].flags.writeable
        assert read_metadata(source) == read_metadata(ctx_path)


def test_empty_weights_make_an_empty_section(tmp_path) -> None:
    g = _matmul_graph("g", "w", "b1")
    g.steps[0].inputs[1] = Ref(INPUT, "x", 0, (4, 8), F32)
    g.steps[1].inputs[2] = None
    g.const_names = []
    path = tmp_path / "empty.ctx"
    write_context(path, [g], {}, INFO)
    with ContextFile.open(path) as cf:
        assert cf.weights() == {} and cf.metadata["weights_size"] == 0
        assert cf.weights_section()[1] == os.path.getsize(path)


def test_arrays_outlive_a_closed_file(ctx_path) -> None:
    cf = ContextFile.open(ctx_path)
    w = cf.weights()["w"]
    cf.close()
    np.testing.assert_array_equal(w, _weights()["w"])


def test_failed_write_leaves_no_file_and_keeps_the_old_one(tmp_path, monkeypatch) -> None:
    path = tmp_path / "model.ctx"

    def half_then_fail(self, f) -> None:
        f.write(b"\x01" * 100)
        raise OSError("disk full")

    monkeypatch.setattr(writer_module.ContextWriter, "_write_weights", half_then_fail)
    with pytest.raises(OSError, match="disk full"):
        write_context(path, _graphs(), _weights(), INFO)
    assert list(tmp_path.iterdir()) == []
    path.write_bytes(b"previous")
    with pytest.raises(OSError, match="disk full"):
        write_context(path, _graphs(), _weights(), INFO)
    assert list(tmp_path.iterdir()) == [path] and path.read_bytes() == b"previous"


def test_writer_refuses_calls_out_of_order() -> None:
    w = ContextWriter(INFO)
    with pytest.raises(FormatError, match="add_weights.*NEW"):
        w.add_weights({})
    w.add_graph(_graphs()[0])
    with pytest.raises(FormatError, match="finish"):
        w.finish()
    w.add_weights(_weights())
    with pytest.raises(FormatError, match="add_graph"):
        w.add_graph(_graphs()[1])


@pytest.mark.parametrize("change", ["set_attr", "object_weight", "missing_weight", "ref_past_arena",
                                    "unknown_info", "bad_mem_type", "huge_int_attr"])
def test_writer_refuses_what_the_reader_would_refuse(tmp_path, change: str) -> None:
    graphs, weights, info = _graphs(), _weights(), dict(INFO)
    step = graphs[0].steps[0]
    if change == "set_attr":
        step.attrs["bad"] = {1, 2}
    elif change == "huge_int_attr":
        step.attrs["bad"] = 2**70
    elif change == "object_weight":
        weights["w"] = np.array(["a"], dtype=object)
    elif change == "missing_weight":
        del weights["b1"]
    elif change == "ref_past_arena":
        step.outputs[0] = Ref(ARENA, "t", 384, (4, 8), F32)
    elif change == "unknown_info":
        info["io_mem_type"] = "raw"
    elif change == "bad_mem_type":
        graphs[0].inputs[0] = TensorInfo("x", (4, 8), F32, "dma")
    with pytest.raises(FormatError):
        write_context(tmp_path / "x.ctx", graphs, weights, info)
    assert list(tmp_path.iterdir()) == []


def test_header_layout_is_as_documented(ctx_path) -> None:
    data = ctx_path.read_bytes()
    magic, version, header_size, count, entry_size, table_at, file_size = struct.unpack_from("<8sIIIIQQ", data)
    assert (magic, version, header_size, count, entry_size, table_at, file_size) == \
           (b"CTXRTBIN", 1, 64, 3, 32, 64, len(data))
    kinds = [struct.unpack_from("<IIQQII", data, 64 + 32 * i)[:3] for i in range(3)]
    assert [(k, a) for k, a, _ in kinds] == [(1, 8), (2, 8), (3, 4096)]
    assert kinds[0][2] == 160 and kinds[2][2] % 4096 == 0
