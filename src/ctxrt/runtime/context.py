"""A context: weights, one spill-fill arena shared by its graphs, the graphs, and their counters."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Mapping
from typing import Any

import numpy as np

from ctxrt.compiler.program import CompiledGraph
from ctxrt.errors import LifecycleError
from ctxrt.runtime.backend import Backend
from ctxrt.runtime.graph import Graph, io_buffer_bytes


class Context:
    """Owns weights, kernels and graphs. Its graphs share one spill-fill buffer and never run at once."""

    def __init__(self, graphs: list[CompiledGraph], weights: Mapping[str, np.ndarray], backend: Backend,
                 *, defer_graph_init: bool = False) -> None:
        self.backend = backend
        self.weights = dict(weights)
        self._graphs = {g.name: Graph(self, g) for g in graphs}
        self.lock = threading.RLock()
        self.stats: Counter[str] = Counter()
        self.finalized = False
        self.freed = False
        self._buffers: list[Any] = []
        self.arena: Any = None
        if not defer_graph_init:
            self.finalize()

    @property
    def properties(self) -> dict[str, int]:
        return {
            "weights_buffer_size": sum(int(w.nbytes) for w in self.weights.values()),
            "max_spillfill_buffer_size": max((g.spillfill_size for g in self._graphs.values()), default=0),
            "buffer_start_alignment": self.backend.alignment,
        }

    @property
    def graph_names(self) -> list[str]:
        return list(self._graphs)

    def graph(self, name: str | None = None) -> Graph:
        """The graph called `name`; without a name, the context's only (or first) graph."""
        if self.freed:
            raise LifecycleError("context was freed")
        if name is None:
            return next(iter(self._graphs.values()))
        try:
            return self._graphs[name]
        except KeyError:
            raise LifecycleError(f"no graph {name!r}; this context has {self.graph_names}") from None

    def _alloc(self, nbytes: int, category: str) -> Any:
        buf = self.backend.alloc_shared(nbytes, self.backend.alignment)
        self._buffers.append(buf)
        self.stats[f"alloc_{category}_bytes"] += nbytes
        return buf

    def finalize(self) -> None:
        if self.freed:
            raise LifecycleError("context was freed")
        if self.finalized:
            raise LifecycleError("context is already finalized")
        arena_size = self.properties["max_spillfill_buffer_size"]
        self.arena = self._alloc(arena_size, "spillfill")
        for g in self._graphs.values():
            g._build_kernels(self.weights)
            io_infos = g.inputs + g.outputs
            layout = io_buffer_bytes(io_infos, self.backend.alignment)
            total = max((off + n for _, off, n in layout), default=0)
            buf = self._alloc(total, "io")
            io = {name: self.backend.view(buf, off, info.shape, info.dtype)
                  for (name, off, _), info in zip(layout, io_infos, strict=True)}
            g._record(self.arena, io, self.weights)
        self.finalized = True

    def free(self) -> None:
        """Release every buffer; the graphs refuse to run afterwards."""
        with self.lock:
            for buf in self._buffers:
                buf.release()
            self._buffers.clear()
            for g in self._graphs.values():
                g._launches, g._io, g._kernels = [], {}, []
            self.arena = None
            self.finalized = False
            self.freed = True

    def __enter__(self) -> Context:
        return self

    def __exit__(self, *exc: object) -> None:
        self.free()
