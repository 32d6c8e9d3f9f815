"""Writing context binaries: an explicit state machine, then an atomic file write.

    w = ContextWriter(info)            # NEW
    w.add_graph(g) ...                 # GRAPHS (one or more)
    w.add_weights(weights[, external]) # WEIGHTS: deduplicated, laid out, checksummed (external: format version 2)
    w.add_programs(programs)           # KERNELS (optional): device program binaries and their sources
    w.finish()                         # READY: META, PROGRAMS (and KERNELS) encoded and read back through the
                                       #        reader's checks
    w.write_to(f)                      # DONE: header, table, META, PROGRAMS, aligned weights, KERNELS, streamed

Each call refuses to run out of order, so a half-built context can never reach a file.
"""

from __future__ import annotations

import enum
import io
import os
from collections.abc import Mapping
from typing import Any, BinaryIO

import msgpack
import numpy as np

from ctxrt import progress
from ctxrt.compiler.program import Body, CompiledGraph, Ref, Step
from ctxrt.errors import FormatError
from ctxrt.format import codec, layout, schema
from ctxrt.format.atomic import atomic_write
from ctxrt.format.weights import ExternalWeight, plan_weights

INFO_REQUIRED = {"backend": str, "hardware": str, "producer": str, "alignment": int}
INFO_OPTIONAL = {"source_models": list, "tuning": dict, "device": dict, "generation": dict}


class State(enum.Enum):
    NEW = 0
    GRAPHS = 1
    WEIGHTS = 2
    KERNELS = 3
    READY = 4
    DONE = 5


