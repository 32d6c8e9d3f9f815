"""Hostile context binaries: every malformed file raises FormatError, without crashing, hanging or over-allocating.

Files are rebuilt here with struct.pack from the documented layout (docs/format.md), recomputing the
checksums where a test wants to reach the check behind them.
"""

from __future__ import annotations

import contextlib
import struct
import tracemalloc
import zlib
from collections.abc import Callable
from typing import Any

import msgpack
import numpy as np
import pytest

from ctxrt.compiler.program import ARENA, CONST, INPUT, OUTPUT, CompiledGraph, Interval, Ref, Step, TensorInfo
from ctxrt.errors import FormatError
from ctxrt.format import ContextFile, context_bytes, read_metadata

HEADER = "<8sIIIIQQI16sI"  # magic version header_size count entry_size table_offset file_size flags reserved crc
ENTRY = "<IIQQII"  # kind alignment offset length crc32 flags
FIELDS = ("magic", "version", "header_size", "count", "entry_size", "table_offset", "file_size", "flags",
          "reserved")
META, PROGRAMS, WEIGHTS = 1, 2, 3
F32 = "<f4"
INFO = {"backend": "cpu", "hardware": "x86_64", "producer": "test", "alignment": 64}


def _graph() -> CompiledGraph:
    steps = [Step("Gemm", "gemm", {"alpha": 1.0, "perm": np.array([1, 0], np.int64)},
                  [Ref(INPUT, "x", 0, (2, 4), F32), Ref(CONST, "w", 0, (4, 4), F32)],
                  [Ref(ARENA, "t", 0, (2, 4), F32)], [Ref(ARENA, "gemm#scratch0", 64, (64,), "|u1")]),
             Step("Relu", "relu", {}, [Ref(ARENA, "t", 0, (2, 4), F32)], [Ref(OUTPUT, "y", 0, (2, 4), F32)], [])]
    return CompiledGraph("main", 17, [TensorInfo("x", (2, 4), F32)], [TensorInfo("y", (2, 4), F32)], steps,
                         128, 96, 64, "greedy_by_size", [Interval("t", 0, 64, 0, 1)], ["w"])


VALID = context_bytes([_graph()], {"w": np.arange(16, dtype=np.float32).reshape(4, 4),
                                   "v": np.ones(40, np.float64)}, INFO)


def _split(data: bytes) -> dict[int, tuple[int, bytes]]:
    """kind -> (alignment, section bytes) of a well-formed file."""
    out = {}
    for i in range(3):
        kind, align, offset, length, _, _ = struct.unpack_from(ENTRY, data, 64 + 32 * i)
        out[kind] = (align, data[offset:offset + length])
    return out


SECTIONS = _split(VALID)
META_VALUE = msgpack.unpackb(SECTIONS[META][1])
PROGRAMS_VALUE = msgpack.unpackb(SECTIONS[PROGRAMS][1], ext_hook=msgpack.ExtType)


