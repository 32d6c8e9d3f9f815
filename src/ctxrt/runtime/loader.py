"""Contexts from context binaries (offline prepare's output) and from graphs compiled in memory."""

from __future__ import annotations

import os
from collections.abc import Mapping

import numpy as np

from ctxrt.backends import Backend, get_backend
from ctxrt.compiler.program import CompiledGraph
from ctxrt.errors import FormatError
from ctxrt.format.weights import WeightEntry, pack
from ctxrt.runtime.context import Context


def context_from_binary(source: str | os.PathLike | bytes, backend: str | Backend | None = None,
                        defer_graph_init: bool = False, num_threads: int | None = None) -> Context:
    """Create a context from a context binary (a path, memory-mapped; or its bytes). Device programs stored
    in it are loaded instead of built (a binary made for another device is rebuilt from its stored source,
    with one warning). `backend`: None runs it on the backend it was compiled for (opencl: the device of
    $CTXRT_OPENCL_DEVICE, else 0). `num_threads`: the threads its runs use (None: the cores other processes leave
    idle)."""
    from ctxrt.format import ContextFile

    f = ContextFile.open(source)
    try:
        meta = f.metadata
        be = get_backend(meta["backend"] if backend is None else backend)
        if meta["backend"] != be.name:
            raise FormatError(f"context binary was compiled for backend {meta['backend']!r}, not {be.name!r}")
        programs = f.programs()
        if programs is not None and be.programs is not None:
            be.programs.load(programs, "<bytes>" if isinstance(source, bytes) else os.fspath(source))
        block = f.weights_block()  # read-only view of the mapped weights section, checksum verified once
        table = {name: WeightEntry(int(e[0]), int(e[1]), str(e[2]), tuple(int(d) for d in e[3]))
                 for name, e in meta["weights"].items()}
        return Context(f.graphs(), table, block, be, defer_graph_init=defer_graph_init, info=meta, keepalive=f,
                       num_threads=num_threads)
    except BaseException:
        f.close()
        raise


def compile_to_context(graphs: list[CompiledGraph], weights: Mapping[str, np.ndarray], backend: Backend,
                       defer_graph_init: bool = False, num_threads: int | None = None) -> Context:
    table, block = pack(weights)
    block.flags.writeable = False
    return Context(graphs, table, block, backend, defer_graph_init=defer_graph_init, num_threads=num_threads)
