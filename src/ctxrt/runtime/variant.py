"""One compiled variant of an InferenceSession's model (runtime/compile_cache.py compiles them)."""

from __future__ import annotations

import weakref
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import numpy as np

from ctxrt.compiler.program import TensorInfo
from ctxrt.compiler.ranges import is_dim_name
from ctxrt.errors import RegistrationError, ShapeError
from ctxrt.frontend.carriers import Spec, carry
from ctxrt.runtime.chain import RangedChain
from ctxrt.runtime.context import Context
from ctxrt.runtime.graph import Graph
from ctxrt.runtime.memhandle import MemHandle
from ctxrt.runtime.tensor import Tensor

if TYPE_CHECKING:
    from ctxrt.runtime.session import InferenceSession
    from ctxrt.runtime.weightstore import WeightStore

_NO_SHAPES: Mapping[str, tuple[int, ...]] = MappingProxyType({})
# Memory a context holds now (set, not accumulated): a session counts these for the variants it keeps only.
HELD = frozenset({"weights_bytes", "weights_prepacked_bytes", "alloc_kernel_bytes", "alloc_spillfill_bytes",
                  "alloc_io_bytes", "alloc_padding_bytes", "alloc_weights_bytes"})
WARN_AFTER = 8  # shape variants compiled by one session before it says how to compile fewer


@dataclass
class Stage:
    context: Context
    graph: Graph
    inputs: list[str]
    outputs: list[str]