def assemble(meta: bytes | None = None, programs: bytes | None = None, weights: bytes | None = None,
             tweak: Callable[[dict[str, Any], list[list[int]]], None] | None = None) -> bytes:
    """A file laid out as the writer does; `tweak` edits the header fields / table entries before packing."""
    bodies = {META: meta, PROGRAMS: programs, WEIGHTS: weights}
    pos, entries, chunks = 160, [], []
    for kind in (META, PROGRAMS, WEIGHTS):
        align, body = SECTIONS[kind]
        body = SECTIONS[kind][1] if bodies[kind] is None else bodies[kind]
        offset = -(-pos // align) * align
        chunks.append(bytes(offset - pos) + body)
        entries.append([kind, align, offset, len(body), zlib.crc32(body), 0])
        pos = offset + len(body)
    header = dict(zip(FIELDS, (b"CTXRTBIN", 1, 64, 3, 32, 64, pos, 0, bytes(16)), strict=True))
    if tweak:
        tweak(header, entries)
    table = b"".join(struct.pack(ENTRY, *e) for e in entries)
    forced_crc = header.pop("crc", None)
    head = struct.pack(HEADER, *header.values(), 0)[:60]
    crc = zlib.crc32(head + table) if forced_crc is None else forced_crc
    return head + struct.pack("<I", crc) + table + b"".join(chunks)


def load_all(source: Any) -> None:
    """Everything a runtime does with a file: open, decode graphs, verify and view the weights."""
    with ContextFile.open(source) as cf:
        cf.graphs()
        cf.weights()


def refused(data: bytes, tmp_path=None, match: str | None = None) -> None:
    with pytest.raises(FormatError, match=match):
        load_all(data)
    if tmp_path is not None:  # the same through a memory-mapped path
        path = tmp_path / "hostile.ctx"
        path.write_bytes(data)
        with pytest.raises(FormatError, match=match):
            load_all(path)


def test_the_rebuilt_valid_file_loads(tmp_path) -> None:
    assert assemble() == VALID
    load_all(VALID)


# -- truncation and corruption ---------------------------------------------------------------------

def _section_bytes(kind: int) -> range:
    _, _, offset, length, _, _ = struct.unpack_from(ENTRY, VALID, 64 + 32 * (kind - 1))
    return range(offset, offset + length)


def _boundaries() -> list[int]:
    cuts = {0, 1, 8, 11, 12, 40, 63, 64, 96, 159, 160}
    for i in range(3):
        _, _, offset, length, _, _ = struct.unpack_from(ENTRY, VALID, 64 + 32 * i)
        cuts |= {offset, offset + 1, offset + length // 3, offset + length // 2, offset + length - 1, offset + length}
    return sorted(c for c in cuts if c < len(VALID))


@pytest.mark.parametrize("cut", _boundaries())
def test_truncated_files_are_refused(tmp_path, cut: int) -> None:
    refused(VALID[:cut], tmp_path, match="truncated|too short|empty|ctxrt context binary")
    with pytest.raises(FormatError):
        read_metadata(tmp_path / "hostile.ctx")


@pytest.mark.parametrize("section", [META, PROGRAMS, WEIGHTS])
def test_truncated_section_with_a_consistent_header_is_refused(section: int) -> None:
    cut = _section_bytes(section)[len(_section_bytes(section)) // 2]
    data = assemble(tweak=_set(file_size=cut))[:cut]  # the header agrees with the shorter file
    refused(data, match=f"section {section} .* extends past the end of the file")


@pytest.mark.parametrize("where", ["header", "table", "META", "PROGRAMS", "WEIGHTS"])
def test_every_flipped_byte_is_detected(where: str) -> None:
    spots = {"header": range(0, 64), "table": range(64, 160), "META": _section_bytes(META),
             "PROGRAMS": _section_bytes(PROGRAMS), "WEIGHTS": _section_bytes(WEIGHTS)}[where]
    for i in spots:
        for bit in (0x01, 0x80):
            data = bytearray(VALID)
            data[i] ^= bit
            with pytest.raises(FormatError):
                load_all(bytes(data))


def test_corrupt_weights_are_found_at_first_use_and_can_be_skipped() -> None:
    data = bytearray(VALID)
    data[_section_bytes(WEIGHTS)[5]] ^= 0xFF
    with ContextFile.open(bytes(data)) as cf:
        cf.graphs()
        with pytest.raises(FormatError, match="WEIGHTS.*checksum"):
            cf.weights()
    with ContextFile.open(bytes(data), verify_weights=False) as cf:
        cf.weights()
    assert read_metadata(bytes(data))["weights_size"] == len(_section_bytes(WEIGHTS))


@pytest.mark.parametrize("source", ["path", "bytes"])
def test_corrupt_weights_checked_beside_a_load_refuse_the_context(source: str, tmp_path) -> None:
    """A weights section of a megabyte or more is checked on a thread beside the rest of `context_from_binary`
    (reader._BESIDE): a flipped weight byte is still a FormatError from the load, the thread is joined before it
    returns or raises, and an intact file loads and runs."""
    import threading

    import onnx
    from onnx import TensorProto, helper, numpy_helper

    import ctxrt
    from ctxrt.cli import main as cli
    from ctxrt.format import reader

    w = np.random.default_rng(0).standard_normal((640, 640)).astype(np.float32)  # 1.6 MB: checked beside
    assert w.nbytes >= reader._BESIDE
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 640])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 640])],
                              [numpy_helper.from_array(w, "w")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "m.onnx")
    assert cli(["compile", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "good.ctx"), "-q"]) == 0
    data = (tmp_path / "good.ctx").read_bytes()
    with ContextFile.open(data) as cf:
        section = cf.sections[WEIGHTS]
    bad = bytearray(data)
    bad[section.offset + section.length // 2] ^= 0x40

    def load(raw: bytes) -> Any:
        if source == "bytes":
            return ctxrt.context_from_binary(raw)
        path = tmp_path / "m.ctx"
        path.write_bytes(raw)
        return ctxrt.context_from_binary(path)
    with pytest.raises(FormatError, match="WEIGHTS.*checksum"):
        load(bytes(bad))
    assert not any(t.name == "ctxrt-weights-check" for t in threading.enumerate())
    x = np.ones((2, 640), np.float32)
    ctx = load(data)
    try:
        assert not any(t.name == "ctxrt-weights-check" for t in threading.enumerate())
        np.testing.assert_allclose(ctx.graph().run({"x": x})["y"], x @ w, rtol=1e-4, atol=1e-3)
    finally:
        ctx.free()


# -- header and section table ----------------------------------------------------------------------

def _set(**fields: Any) -> Callable[[dict[str, Any], list[list[int]]], None]:
    return lambda header, entries: header.update(fields)


def _entry(index: int, **fields: int) -> Callable[[dict[str, Any], list[list[int]]], None]:
    names = ("kind", "alignment", "offset", "length", "crc", "flags")

    def tweak(header: dict[str, Any], entries: list[list[int]]) -> None:
        for key, value in fields.items():
            entries[index][names.index(key)] = value
    return tweak


HUGE = [2**63, 2**64 - 1, 2**32, 2**32 + 4096, 2**63 - 4096]  # 2**64 - 1 is -1 read as unsigned
HOSTILE_LAYOUTS = {
    "wrong magic": (_set(magic=b"GGUF\0\0\0\0"), "magic"),
    "version 7": (_set(version=7), r"format version 7 is not supported by this ctxrt \(supports 1, 2\)"),
    "version 0": (_set(version=0), "format version 0"),
    "version -1": (_set(version=2**32 - 1), "not supported"),
    "header size": (_set(header_size=32), "header size"),
    "entry size": (_set(entry_size=2**32 - 1), "entry size"),
    "flags": (_set(flags=1), "flags"),
    "reserved": (_set(reserved=b"\x01" + bytes(15)), "reserved"),
    "header crc": (_set(crc=12345), "header checksum"),
    "file size small": (_set(file_size=100), "file size"),
    "no sections": (_set(count=0), "section count"),
    "too many sections": (_set(count=17), "section count"),
    "table in header": (_set(table_offset=16), "points into the"),
    "table misaligned": (_set(table_offset=66), "8-aligned"),
    "unknown kind": (_entry(1, kind=9), "unknown section kind 9"),
    "duplicate kind": (_entry(1, kind=META), "second META"),
    "missing weights": (_entry(2, kind=4), "no WEIGHTS"),
    "alignment not power of two": (_entry(0, alignment=24), "power of two"),
    "alignment zero": (_entry(0, alignment=0), "power of two"),
    "weights not page aligned": (_entry(2, alignment=64), "below the required 4096"),
    "offset not aligned": (_entry(1, offset=801), "not aligned"),
    "section into the header": (_entry(0, offset=0), "points into the header"),
    "section into the table": (_entry(0, offset=128), "points into the header"),
    "overlapping sections": (_entry(1, offset=168), "overlap"),
    "section flags": (_entry(2, flags=2), "flags"),
    "section crc": (_entry(0, crc=0), "META.*checksum"),
}
for i, big in enumerate(HUGE):
    HOSTILE_LAYOUTS[f"huge file size {i}"] = (_set(file_size=big), "file size")
    HOSTILE_LAYOUTS[f"huge table offset {i}"] = (_set(table_offset=big), "section table|8-aligned")
    for k in (0, 1, 2):
        HOSTILE_LAYOUTS[f"huge offset {i} in section {k + 1}"] = (_entry(k, offset=big), "past the end|aligned")
        HOSTILE_LAYOUTS[f"huge length {i} in section {k + 1}"] = (_entry(k, length=big), "past the end")
HOSTILE_LAYOUTS["huge count"] = (_set(count=2**32 - 1), "section count")
HOSTILE_LAYOUTS["huge alignment"] = (_entry(0, alignment=2**31), "power of two up to")


@pytest.mark.parametrize("case", sorted(HOSTILE_LAYOUTS))
def test_hostile_header_and_table_are_refused_within_a_few_mb(tmp_path, case: str) -> None:
    tweak, match = HOSTILE_LAYOUTS[case]
    data = assemble(tweak=tweak)
    path = tmp_path / "hostile.ctx"
    path.write_bytes(data)
    tracemalloc.start()
    try:
        for source in (data, path):
            with pytest.raises(FormatError, match=match):
                load_all(source)
        with pytest.raises(FormatError, match=match):
            read_metadata(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * 2**20


def test_empty_and_tiny_files_are_refused(tmp_path) -> None:
    for data in (b"", b"CTX", b"CTXRTBIN", VALID[:12], b"\0" * 64):
        refused(data, tmp_path)


# -- META: valid msgpack, wrong schema --------------------------------------------------------------

def _meta(edit: Callable[[dict[str, Any]], None]) -> bytes:
    value = msgpack.unpackb(SECTIONS[META][1])
    edit(value)
    return assemble(meta=msgpack.packb(value))


def _drop(key: str) -> Callable[[dict[str, Any]], None]:
    return lambda m: m.pop(key)


def _put(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(m: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        for p in parents:
            m = m[int(p)] if isinstance(m, list) else m[p]
        if isinstance(m, list):
            m[int(last)] = value
        else:
            m[last] = value
    return edit


BAD_META = {f"missing {k}": _drop(k) for k in META_VALUE}
BAD_META |= {
    "backend not str": _put("backend", 3),
    "graphs a map": _put("graphs", {}),
    "no graphs": _put("graphs", []),
    "weights a list": _put("weights", []),
    "source model int": _put("source_models", [1]),
    "alignment 3": _put("alignment", 3),
    "alignment bool": _put("alignment", True),
    "tuning int keys": _put("tuning", {1: 2}),
    "format version 2": _put("format_version", 2),
    "weights size": _put("weights_size", 10**6),
    "negative weights size": _put("weights_size", -1),
    "max spillfill": _put("max_spillfill_size", 1),
    "huge shape": _put("graphs.0.inputs.0.shape", [2**62, 2**62]),
    "negative dim": _put("graphs.0.inputs.0.shape", [-1, 4]),
    "float dim": _put("graphs.0.inputs.0.shape", [2.0, 4]),
    "rank 100": _put("graphs.0.inputs.0.shape", [1] * 100),
    "shape a str": _put("graphs.0.inputs.0.shape", "2x4"),
    "dtype O": _put("graphs.0.inputs.0.dtype", "O"),
    "dtype U10": _put("graphs.0.inputs.0.dtype", "<U10"),
    "dtype V8": _put("graphs.0.inputs.0.dtype", "V8"),
    "dtype datetime": _put("graphs.0.inputs.0.dtype", "<M8[s]"),
    "dtype record": _put("graphs.0.inputs.0.dtype", "f4,i4"),
    "dtype subarray": _put("graphs.0.inputs.0.dtype", "(2,)f4"),
    "dtype nonsense": _put("graphs.0.inputs.0.dtype", "float33"),
    "dtype long": _put("graphs.0.inputs.0.dtype", "<f4" * 100),
    "mem type": _put("graphs.0.inputs.0.mem_type", "gpu"),
    "io bytes": _put("graphs.0.io_bytes", 1),
    "graph not a map": _put("graphs.0", [1, 2]),
    "tensor info not a map": _put("graphs.0.outputs.0", "y"),
    "duplicate inputs": lambda m: m["graphs"][0]["inputs"].append(m["graphs"][0]["inputs"][0]),
    "duplicate graphs": lambda m: m["graphs"].append(m["graphs"][0]),
    "spillfill negative": _put("graphs.0.spillfill_size", -5),
    "opset huge": _put("graphs.0.opset", 2**40),
    "weight past section": _put("weights.w", [384, 64, F32, [4, 4]]),
    "weight misaligned": _put("weights.w", [8, 64, F32, [4, 4]]),
    "weight nbytes": _put("weights.w", [0, 60, F32, [4, 4]]),
    "weight entry short": _put("weights.w", [0, 64, F32]),
    "weight huge offset": _put("weights.w", [2**63, 64, F32, [4, 4]]),
    "weight object dtype": _put("weights.w", [0, 64, "O", [8]]),
    "meta is an empty map": lambda m: m.clear(),
}


@pytest.mark.parametrize("case", sorted(BAD_META))
def test_metadata_with_the_wrong_schema_is_refused(tmp_path, case: str) -> None:
    data = _meta(BAD_META[case])
    refused(data, tmp_path)
    with pytest.raises(FormatError):
        read_metadata(tmp_path / "hostile.ctx")


@pytest.mark.parametrize("raw", [
    b"", b"\xc1", b"\x91", msgpack.packb(META_VALUE) + b"\x00",  # reserved byte, short, trailing data
    b"\xdb\xff\xff\xff\xff", b"\xdd\xff\xff\xff\xff", b"\xdf\x7f\xff\xff\xff",  # str/array/map of 2**32
    b"\x91" * 5000 + b"\xc0",  # nested far deeper than any schema
    b"\xd4\x01\x00", b"\xa2\xff\xfe",  # an extension type in META, invalid UTF-8
    msgpack.packb([1, 2, 3]), msgpack.packb(None),
])
def test_metadata_that_is_not_the_expected_msgpack_is_refused(raw: bytes) -> None:
    data = assemble(meta=raw)
    tracemalloc.start()
    try:
        with pytest.raises(FormatError, match="META"):
            load_all(data)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * 2**20


# -- PROGRAMS: valid msgpack, wrong schema -------------------------------------------------------------

def _programs(edit: Callable[[list[Any]], None]) -> bytes:
    value = msgpack.unpackb(SECTIONS[PROGRAMS][1], ext_hook=msgpack.ExtType)
    edit(value)
    return assemble(programs=msgpack.packb(value))


def _ext(code: int, body: Any) -> msgpack.ExtType:
    return msgpack.ExtType(code, msgpack.packb(body))


def _prog(path: str, value: Any) -> Callable[[list[Any]], None]:
    return lambda p: _put(path, value)({"root": p})


BAD_PROGRAMS = {
    "not a list": lambda p: p.__setitem__(slice(None), []),
    "extra graph": lambda p: p.append(p[0]),
    "graph name": _prog("root.0.name", "other"),
    "alignment": _prog("root.0.alignment", 48),
    "steps a map": _prog("root.0.steps", {}),
    "step missing op": lambda p: p[0]["steps"][0].pop("op"),
    "attrs a list": _prog("root.0.steps.0.attrs", [1]),
    "output None": _prog("root.0.steps.0.outputs.0", None),
    "ref short": _prog("root.0.steps.0.outputs.0", ["arena", "t", 0, [2, 4]]),
    "ref space": _prog("root.0.steps.0.outputs.0", ["gpu", "t", 0, [2, 4], F32]),
    "ref past arena": _prog("root.0.steps.0.outputs.0", ["arena", "t", 128, [2, 4], F32]),
    "ref huge offset": _prog("root.0.steps.0.outputs.0", ["arena", "t", 2**63, [2, 4], F32]),
    "ref misaligned": _prog("root.0.steps.0.outputs.0", ["arena", "t", 8, [2, 4], F32]),
    "ref huge shape": _prog("root.0.steps.0.outputs.0", ["arena", "t", 0, [2**40, 2**40], F32]),
    "ref dtype": _prog("root.0.steps.0.outputs.0", ["arena", "t", 0, [2, 4], "<U2"]),
    "const unknown": _prog("root.0.steps.0.inputs.1", ["const", "nope", 0, [4, 4], F32]),
    "const too big": _prog("root.0.steps.0.inputs.1", ["const", "w", 0, [8, 4], F32]),
    "input unknown": _prog("root.0.steps.0.inputs.0", ["input", "nope", 0, [2, 4], F32]),
    "input past end": _prog("root.0.steps.0.inputs.0", ["input", "x", 4, [2, 4], F32]),
    "output as input": _prog("root.0.steps.0.inputs.0", ["output", "x", 0, [2, 4], F32]),
    "const names": _prog("root.0.const_names", ["nope"]),
    "interval outside": _prog("root.0.intervals.0", ["t", 64, 128, 0, 1]),
    "interval reversed": _prog("root.0.intervals.0", ["t", 0, 64, 3, 1]),
    "unknown ext": _prog("root.0.steps.0.attrs.perm", msgpack.ExtType(9, b"")),
    "ndarray object": _prog("root.0.steps.0.attrs.perm", _ext(1, ["|O", [1], b"\0" * 8])),
    "ndarray size": _prog("root.0.steps.0.attrs.perm", _ext(1, ["<i8", [2**40], b"\0" * 8])),
    "ndarray body": _prog("root.0.steps.0.attrs.perm", msgpack.ExtType(1, b"\xdd\xff\xff\xff\xff")),
    "scalar size": _prog("root.0.steps.0.attrs.perm", _ext(2, ["<f8", b"\0"])),
}


@pytest.mark.parametrize("case", sorted(BAD_PROGRAMS))
def test_programs_with_the_wrong_schema_are_refused(case: str) -> None:
    data = _programs(BAD_PROGRAMS[case])
    # PROGRAMS is read only when graphs are first needed.
    with ContextFile.open(data) as cf, pytest.raises(FormatError, match="PROGRAMS"):
        cf.graphs()


def test_programs_that_are_not_msgpack_are_refused() -> None:
    for raw in (b"", b"\xc1", b"\x92\x01", b"\xdd\x7f\xff\xff\xff", b"\x91" * 5000):
        with ContextFile.open(assemble(programs=raw)) as cf, pytest.raises(FormatError, match="PROGRAMS"):
            cf.graphs()


# -- random damage behind valid checksums ------------------------------------------------------------

@pytest.mark.parametrize("kind", [META, PROGRAMS])
def test_random_damage_with_fixed_checksums_raises_only_format_errors(kind: int) -> None:
    """Checksums cannot catch a crafted file: the schema checks must, and nothing else may escape."""
    rng = np.random.default_rng(kind)
    marks = [0x00, 0x7F, 0xC0, 0xC1, 0xC3, 0xCF, 0xD3, 0xD4, 0xDB, 0xDD, 0xDF, 0x9F, 0x8F, 0xBF, 0xFF]
    for _ in range(400):
        body = bytearray(SECTIONS[kind][1])
        for _ in range(int(rng.integers(1, 4))):
            i = int(rng.integers(len(body)))
            if rng.random() < 0.6:
                body[i] = int(rng.choice(marks)) if rng.random() < 0.5 else int(rng.integers(256))
            else:
                del body[i:i + int(rng.integers(1, 8))]
        data = assemble(**{"meta" if kind == META else "programs": bytes(body)})
        with contextlib.suppress(FormatError):  # loading cleanly is fine too; any other exception fails
            load_all(data)


DEEP = b"\x91" * 1000 + b"\xc0"  # 1000 nested arrays: within msgpack's stack, beyond Python's recursion limit


@pytest.mark.parametrize("where", ["META tuning.k", "META graphs.0.inputs", "META graphs.0.name",
                                   "PROGRAMS root.0.steps.0.attrs.perm", "PROGRAMS root.0.steps.0.inputs.0"])
def test_deeply_nested_values_are_refused_without_recursion_errors(where: str) -> None:
    section, path = where.split()
    marker = "DEEP-NESTING-GOES-HERE"
    if section == "META":
        value = msgpack.unpackb(SECTIONS[META][1])
        _put(path, marker)(value)
        data = assemble(meta=msgpack.packb(value).replace(msgpack.packb(marker), DEEP))
    else:
        value = msgpack.unpackb(SECTIONS[PROGRAMS][1], ext_hook=msgpack.ExtType)
        _prog(path, marker)(value)
        data = assemble(programs=msgpack.packb(value).replace(msgpack.packb(marker), DEEP))
    refused(data)


def test_binary_from_other_kernels_is_refused_not_crashed(tmp_path, monkeypatch) -> None:
    """A binary whose planned kernel scratch no longer fits this ctxrt's kernels: a FormatError, no crash."""
    from onnx import TensorProto, helper

    from ctxrt import FormatError, context_from_binary
    from ctxrt.backends.cpu.registry import KERNELS
    from ctxrt.cli import main as cli

    g = helper.make_graph([helper.make_node("Relu", ["x"], ["h"]), helper.make_node("Neg", ["h"], ["y"])], "t",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = tmp_path / "m.onnx"
    model.write_bytes(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)],
                                        ir_version=8).SerializeToString())
    assert cli(["compile", str(model), "-o", str(tmp_path / "m.ctx")]) == 0
    relu = KERNELS["Relu"]

    def needs_scratch(spec):
        k = relu(spec)
        k.scratch = (256,)
        return k

    monkeypatch.setitem(KERNELS, "Relu", needs_scratch)
    with pytest.raises(FormatError, match="compiled by another version"):
        context_from_binary(tmp_path / "m.ctx")
