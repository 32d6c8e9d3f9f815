"""`InferenceSession`: onnxruntime's API over contexts, with a tensor cache and pinning (DESIGN.md §8).

The session passes every input and output to its graphs as a memory handle of a device `Tensor`. NumPy
feeds are copied into tensors from the session's cache; after the run the tensors go back to the cache,
and the next run takes the same tensor for the same input again, so the graph's recorded launches stay
valid (pinning) and nothing is created, registered or recorded in a steady loop.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
import weakref
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ctxrt.backends import Backend, get_backend
from ctxrt.compiler.program import TensorInfo
from ctxrt.errors import CtxrtError, FormatError, LifecycleError, RegistrationError, ShapeError
from ctxrt.runtime.context import Context
from ctxrt.runtime.graph import Graph
from ctxrt.runtime.memhandle import MemHandle
from ctxrt.runtime.tensor import Tensor, TensorCache

_ONNX_TYPES = {"float32": "float", "float16": "float16", "float64": "double", "bool": "bool", "int8": "int8",
               "int16": "int16", "int32": "int32", "int64": "int64", "uint8": "uint8", "uint16": "uint16",
               "uint32": "uint32", "uint64": "uint64"}


@dataclass(frozen=True)
class NodeArg:
    """Like onnxruntime's NodeArg: `name`, `shape` (ints; a string for a dimension bound only at run),
    `type` ("tensor(float)", ...)."""

    name: str
    shape: list[int | str]
    type: str


@dataclass
class _Stage:
    context: Context
    graph: Graph
    inputs: list[str]
    outputs: list[str]


class _Variant:
    """The contexts compiled for one set of input shapes, with the tensors bound last and their plan."""

    def __init__(self, session: InferenceSession, contexts: list[Context], stages: list[_Stage],
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

    def matches(self, feeds: Mapping[str, Any]) -> bool:
        for info in self.inputs:
            v = feeds.get(info.name)
            if v is None or getattr(v, "shape", None) != info.shape:
                return False
        return True

    def execute(self) -> None:
        """Run every stage on the current tensors; rebuild the per-stage handle dicts only when a tensor
        changed (compared by identity, without allocating)."""
        if not (_same(self.cur_in, self.plan_in) and _same(self.cur_out, self.plan_out)):
            self._make_plan()
        for graph, ins, outs in self.plan:
            graph.execute(ins, outs)
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


class InferenceSession:
    """Run a model the way onnxruntime does: `.onnx` (compiled in memory, or through `cache_dir`), `.ctx`,
    or an EPContext `_ctx.onnx` model (several contexts run as a chain sharing one spill-fill buffer).

    Options: `shapes` binds dynamic input dimensions; `graph` picks a graph of a multi-graph context (or
    of an EPContext file holding several models; default: the first); `cache_dir` keeps compiled context
    binaries keyed by the model's hash and the options; `tensor_cache_bytes` caps the bytes of tensors the cache keeps;
    `enable_tensor_cache=False` destroys a run's tensors after it; `enable_pinning=False` stops preferring
    last run's tensor for each input and output (both only to measure what they save); `max_shape_variants`
    bounds how many input-shape variants of an ONNX model stay compiled (each holds its own weights and
    arena; the least recently used is freed first)."""

    def __init__(self, path_or_bytes: str | os.PathLike | bytes, backend: str | Backend = "cpu", *,
                 shapes: Mapping[str, Sequence[int]] | None = None, graph: str | None = None,
                 cache_dir: str | os.PathLike | None = None, tensor_cache_bytes: int | None = None,
                 enable_tensor_cache: bool = True, enable_pinning: bool = True, max_shape_variants: int = 4) -> None:
        if max_shape_variants < 1:
            raise CtxrtError(f"max_shape_variants must be >= 1, got {max_shape_variants}")
        self._max_variants = max_shape_variants
        self.backend = get_backend(backend)
        self._lock = threading.RLock()
        self._closed = True  # until loaded
        self._counters: Counter[str] = Counter()
        self._user_tensors: weakref.WeakSet[Tensor] = weakref.WeakSet()
        self._orphans: list[list[Tensor]] = []  # session tensors of IOBindings deleted since the last run
        self._source: Any = None  # an ONNX model (path or bytes) that can be compiled for other shapes
        self._cache_dir = cache_dir
        self._variants: dict[tuple[tuple[int, ...], ...], _Variant] = {}
        self._retired: Counter[str] = Counter()  # counters of freed variants' contexts
        default = self._load(path_or_bytes, shapes, graph)
        # name -> (dtype, dims) of the model's inputs and outputs (dims symbolic where not compiled yet)
        self._in_decl: dict[str, tuple[np.dtype, list[int | str]]]
        self._out_decl: dict[str, tuple[np.dtype, list[int | str]]]
        if default is not None:
            self._variants[self._key(default.inputs)] = default
            self._in_decl = {t.name: (np.dtype(t.dtype), list(t.shape)) for t in default.inputs}
            self._out_decl = {t.name: (np.dtype(t.dtype), list(t.shape)) for t in default.outputs}
        else:
            from ctxrt.frontend.onnx import declared_io

            ins, outs = declared_io(self._source)
            self._in_decl = {n: (dt, dims) for n, dt, dims in ins}
            self._out_decl = {n: (dt, dims) for n, dt, dims in outs}
        self._current: _Variant | None = default
        self._closed = False
        self._cache = TensorCache(self, tensor_cache_bytes, enable_tensor_cache)
        self._pinning = enable_pinning

    # -- loading -------------------------------------------------------------------------------------
    def _load(self, source: Any, shapes: Any, graph: str | None) -> _Variant | None:
        """The variant for the given (or declared) shapes; None for an ONNX model with dynamic dimensions and
        no `shapes`: it is compiled at the first run, for the feeds' shapes."""
        from ctxrt.format.layout import MAGIC
        from ctxrt.runtime.loader import context_from_binary

        if isinstance(source, bytes):
            if source.startswith(MAGIC):
                return self._single(context_from_binary(source, self.backend), graph)
            self._source = source
            return self._compile_default(shapes, graph)
        path = Path(source)
        if not path.is_file():
            raise CtxrtError(f"no such model file: {path}")
        with open(path, "rb") as f:
            head = f.read(len(MAGIC))
        if head == MAGIC:
            return self._single(context_from_binary(path, self.backend), graph)
        from ctxrt.frontend.epcontext import is_epcontext

        if is_epcontext(path):
            from ctxrt.runtime.group import ContextGroup

            group = ContextGroup.from_epcontext(path, self.backend, graph=graph)
            stages = [_Stage(s.context, s.context.graph(s.graph), s.inputs, s.outputs) for s in group.steps]
            return _Variant(self, [c for c in group.contexts if c is not None], stages, list(group.inputs),
                            list(group.outputs), dict(group._chain_handles), group)
        self._source = path
        return self._compile_default(shapes, graph)

    def _compile_default(self, shapes: Any, graph: str | None) -> _Variant | None:
        try:
            return self._single(self._compile(self._source, shapes), graph)
        except ShapeError as e:
            if shapes or "is dynamic" not in str(e):
                raise
            return None

    def _single(self, ctx: Context, graph: str | None) -> _Variant:
        g = ctx.graph(graph)
        stage = _Stage(ctx, g, [t.name for t in g.inputs], [t.name for t in g.outputs])
        return _Variant(self, [ctx], [stage], list(g.inputs), list(g.outputs), {})

    @staticmethod
    def _key(infos: Sequence[TensorInfo]) -> tuple[tuple[int, ...], ...]:
        return tuple(t.shape for t in infos)

    def _variant(self, feeds: Mapping[str, Any]) -> _Variant:
        """The contexts for these feeds' shapes: the current ones, an earlier variant, or (for an ONNX
        model) a new compile for the new shapes."""
        current = self._current
        if current is not None and current.matches(feeds):
            return current
        decl = self._in_decl
        if feeds.keys() != decl.keys():
            missing, extra = sorted(set(decl) - set(feeds)), sorted(set(feeds) - set(decl))
            raise ShapeError(f"inputs: missing {missing}, unknown {extra}")
        for name, (dt, _) in decl.items():
            v = feeds[name]
            if not isinstance(v, np.ndarray | Tensor):
                raise ShapeError(f"input {name!r} must be a numpy.ndarray or a ctxrt.Tensor, got {type(v).__name__}")
            if v.dtype != dt:
                raise ShapeError(f"input {name!r} expects {dt}, got {v.dtype}")
        key = tuple(tuple(feeds[name].shape) for name in decl)
        variant = self._variants.pop(key, None)
        if variant is None:
            if self._source is None:
                name = next(n for n, (_, dims) in decl.items() if list(feeds[n].shape) != dims)
                raise ShapeError(f"input {name!r} expects {decl[name][0]}{decl[name][1]}, got "
                                 f"{feeds[name].dtype}{list(feeds[name].shape)} (a context binary has fixed shapes)")
            for name, (dt, dims) in decl.items():
                got = feeds[name].shape
                if len(got) != len(dims) or any(isinstance(d, int) and d != g for d, g in zip(dims, got, strict=True)):
                    raise ShapeError(f"input {name!r} expects {dt}{dims}, got {feeds[name].dtype}{list(got)}")
            while len(self._variants) >= self._max_variants:  # free the least recently used variant first
                old = self._variants.pop(next(iter(self._variants)))
                for ctx in old.contexts:
                    self._retired.update(ctx.stats)  # its counters stay in sess.stats
                old.free()
                self._counters["shape_variants_freed"] += 1
            variant = self._single(self._compile(self._source, {n: feeds[n].shape for n in decl}), None)
            self._counters["shape_variants_compiled"] += 1
        self._variants[key] = variant  # most recently used last
        self._current = variant
        return variant

    def _compile(self, source: Path | bytes, shapes: Any) -> Context:
        """Online prepare with memhandle IO (the session binds every IO tensor); through `cache_dir` when set."""
        from ctxrt.compiler import compile_graphs, save_context
        from ctxrt.runtime.loader import compile_to_context, context_from_binary

        shapes = {k: tuple(int(d) for d in v) for k, v in (shapes or {}).items()}
        cache_dir = self._cache_dir
        if cache_dir is None:
            graphs, weights = compile_graphs([(source, shapes, "main")], self.backend, "memhandle")
            return compile_to_context(graphs, weights, self.backend)
        data = source if isinstance(source, bytes) else source.read_bytes()
        options = json.dumps({"shapes": sorted((k, list(v)) for k, v in shapes.items()), "io_mem_type": "memhandle",
                              "device": self.backend.device_id()}, sort_keys=True)
        key = hashlib.sha256(data + b"\0" + options.encode()).hexdigest()[:32]
        folder = Path(cache_dir)
        folder.mkdir(parents=True, exist_ok=True)
        cached = folder / f"{key}.ctx"
        if cached.is_file():
            try:
                ctx = context_from_binary(cached, self.backend)
                self._counters["compile_cache_hits"] += 1
                return ctx
            except FormatError:  # a damaged cache entry: compile again and replace it
                self._counters["compile_cache_damaged"] += 1
        self._counters["compile_cache_misses"] += 1
        graphs, weights = compile_graphs([(source, shapes, "main")], self.backend, "memhandle")
        save_context(cached, graphs, weights, self.backend, ["<bytes>" if isinstance(source, bytes) else source])
        return context_from_binary(cached, self.backend)

    # -- onnxruntime's API ---------------------------------------------------------------------------
    def get_inputs(self) -> list[NodeArg]:
        return [_node_arg(n, dt, dims) for n, (dt, dims) in self._in_decl.items()]

    def get_outputs(self) -> list[NodeArg]:
        return [_node_arg(n, dt, dims) for n, (dt, dims) in self._out_decl.items()]

    def get_providers(self) -> list[str]:
        return [f"ctxrt:{self.backend.name}"]

    def run(self, output_names: Sequence[str] | None, input_feed: Mapping[str, np.ndarray | Tensor],
            run_options: Any = None) -> list[np.ndarray]:
        """Run once; new arrays for the named outputs (all when None), in that order. Feeds of other shapes
        than compiled run a variant compiled for them (ONNX models only), kept for later runs. A feed may be
        a `Tensor` of this session (as onnxruntime's `run` takes an OrtValue): it is bound in place, no copy."""
        with self._lock:
            self._check_open()
            if self._orphans:
                self._return_orphans()
            v = self._variant(input_feed)
            names = v.all_outputs if output_names is None else self._check_outputs(v, output_names)
            if input_feed.keys() != v.in_info.keys():
                missing = sorted(set(v.in_info) - set(input_feed))
                extra = sorted(set(input_feed) - set(v.in_info))
                raise ShapeError(f"inputs: missing {missing}, unknown {extra}")
            for info, dt in zip(v.inputs, v.in_dt, strict=True):
                x = input_feed[info.name]
                if x.__class__ is Tensor:
                    self._check_tensor(info, dt, x, "input")
                else:
                    _check_array(info, dt, x, "input")
            cache, counters, pin = self._cache, self._counters, self._pinning
            own_in, own_out = v.own_in, v.own_out  # what this run took from the cache (None: the user's)
            try:
                for i, info in enumerate(v.inputs):
                    x = input_feed[info.name]
                    if x.__class__ is Tensor:
                        v.cur_in[i] = x
                        continue
                    t = own_in[i] = cache.acquire(info.shape, v.in_dt[i], v.last_in[i] if pin else None)
                    t.write(x)
                    counters["copies_in"] += 1
                    v.cur_in[i] = v.last_in[i] = t
                for i, info in enumerate(v.outputs):
                    t = own_out[i] = cache.acquire(info.shape, v.out_dt[i], v.last_out[i] if pin else None)
                    v.cur_out[i] = v.last_out[i] = t
                v.execute()
                counters["session_runs"] += 1
                results = [v.cur_out[v.out_index[n]].numpy() for n in names]
                counters["copies_out"] += len(names)
            finally:  # back to the cache, also when the run failed halfway
                for i, t in enumerate(own_in):
                    if t is not None:
                        cache.release(t)
                        own_in[i] = None
                for i, t in enumerate(own_out):
                    if t is not None:
                        cache.release(t)
                        own_out[i] = None
            return results

    def io_binding(self) -> IOBinding:
        self._check_open()
        return IOBinding(self)

    def run_with_iobinding(self, binding: IOBinding, run_options: Any = None) -> None:
        """Run with the binding's inputs and outputs; bound Tensors are used in place (no copy)."""
        if binding.session is not self:
            raise RegistrationError("this IOBinding belongs to another session")
        with self._lock:
            self._check_open()
            for name in self._in_decl:  # a loop: no list made per run
                if name not in binding._inputs:
                    missing = [n for n in self._in_decl if n not in binding._inputs]
                    raise ShapeError(f"run_with_iobinding: inputs not bound: {missing}")
            if self._orphans:
                self._return_orphans()
            v = self._variant(binding._inputs)
            cache, pin = self._cache, self._pinning
            lent = binding._lent
            for t in lent:  # session output tensors of this binding's previous run go back to the cache first
                cache.release(t)
            lent.clear()
            own_in = v.own_in
            try:
                for i, info in enumerate(v.inputs):
                    x = binding._inputs[info.name]
                    if x.__class__ is Tensor:
                        self._check_tensor(info, v.in_dt[i], x, "input")  # e.g. destroyed since it was bound
                    else:
                        _check_array(info, v.in_dt[i], x, "input")
                        t = own_in[i] = cache.acquire(info.shape, v.in_dt[i], v.last_in[i] if pin else None)
                        t.write(x)
                        self._counters["copies_in"] += 1
                        v.last_in[i] = x = t
                    v.cur_in[i] = x
                for i, info in enumerate(v.outputs):
                    y = binding._outputs.get(info.name)
                    if y is None:  # a session tensor, the binding's until its next run (or its deletion)
                        y = cache.acquire(info.shape, v.out_dt[i], v.last_out[i] if pin else None)
                        lent.append(y)
                        v.last_out[i] = y
                    else:
                        self._check_tensor(info, v.out_dt[i], y, "output")
                    v.cur_out[i] = y
                    binding._results[info.name] = y
                v.execute()
                self._counters["session_runs"] += 1
            finally:  # input copies are not needed after the run: back to the cache at once
                for i, t in enumerate(own_in):
                    if t is not None:
                        cache.release(t)
                        own_in[i] = None

    @property
    def stats(self) -> Counter[str]:
        """Session counters (runs, copies, plans, compile cache, shape variants), tensor-cache counters
        (hits, misses, created, destroyed, evicted, bytes held) and the contexts' counters (recordings,
        bytes allocated by category, memory handles)."""
        total: Counter[str] = Counter(self._retired)
        for v in self._variants.values():
            for ctx in v.contexts:
                total.update(ctx.stats)
        total.update(self._counters)
        total.update(self._cache.counters())
        total["alloc_cache_bytes"] = self._cache.stats["created_bytes"]
        return total

    def close(self) -> None:
        """Destroy every tensor of this session (cached or made by the user) and free its contexts."""
        with self._lock:
            if self._closed:
                return
            self._cache.clear()
            self._orphans.clear()
            for t in list(self._user_tensors):
                t.destroy()
            for v in self._variants.values():
                v.free()
            self._closed = True

    def __enter__(self) -> InferenceSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # interpreter shutdown: nothing to report to
            self.close()

    # -- internals -----------------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise LifecycleError("session is closed")

    def _return_orphans(self) -> None:
        """Tensors lent to IOBindings that were deleted go back to the cache."""
        while self._orphans:
            for t in self._orphans.pop():
                if not t.destroyed:
                    self._cache.release(t)
            self._counters["bindings_returned"] += 1

    def _check_tensor(self, info: TensorInfo, dt: np.dtype, t: Tensor, role: str) -> None:
        if t.session is not self:
            raise RegistrationError(f"{role} {info.name!r}: the Tensor belongs to another session")
        t._check()
        if t.shape != info.shape or t.dtype != dt:
            raise ShapeError(f"{role} {info.name!r} expects {dt}{list(info.shape)}, "
                             f"got a Tensor {t.dtype}{list(t.shape)}")

    @staticmethod
    def _check_outputs(v: _Variant, output_names: Sequence[str]) -> Sequence[str]:
        for n in output_names:
            if n not in v.out_info:
                raise ShapeError(f"no output {n!r}; outputs are {v.all_outputs}")
        return output_names


