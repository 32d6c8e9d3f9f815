"""Offline prepare: several models into one context's graphs and weights, a model cut into parts, and the
context binary written with its device programs."""

from __future__ import annotations

import contextlib
import os
import platform
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

import ctxrt
from ctxrt import progress
from ctxrt.backends import Backend
from ctxrt.compiler.program import CONST, CompiledGraph, TensorInfo
from ctxrt.errors import CtxrtError

IO_MEM_TYPES = ("raw", "memhandle")


def _namespaced(g: CompiledGraph, weights: Mapping[str, np.ndarray], prefix: str
                ) -> tuple[CompiledGraph, dict[str, np.ndarray]]:
    """Prefix constant names with the graph name: two models may use one name for different tensors.
    Identical contents are still stored once (the weights block dedups by content)."""
    def ren(r):
        return replace(r, key=f"{prefix}/{r.key}") if r is not None and r.space == CONST else r

    steps = [replace(s, inputs=[ren(r) for r in s.inputs]) for s in g.steps]
    return (replace(g, steps=steps, const_names=[f"{prefix}/{n}" for n in g.const_names]),
            {f"{prefix}/{k}": v for k, v in weights.items()})


def compile_graphs(models: Sequence[tuple[Any, ...]], backend: Backend, io_mem_type: str = "raw",
                   feeds: Mapping[str, Any] | None = None, options: Mapping[str, Any] | None = None,
                   dims: Mapping[str, Any] | None = None, prior: Any = None, **tuning: Any
                   ) -> tuple[list[CompiledGraph], dict[str, np.ndarray]]:
    """(model, shapes, graph name[, values]) for each graph -> compiled graphs and all their weights. Value
    inputs (docs/shapes-and-control-flow.md) are baked in from `values`, or from `feeds` when given. `options`: from
    `ctxrt.compiler.compile_options` (default: prefer speed). `tuning` takes the compile config's keys
    (`tuning_mode=True, performance_cache_dir=...`, docs/tuning.md): the device's kernels are then tuned, and
    `save_context` stores the winners. `dims`: ranges of dynamic dims (compiler/ranges.py), for every model; `prior`:
    the Ranges of a narrower compile of the same model, whose fit is checked first (compile_ranges)."""
    from ctxrt.compiler import compile_model

    if io_mem_type not in IO_MEM_TYPES:
        raise CtxrtError(f"io_mem_type must be one of {IO_MEM_TYPES}, got {io_mem_type!r}")
    names = [m[2] for m in models]
    if len(set(names)) != len(names):
        raise CtxrtError(f"graph names must be unique, got {names}")
    tuner = _tuner(backend, tuning)  # config and cache directory checked before any work
    graphs, weights = [], {}
    for model, shapes, name, *rest in models:
        with progress.part(name) if len(models) > 1 else contextlib.nullcontext():
            try:
                g, w = compile_model(model, shapes, backend, name, rest[0] if rest else None, feeds,
                                     options, tuner, dims, prior)
            except CtxrtError as e:  # with several models, say which one
                if len(models) == 1:
                    raise
                label = os.fspath(model) if isinstance(model, str | os.PathLike) else f"graph {name!r}"
                raise type(e)(f"{label}: {e}") from e
        g, w = _namespaced(g, w, name) if len(models) > 1 else (g, w)
        mem = [TensorInfo(t.name, t.shape, t.dtype, io_mem_type) for t in g.inputs], \
              [TensorInfo(t.name, t.shape, t.dtype, io_mem_type) for t in g.outputs]
        graphs.append(replace(g, inputs=mem[0], outputs=mem[1]))
        weights.update(w)
    return graphs, weights