class Variant:
    """The contexts compiled for one set of input shapes (and values of value inputs), with the tensors bound
    last and their plan."""

    @property
    def session(self) -> InferenceSession:
        return self._session()

    def __init__(self, session: InferenceSession, contexts: list[Context], stages: list[Stage],
                 inputs: list[TensorInfo], outputs: list[TensorInfo], links: dict[tuple[int, str], MemHandle],
                 group: Any = None) -> None:
        self._session = weakref.ref(session)  # (its session holds it: a session dropped is freed at once)
        self.contexts, self.stages, self.group = contexts, stages, group
        for ctx in contexts:
            ctx.num_threads = session._num_threads  # the session's sess_options.intra_op_num_threads
        self.inputs, self.outputs, self.links = inputs, outputs, links
        self.in_info = {t.name: t for t in inputs}
        self.carriers: Spec = ()  # value inputs fed as the lengths of inputs (frontend/carriers.py)
        self.carried: frozenset[str] = frozenset()  # their names
        self.carried_dims: dict[str, tuple[str, int]] = {}  # a carrier whose length is a dim -> its (input, axis)
        self._carried_last: tuple[Any, Any] = (None, None)  # (the feeds `matches` carried last, their carriers)
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
        # Value inputs (docs/shapes-and-control-flow.md) and the values this variant was compiled for.
        self.values = [(n, a) for st in stages for n, a in st.graph.value_inputs.items() if n in self.in_info]
        self.shapes: Mapping[str, tuple[int, ...]] = _NO_SHAPES  # real shapes of the last run's bounded outputs
        # A range program (one stage), or a split model's chain of them: shapes of its IO tensors follow the
        # feeds' (compiler/ranges.py, runtime/chain.py).
        graph = stages[0].graph if len(stages) == 1 else None
        self.ranged: Graph | RangedChain | None = graph if graph is not None and graph.ranges is not None else None
        self.chain: RangedChain | None = None
        if len(stages) > 1 and any(st.graph.ranges is not None for st in stages):
            self.ranged = self.chain = RangedChain(stages, links, inputs, outputs)
        self._plan_at: Any = None  # the chain's shapes `plan` was built for
        self._run_at: Any = None  # and those of the run in progress
        self.in_shapes = [t.shape for t in inputs]  # the IO shapes of the run in progress
        self.out_shapes = [t.shape for t in outputs]
        self.recent: dict[tuple[int, ...], set[tuple[tuple[int, ...], str]]] = {}  # dims -> IO keys, oldest first
        self._lasts: dict[tuple[int, ...], tuple[list[Tensor | None], list[Tensor | None]]] = {}

    def fits(self, feeds: Mapping[str, Any]) -> bool:
        """A range program: whether the feeds' shapes lie inside its ranges (static axes checked by the run)."""
        g = self.ranged
        try:
            if self.chain is not None:
                self.chain._child(feeds)
            elif g._extent is not None and feeds.keys() == g._input_names:
                g._extent.at(feeds)  # binds the dims once for this run (the run asks again)
            else:
                g.ranges.bind(g.inputs, [getattr(feeds.get(t.name), "shape", None) for t in g.inputs])
        except ShapeError:
            return False
        return all(np.array_equal(array_of(feeds[name]), value) for name, value in self.values)

    def shapes_for(self, feeds: Mapping[str, Any]) -> bool:
        """Set `in_shapes` and `out_shapes` for a range program's run on these feeds; True when these dims are
        new (the tensor cache then keeps the IO shapes of the last few only)."""
        g = self.ranged
        child = g._child(feeds)
        if self.chain is not None:
            self._run_at = child
        self.in_shapes = [t.shape for t in child.inputs]
        self.out_shapes = [t.shape for t in child.outputs]
        dims = child.dims  # bound once, by _child
        new = dims not in self.recent
        self.recent.pop(dims, None)
        self.recent[dims] = {(t.shape, np.dtype(t.dtype).str) for t in child.inputs + child.outputs}
        # pinning per shape: the tensors bound last at these dims (two inputs of one shape must not swap)
        self.last_in, self.last_out = self._lasts.pop(dims, None) or ([None] * len(self.inputs),
                                                                       [None] * len(self.outputs))
        self._lasts[dims] = (self.last_in, self.last_out)
        while len(self.recent) > Graph.MAX_CHILDREN:
            old = next(iter(self.recent))
            self.recent.pop(old)
            self._lasts.pop(old, None)
        return new

    def carry(self, feeds: Mapping[str, Any]) -> Any:
        """The feeds with each carried value input replaced by its carriers; None where a value is no length or
        another program's (frontend/carriers.py). Those `matches` made for these feeds in this run, not again."""
        last, self._carried_last = self._carried_last, (None, None)
        return last[1] if last[0] is feeds else self._carry(feeds)

    def _carry(self, feeds: Mapping[str, Any]) -> Any:
        decl = self.session._in_decl
        for name in self.carried:  # of the declared type (then the session's check of the feeds names another)
            v, (dt, dims) = feeds.get(name), decl[name]
            if v is None or v.dtype != dt or dims is not None and all(isinstance(d, int) for d in dims) and \
                    tuple(v.shape) != tuple(dims):
                return None
        out = carry({k: array_of(v) if k in self.carried else v for k, v in feeds.items()}, self.carriers)
        if out is None:
            return None
        for length, (name, axis) in self.carried_dims.items():  # an element that is one of the model's dims
            shape = getattr(feeds.get(name), "shape", None)
            if shape is None or axis >= len(shape) or shape[axis] != out[length].shape[0]:
                return None
        return out

    def matches(self, feeds: Mapping[str, Any]) -> bool:
        if self.carriers:
            carried = self._carry(feeds)
            self._carried_last = (feeds, carried)  # (the run that follows takes them: `carry`)
            if carried is None:
                return False
            feeds = carried
        if self.ranged is not None:
            return self.fits(feeds)
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
        at = self._run_at  # a chain: its shapes at this run's feeds (shapes_for)
        if not (_same(self.cur_in, self.plan_in) and _same(self.cur_out, self.plan_out)) or at is not self._plan_at:
            self._make_plan(at)
        shapes = None
        for graph, ins, outs in self.plan:
            real = graph.execute(ins, outs)
            if real:
                shapes = dict(real) if shapes is None else {**shapes, **real}
        self.shapes = _NO_SHAPES if shapes is None else shapes
        for view, i in self.plan_copies:  # model outputs that later stages read: made in the chain buffer
            self.cur_out[i].write(view)

    def _make_plan(self, at: Any = None) -> None:
        """Each stage's input and output handles; `at`: a chain of range programs at the run's shapes, whose
        link handles are at those shapes."""
        session = self.session
        links = self.links if at is None else at.links
        tensors = {t.name: self.cur_in[i] for i, t in enumerate(self.inputs)}
        tensors.update({t.name: self.cur_out[i] for i, t in enumerate(self.outputs)})
        for t in tensors.values():
            if t.session is not session:
                raise RegistrationError("a Tensor of another session is bound")
            t._check()
        plan, copies = [], []
        for k, st in enumerate(self.stages):
            ins = {n: links[(k, n)] if (k, n) in links else tensors[n].handle(st.context)
                   for n in st.inputs}
            outs = {}
            for n in st.outputs:
                if (k, n) in links:
                    outs[n] = links[(k, n)]
                    if n in self.out_info:
                        copies.append((links[(k, n)].view, self.out_index[n]))
                elif n in tensors:
                    outs[n] = tensors[n].handle(st.context)
            plan.append((st.graph, ins, outs))
        self.plan, self.plan_copies = plan, copies
        self.plan_in[:] = self.cur_in
        self.plan_out[:] = self.cur_out
        self._plan_at = at
        session._counters["plans"] += 1

    def io_keys(self) -> set[tuple[tuple[int, ...], str]]:
        """(shape, dtype) of every input and output: what the session's tensor cache keeps tensors of (a range
        program's: those of its last few dims)."""
        if self.ranged is not None:
            return set().union(*self.recent.values())
        return {(t.shape, np.dtype(t.dtype).str) for t in self.inputs + self.outputs}

    def free(self) -> None:
        """Free the contexts and let go of every tensor this variant referred to."""
        self.plan, self.plan_copies, self._plan_at = [], [], None
        self._lasts.clear()
        for tensors in (self.last_in, self.last_out, self.cur_in, self.cur_out, self.plan_in, self.plan_out):
            tensors[:] = [None] * len(tensors)
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