class ContextWriter:
    def __init__(self, info: Mapping[str, Any]) -> None:
        unknown = set(info) - set(INFO_REQUIRED) - set(INFO_OPTIONAL)
        if unknown:
            raise FormatError(f"context info has unknown keys {sorted(unknown)}")
        for key, kind in INFO_REQUIRED.items():
            if not isinstance(info.get(key), kind):
                raise FormatError(f"context info needs {key!r} as {kind.__name__}, got {info.get(key)!r}")
        self.info = {"source_models": [], "tuning": {}, **info}
        self.state = State.NEW
        self.graphs: list[CompiledGraph] = []
        self.table: dict[str, list[Any]] = {}  # name -> [offset, nbytes, dtype, shape]
        self.chunks: list[tuple[int, np.ndarray]] = []  # (offset in the section, uint8 bytes), unique only
        self.external: dict[str, list[Any]] = {}  # name -> [key, nbytes, dtype, shape, crc]: outside the file
        self.weights_size = 0
        self.weights_crc = 0
        self.head = self.meta = self.programs = self.kernels = b""
        self.sections: dict[int, layout.Section] = {}

    def _advance(self, allowed: tuple[State, ...], to: State, call: str) -> None:
        if self.state not in allowed:
            raise FormatError(f"ContextWriter.{call}() called in state {self.state.name}; "
                              f"it needs {' or '.join(s.name for s in allowed)}")
        self.state = to

    def add_graph(self, graph: CompiledGraph) -> None:
        self._advance((State.NEW, State.GRAPHS), State.GRAPHS, "add_graph")
        _check_steps(graph.steps, f"graph {graph.name!r}")
        self.graphs.append(graph)

    def add_weights(self, weights: Mapping[str, np.ndarray], external: Mapping[str, ExternalWeight] | None = None
                    ) -> None:
        """Lay out the weights: identical (dtype, shape, bytes) are stored once, each start 64-aligned. Weights in
        `external` are only named (by the SHA-256 of their bytes): the file is then format version 2."""
        self._advance((State.GRAPHS,), State.WEIGHTS, "add_weights")
        table, self.chunks, size = plan_weights(weights)
        self.table = {name: [e.offset, e.nbytes, e.dtype, list(e.shape)] for name, e in table.items()}
        self.external = {name: e.as_list() for name, e in (external or {}).items()}
        crc = pos = 0
        for offset, raw in self.chunks:
            crc = layout.crc32(raw, layout.crc32(bytes(offset - pos), crc))
            pos = offset + raw.nbytes
        self.weights_size, self.weights_crc = size, crc

    def add_programs(self, programs: Mapping[str, Any]) -> None:
        """The device programs (`{"device": {...}, "programs": [...]}`, docs/format.md) for the KERNELS section."""
        self._advance((State.WEIGHTS,), State.KERNELS, "add_programs")
        try:
            self.kernels = msgpack.packb(dict(programs), use_bin_type=True)
        except (TypeError, ValueError, OverflowError) as e:
            raise FormatError(f"cannot encode the device programs: {e}") from e
        schema.check_kernels(codec.decode(self.kernels, "KERNELS"))

    @property
    def version(self) -> int:
        """The format version a reader needs: 2 when some weights are outside the file, else 1."""
        return layout.EXTERNAL_VERSION if self.external else layout.FORMAT_VERSION

    def finish(self) -> None:
        self._advance((State.WEIGHTS, State.KERNELS), State.READY, "finish")
        meta = {"format_version": self.version, **self.info, "weights_size": self.weights_size,
                "max_spillfill_size": max(g.spillfill_size for g in self.graphs),
                "graphs": [_graph_meta(g, self.info["backend"]) for g in self.graphs], "weights": self.table}
        if self.external:
            meta["external_weights"] = self.external
        try:
            self.meta = msgpack.packb(meta, use_bin_type=True)  # META is plain data: no numpy extensions
            self.programs = codec.encode([_program(g, self.info["backend"]) for g in self.graphs])
        except (TypeError, ValueError, OverflowError) as e:
            raise FormatError(f"cannot encode context metadata or programs: {e}") from e
        # Read back what would be written: a file this writer makes always passes the reader's checks.
        checked = schema.check_meta(codec.decode(self.meta, "META"), self.weights_size, self.version)
        schema.graphs_from(codec.decode(self.programs, "PROGRAMS", keep_ext=True), checked)
        table_end = layout.HEADER.size + (4 if self.kernels else 3) * layout.ENTRY.size
        meta_at = layout.align(table_end, layout.SECTION_ALIGNMENT[layout.META])
        programs_at = layout.align(meta_at + len(self.meta), layout.SECTION_ALIGNMENT[layout.PROGRAMS])
        weights_at = layout.align(programs_at + len(self.programs), layout.PAGE)
        self.sections = {
            layout.META: layout.Section(layout.META, 8, meta_at, len(self.meta), layout.crc32(self.meta)),
            layout.PROGRAMS: layout.Section(layout.PROGRAMS, 8, programs_at, len(self.programs),
                                            layout.crc32(self.programs)),
            layout.WEIGHTS: layout.Section(layout.WEIGHTS, layout.PAGE, weights_at, self.weights_size,
                                           self.weights_crc),
        }
        if self.kernels:
            kernels_at = layout.align(self.sections[layout.WEIGHTS].end, layout.PAGE)
            self.sections[layout.KERNELS] = layout.Section(layout.KERNELS, layout.PAGE, kernels_at,
                                                           len(self.kernels), layout.crc32(self.kernels))
        self.head = layout.pack_head(list(self.sections.values()), self.size, self.version)

    @property
    def size(self) -> int:
        return max(s.end for s in self.sections.values())

    def write_to(self, f: BinaryIO) -> None:
        self._advance((State.READY,), State.DONE, "write_to")
        progress.stage("writing", self.size, "B")
        f.write(self.head)
        pos = len(self.head)
        for kind in (layout.META, layout.PROGRAMS):
            s = self.sections[kind]
            f.write(bytes(s.offset - pos))
            f.write(self.meta if kind == layout.META else self.programs)
            pos = s.end
        f.write(bytes(self.sections[layout.WEIGHTS].offset - pos))
        progress.advance(self.sections[layout.WEIGHTS].offset)
        self._write_weights(f)
        if self.kernels:
            f.write(bytes(self.sections[layout.KERNELS].offset - self.sections[layout.WEIGHTS].end))
            f.write(self.kernels)
            progress.advance(self.sections[layout.KERNELS].end - self.sections[layout.WEIGHTS].end)

    def _write_weights(self, f: BinaryIO) -> None:
        pos = 0
        for offset, raw in self.chunks:
            f.write(bytes(offset - pos))
            f.write(raw.data)
            progress.advance(offset + raw.nbytes - pos)
            pos = offset + raw.nbytes


def _check_steps(steps: list[Step], where: str, depth: int = 0) -> None:
    if depth > schema.MAX_BODY_DEPTH:
        raise FormatError(f"{where}: control-flow bodies nested deeper than {schema.MAX_BODY_DEPTH} levels")
    for step in steps:
        for key, value in step.attrs.items():
            if isinstance(value, Body):
                _check_steps(value.steps, f"{where} step {step.name!r} body {key!r}", depth + 1)
            else:
                codec.check_attr(value, f"{where} step {step.name!r} attribute {key!r}")


