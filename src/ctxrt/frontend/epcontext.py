"""EPContext models: an ONNX wrapper whose com.microsoft EPContext nodes point at context binaries.

Follows onnxruntime's conventions (QNN EP): main_context, ep_cache_context (a path relative to the
model with embed_mode=0, the binary's bytes with embed_mode=1), source, ep_sdk_version,
hardware_architecture, partition_name, onnx_model_filename, max_size (the context's max spill-fill).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper

import ctxrt
from ctxrt.errors import CtxrtError, FormatError
from ctxrt.format.atomic import atomic_write

DOMAIN = "com.microsoft"
SOURCE = "ctxrt"


@dataclass(frozen=True)
class EPNode:
    name: str
    partition_name: str
    main_context: bool
    max_size: int
    cache_path: Path | None  # embed_mode=0: the binary beside the model
    cache_bytes: bytes | None  # embed_mode=1
    inputs: list[str]
    outputs: list[str]

    @property
    def source(self) -> Path | bytes:
        return self.cache_bytes if self.cache_bytes is not None else self.cache_path  # type: ignore[return-value]


def _value_info(t: dict[str, Any]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(t["name"], helper.np_dtype_to_tensor_dtype(np.dtype(t["dtype"])),
                                         list(t["shape"]))


def write_epcontext(path: str | os.PathLike, contexts: list[tuple[Path, dict[str, Any]]], embed: bool = False,
                    source_model: str = "", outputs: list[str] | None = None) -> None:
    """One EPContext node per graph of each context binary (its metadata given beside its path).

    Graph IO of the wrapper: inputs no node produces; `outputs` if given (a split model's outputs, which
    later parts may read too), else the node outputs no later node reads. So a chain of split contexts
    becomes one model.
    """
    path = Path(path)
    nodes, produced, consumed = [], {}, set()
    for ctx_path, meta in contexts:
        payload = ctx_path.read_bytes() if embed else os.path.relpath(ctx_path, path.parent)
        for i, g in enumerate(meta["graphs"]):
            if g.get("value_ranges"):
                names = [v["name"] for v in g["value_ranges"]]
                raise CtxrtError(f"graph {g['name']!r} takes value inputs as ranges ({names}): an EPContext model "
                                 "cannot declare them; run the context binary itself")
            ins, outs = [t["name"] for t in g["inputs"]], [t["name"] for t in g["outputs"]]
            extra = {}
            if "ranges" in g:  # a range program: its IO dims named, its ranges on the node
                # (docs/shapes-and-control-flow.md)
                from ctxrt.compiler.ranges import io_dims

                in_dims, out_dims = io_dims(g["ranges"], g["inputs"], g["outputs"])
                g = {**g, "inputs": [{**t, "shape": d} for t, d in zip(g["inputs"], in_dims, strict=True)],
                     "outputs": [{**t, "shape": d} for t, d in zip(g["outputs"], out_dims, strict=True)]}
                extra["dim_ranges"] = [f"{d[0]}={d[1]}:{d[2]}" + (f":{d[3]}" if len(d) > 3 else "")
                                       for d in g["ranges"]["dims"]]
            nodes.append(helper.make_node(
                "EPContext", ins, outs, name=f"{ctx_path.stem}_{g['name']}", domain=DOMAIN,
                main_context=1 if i == 0 else 0, ep_cache_context=payload, embed_mode=int(embed),
                source=SOURCE, ep_sdk_version=ctxrt.__version__,
                hardware_architecture=str(meta.get("hardware", "")), partition_name=g["name"],
                onnx_model_filename=source_model, max_size=int(meta["max_spillfill_size"]), **extra))
            for t in g["inputs"]:
                consumed.add(t["name"])
                produced.setdefault(("in", t["name"]), t)
            for t in g["outputs"]:
                produced[("out", t["name"])] = t
    outs_made = {k[1] for k in produced if k[0] == "out"}
    graph_inputs = [_value_info(t) for (kind, name), t in produced.items() if kind == "in" and name not in outs_made]
    if outputs is None:
        outputs = [name for (kind, name) in produced if kind == "out" and name not in consumed]
    graph_outputs = [_value_info(produced[("out", name)]) for name in outputs]
    model = helper.make_model(
        helper.make_graph(nodes, path.stem, graph_inputs, graph_outputs),
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1)], ir_version=8,
        producer_name="ctxrt", producer_version=ctxrt.__version__)
    with atomic_write(path) as f:
        f.write(model.SerializeToString())


def is_epcontext(path: str | os.PathLike) -> bool:
    """True for a readable ONNX file with EPContext nodes (an unreadable one is reported by its loader)."""
    try:
        model = _load(path)
    except FormatError:
        return False
    return any(n.op_type == "EPContext" and n.domain == DOMAIN for n in model.graph.node)


def _load(path: str | os.PathLike) -> onnx.ModelProto:
    from ctxrt.frontend.external import structure

    try:
        return structure(path)
    except Exception as e:
        raise FormatError(f"cannot read EPContext model {path}: {e}") from e


def read_epcontext_io(path: str | os.PathLike) -> tuple[list[str], list[str]]:
    """The wrapper model's input and output names."""
    graph = _load(path).graph
    return [v.name for v in graph.input], [v.name for v in graph.output]


def read_epcontext(path: str | os.PathLike) -> list[EPNode]:
    """The EPContext nodes of a wrapper model, in order; every other node is refused."""
    path = Path(path)
    model = _load(path)
    out = []
    for node in model.graph.node:
        if node.op_type != "EPContext" or node.domain != DOMAIN:
            raise FormatError(f"{path}: node {node.name!r} ({node.domain or 'ai.onnx'}.{node.op_type}) is not "
                              "an EPContext node; ctxrt runs EPContext models made of EPContext nodes only")
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if "ep_cache_context" not in attrs:
            raise FormatError(f"{path}: EPContext node {node.name!r} has no ep_cache_context")
        cache = attrs["ep_cache_context"]
        embed = int(attrs.get("embed_mode", 1))
        cache_path = cache_bytes = None
        if embed:
            cache_bytes = bytes(cache)
        else:
            rel = cache.decode() if isinstance(cache, bytes) else str(cache)
            cache_path = (path.parent / rel).resolve()
            if not cache_path.is_file():
                raise FormatError(f"{path}: EPContext node {node.name!r} points at missing file {rel}")
        part = attrs.get("partition_name", node.name.encode())
        out.append(EPNode(node.name, part.decode() if isinstance(part, bytes) else str(part),
                          bool(attrs.get("main_context", 1)), int(attrs.get("max_size", 0)), cache_path,
                          cache_bytes, list(node.input), list(node.output)))
    if not out:
        raise FormatError(f"{path}: no EPContext nodes")
    return out
