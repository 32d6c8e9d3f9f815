"""Compile ONNX models into graphs bound to a memory plan (online prepare returns a Context)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from ctxrt import progress
from ctxrt.backends import Backend, get_backend, supported_ops
from ctxrt.compiler.build import compile_graph
from ctxrt.compiler.prepare import compile_graphs, compile_split, context_info, context_to_bytes, save_context
from ctxrt.compiler.program import CompiledGraph
from ctxrt.errors import CtxrtError
from ctxrt.ir.graph import Graph as IRGraph
from ctxrt.ir.passes import default_passes, run_passes
from ctxrt.runtime.context import Context

if TYPE_CHECKING:
    from ctxrt.tuning.tuner import Tuner


def lower(model: Any, shapes: Mapping[str, Iterable[int]] | None, backend: Backend, name: str = "main",
          values: Mapping[str, Any] | None = None, feeds: Mapping[str, Any] | None = None,
          keep: frozenset[str] = frozenset(), options: Mapping[str, Any] | None = None) -> IRGraph:
    """ONNX model -> IR graph with static shapes, after the default passes (on control-flow bodies too).
    `values` bakes in value inputs; missing ones are taken from `feeds` when given (docs/shapes-and-control-flow.md).
    `options["kv_shared"]`: past inputs bound to one buffer with their presents (frontend.onnx.to_ir)."""
    return lower_ir(read(model, shapes, backend, name, values, feeds, keep, options), backend, options)


def read(model: Any, shapes: Mapping[str, Iterable[int]] | None, backend: Backend, name: str = "main",
         values: Mapping[str, Any] | None = None, feeds: Mapping[str, Any] | None = None,
         keep: frozenset[str] = frozenset(), options: Mapping[str, Any] | None = None) -> IRGraph:
    """The first half of `lower`: the frontend alone (read, shapes inferred, constants folded), no passes."""
    from ctxrt.frontend.onnx import to_ir

    progress.stage("reading and folding")
    shared = frozenset((options or {}).get("kv_shared", ()))
    probe = bool((options or {}).get("ranges"))  # a range compile compares what each probe folded
    return to_ir(model, supported_ops(backend), shapes, name, values, feeds, keep, shared, probe)


def lower_ir(graph: IRGraph, backend: Backend, options: Mapping[str, Any] | None = None) -> IRGraph:
    """The second half of `lower`: the default passes on what `read` gave."""
    in_memory = bool((options or {}).get("in_memory"))
    # the RMS norm fused only where the backend itself runs RMSNormalization (the CPU): elsewhere its kernel
    # would be a CPU partition between two device ones
    fuse_rms = "RMSNormalization" in getattr(backend, "kernels", {})
    return _passes(graph, in_memory, fuse_rms)


def _passes(graph: IRGraph, in_memory: bool = False, fuse_rms: bool = True) -> IRGraph:
    for node in graph.nodes:
        for key, value in node.attrs.items():
            if isinstance(value, IRGraph):
                node.attrs[key] = _passes(value, in_memory, fuse_rms)
    return run_passes(graph, default_passes(in_memory, fuse_rms))


PREFER = ("speed", "memory")


def compile_options(prefer: str = "speed", kv_shared: Iterable[str] = (), in_memory: bool = False
                    ) -> dict[str, Any]:
    """The options a compile sees. `prefer="memory"`: no kernel whose own constants (transformed or prepacked
    weights) are larger than the weights they replace. `kv_shared`: past inputs (GroupQueryAttention's) that runs
    bind to the same buffer as their present outputs, a KV cache written in place (docs/generate.md).
    `in_memory`: the program runs from memory, not from a binary written now: weights mapped from the model's
    external data file are used as they are stored (docs/cpu.md)."""
    if prefer not in PREFER:
        raise CtxrtError(f"prefer must be one of {PREFER}, got {prefer!r}")
    shared = sorted(kv_shared)
    return {"prefer": prefer, **({"kv_shared": shared} if shared else {}), **({"in_memory": True} if in_memory else {})}


def compile_ir(graph: IRGraph, backend: Backend, options: Mapping[str, Any] | None = None,
               tuner: Tuner | None = None) -> tuple[CompiledGraph, dict[str, Any]]:
    """IR graph -> (compiled graph, the constants it reads). The backend's own lowering (e.g. the CPU's layout
    pass) runs first, on each graph that becomes a program (so a split model's parts keep plain IO)."""
    options = dict(options or compile_options())
    own = getattr(backend, "lower", None)  # backends without layouts or providers to choose have none
    if own is not None:
        graph = own(graph, options)
    compiled = compile_graph(graph, backend, options, tuner)
    return compiled, {n: graph.values[n].const for n in compiled.const_names}


def compile_model(model: Any, shapes: Mapping[str, Iterable[int]] | None = None, backend: Backend | None = None,
                  name: str = "main", values: Mapping[str, Any] | None = None,
                  feeds: Mapping[str, Any] | None = None, options: Mapping[str, Any] | None = None,
                  tuner: Tuner | None = None, dims: Mapping[str, Any] | None = None, prior: Any = None
                  ) -> tuple[CompiledGraph, dict[str, Any]]:
    """One ONNX model (path, bytes or ModelProto) -> (compiled graph, the constants it reads). `dims` (a dim
    name or "INPUT:AXIS" -> (min, max)) makes it one range program for every shape inside
    (docs/shapes-and-control-flow.md)."""
    backend = backend or get_backend("cpu")
    if dims:
        from ctxrt.compiler.ranges import compile_ranges

        return compile_ranges(model, dims, backend, name, shapes, values, feeds, options, tuner, prior)
    return compile_ir(lower(model, shapes, backend, name, values, feeds, options=options), backend, options, tuner)


def compile(model: str | os.PathLike | bytes | Any, shapes: Mapping[str, Iterable[int]] | None = None,
            backend: str | Backend = "cpu", defer_graph_init: bool = False, io_mem_type: str = "raw",
            values: Mapping[str, Any] | None = None, *, num_threads: int | None = None,
            prefer: str = "speed", dims: Mapping[str, Any] | None = None, **tuning: Any) -> Context:
    """Online prepare: compile an ONNX model in memory and return a Context (finalized unless deferred).

    `io_mem_type="memhandle"` tells the context its IO tensors will be passed as memory handles, so it
    allocates no internal IO buffers (docs/architecture.md). `values` gives the values of value inputs (inputs
    that decide shapes or branches, docs/shapes-and-control-flow.md), e.g. {"shape": [2, -1]}: the graph is
    specialized on them.
    `num_threads`: threads its runs use (None: the cores other processes leave idle). `prefer="memory"` keeps
    kernels whose own constants would be larger than the weights (Winograd, prepacked layouts) out. `dims`
    (a dim name of the model, or "INPUT:AXIS" -> (min, max)) compiles one program for every shape inside those
    ranges (docs/shapes-and-control-flow.md). `tuning`
    takes the compile config's keys (docs/tuning.md): `tuning_mode=True, performance_cache_dir=...,
    invalidate_performance_cache=False` and the budgets."""
    from ctxrt.runtime import heap
    from ctxrt.runtime.loader import compile_to_context

    be = get_backend(backend)
    graphs, weights = compile_graphs([(model, shapes, "main", values)], be, io_mem_type,
                                     options=compile_options(prefer, in_memory=True), dims=dims, **tuning)
    ctx = compile_to_context(graphs, weights, be, defer_graph_init, num_threads)
    del graphs, weights
    heap.trim()  # what the compile freed: not kept at its peak (runtime/heap.py)
    return ctx


__all__ = ["compile", "compile_graphs", "compile_ir", "compile_model", "compile_options", "compile_split",
           "context_info", "context_to_bytes", "lower", "save_context"]
