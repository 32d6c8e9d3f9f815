"""The files an ONNX model reads besides itself: what a compile cache key must cover, and how their tensors are
read — in place, as views of the mapped file (ctxrt.mapped), not copied into the protobuf as onnx.load does."""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import external_data_helper, helper, numpy_helper

from ctxrt import dtypes
from ctxrt.errors import ModelError
from ctxrt.mapped import file_view, read_from

ALIGNMENT = 64  # an external tensor at an offset of this many bytes is read in place; others are copied


def _tensors(m: onnx.ModelProto) -> Iterator[tuple[onnx.TensorProto, bool]]:
    """Every tensor of the model (initializers, sparse initializers, node attributes, subgraphs, functions), each
    with whether it is an initializer of the main graph."""

    def nodes(ns: Iterable[onnx.NodeProto]) -> Iterator[tuple[onnx.TensorProto, bool]]:
        for node in ns:
            for a in node.attribute:
                if a.HasField("t"):
                    yield a.t, False
                for t in a.tensors:
                    yield t, False
                for sub in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                    yield from graph(sub, False)

    def graph(g: onnx.GraphProto, main: bool) -> Iterator[tuple[onnx.TensorProto, bool]]:
        for t in g.initializer:
            yield t, main
        for sp in g.sparse_initializer:
            yield sp.values, False
            yield sp.indices, False
        yield from nodes(g.node)

    yield from graph(m.graph, True)
    for f in m.functions:
        yield from nodes(f.node)


def _external(t: onnx.TensorProto) -> bool:
    return t.data_location == onnx.TensorProto.EXTERNAL


def external_data_files(path: str | os.PathLike) -> list[Path]:
    """The files other than the model itself that its tensors keep their data in (ONNX external data: every
    initializer, Constant and subgraph tensor), resolved against the model's folder, each once, sorted."""
    try:
        m = structure(path)
    except Exception as e:
        raise ModelError(f"cannot read ONNX model {path}: {e}") from e
    found = {e.value for t, _ in _tensors(m) if _external(t) for e in t.external_data if e.key == "location"}
    me = Path(path).resolve()
    return sorted({(me.parent / loc).resolve() for loc in found} - {me})  # not the model's own embedded weights


IN_PLACE_MIN = 1 << 20  # a model file of at least this many bytes has its main-graph initializers read in place
STAMP = "ctxrt_file_stat"  # external_data key: "size:mtime_ns" of the model file its embedded bytes were found in


def load_in_place(path: str | os.PathLike) -> onnx.ModelProto:
    """The model without its external data loaded: each main-graph initializer kept there names its file by
    absolute path (checked to lie in the model's folder), read later by `tensor_array` as a view of the mapped
    file; the few other external tensors (attributes, subgraphs) are loaded as onnx.load would. A model file of
    IN_PLACE_MIN bytes or more is parsed without its main-graph initializers' `raw_data` (`_without_raw_data`),
    each then read from the model file itself as external data is: onnx.load would hold the file's bytes and
    the parsed copy of every weight at once (twice the weights at its peak, before any compile)."""
    m = structure(path)
    base = os.path.dirname(os.fspath(path))
    files: dict[str, Path] = {}  # location -> the file checked (resolved once, not once per tensor)
    for t, main in _tensors(m):
        if not _external(t):
            continue
        if not main or sys.byteorder != "little":
            external_data_helper.load_external_data_for_tensor(t, base)
            continue
        where = {e.key: e.value for e in t.external_data}
        location = where.get("location", "")
        file = files.get(location) or files.setdefault(location, _inside(Path(base), location, t.name))
        for e in t.external_data:
            if e.key == "location":
                e.value = os.fspath(file)
    return m