class IOBinding:
    """Like onnxruntime's IOBinding: bind inputs (Tensor: in place; ndarray: copied into a cached tensor at
    run) and outputs (Tensor: written in place; None: a session tensor, read with get_outputs()).

    Unlike onnxruntime, an output bound with None does not get a new tensor every run: the binding's next
    run writes the same session tensor again (pinning), and when the binding is deleted its tensors go back
    to the session's cache. Keep a result with `.numpy()` (a copy) or bind a Tensor of your own."""

    def __init__(self, session: InferenceSession) -> None:
        self.session = session
        self._inputs: dict[str, Tensor | np.ndarray] = {}
        self._outputs: dict[str, Tensor | None] = {}
        self._results: dict[str, Tensor] = {}
        self._lent: list[Tensor] = []  # session tensors this binding's last run used

    def __del__(self) -> None:
        # The session returns them to its cache at its next run: a binding made per iteration (as is usual
        # with onnxruntime) does not make new tensors every run. list.append is safe wherever GC runs this.
        if self._lent:
            self.session._orphans.append(self._lent)

    def bind_input(self, name: str, value: Tensor | np.ndarray) -> None:
        decl = self.session._in_decl.get(name)
        if decl is None:
            raise ShapeError(f"no input {name!r}; inputs are {list(self.session._in_decl)}")
        if not isinstance(value, Tensor | np.ndarray):
            raise ShapeError(f"bind_input {name!r}: expects a ctxrt.Tensor or a numpy.ndarray, "
                             f"got {type(value).__name__}")
        self._check_value(name, decl[0], value, "input")  # its shape may select another compiled variant
        self._inputs[name] = value

    def bind_output(self, name: str, value: Tensor | None = None) -> None:
        decl = self.session._out_decl.get(name)
        if decl is None:
            raise ShapeError(f"no output {name!r}; outputs are {list(self.session._out_decl)}")
        if value is not None:
            if not isinstance(value, Tensor):
                raise ShapeError(f"bind_output {name!r}: expects a ctxrt.Tensor or None, got {type(value).__name__}")
            self._check_value(name, decl[0], value, "output")
        self._outputs[name] = value

    def _check_value(self, name: str, dtype: np.dtype, value: Tensor | np.ndarray, role: str) -> None:
        if isinstance(value, Tensor):
            if value.session is not self.session:
                raise RegistrationError(f"{role} {name!r}: the Tensor belongs to another session")
            value._check()
        if value.dtype != dtype:
            raise ShapeError(f"{role} {name!r} expects {dtype}, got {value.dtype}")

    def clear_binding_inputs(self) -> None:
        self._inputs.clear()

    def clear_binding_outputs(self) -> None:
        self._outputs.clear()
        self._results.clear()

    def get_outputs(self) -> list[Tensor]:
        """The output Tensors of the last run, in the order the outputs were bound."""
        return [self._results[n] for n in self._outputs if n in self._results]

    def copy_outputs_to_cpu(self) -> list[np.ndarray]:
        return [t.numpy() for t in self.get_outputs()]


def _same(a: list[Any], b: list[Any]) -> bool:
    for x, y in zip(a, b, strict=True):  # noqa: SIM110 - a loop allocates no generator in the hot path
        if x is not y:
            return False
    return True


def _node_arg(name: str, dt: np.dtype, dims: list[int | str]) -> NodeArg:
    return NodeArg(name, list(dims), f"tensor({_ONNX_TYPES.get(dt.name, dt.name)})")


def _check_array(info: TensorInfo, dt: np.dtype, value: Any, role: str) -> None:
    if not isinstance(value, np.ndarray):
        raise ShapeError(f"{role} {info.name!r} must be a numpy.ndarray or a ctxrt.Tensor, "
                         f"got {type(value).__name__}")
    if value.shape != info.shape or value.dtype != dt:
        raise ShapeError(f"{role} {info.name!r} expects {dt}{list(info.shape)}, got {value.dtype}{list(value.shape)}")


__all__ = ["InferenceSession", "IOBinding", "NodeArg", "Tensor"]