def held_stats(retired: Counter[str], contexts: list[Context], store: WeightStore | None) -> Counter[str]:
    """The contexts' counters added to those of freed ones, weights that several contexts share counted once
    (`weights_bytes`: each segment, `weights_mapped_bytes` those read in place from a model's external data file;
    `weights_prepacked_bytes`: each prepacked weight), with the weight store's
    counters and its device copies (in `alloc_weights_bytes`)."""
    total = Counter(retired)
    segments: dict[int, int] = {}
    mapped: dict[int, int] = {}
    prepacked: dict[tuple[int, int], int] = {}
    for ctx in contexts:
        total.update(ctx.stats)
        held, packed = ctx.held_weights()
        segments.update(held)
        mapped.update(ctx.mapped_weights())
        prepacked.update(packed)
    total["weights_bytes"] = sum(segments.values())
    total["weights_mapped_bytes"] = sum(mapped.values())
    total["weights_prepacked_bytes"] = sum(prepacked.values())
    if store is not None:
        total.update(store.stats)
        total["alloc_weights_bytes"] += store.device_bytes
    return total


def variants_warning(compiled: int, dims: Mapping[tuple[str, int], set[int]],
                     decl: Mapping[str, tuple[Any, list[int | str | None] | None]], max_variants: int) -> str | None:
    """What a session that keeps compiling says (once, at its WARN_AFTER-th compile): which input axes took
    which sizes, and how to bind or widen them instead."""
    if compiled < WARN_AFTER:
        return None
    varying = {key: sorted(sizes) for key, sizes in dims.items() if len(sizes) > 1}
    seen = []
    for (name, axis), sizes in varying.items():
        declared = (decl[name][1] if name in decl else None) or []  # None: rank unknown
        label = f" ({declared[axis]})" if axis < len(declared) and isinstance(declared[axis], str) else ""
        seen.append(f"input {name!r} axis {axis}{label} took {len(sizes)} sizes from {sizes[0]} to {sizes[-1]}")
    example = {name: [max(dims[(name, a)]) for a in range(len(declared or []))]
               for name, (_, declared) in decl.items() if any((name, a) in varying for a in range(len(declared or [])))}
    ranges = {f"{name}:{a}" if not is_dim_name(declared[a]) else declared[a]:
              (0, max(dims[(name, a)])) for name, (_, declared) in decl.items()
              for a in range(len(declared or [])) if (name, a) in varying}
    how = (f"give ranges wide enough for every shape, e.g. InferenceSession(..., dim_ranges={ranges}) (one "
           f"program for all of them, docs/shapes-and-control-flow.md), or pad inputs to one size and bind it, "
           f"e.g. shapes={example}" if example else "feed value inputs fewer distinct values (those a range program "
           "cannot take: a branch's condition, floats, negative values, more than 8 elements)")
    return (f"InferenceSession compiled {compiled} shape variants of its model "
            f"({'; '.join(seen) or 'the same shapes with other values of value inputs'}): every new input shape "
            f"compiles the model again. To compile fewer, {how}; max_shape_variants={max_variants} bounds how many "
            "stay compiled (sess.stats['shape_variants_compiled'] counts the compiles).")