def structure(path: str | os.PathLike) -> onnx.ModelProto:
    """The model as onnx.load(..., load_external_data=False) gives it, but a file of IN_PLACE_MIN bytes or more
    without its main-graph initializers' embedded bytes (`_without_raw_data`: external data in the model file
    itself): what reading its inputs, outputs and nodes needs, at a fraction of the memory. A new proto each call
    (callers change it), parsed from the file's last parse while the file is the same (`_PARSED`: opening a session
    reads a model's structure three times, ~1.3 ms each for a 13 MB decoder, 0.1 ms from the bytes)."""
    key = file_key(path)
    hit = _PARSED.get(key) if key is not None else None
    if hit is not None:
        return onnx.ModelProto.FromString(hit)
    m = None
    if os.path.getsize(path) >= IN_PLACE_MIN:
        m = _without_raw_data(Path(path).resolve())
    m = m if m is not None else onnx.load(os.fspath(path), load_external_data=False)
    remember(_PARSED, key, m.SerializeToString())
    return m


_PARSED: dict[tuple[Any, ...], bytes] = {}  # file_key -> the structure's bytes, the latest KEPT files
KEPT = 2
_RACY_NS = 2_000_000_000


def file_key(path: str | os.PathLike) -> tuple[Any, ...] | None:
    """The file as it is now (its real path and stat), to key what was read from it; None where it cannot be
    kept: no such file, or changed within the clock's resolution (a change then could keep its stamp)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    if time.time_ns() - max(st.st_mtime_ns, st.st_ctime_ns) <= _RACY_NS:
        return None
    return os.path.realpath(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def remember(table: dict[Any, Any], key: tuple[Any, ...] | None, value: Any) -> None:
    """`value` kept in `table` under `key` (a `file_key`; None: not kept), with the latest KEPT others."""
    if key is None:
        return
    table[key] = value
    while len(table) > KEPT:
        table.pop(next(iter(table)))


def _varint(buf: memoryview, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, i
        shift += 7
        if shift > 63:
            raise ValueError("malformed varint")


def _fields(buf: memoryview, start: int, end: int) -> Iterator[tuple[int, int, int, int]]:
    """(field number, where its tag starts, where its payload starts, where it ends) of each field of the
    protobuf message in buf[start:end] (wire types 0, 1, 2 and 5; ONNX uses no groups)."""
    i = start
    while i < end:
        tag, j = _varint(buf, i)
        kind = tag & 7
        if kind == 0:
            _, k = _varint(buf, j)
            yield tag >> 3, i, j, k
        elif kind == 1:
            yield tag >> 3, i, j, j + 8
            k = j + 8
        elif kind == 2:
            n, j = _varint(buf, j)
            k = j + n
            yield tag >> 3, i, j, k
        elif kind == 5:
            yield tag >> 3, i, j, j + 4
            k = j + 4
        else:
            raise ValueError(f"unsupported wire type {kind}")
        if k > end:
            raise ValueError("field runs past its message")
        i = k


def _length_delimited(field: int, payload: bytes) -> bytes:
    out, n = bytearray(), field << 3 | 2
    for v in (n, len(payload)):
        while v >= 0x80:
            out.append(v & 0x7F | 0x80)
            v >>= 7
        out.append(v)
    return bytes(out) + payload


def _without_raw_data(path: Path) -> onnx.ModelProto | None:
    """The model parsed from its file without the `raw_data` of its main graph's initializers (ModelProto.graph
    = 7, GraphProto.initializer = 5, TensorProto.raw_data = 9), each such tensor then external data at its
    offset in the model file itself (`tensor_array` reads it in place). None where the file holds none, or is
    not what this reader expects (onnx.load then reads it as it would)."""
    try:
        st = os.stat(path)
        mm = np.memmap(path, np.uint8, mode="r")
    except (OSError, ValueError):
        return None
    stamp = f"{st.st_size}:{st.st_mtime_ns}"  # the file as parsed: a weight read from another one is refused
    buf = memoryview(mm)
    try:
        where: list[tuple[int, int]] = []  # per stripped initializer: (offset of its bytes, length)
        model = bytearray()
        for field, tag, start, end in _fields(buf, 0, len(buf)):
            if field != 7:
                model += buf[tag:end]
                continue
            graph = bytearray()
            for gfield, gtag, gstart, gend in _fields(buf, start, end):
                if gfield != 5:
                    graph += buf[gtag:gend]
                    continue
                tensor, raw = bytearray(), None
                for tfield, ttag, tstart, tend in _fields(buf, gstart, gend):
                    if tfield == 9:
                        raw = (tstart, tend - tstart)  # the last one is the value, as a parser reads it
                    else:
                        tensor += buf[ttag:tend]
                where.append(raw if raw is not None else (-1, 0))
                graph += _length_delimited(5, bytes(tensor))
            model += _length_delimited(7, bytes(graph))
        if not any(off >= 0 for off, _ in where):
            return None
        m = onnx.ModelProto.FromString(bytes(model))
    except (ValueError, IndexError, Exception):  # noqa: BLE001  protobuf's DecodeError included: onnx.load decides
        return None
    finally:
        del buf
        del mm
    if len(m.graph.initializer) != len(where):
        return None
    for t, (offset, length) in zip(m.graph.initializer, where, strict=True):
        if offset < 0:
            continue
        t.data_location = onnx.TensorProto.EXTERNAL
        for key, value in (("location", path.name), ("offset", str(offset)), ("length", str(length)),
                           (STAMP, stamp)):
            e = t.external_data.add()
            e.key, e.value = key, value
    return m


def _inside(folder: Path, location: str, name: str) -> Path:
    """The external data file of tensor `name`, which must be a file inside the model's folder."""
    root = folder.resolve()
    file = (root / location).resolve()
    if not location or os.path.isabs(location) or root not in file.parents:
        raise ModelError(f"tensor {name!r}: external data location {location!r} is not a file inside the model's "
                         "folder")
    if not file.is_file():
        raise ModelError(f"tensor {name!r}: external data file {file} does not exist")
    return file


