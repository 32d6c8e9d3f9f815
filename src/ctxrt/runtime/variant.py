"""One compiled variant of an InferenceSession's model, and the compile (through the session's cache) that
makes it."""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import numpy as np

from ctxrt.backends import Backend
from ctxrt.compiler.program import TensorInfo
from ctxrt.errors import FormatError, RegistrationError
from ctxrt.runtime.context import Context
from ctxrt.runtime.graph import Graph
from ctxrt.runtime.memhandle import MemHandle
from ctxrt.runtime.tensor import Tensor

if TYPE_CHECKING:
    from ctxrt.runtime.session import InferenceSession

_NO_SHAPES: Mapping[str, tuple[int, ...]] = MappingProxyType({})


@dataclass
class Stage:
    context: Context
    graph: Graph
    inputs: list[str]
    outputs: list[str]


class Variant:
    """The contexts compiled for one set of input shapes (and values of value inputs), with the tensors bound
    last and their plan."""

    def __init__(self, session: InferenceSession, contexts: list[Context], stages: list[Stage],
                 inputs: list[TensorInfo], outputs: list[TensorInfo], links: dict[tuple[int, str], MemHandle],
                 group: Any = None) -> None:
        self.session, self.contexts, self.stages, self.group = session, contexts, stages, group
        self.inputs, self.outputs, self.links = inputs, outputs, links
        self.in_info = {t.name: t for t in inputs}
        self.out_info = {t.name: t for t in outputs}
        self.out_index = {t.name: i for i, t in enumerate(outputs)}
        self.all_outputs = [t.name for t in outputs]
        self.in_dt = [np.dtype(t.dtype) for t in inputs]  # looked up once, not every run
        self.out_dt = [np.dtype(t.dtype) for t in outputs]
        n_in, n_out = len(inputs), len(outputs)
        self.last_in: list[Tensor | None] = [None] * n_in  # the tensors bound last (pinning)
        self.last_out: list[Tensor | None] = [None] * n_out
        self.cur_in: list[Tensor | None] = [None] * n_in
        self.cur_out: list[Tensor | None] = [None] * n_out
        self.own_in: list[Tensor | None] = [None] * n_in  # the cache's tensors lent to the run in progress
        self.own_out: list[Tensor | None] = [None] * n_out
        self.plan_in: list[Tensor | None] = [None] * n_in  # the tensors `plan` was built for
        self.plan_out: list[Tensor | None] = [None] * n_out
        self.plan: list[tuple[Graph, dict[str, Any], dict[str, Any]]] = []
        self.plan_copies: list[tuple[Any, int]] = []
        # Value inputs (DESIGN.md §9b) and the values this variant was compiled for.
        self.values = [(n, a) for st in stages for n, a in st.graph.value_inputs.items() if n in self.in_info]
        self.shapes: Mapping[str, tuple[int, ...]] = _NO_SHAPES  # real shapes of the last run's bounded outputs

    def matches(self, feeds: Mapping[str, Any]) -> bool:
        for info in self.inputs:
            v = feeds.get(info.name)
            if v is None or getattr(v, "shape", None) != info.shape:
                return False
        for name, value in self.values:  # noqa: SIM110 - a loop allocates no generator in the hot path
            if not np.array_equal(array_of(feeds[name]), value):
                return False
        return True

    def execute(self) -> None:
        """Run every stage on the current tensors; rebuild the per-stage handle dicts only when a tensor
        changed (compared by identity, without allocating)."""
        if not (_same(self.cur_in, self.plan_in) and _same(self.cur_out, self.plan_out)):
            self._make_plan()
        shapes = None
        for graph, ins, outs in self.plan:
            real = graph.execute(ins, outs)
            if real:
                shapes = dict(real) if shapes is None else {**shapes, **real}
        self.shapes = _NO_SHAPES if shapes is None else shapes
        for view, i in self.plan_copies:  # model outputs that later stages read: made in the chain buffer
            self.cur_out[i].write(view)

    def _make_plan(self) -> None:
        session = self.session
        tensors = {t.name: self.cur_in[i] for i, t in enumerate(self.inputs)}
        tensors.update({t.name: self.cur_out[i] for i, t in enumerate(self.outputs)})
        for t in tensors.values():
            if t.session is not session:
                raise RegistrationError("a Tensor of another session is bound")
            t._check()
        plan, copies = [], []
        for k, st in enumerate(self.stages):
            ins = {n: self.links[(k, n)] if (k, n) in self.links else tensors[n].handle(st.context)
                   for n in st.inputs}
            outs = {}
            for n in st.outputs:
                if (k, n) in self.links:
                    outs[n] = self.links[(k, n)]
                    if n in self.out_info:
                        copies.append((self.links[(k, n)].view, self.out_index[n]))
                elif n in tensors:
                    outs[n] = tensors[n].handle(st.context)
            plan.append((st.graph, ins, outs))
        self.plan, self.plan_copies = plan, copies
        self.plan_in[:] = self.cur_in
        self.plan_out[:] = self.cur_out
        session._counters["plans"] += 1

    def free(self) -> None:
        self.plan, self.plan_copies = [], []
        if self.group is not None:
            self.group.free()
        for ctx in self.contexts:
            ctx.free()


