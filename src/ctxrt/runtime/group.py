"""Contexts sharing one spill-fill buffer (docs/architecture.md), and EPContext chains.

A `ContextGroup` reads every context's max spill-fill size from its metadata (or from an EPContext
node's `max_size`) without loading the binaries, allocates one buffer of the largest size, then loads
and finalizes the largest context first (the leader) and the others after it, all registering that
buffer. One lock serializes every graph of the group, since they all use the same scratch memory.

An EPContext model with several nodes is a chain: each node runs one graph of one context, tensors
passing from one node to the next. The tensors between nodes live in one chain buffer, planned like an
arena over the chain's steps, and are passed as memory handles: a node writes its output where the
next node reads it, with no copy.
"""

from __future__ import annotations

import os
import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ctxrt.backends import Backend, get_backend
from ctxrt.compiler.program import TensorInfo
from ctxrt.errors import CtxrtError, FormatError, LifecycleError, ShapeError
from ctxrt.planner import arena as planner
from ctxrt.runtime.context import Context
from ctxrt.runtime.memhandle import MemHandle

Source = str | os.PathLike | bytes


def _label(source: Source, k: int) -> str:
    return f"context {k} (bytes)" if isinstance(source, bytes) else os.fspath(source)


@dataclass
class ChainStep:
    """One EPContext node: graph `graph` of `context`, reading and writing the chain's tensors by name."""

    context: Context
    graph: str
    inputs: list[str]
    outputs: list[str]


def epcontext_model(nodes: list[Any], graph: str | None, path: str | os.PathLike) -> list[Any]:
    """The EPContext nodes of the model holding graph `graph` (default: the first node's): a node joins
    the model of the latest earlier node making a tensor it reads. Two independent models in one file may
    then use the same tensor names (both an output "logits") without being wired together."""
    owner = list(range(len(nodes)))

    def root(k: int) -> int:
        while owner[k] != k:
            k = owner[k]
        return k

    made: dict[str, int] = {}
    for k, n in enumerate(nodes):
        for t in n.inputs:
            if t in made:
                owner[root(k)] = root(made[t])
        for t in n.outputs:
            made[t] = k
    if graph is None:
        start = 0
    else:
        start = next((k for k, n in enumerate(nodes) if n.partition_name == graph), -1)
        if start < 0:
            raise CtxrtError(f"{os.fspath(path)}: no graph {graph!r}; its EPContext nodes run "
                             f"{[n.partition_name for n in nodes]}")
    model = [n for k, n in enumerate(nodes) if root(k) == root(start)]
    if graph is not None and len(model) > 1:
        raise CtxrtError(f"{os.fspath(path)}: graph {graph!r} is one of {len(model)} parts chained into one model, "
                         "which runs whole: leave out graph")
    return model


