"""Contexts from context binaries (offline prepare's output) and from graphs compiled in memory."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

import numpy as np

from ctxrt.backends import Backend, get_backend
from ctxrt.compiler.program import CompiledGraph
from ctxrt.errors import FormatError
from ctxrt.format.weights import WeightEntry, pack
from ctxrt.runtime.context import Context
from ctxrt.runtime.weightstore import WeightStore


def context_from_binary(source: str | os.PathLike | bytes, backend: str | Backend | None = None,
                        defer_graph_init: bool = False, num_threads: int | None = None,
                        store: WeightStore | None = None) -> Context:
    """Create a context from a context binary (a path, memory-mapped; or its bytes). Device programs stored
    in it are loaded instead of built (a binary made for another device is rebuilt from its stored source,
    with one warning). `backend`: None runs it on the backend it was compiled for (opencl: the device of
    $CTXRT_OPENCL_DEVICE, else 0). `num_threads`: the threads its runs use (None: the cores other processes leave
    idle). `store`: where the weights a binary keeps outside its file (format version 2: an InferenceSession's
    compile cache entry) come from, shared with the store's other contexts."""
    from ctxrt.format import ContextFile
    from ctxrt.format.reader import beside

    f = ContextFile.open(source)
    wait = None
    try:
        wait = f.check_weights_beside()  # the weights' checksum on another core while the rest loads
        meta = f.metadata
        be = get_backend(meta["backend"] if backend is None else backend)
        if meta["backend"] != be.name:
            raise FormatError(f"context binary was compiled for backend {meta['backend']!r}, not {be.name!r}")
        programs = f.programs()
        if programs is not None and be.programs is not None:
            be.programs.load(programs, "<bytes>" if isinstance(source, bytes) else os.fspath(source))
        block = f.weights_block()  # read-only view of the mapped weights section (its checksum: `wait`)
        table = {name: WeightEntry(int(e[0]), int(e[1]), str(e[2]), tuple(int(d) for d in e[3]))
                 for name, e in meta["weights"].items()}
        graphs, external = f.graphs(), f.external_weights()
        if external and store is None:
            raise FormatError(f"{len(external)} weights of this context binary are kept outside it (format version "
                              "2, an InferenceSession compile cache entry): open the model through "
                              "InferenceSession(..., cache_dir=...) instead")
        segments, keys = [block], [None]
        if external and store is not None:
            unchecked: list[Callable[[], None]] = []  # the blobs' checksums, run beside the rest of the load
            shared, more, keys_out = store.lease(external, 1, unchecked)
            table.update(shared)
            segments, keys = [block, *more], [None, *keys_out]
            if unchecked:
                wait = beside(lambda: _run_all(unchecked), wait)
        try:
            ctx = Context(graphs, table, segments, be, defer_graph_init=defer_graph_init, info=meta, keepalive=f,
                          num_threads=num_threads, store=store, segment_keys=keys)
        except BaseException:
            if store is not None:
                store.release([k for k in keys if k is not None])
            raise
        try:
            wait()
        except BaseException:  # the weights were corrupt: nothing of this context is handed out
            ctx.free()
            raise
        return ctx
    except BaseException:
        if wait is not None:
            wait(False)  # the check reads the map: it ends before the file closes
        f.close()
        raise


def _run_all(checks: list[Callable[[], None]]) -> None:
    for check in checks:
        check()


def compile_to_context(graphs: list[CompiledGraph], weights: Mapping[str, np.ndarray], backend: Backend,
                       defer_graph_init: bool = False, num_threads: int | None = None,
                       store: WeightStore | None = None) -> Context:
    """A context over weights compiled in memory: packed into one block of its own (those read in place from a
    model's external data file stay there), or (with `store`) held by the store once per distinct content,
    shared with the other contexts it gave them to."""
    if store is None:
        table, segments = pack(weights)
        segments[0].flags.writeable = False
        return Context(graphs, table, segments, backend, defer_graph_init=defer_graph_init, num_threads=num_threads)
    table, segments, keys = store.intern(weights)
    try:
        return Context(graphs, table, segments, backend, defer_graph_init=defer_graph_init, num_threads=num_threads,
                       store=store, segment_keys=keys)
    except BaseException:
        store.release(keys)
        raise
