"""The tuning record in META and tuned parameters in PROGRAMS: written, read back, and every malformed value
refused with a FormatError (as the rest of the format, tests/format/test_hostile.py)."""

from __future__ import annotations

import copy
import struct
import zlib
from typing import Any

import msgpack
import numpy as np
import pytest

from ctxrt.compiler.program import ARENA, INPUT, OUTPUT, CompiledGraph, Ref, Step, TensorInfo
from ctxrt.errors import FormatError
from ctxrt.format import ContextFile, context_bytes, read_metadata
from ctxrt.tuning.record import context_record, report, report_lines

F32 = "<f4"
DEVICE = {"backend": "opencl", "vendor": "acme", "device": "GPU 9000", "driver": "1.2", "tier": "acme/gpu-9000/1.2"}
KERNEL = {"graph": "main", "signature": "ab" * 16, "label": "Elementwise Relu 2x4 float32", "op": "Relu",
          "kernel": "Elementwise", "nodes": ["relu"], "params": {"VW": 1, "WGS": 32},
          "default_params": {"VW": 4, "WGS": 64}, "default_time_us": 2.0, "best_time_us": 1.0, "tried": 5,
          "failed": 1, "source": "profiled", "complete": True, "note": ""}


def _graph() -> CompiledGraph:
    steps = [Step("Relu", "relu", {}, [Ref(INPUT, "x", 0, (2, 4), F32)], [Ref(ARENA, "t", 0, (2, 4), F32)], [],
                  params={"VW": 1, "WGS": 32}),
             Step("Relu", "out", {}, [Ref(ARENA, "t", 0, (2, 4), F32)], [Ref(OUTPUT, "y", 0, (2, 4), F32)], [])]
    g = CompiledGraph("main", 17, [TensorInfo("x", (2, 4), F32)], [TensorInfo("y", (2, 4), F32)], steps, 64, 32,
                      64, "greedy_by_size")
    g.tuning = [dict(KERNEL)]
    return g


RECORD = context_record([_graph()], DEVICE)
INFO = {"backend": "cpu", "hardware": "x86_64", "producer": "test", "alignment": 64, "tuning": RECORD}
VALID = context_bytes([_graph()], {"w": np.ones(4, np.float32)}, INFO)


def _sections(data: bytes) -> list[list[Any]]:
    """[kind, alignment, bytes] per section, in file order."""
    (count,) = struct.unpack_from("<I", data, 16)
    out = []
    for i in range(count):
        kind, align, offset, length, _, _ = struct.unpack_from("<IIQQII", data, 64 + 32 * i)
        out.append([kind, align, data[offset:offset + length]])
    return out


def _with(kind: int, body: bytes) -> bytes:
    """VALID with one section replaced, laid out and checksummed as the writer does."""
    sections = _sections(VALID)
    pos = 64 + 32 * len(sections)
    entries, chunks = [], []
    for k, align, old in sections:
        new = body if k == kind else old
        offset = -(-pos // align) * align
        chunks.append(bytes(offset - pos) + new)
        entries.append(struct.pack("<IIQQII", k, align, offset, len(new), zlib.crc32(new), 0))
        pos = offset + len(new)
    head = bytearray(VALID[:64])
    struct.pack_into("<Q", head, 32, pos)
    table = b"".join(entries)
    struct.pack_into("<I", head, 60, zlib.crc32(bytes(head[:60]) + table))
    return bytes(head) + table + b"".join(chunks)


def test_record_round_trips_and_reports() -> None:
    meta = read_metadata(VALID)
    assert meta["tuning"] == RECORD and RECORD["kernels_profiled"] == 1
    with ContextFile.open(VALID) as cf:
        assert cf.graphs()[0].steps[0].params == {"VW": 1, "WGS": 32} and cf.graphs()[0].steps[1].params == {}
    rep = report(meta)
    assert rep["kernels"][0]["speedup"] == 2.0 and rep["kernels"][0]["changed"] == {"VW": 1, "WGS": 32}
    assert any("2.00x" in line for line in report_lines(rep))
    assert not report({"tuning": {}})["tuned"]


def _meta(edit: Any) -> bytes:
    value = msgpack.unpackb(_sections(VALID)[0][2])
    edit(value["tuning"])
    return _with(1, msgpack.packb(value, use_bin_type=True))


def _kernel(key: str, v: Any) -> Any:
    return lambda t: t["kernels"][0].__setitem__(key, v)


def _deep(depth: int) -> Any:
    v: Any = 1
    for _ in range(depth):
        v = [v]
    return v


META_CASES = {
    "not a map": lambda t: t.__setitem__("kernels", {}),
    "unknown key": lambda t: t.__setitem__("extra", 1),
    "missing kernels": lambda t: t.pop("kernels"),
    "device not str map": lambda t: t.__setitem__("device", {"tier": 3}),
    "counts do not add up": lambda t: t.__setitem__("kernels_from_cache", 5),
    "negative count": lambda t: t.__setitem__("kernels_profiled", -1),
    "tuning_mode int": lambda t: t.__setitem__("tuning_mode", 1),
    "entry not a map": lambda t: t["kernels"].__setitem__(0, [1, 2]),
    "entry missing key": lambda t: t["kernels"][0].pop("params"),
    "entry unknown key": _kernel("shell", "rm -rf /"),
    "tried as str": _kernel("tried", "5"),
    "tried as bool": _kernel("tried", True),
    "complete as int": _kernel("complete", 1),
    "nodes with an int": _kernel("nodes", ["a", 3]),
    "params not a map": _kernel("params", [1]),
    "params nested": _kernel("params", {"VW": [1, 2]}),
    "params too many": _kernel("params", {f"P{i}": i for i in range(100)}),
    "params long name": _kernel("params", {"P" * 100: 1}),
    "params long str": _kernel("default_params", {"A": "x" * 100}),
    "negative time": _kernel("best_time_us", -1.0),
    "nan time": _kernel("default_time_us", float("nan")),
    "infinite time": _kernel("default_time_us", float("inf")),
    "unknown source": _kernel("source", "elsewhere"),
    "deeply nested": _kernel("note", _deep(200)),
}


@pytest.mark.parametrize("case", list(META_CASES))
def test_malformed_tuning_record_is_refused(case: str) -> None:
    data = _meta(META_CASES[case])
    with pytest.raises(FormatError, match="META tuning"):
        read_metadata(data)
    with pytest.raises(FormatError):
        ContextFile.open(data).close()


@pytest.mark.parametrize("params", [[1, 2], {"VW": {"x": 1}}, {"VW": None}, {f"P{i}": 1 for i in range(65)}, "VW"])
def test_malformed_step_params_are_refused(params: Any) -> None:
    value = msgpack.unpackb(_sections(VALID)[1][2], ext_hook=msgpack.ExtType)
    value = copy.deepcopy(value)
    value[0]["steps"][0]["params"] = params
    data = _with(2, msgpack.packb(value, use_bin_type=True))
    with ContextFile.open(data) as cf, pytest.raises(FormatError, match="params"):
        cf.graphs()


def test_writer_refuses_a_record_it_could_not_read_back() -> None:
    bad = copy.deepcopy(RECORD)
    bad["kernels"][0]["tried"] = "many"
    with pytest.raises(FormatError, match="tried"):
        context_bytes([_graph()], {"w": np.ones(4, np.float32)}, {**INFO, "tuning": bad})
