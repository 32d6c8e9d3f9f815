"""The files an ONNX model reads besides itself: what a compile cache key must cover, and how their tensors are
read — in place, as views of the mapped file (ctxrt.mapped), not copied into the protobuf as onnx.load does."""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import onnx
from onnx import external_data_helper, helper, numpy_helper

from ctxrt import dtypes
from ctxrt.errors import ModelError
from ctxrt.mapped import file_view

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
        m = onnx.load(os.fspath(path), load_external_data=False)
    except Exception as e:
        raise ModelError(f"cannot read ONNX model {path}: {e}") from e
    found = {e.value for t, _ in _tensors(m) if _external(t) for e in t.external_data if e.key == "location"}
    folder = Path(path).resolve().parent
    return sorted({(folder / loc).resolve() for loc in found})


def load_in_place(path: str | os.PathLike) -> onnx.ModelProto:
    """The model without its external data loaded: each main-graph initializer kept there names its file by
    absolute path (checked to lie in the model's folder), read later by `tensor_array` as a view of the mapped
    file; the few other external tensors (attributes, subgraphs) are loaded as onnx.load would."""
    m = onnx.load(os.fspath(path), load_external_data=False)
    base = os.path.dirname(os.fspath(path))
    for t, main in _tensors(m):
        if not _external(t):
            continue
        if not main or sys.byteorder != "little":
            external_data_helper.load_external_data_for_tensor(t, base)
            continue
        where = {e.key: e.value for e in t.external_data}
        file = _inside(Path(base), where.get("location", ""), t.name)
        for e in t.external_data:
            if e.key == "location":
                e.value = os.fspath(file)
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
    size = os.stat(location).st_size
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
    view = file_view(Path(location), offset, dt, shape)
    return view if offset % ALIGNMENT == 0 else np.array(view)  # kernels get aligned weights