def compile_split(model: Any, shapes: Mapping[str, Iterable[int]] | None, backend: Backend, k: int,
                  io_mem_type: str = "raw", values: Mapping[str, Any] | None = None,
                  options: Mapping[str, Any] | None = None, dims: Mapping[str, Any] | None = None, **tuning: Any
                  ) -> tuple[list[tuple[CompiledGraph, dict[str, np.ndarray]]], list[str]]:
    """One model cut into K parts (compiler/split.py), each compiled as its own graph. The tensors passed
    between parts are prepared as memhandle (the chain passes them as handles); the model's own inputs
    and outputs as `io_mem_type`. Returns the parts and the model's output names. `tuning`: as compile_graphs.
    `dims`: ranges of dynamic dims (compiler/ranges.py): each part a range program (no `shapes` or `values`)."""
    from ctxrt.compiler import compile_ir, lower
    from ctxrt.compiler.split import check_links, split_graph

    if io_mem_type not in IO_MEM_TYPES:
        raise CtxrtError(f"io_mem_type must be one of {IO_MEM_TYPES}, got {io_mem_type!r}")
    tuner = _tuner(backend, tuning)
    if dims:
        from ctxrt.compiler.ranges import compile_ranges_split
        from ctxrt.frontend.onnx import load_model

        model = load_model(model)  # once, and only the IO names read here (the range compile infers the types)
        inits = {t.name for t in model.graph.initializer}
        return _memtypes(compile_ranges_split(model, dims, backend, k, options, tuner), io_mem_type,
                         [v.name for v in model.graph.input if v.name not in inits],
                         [v.name for v in model.graph.output])
    whole = lower(model, shapes, backend, values=values)
    cut = split_graph(whole, k)
    check_links(whole, cut)
    parts = []
    for i, part in enumerate(cut):
        with progress.part(f"part {i + 1}/{k}"):
            parts.append(compile_ir(part, backend, options, tuner))
    return _memtypes(parts, io_mem_type, list(whole.inputs), list(whole.outputs))


def _memtypes(parts: list[tuple[CompiledGraph, dict[str, np.ndarray]]], io_mem_type: str, inputs: list[str],
              outputs: list[str]) -> tuple[list[tuple[CompiledGraph, dict[str, np.ndarray]]], list[str]]:
    """The parts with the model's inputs and outputs as `io_mem_type`, the tensors between parts as memhandle;
    and the model's output names."""
    ends = set(inputs) | set(outputs)
    typed = []
    for g, w in parts:
        mem = [[TensorInfo(t.name, t.shape, t.dtype, io_mem_type if t.name in ends else "memhandle") for t in ts]
               for ts in (g.inputs, g.outputs)]
        typed.append((replace(g, inputs=mem[0], outputs=mem[1]), w))
    return typed, outputs


def context_info(backend: Backend, source_models: Sequence[str], tuning: Mapping[str, Any] | None = None
                 ) -> dict[str, Any]:
    """META's description of a context compiled for `backend`: backend, device, producer, sources."""
    device = backend.device_id()
    return {"backend": backend.name, "hardware": device.get("device", platform.machine()), "device": device,
            "producer": f"ctxrt {ctxrt.__version__}",
            "source_models": [os.path.basename(str(s)) for s in source_models],
            "alignment": backend.alignment, "tuning": dict(tuning or {})}


def _programs(graphs: Sequence[CompiledGraph], backend: Backend) -> dict[str, Any] | None:
    """The device programs every graph needs, built once each, as the KERNELS section stores them."""
    if backend.programs is None:
        return None
    keys = dict.fromkeys(k for g in graphs for k in g.programs)
    return backend.programs.export(keys)


def _info(graphs: Sequence[CompiledGraph], backend: Backend, source_models: Sequence[str]) -> dict[str, Any]:
    from ctxrt.tuning.record import context_record

    return context_info(backend, source_models, context_record(graphs, backend.device_id()))


def save_context(path: str | os.PathLike, graphs: list[CompiledGraph], weights: Mapping[str, np.ndarray],
                 backend: Backend, source_models: Sequence[str], external: Mapping[str, Any] | None = None,
                 generation: Mapping[str, Any] | None = None) -> Path:
    """Write a context binary: graphs, weights, the tuning record and (for OpenCL) every program's device
    binary. `external` (name -> format.weights.ExternalWeight): weights kept outside the file, only named in it
    (format version 2: the session's compile cache). `generation`: what `compile --generate` found of the model
    that its Generator needs without the ONNX model (META `generation`, docs/format.md)."""
    from ctxrt.format import write_context

    info = _info(graphs, backend, source_models)
    if generation:
        info["generation"] = dict(generation)
    write_context(path, graphs, dict(weights), info, _programs(graphs, backend), external)
    return Path(path)


def context_to_bytes(graphs: list[CompiledGraph], weights: Mapping[str, np.ndarray], backend: Backend,
                     source_models: Sequence[str]) -> bytes:
    """The context binary as bytes (for embedding, e.g. in an EPContext node, or a group made in memory)."""
    from ctxrt.format import context_bytes

    return context_bytes(graphs, dict(weights), _info(graphs, backend, source_models), _programs(graphs, backend))


def _tuner(backend: Any, tuning: Any) -> Any:
    """make_tuner's tuner where a compile config was given; None without importing ctxrt.tuning (and with it the
    OpenCL backend and pyopencl: ~5 MiB resident in a CPU session that compiled an ONNX model)."""
    if not tuning:
        return None
    from ctxrt.tuning import make_tuner

    return make_tuner(backend, tuning)
