"""The KERNELS section (device programs: binaries, sources, the device they were built for): round trip, and
hostile sections refused with FormatError by the reader (and by the writer before it writes them)."""

from __future__ import annotations

import contextlib
import hashlib
import struct
import zlib
from typing import Any

import msgpack
import numpy as np
import pytest
from test_hostile import _graph

from ctxrt.errors import FormatError
from ctxrt.format import ContextFile, context_bytes, read_metadata

KERNELS = 4
INFO = {"backend": "opencl", "hardware": "dev", "producer": "test", "alignment": 128,
        "device": {"backend": "opencl", "device": "dev", "driver": "1.0"}}
SOURCE = "__kernel void k(__global float* x) { x[0] = 1; }"


def _programs(**edit: Any) -> dict[str, Any]:
    p = {"name": "k.cl", "source_hash": hashlib.sha256(SOURCE.encode()).hexdigest(), "options": "-DT=float",
         "source": SOURCE, "binary": b"\x7fELF..."}
    p.update(edit)
    return {"device": {"tier": "acme/dev/1.0", "vendor": "Acme", "device": "dev", "driver": "1.0"}, "programs": [p]}


WEIGHTS = {"w": np.arange(16, dtype=np.float32).reshape(4, 4)}
VALID = context_bytes([_graph()], WEIGHTS, INFO, _programs())


def _with_kernels(body: bytes, fix_crc: bool = True) -> bytes:
    """VALID with its KERNELS section (the last one) replaced by `body`; table, sizes and checksums fixed."""
    count = struct.unpack_from("<I", VALID, 16)[0]
    entries = [list(struct.unpack_from("<IIQQII", VALID, 64 + 32 * i)) for i in range(count)]
    k = next(e for e in entries if e[0] == KERNELS)
    k[3] = len(body)
    k[4] = zlib.crc32(body) if fix_crc else k[4]
    data = VALID[:k[2]] + body
    table = b"".join(struct.pack("<IIQQII", *e) for e in entries)
    head = bytearray(VALID[:64])
    struct.pack_into("<Q", head, 32, len(data))
    struct.pack_into("<I", head, 60, zlib.crc32(bytes(head[:60]) + table))
    return bytes(head) + table + data[64 + len(table):]


def _programs_of(data: bytes) -> dict[str, Any] | None:
    with ContextFile.open(data) as f:
        return f.programs()


def test_round_trip_and_metadata_untouched() -> None:
    assert _programs_of(VALID) == _programs()
    assert read_metadata(VALID)["device"] == INFO["device"]
    assert _programs_of(context_bytes([_graph()], WEIGHTS, {**INFO, "backend": "cpu"})) is None


BAD = {
    "not msgpack": (b"\xc1\xc1\xc1", "not valid msgpack"),
    "not a map": (msgpack.packb([1, 2]), "expected a map"),
    "no device": (msgpack.packb({"programs": []}), "missing key 'device'"),
    "device not str": (msgpack.packb({"device": {"tier": 3}, "programs": []}), "expected a str"),
    "programs not a list": (msgpack.packb({"device": {}, "programs": {}}), "expected a list"),
    "binary as str": (msgpack.packb(_programs(binary="x"), use_bin_type=True), "expected bytes"),
    "name missing": (msgpack.packb({**_programs(), "programs": [{"source": SOURCE}]}), "missing key"),
    "source edited": (msgpack.packb(_programs(source=SOURCE + " "), use_bin_type=True), "does not match"),
    "twice": (msgpack.packb({**_programs(), "programs": _programs()["programs"] * 2}, use_bin_type=True),
              "a second program"),
    "huge claimed bin": (b"\x82\xa6device\x80\xa8programs\x91\x85\xa6binary\xc6\x7f\xff\xff\xff", "not valid msgpack"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_hostile_kernels_section_is_refused(case: str) -> None:
    body, match = BAD[case]
    with pytest.raises(FormatError, match=match):
        _programs_of(_with_kernels(body))


def test_checksum_and_bounds() -> None:
    body = bytearray(msgpack.packb(_programs(), use_bin_type=True))
    good = _with_kernels(bytes(body))
    body[-3] ^= 0xFF
    with pytest.raises(FormatError, match="checksum mismatch"):
        _programs_of(_with_kernels(bytes(body), fix_crc=False)[:len(good)])
    with pytest.raises(FormatError):
        ContextFile.open(good[:-1])  # truncated: the header's file size no longer matches


def test_random_damage_raises_only_format_errors() -> None:
    body = msgpack.packb(_programs(), use_bin_type=True)
    rng = np.random.default_rng(0)
    for _ in range(300):
        damaged = bytearray(body)
        for i in rng.integers(0, len(body), size=rng.integers(1, 6)):
            damaged[i] = int(rng.integers(0, 256))
        with contextlib.suppress(FormatError):
            _programs_of(_with_kernels(bytes(damaged)))


def test_writer_refuses_what_the_reader_would() -> None:
    with pytest.raises(FormatError, match="does not match"):
        context_bytes([_graph()], WEIGHTS, INFO, _programs(source="other"))
    with pytest.raises(FormatError, match="cannot encode"):
        context_bytes([_graph()], WEIGHTS, INFO, {"device": {}, "programs": [object()]})