class ContextGroup:
    """Several contexts, one spill-fill buffer of the largest size, the largest context loaded first."""

    def __init__(self, sources: Sequence[Source], backend: str | Backend = "cpu",
                 spillfill_sizes: Sequence[int] | None = None, share_spillfill: bool = True,
                 num_threads: int | None = None) -> None:
        """`spillfill_sizes`: each context's max spill-fill size when known (EPContext max_size); else read
        from each binary's metadata. `share_spillfill=False` gives each context its own buffer (to compare).
        `num_threads`: the threads every context's runs use (None: the cores other processes leave idle)."""
        from ctxrt.format import read_metadata
        from ctxrt.runtime.loader import context_from_binary

        if not sources:
            raise CtxrtError("a context group needs at least one context binary")
        self.backend = be = get_backend(backend)
        self.sources = list(sources)
        if spillfill_sizes is None:  # metadata only: the binaries are not read yet
            metas = [read_metadata(s) for s in self.sources]
            spillfill_sizes = [int(m["max_spillfill_size"]) for m in metas]
            alignment = max(int(m["alignment"]) for m in metas)
        else:
            if len(spillfill_sizes) != len(self.sources):
                raise CtxrtError("one spill-fill size per context binary is needed")
            alignment = be.alignment
        self.spillfill_sizes = [int(n) for n in spillfill_sizes]
        # Leader first: the largest (stable for ties, so the first given of equal sizes leads).
        self.load_order = sorted(range(len(self.sources)), key=lambda k: -self.spillfill_sizes[k])
        self.lock = threading.RLock()
        self.share_spillfill = share_spillfill
        self.buffer = be.alloc_shared(max(self.spillfill_sizes), max(alignment, be.alignment)) \
            if share_spillfill else None
        self.contexts: list[Context] = [None] * len(self.sources)  # type: ignore[list-item]
        self.steps: list[ChainStep] = []
        self._chain_buffer: Any = None
        self._chain_handles: dict[tuple[int, str], MemHandle] = {}
        self.freed = False
        try:
            for k in self.load_order:
                ctx = context_from_binary(self.sources[k], be, defer_graph_init=True, num_threads=num_threads)
                self.contexts[k] = ctx
                ctx.lock = self.lock
                actual = ctx.properties["max_spillfill_buffer_size"]
                if actual > self.spillfill_sizes[k]:
                    raise FormatError(f"{_label(self.sources[k], k)}: declared max spill-fill size "
                                      f"{self.spillfill_sizes[k]} is smaller than the context's {actual}")
                if self.buffer is not None:
                    ctx.register_spillfill_buffer(self.buffer)
                ctx.finalize()
        except BaseException:
            self.free()
            raise

    @property
    def leader(self) -> Context:
        return self.contexts[self.load_order[0]]

    # -- EPContext chains --------------------------------------------------------------------------
    @classmethod
    def from_epcontext(cls, path: str | os.PathLike, backend: str | Backend = "cpu",
                       share_spillfill: bool = True, graph: str | None = None) -> ContextGroup:
        """Load the contexts of one model of an EPContext file, sizes from the nodes' max_size attributes.

        A file may hold several independent models (the wrapper of a multi-model compile): nodes belong to
        one model only when tensors pass between them. `graph` picks the model whose node runs that graph
        (partition_name); by default the first node's model."""
        from ctxrt.frontend.epcontext import read_epcontext, read_epcontext_io

        nodes = epcontext_model(read_epcontext(path), graph, path)
        keys: list[Any] = []
        sources: list[Source] = []
        sizes: list[int] = []
        for n in nodes:
            key = n.cache_bytes if n.cache_bytes is not None else str(n.cache_path)
            if key not in keys:
                keys.append(key)
                sources.append(n.source)
                sizes.append(n.max_size)
            else:
                sizes[keys.index(key)] = max(sizes[keys.index(key)], n.max_size)
        group = cls(sources, backend, spillfill_sizes=sizes if all(s > 0 for s in sizes) else None,
                    share_spillfill=share_spillfill)
        try:
            steps = []
            for n in nodes:
                ctx = group.contexts[keys.index(n.cache_bytes if n.cache_bytes is not None else str(n.cache_path))]
                if n.partition_name not in ctx.graph_names:
                    raise FormatError(f"{path}: EPContext node {n.name!r} names graph {n.partition_name!r}; "
                                      f"its context has {ctx.graph_names}")
                steps.append(ChainStep(ctx, n.partition_name, n.inputs, n.outputs))
            inputs, outputs = read_epcontext_io(path)
            read = {t for n in nodes for t in n.inputs}
            made = {t for n in nodes for t in n.outputs}
            mine = [t for t in outputs if t in made]
            if not mine:
                raise FormatError(f"{path}: graph {nodes[0].partition_name!r} makes none of the model's outputs "
                                  f"{outputs}")
            group._make_chain(steps, [t for t in inputs if t in read], mine)
        except BaseException:
            group.free()
            raise
        return group

    def _make_chain(self, steps: list[ChainStep], inputs: list[str], outputs: list[str]) -> None:
        infos: dict[str, TensorInfo] = {}
        producer: dict[str, int] = {}
        last_use: dict[str, int] = {}
        for k, step in enumerate(steps):
            g = step.context.graph(step.graph)
            if [t.name for t in g.inputs] != step.inputs or [t.name for t in g.outputs] != step.outputs:
                raise FormatError(f"EPContext node for graph {step.graph!r}: its inputs/outputs do not match the "
                                  "graph's in the context binary")
            for t in g.inputs:
                if t.name not in producer and t.name not in inputs:
                    raise FormatError(f"chain input {t.name!r} of graph {step.graph!r} is neither a model input "
                                      "nor produced by an earlier node")
                known = infos.setdefault(t.name, t)
                if (known.shape, known.dtype) != (t.shape, t.dtype):
                    raise FormatError(f"chain tensor {t.name!r} is {known.dtype}{list(known.shape)} where it is "
                                      f"made and {t.dtype}{list(t.shape)} where graph {step.graph!r} reads it")
                last_use[t.name] = k
            for t in g.outputs:
                if t.name in producer or t.name in inputs:
                    raise FormatError(f"chain tensor {t.name!r} is produced twice")
                producer[t.name] = k
                infos[t.name] = t
        for name in outputs:
            if name not in producer:
                raise FormatError(f"model output {name!r} is produced by no EPContext node")
        self.steps = steps
        self.inputs = [infos[n] for n in inputs if n in infos]
        self.outputs = [infos[n] for n in outputs]
        # Tensors passed between nodes: planned into one chain buffer over the chain's steps.
        between = [n for n in producer if n in last_use]
        align = self.backend.alignment
        plan = planner.plan([planner.Request(n, planner.align(max(infos[n].nbytes, 1), align), producer[n],
                                             last_use[n]) for n in between])
        self.chain_bytes = plan.size
        if between:
            self._chain_buffer = self.backend.alloc_shared(plan.size, align)
            for n in between:
                off, t = plan.allocations[n].offset, infos[n]
                for k in {producer[n], *[j for j, s in enumerate(steps) if n in s.inputs]}:
                    self._chain_handles[(k, n)] = steps[k].context.mem_register(self._chain_buffer, off, t.shape,
                                                                               t.dtype)

    def run(self, feeds: Mapping[str, np.ndarray], output_names: Sequence[str] | None = None
            ) -> dict[str, np.ndarray]:
        """Run the chain once: model inputs in, every (or the named) model output out as new arrays."""
        if not self.steps:
            raise LifecycleError("this group is not a chain; run its contexts' graphs")
        if self.freed:
            raise LifecycleError("context group was freed")
        names = {t.name for t in self.inputs}
        if set(feeds) != names:
            missing, extra = sorted(names - set(feeds)), sorted(set(feeds) - names)
            raise ShapeError(f"model inputs: missing {missing}, unknown {extra}")
        want = [t.name for t in self.outputs] if output_names is None else list(output_names)
        known = {t.name: t for t in self.outputs}
        for n in want:
            if n not in known:
                raise ShapeError(f"no model output {n!r}; outputs are {sorted(known)}")
        results = {n: np.empty(known[n].shape, np.dtype(known[n].dtype)) for n in want}
        with self.lock:
            for k, step in enumerate(self.steps):
                ins = {n: self._chain_handles.get((k, n), feeds.get(n)) for n in step.inputs}
                outs = {n: self._chain_handles.get((k, n), results.get(n)) for n in step.outputs}
                step.context.graph(step.graph).execute(ins, {n: v for n, v in outs.items() if v is not None})
            for n in want:  # outputs that later nodes also read live in the chain buffer
                h = self._chain_handles.get((next(k for k, s in enumerate(self.steps) if n in s.outputs), n))
                if h is not None:
                    self.backend.copy_out(results[n], h.view)
        return results

    # -- accounting and release ---------------------------------------------------------------------
    @property
    def stats(self) -> Counter[str]:
        total: Counter[str] = Counter()
        for ctx in self.contexts:
            if ctx is not None:
                total.update(ctx.stats)
        return total

    def memory(self) -> dict[str, int]:
        """Bytes by category. `spillfill_saved` is what one buffer per context would have cost more."""
        stats = self.stats
        shared = self.buffer.nbytes if self.buffer is not None else stats["alloc_spillfill_bytes"]
        return {"weights": sum(c.properties["weights_buffer_size"] for c in self.contexts if c is not None),
                "spillfill": shared, "spillfill_unshared": sum(self.spillfill_sizes),
                "spillfill_saved": sum(self.spillfill_sizes) - shared,
                "io": stats["alloc_io_bytes"] + getattr(self, "chain_bytes", 0)}

    def free(self) -> None:
        if self.freed:
            return
        for ctx in self.contexts:
            if ctx is not None:
                ctx.free()
        self._chain_handles.clear()
        for buf in (self._chain_buffer, self.buffer):
            if buf is not None:
                buf.release()
        self._chain_buffer = None
        self.freed = True

    def __enter__(self) -> ContextGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.free()

    def __repr__(self) -> str:
        names = [Path(s).name if not isinstance(s, bytes) else "<bytes>" for s in self.sources]
        return f"ContextGroup({names}, spillfill={self.memory()['spillfill']})"