def _io(infos: list[Any]) -> list[dict[str, Any]]:
    return [{"name": t.name, "dtype": t.dtype, "shape": list(t.shape), "mem_type": t.mem_type} for t in infos]


def _graph_meta(g: CompiledGraph, backend: str) -> dict[str, Any]:
    meta = {"name": g.name, "opset": g.opset, "inputs": _io(g.inputs), "outputs": _io(g.outputs),
            "spillfill_size": g.spillfill_size, "lower_bound": g.lower_bound, "io_bytes": g.io_bytes,
            "strategy": g.strategy,
            "partitions": [{**p, "backend": p["backend"] or backend} for p in g.partitions()]}
    if g.value_inputs:  # optional keys: files without value inputs or bounded outputs stay as they were
        meta["value_inputs"] = {k: np.asarray(v).reshape(-1).tolist() for k, v in g.value_inputs.items()}
    if g.extents:
        meta["bounded_outputs"] = {k: axis for k, (axis, _) in g.extents.items()}
    if g.ranges is not None:  # a range program: its dims and how its integers follow them (docs/format.md)
        meta["ranges"] = g.ranges.to_meta()
    if g.carriers:  # value inputs it takes as lengths (docs/format.md)
        meta["value_ranges"] = [{"name": n, "dtype": dt, "shape": list(shape), "elements": list(elements)}
                                for n, dt, shape, elements in g.carriers]
    return meta


def _ref(r: Ref | None) -> list[Any] | None:
    return None if r is None else [r.space, r.key, r.offset, list(r.shape), r.dtype]


def _step(s: Step, backend: str) -> dict[str, Any]:
    """A step; its backend defaults to the context's (a body's steps run on their control node's)."""
    attrs = {k: _body(v, s.backend or backend) if isinstance(v, Body) else v for k, v in s.attrs.items()}
    out = {"op": s.op, "name": s.name, "attrs": attrs, "inputs": [_ref(r) for r in s.inputs],
           "outputs": [_ref(r) for r in s.outputs], "scratch": [_ref(r) for r in s.scratch],
           "algorithm": s.algorithm, "backend": s.backend or backend}
    if s.params:  # tuned kernel parameters: only tuned steps carry them
        out["params"] = dict(s.params)
    return out


def _body(b: Body, backend: str) -> msgpack.ExtType:
    """A compiled body as an extension value whose payload is itself MessagePack (docs/format.md)."""
    value = {"inputs": _io(b.inputs), "outputs": _io(b.outputs), "steps": [_step(s, backend) for s in b.steps],
             "arena_size": b.arena_size, "alignment": b.alignment}
    return msgpack.ExtType(codec.EXT_BODY, codec.encode(value))


def _program(g: CompiledGraph, backend: str) -> dict[str, Any]:
    out = {"name": g.name, "alignment": g.alignment, "steps": [_step(s, backend) for s in g.steps],
           "intervals": [[i.key, i.offset, i.size, i.first, i.last] for i in g.intervals],
           "const_names": list(g.const_names)}
    if g.extents:
        out["extents"] = {k: _ref(r) for k, (_, r) in g.extents.items()}
    return out


def _writer(graphs: list[CompiledGraph], weights: Mapping[str, np.ndarray], info: Mapping[str, Any],
            programs: Mapping[str, Any] | None, external: Mapping[str, ExternalWeight] | None = None
            ) -> ContextWriter:
    w = ContextWriter(info)
    for g in graphs:
        w.add_graph(g)
    w.add_weights(weights, external)
    if programs is not None:
        w.add_programs(programs)
    w.finish()
    return w


def context_bytes(graphs: list[CompiledGraph], weights: Mapping[str, np.ndarray], info: Mapping[str, Any],
                  programs: Mapping[str, Any] | None = None,
                  external: Mapping[str, ExternalWeight] | None = None) -> bytes:
    """The context binary as bytes (for embedding, e.g. in an EPContext node)."""
    buf = io.BytesIO()
    _writer(graphs, weights, info, programs, external).write_to(buf)
    return buf.getvalue()


def write_context(path: str | os.PathLike[str], graphs: list[CompiledGraph], weights: Mapping[str, np.ndarray],
                  info: Mapping[str, Any], programs: Mapping[str, Any] | None = None,
                  external: Mapping[str, ExternalWeight] | None = None) -> None:
    """Write a context binary atomically (format/atomic.py): the file at `path` is whole or absent. `external`:
    weights the file only names (format version 2), whose bytes the loader supplies."""
    w = _writer(graphs, weights, info, programs, external)
    with atomic_write(path) as f:
        w.write_to(f)
