"""A split model's chain of range programs (`ctxrt compile --split K` with ranges, docs/shapes-and-control-flow.md):
each part runs at the dims its own inputs give, and the tensors passed between parts live in the chain buffer planned at
the upper bound, read and written through handles at the run's shapes (same offsets, made on first need)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ctxrt.compiler.program import TensorInfo
from ctxrt.errors import FormatError, ShapeError

if TYPE_CHECKING:
    from ctxrt.runtime.memhandle import MemHandle
    from ctxrt.runtime.variant import Stage


class _Shaped:
    """What a range program reads of a feed to bind its dims: the shape."""

    __slots__ = ("shape",)

    def __init__(self, shape: tuple[int, ...]) -> None:
        self.shape = shape


class ChainAt:
    """The chain at one set of model input shapes: the model's IO at those shapes, every part's dims (`dims`,
    concatenated) and the handles of the tensors between parts at their shapes, by (part, name)."""

    __slots__ = ("dims", "inputs", "outputs", "links")

    def __init__(self, dims: tuple[int, ...], inputs: list[TensorInfo], outputs: list[TensorInfo],
                 links: dict[tuple[int, str], MemHandle]) -> None:
        self.dims, self.inputs, self.outputs, self.links = dims, inputs, outputs, links


class RangedChain:
    """What a session reads of a range program (`ranges`, `inputs`, `_child`), for a chain of them. Its `ranges` is
    itself: `dims` (every part's, by name), `bind` (a ShapeError for feeds outside them)."""

    MAX_SHAPES = 16  # sets of input shapes whose link handles are kept
    widened = False
    _extent = None  # runs go through the session's tensors (Variant.execute), never a single program's runner

    def __init__(self, stages: Sequence[Stage], links: Mapping[tuple[int, str], MemHandle],
                 inputs: list[TensorInfo], outputs: list[TensorInfo]) -> None:
        self.stages, self.bound_links = list(stages), dict(links)
        self.inputs, self.outputs = inputs, outputs
        self.ranges = self
        names: dict[str, tuple[int, int]] = {}
        for st in self.stages:
            for name, lo, hi in (st.graph.ranges.dims if st.graph.ranges is not None else ()):
                old = names.setdefault(name, (lo, hi))
                if old != (lo, hi):
                    raise FormatError(f"the chain's parts give dim {name!r} two ranges: {old} and {(lo, hi)} "
                                      "(binaries of different compiles)")
        self.dims = [(n, lo, hi) for n, (lo, hi) in names.items()]
        self._at: OrderedDict[tuple[Any, ...], ChainAt] = OrderedDict()
        self._refs: dict[int, list[Any]] = {}  # id(handle) -> [handle, ChainAts using it]: deregistered at 0

    def step_of(self) -> list[int]:
        return [1] * len(self.dims)  # (a split model's parts take no stepped ranges)

    def natural(self) -> list[tuple[str, int, int, int]]:
        return [(n, lo, hi, 1) for n, lo, hi in self.dims]

    def bind(self, inputs: Sequence[TensorInfo], shapes: Sequence[tuple[int, ...] | None]) -> tuple[int, ...]:
        return self._child({t.name: _Shaped(s) for t, s in zip(inputs, shapes, strict=True) if s is not None}).dims

    def _child(self, feeds: Mapping[str, Any]) -> ChainAt:
        key = tuple([getattr(feeds.get(t.name), "shape", None) for t in self.inputs])
        at = self._at.get(key)
        if at is not None:
            self._at.move_to_end(key)
            return at
        at = self._make(feeds)
        self._at[key] = at
        while len(self._at) > self.MAX_SHAPES:
            self._drop(self._at.popitem(last=False)[1])
        return at

    def _make(self, feeds: Mapping[str, Any]) -> ChainAt:
        shapes: dict[str, tuple[int, ...]] = {}
        for t in self.inputs:
            x = feeds.get(t.name)
            if x is None:
                raise ShapeError(f"inputs: missing {[t.name for t in self.inputs if t.name not in feeds]}")
            shapes[t.name] = tuple(x.shape)
        dims: list[int] = []
        links: dict[tuple[int, str], MemHandle] = {}
        for k, st in enumerate(self.stages):
            g = st.graph
            if g.ranges is None:
                ins, outs = g.inputs, g.outputs
            else:
                child = g._child({n: _Shaped(shapes[n]) for n in st.inputs})
                ins, outs, part_dims = child.inputs, child.outputs, child.dims
                dims.extend(part_dims)
            for t in ins:
                if t.name in shapes and shapes[t.name] != t.shape:
                    raise ShapeError(f"part {k} ({g.name!r}) reads {t.name!r} as {list(t.shape)}; it is "
                                     f"{list(shapes[t.name])}")
            for t in outs:
                shapes[t.name] = t.shape
        for (k, name), h in self.bound_links.items():
            links[(k, name)] = h if shapes[name] == h.shape else self._handle(h, shapes[name])
        inputs = [TensorInfo(t.name, shapes[t.name], t.dtype, t.mem_type) for t in self.inputs]
        outputs = [TensorInfo(t.name, shapes[t.name], t.dtype, t.mem_type) for t in self.outputs]
        return ChainAt(tuple(dims), inputs, outputs, links)

    def _handle(self, bound: MemHandle, shape: tuple[int, ...]) -> MemHandle:
        """A handle at `shape` on the bytes of a link's handle at the upper bound (its leading bytes)."""
        h = bound.context.mem_register(bound.buffer, bound.offset, shape, bound.dtype)
        self._refs.setdefault(id(h), [h, 0])[1] += 1
        return h

    def _drop(self, at: ChainAt) -> None:
        for (k, name), h in at.links.items():
            if h is self.bound_links[(k, name)]:
                continue
            ref = self._refs[id(h)]
            ref[1] -= 1
            if ref[1] == 0:
                del self._refs[id(h)]
                if h.registered and h.context.finalized:
                    h.context.mem_deregister(h)

    def io_dims(self) -> tuple[list[list[Any]], list[list[Any]]]:
        """The model inputs' and outputs' dims with the parts' dims named (compiler/ranges.io_dims)."""
        from ctxrt.compiler.ranges import io_dims

        named: dict[str, list[Any]] = {}
        for st in self.stages:
            g = st.graph
            if g.ranges is None:
                found = [list(t.shape) for t in g.inputs], [list(t.shape) for t in g.outputs]
            else:
                found = io_dims(g.ranges.to_meta(), [{"shape": t.shape} for t in g.inputs],
                                [{"shape": t.shape} for t in g.outputs])
            for t, d in zip([*g.inputs, *g.outputs], [*found[0], *found[1]], strict=True):
                named.setdefault(t.name, d)
        return [named[t.name] for t in self.inputs], [named[t.name] for t in self.outputs]

    def appends(self) -> dict[str, str]:
        """{past input: present output} of every part that appends to a KV cache window in place
        (InferenceSession.kv_appends)."""
        pairs: dict[str, str] = {}
        for st in self.stages:
            runner = st.graph._extent
            if runner is None:
                continue
            pairs.update({past: present for (present, past) in st.graph._append
                          if runner.kernel_reading({past, present}) is None})
        return pairs