def tensor_array(t: onnx.TensorProto) -> np.ndarray:
    """A tensor's value: for a main-graph initializer kept in an external file (`load_in_place`), a read-only
    view of the mapped file where its bytes are stored as the array's own (not 4-bit, not strings); else
    numpy_helper.to_array."""
    if not _external(t):
        return numpy_helper.to_array(t)
    where = {e.key: e.value for e in t.external_data}
    location = where.get("location", "")
    if not os.path.isabs(location):  # a proto loaded some other way: onnx reads it
        return numpy_helper.to_array(t)
    dt = np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type))
    shape = tuple(int(d) for d in t.dims)
    nbytes = math.prod(shape) * dt.itemsize
    offset, length = int(where.get("offset", 0)), int(where.get("length", nbytes))
    st = os.stat(location)
    size = st.st_size
    if STAMP in where and where[STAMP] != f"{st.st_size}:{st.st_mtime_ns}":
        raise ModelError(f"tensor {t.name!r}: {location} changed after it was parsed; open the model again")
    if offset < 0 or length != nbytes or offset + nbytes > size:
        raise ModelError(f"tensor {t.name!r}: external data at offset {offset}, {length} bytes, does not hold "
                         f"{dt} {list(shape)} ({nbytes} bytes) inside {location} ({size} bytes)")
    if dtypes.is_4bit(dt) or dt.kind not in "biufc" and dt != dtypes.BFLOAT16 or nbytes == 0:
        copy = onnx.TensorProto()
        copy.CopyFrom(t)
        for e in copy.external_data:
            if e.key == "location":
                e.value = os.path.basename(location)
        return numpy_helper.to_array(copy, os.path.dirname(location))
    if offset % ALIGNMENT == 0:
        return file_view(Path(location), offset, dt, shape)
    # kernels get aligned weights: read into a new array (no file page kept mapped), ALIGNMENT-aligned and
    # read-only, which a weight store then holds as it is instead of copying (runtime/weightstore.py)
    block = np.empty(nbytes + ALIGNMENT, np.uint8)
    start = -block.ctypes.data % ALIGNMENT
    with open(location, "rb") as f:
        f.seek(offset)
        if f.readinto(block[start:start + nbytes]) != nbytes:
            raise ModelError(f"tensor {t.name!r}: {location} ended before its {nbytes} bytes")
        after = os.fstat(f.fileno())
    block.flags.writeable = False
    version = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    if version == (after.st_dev, after.st_ino, after.st_size, after.st_mtime_ns, after.st_ctime_ns):
        read_from(block, ":".join(map(str, version)), offset - start)  # (the file unchanged while it was read)
    return block[start:start + nbytes].view(dt).reshape(shape)
