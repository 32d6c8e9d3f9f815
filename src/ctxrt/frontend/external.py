"""The files an ONNX model reads besides itself: what a compile cache key must cover."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import onnx

from ctxrt.errors import ModelError


def external_data_files(path: str | os.PathLike) -> list[Path]:
    """The files other than the model itself that its tensors keep their data in (ONNX external data: every
    initializer, Constant and subgraph tensor), resolved against the model's folder, each once, sorted."""
    try:
        m = onnx.load(os.fspath(path), load_external_data=False)
    except Exception as e:
        raise ModelError(f"cannot read ONNX model {path}: {e}") from e
    found: set[str] = set()

    def tensors(t: onnx.TensorProto) -> None:
        if t.data_location == onnx.TensorProto.EXTERNAL:
            found.update(e.value for e in t.external_data if e.key == "location")

    def nodes(ns: Iterable[onnx.NodeProto]) -> None:
        for node in ns:
            for a in node.attribute:
                if a.HasField("t"):
                    tensors(a.t)
                for t in a.tensors:
                    tensors(t)
                for sub in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                    graph(sub)

    def graph(g: onnx.GraphProto) -> None:
        for t in g.initializer:
            tensors(t)
        for sp in g.sparse_initializer:
            tensors(sp.values)
            tensors(sp.indices)
        nodes(g.node)

    graph(m.graph)
    for f in m.functions:
        nodes(f.node)
    folder = Path(path).resolve().parent
    return sorted({(folder / loc).resolve() for loc in found})