def _same(a: list[Any], b: list[Any]) -> bool:
    for x, y in zip(a, b, strict=True):  # noqa: SIM110 - a loop allocates no generator in the hot path
        if x is not y:
            return False
    return True


def array_of(x: Any) -> Any:
    """A feed's values as a host array: a Tensor's zero-copy view where there is one, else a copy."""
    if not isinstance(x, Tensor):
        return x
    return x.array if x.array is not None else x.numpy()


def compile_variant(source: Path | bytes, shapes: Mapping[str, Any] | None, feeds: Mapping[str, Any] | None,
                    backend: Backend, cache_dir: str | os.PathLike | None, counters: Counter[str]) -> Context:
    """Online prepare with memhandle IO; value inputs are taken from `feeds`. With `cache_dir`, the binary is
    kept under a key of the model, the options, the shapes and the values of the model's value inputs (whose
    names are learned at its first compile and kept beside the binaries)."""
    from ctxrt.compiler import compile_graphs, save_context
    from ctxrt.runtime.loader import compile_to_context, context_from_binary

    shapes = {k: tuple(int(d) for d in v) for k, v in (shapes or {}).items()}
    feeds = {k: array_of(v) for k, v in (feeds or {}).items()}
    if cache_dir is None:
        graphs, weights = compile_graphs([(source, shapes, "main")], backend, "memhandle", feeds)
        return compile_to_context(graphs, weights, backend)
    data = source if isinstance(source, bytes) else source.read_bytes()
    folder = Path(cache_dir)
    folder.mkdir(parents=True, exist_ok=True)
    names_file = folder / f"{hashlib.sha256(data).hexdigest()[:32]}.value_inputs.json"
    options = json.dumps({"shapes": sorted((k, list(v)) for k, v in shapes.items()), "io_mem_type": "memhandle",
                          "device": backend.device_id()}, sort_keys=True)

    def path_for(names: list[str]) -> Path:
        digest = hashlib.sha256(data + b"\0" + options.encode())
        for n in sorted(names):
            v = np.asarray(feeds[n])
            digest.update(f"\0{n}\0{v.dtype.str}{v.shape}".encode() + v.tobytes())
        return folder / f"{digest.hexdigest()[:32]}.ctx"

    names = _read_names(names_file)
    if names is not None and all(n in feeds for n in names):
        cached = path_for(names)
        if cached.is_file():
            try:
                ctx = context_from_binary(cached, backend)
                counters["compile_cache_hits"] += 1
                return ctx
            except FormatError:  # a damaged cache entry: compile again and replace it
                counters["compile_cache_damaged"] += 1
    counters["compile_cache_misses"] += 1
    graphs, weights = compile_graphs([(source, shapes, "main")], backend, "memhandle", feeds)
    names = sorted(graphs[0].value_inputs)
    names_file.write_text(json.dumps(names))
    cached = path_for(names)
    save_context(cached, graphs, weights, backend, ["<bytes>" if isinstance(source, bytes) else source])
    return context_from_binary(cached, backend)


def _read_names(path: Path) -> list[str] | None:
    try:
        names = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return names if isinstance(names, list) and all(isinstance(n, str) for n in names) else None
