"""A range program run at every set of dim values from one list of launches (docs/shapes-and-control-flow.md).

Only the steps whose integers changed get other launches; the rest are the upper bound's. A changed step covered by
the CPU's makers of run-time extents (`backends/cpu/extents.py`: element-wise ops, MatMul, Softmax, Concat,
Transpose, Slice, Expand, Trilu, Range, copies) whose integers are extents or elements of small constants is live:
one launch for every set of dims, which makes its views at the same arena offsets when it first meets its values
(a few microseconds). Another changed step (a oneDNN GEMM whose rows follow the sequence) gets its kernel made once
per shape, from a small cache per step. A decoder's token at a new past length changes only its attention steps,
all live: it costs no kernel, no graph and no compile. Run on arrays, the sets of dims with the same changed
kernels share one batched list whose live steps are slots (runtime/slots.py: their native structs copied, or
predicted, per set), and feeds and outputs only known native calls touch are used in place (runtime/feeds.py). Other
backends make a child graph per set of dims (runtime/graph.py).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import numpy as np

from ctxrt import dtypes
from ctxrt.backends import select_kernel
from ctxrt.backends.cpu import native, strided, threads
from ctxrt.backends.cpu.extents import UNREAD_ATTRS, _nothing, in_place_reshape, small_rows
from ctxrt.backends.kernel import NodeSpec, TensorSpec
from ctxrt.compiler.program import ARENA, CONST, INPUT, OUTPUT, Step, TensorInfo
from ctxrt.compiler.ranges import _apply, filled
from ctxrt.errors import RegistrationError, ShapeError
from ctxrt.runtime import feeds, slots
from ctxrt.runtime.memhandle import MemHandle
from ctxrt.runtime.work import SMALL_WORK, splits, step_work

if TYPE_CHECKING:
    from ctxrt.backends.cpu.extents import Make
    from ctxrt.runtime.graph import Graph

_NO_SHAPES: Mapping[str, tuple[int, ...]] = {}
_NO_OUTPUTS: Mapping[str, Any] = MappingProxyType({})  # outputs a run may not write in place (run_recorded)
PER_STEP = 64  # shapes of one changed step whose launches (and kernels) are kept
# values of a live step's integers whose launches it keeps (~1 KB each: a closure and its views): a generation of
# up to this many tokens, repeated, makes no launch the second time
LIVE_KEPT = 128
# sets of dim values whose state (IO infos, changed steps, recorded launch lists) a program keeps, ~10 KB each: a
# second generation of up to this many tokens finds each past length's state (GPT-2 tiny's steady token: 1.6 ->
# 1.0-1.6 ms beside onnxruntime's 0.5-0.9, 2.2x -> 1.8x); at 16 every token past the 16th rebuilt its state
MAX_STATES = 128


# op -> positions of constant inputs its CPU kernel reads only when it runs, never when it is made: a range
# program's step whose only changes are these values keeps one kernel (GroupQueryAttention's seqlens_k and
# total_sequence_length follow the mask's length, a new value every token)
RUN_TIME_CONSTS = {"com.microsoft.GroupQueryAttention": frozenset({5, 6})}


class Made:
    """One changed step at one set of its integers' values: the step (None: its outputs are empty, nothing to run),
    its launch maker or kernel, its launch when it touches no IO tensor (or on the internal IO buffers), what it
    holds, its work."""

    __slots__ = ("step", "make", "kernel", "launch", "raw", "consts", "scratch", "held", "work", "blas")

    def __init__(self, step: Step | None) -> None:
        self.step, self.make, self.kernel, self.launch = step, None, None, None
        self.raw: Any = None  # its launch on the internal IO buffers (a step touching IO, runs on arrays)
        self.consts: dict[int, np.ndarray] = {}
        self.scratch: list[Any] = []
        self.held: list[Any] = []
        self.work: int | None = 0
        self.blas = False  # a GEMM run by NumPy's BLAS at these shapes (small_rows' GEMV)


RECORDINGS = 2  # launch lists kept per set of dims, by binding
_NO_STEPS: Mapping[int, Any] = MappingProxyType({})  # the changed steps of a state with none (one object)


class AtDims:
    """A range program at one set of dim values: its IO (shapes at these dims), its changed steps, the thread cap,
    and the launch list recorded for one IO binding."""

    __slots__ = ("dims", "inputs", "outputs", "out_info", "steps", "cap", "blas", "bound", "internal", "launches",
                 "kv", "recordings", "vals", "resolved", "built", "plans", "shared", "in_shapes")

    def __init__(self, dims: tuple[int, ...], inputs: list[TensorInfo], outputs: list[TensorInfo],
                 steps: Mapping[int, Made], cap: int | None, blas: bool = False) -> None:
        self.dims, self.inputs, self.outputs, self.steps, self.cap = dims, inputs, outputs, steps, cap
        self.in_shapes = [t.shape for t in inputs]  # (ExtentRunner.at: feeds of exactly these shapes fit)
        self.blas = blas  # the run's large kernels are BLAS GEMVs: BLAS gets the threads, not only OpenMP
        self.out_info = {t.name: t for t in outputs}
        self.bound: tuple[MemHandle | None, ...] | None = None
        self.internal: dict[str, Any] = {}
        self.launches: list[Any] = []
        # (bytes left in place, bytes appended) per run by Concats appending to a KV cache window (Tensor.window)
        self.kv: tuple[int, int] | None = None
        # the latest RECORDINGS launch lists by their binding: a loop that binds two sets of outputs in turn (a
        # torch export's generation: a step's presents are the next step's pasts) records each once
        self.recordings: OrderedDict[tuple[MemHandle | None, ...], tuple[list[Any], Any]] = OrderedDict()
        self.vals: list[int] = []  # the integers of the program at these dims (ExtentRunner.live reads them)
        # (launches, the same with each live launch replaced by its launch at these dims): what runs, made once
        # per recording a state uses (a recording is shared by states whose live steps differ)
        self.resolved: list[Any] | None = None  # [the recording, its launches as run, runs of it]
        self.built = False  # kernels were built for these dims (their first run costs milliseconds: BATCH_AT)
        # (the batched list run on arrays, {thread key: its feeds.Plan or None}): feeds read in place
        self.plans: tuple[list[Any] | None, dict[Any, Any]] = (None, {})
        # on arrays, the list shared by its recording's sets of dims (slots.py): (recording, Shared, the launch per
        # step at these dims, their structs), or False (this set runs its own list), None before its first run
        self.shared: tuple[list[Any], slots.Shared, list[Any], np.ndarray] | bool | None = None


def _at_dims(launches: list[Any], vals: list[int]) -> list[Any]:
    """A recording's launch per step at the program's integers `vals` (each live step's launch at them)."""
    return [launch.at(vals) if hasattr(launch, "at") else launch for launch in launches]


class _Views(dict):
    """A state's views of the internal IO buffers at its dims, each made when first asked for: a run on arrays
    copies few of them (the feeds and outputs not used in place, runtime/feeds.py)."""

    __slots__ = ("g", "infos")

    def __init__(self, g: Graph, infos: list[TensorInfo]) -> None:
        super().__init__()
        self.g, self.infos = g, infos

    def __missing__(self, name: str) -> Any:
        info = next(t for t in self.infos if t.name == name)
        buf, off = self.g._io_place(name)
        view = self[name] = np.ndarray(info.shape, dtypes.dtype_of(info.dtype), buf.array, off)
        return view


class ExtentRunner:
    """Runs graph `g` (a range program on the CPU) at any dims inside its ranges; see the module's docstring."""

    def __init__(self, g: Graph, makers: dict[int, Make | None]) -> None:
        self.g, self.makers = g, makers
        self.states: OrderedDict[tuple[int, ...], AtDims] = OrderedDict()
        self.last: tuple[list[Any] | None, Any] = (None, None)  # (feeds' shapes, the state they bound)
        self.io_steps = set(g._io_steps)
        self.cache: dict[int, OrderedDict[tuple[int, ...], Made]] = {k: OrderedDict() for k in makers}
        # kernels of steps whose changing constants their kernel reads only when it runs, by step and shapes
        self.by_shape: dict[tuple[int, Any], Any] = {}
        self.kernels_built = 0  # kernels made for sets of dims (AtDims.built: the new ones of a set)
        self.work = [step_work(s) for s in g.compiled.steps]  # at the upper bound: bounds every shape inside
        fixed = [w for k, w in enumerate(self.work) if k not in makers]
        self.static_work: int | None = None if None in fixed else max(fixed, default=0)
        self.static_total = sum(w for w in fixed if w)  # with the changed steps' at each set of dims (`splits`)
        # the changed steps grouped by the dims their integers follow (bit j: dim j), each group kept per the
        # values of its dims: a decoder's token at a new past length remakes only the steps that follow the past
        groups = {}
        for k, idx in g.ranges._by_step.items():
            mask = 0
            for i in idx:
                for m in g.ranges.monomial_masks(i):
                    mask |= m
            groups.setdefault(mask, []).append((k, idx))
        self.groups: dict[int, list[tuple[int, list[int]]]] = groups
        self.group_cache: dict[int, OrderedDict[tuple[int, ...], tuple[dict[int, Made], int | None, int]]] = {
            m: OrderedDict() for m in groups}
        # steps with a launch maker whose integers are only extents: their refs' axes that follow the dims, by
        # position in the step's values (made without a new Step, _pure)
        self.live_spec: dict[int, tuple[list[Any], list[Any]]] = {}
        self.pure: dict[int, tuple[list[Any], list[Any]]] = {}
        # steps with a launch maker whose integers are extents and elements of small constants (a causal mask's
        # Range limit, Expand's shape, Trilu's k): live too, those constants filled at each run
        self.fills: dict[int, dict[int, list[tuple[int, int]]]] = {}
        entries = g.ranges.entries
        for k, idx in g.ranges._by_step.items():
            step = g.compiled.steps[k]
            unread = UNREAD_ATTRS.get(step.op, frozenset())
            if makers[k] is None or any(entries[i][0][0] not in ("in", "out", "const") and not (
                    entries[i][0][0] == "attr" and entries[i][0][2] in unread) for i in idx):
                continue
            axes: dict[tuple[str, int], list[tuple[int, int]]] = {}
            fills: dict[int, list[tuple[int, int]]] = {}
            for j, i in enumerate(idx):
                if entries[i][0][0] == "attr":
                    continue  # the output's shape, which its view has
                kind, _, slot, axis = entries[i][0]
                if kind == "const":
                    fills.setdefault(int(slot), []).append((int(axis), j))  # (flat index, position in idx)
                else:
                    axes.setdefault((kind, int(slot)), []).append((int(axis), j))
            spec = ([None if r is None else (r, axes.get(("in", n), ())) for n, r in enumerate(step.inputs)],
                    [(r, axes.get(("out", n), ())) for n, r in enumerate(step.outputs)])
            if fills:
                self.fills[k] = fills
            else:
                self.pure[k] = spec
            self.live_spec[k] = spec
        # the pure steps' launches for every set of dims, their views made at each run from the dims' values (the
        # current ones in `self.vals`): a token at a new past length makes nothing for them. Steps touching no IO
        # tensor serve every binding; the others on the internal IO buffers only (arrays fed and returned)
        self.vals: list[int] = []
        self.live: dict[int, Any] = {k: self._live(k, idx, raw=False) for k, idx in g.ranges._by_step.items()
                                     if k in self.live_spec and k not in self.io_steps}
        self.live_raw: dict[int, Any] = {**self.live, **{k: self._live(k, idx, raw=True)
                                                          for k, idx in g.ranges._by_step.items()
                                                          if k in self.live_spec and k in self.io_steps}}
        self.groups_made = {m: [(k, idx) for k, idx in members if k not in self.live_raw]
                            for m, members in groups.items()}
        # the live steps' work: at the upper bound where that is small (it bounds every shape inside), else at
        # each set of dims (`_at`: a batch range's bound must not take a one-token run off its single thread)
        small = [self.work[k] for k in self.live_raw if self.work[k] is not None and self.work[k] < SMALL_WORK]
        self.live_big = [k for k in self.live_raw if self.work[k] is None or self.work[k] >= SMALL_WORK]
        self.live_work: int | None = None if self.static_work is None else max([self.static_work, *small])
        # the small live steps' work at a set of dims, for the total that decides a thread split (`splits`): their
        # work at the upper bound scaled by the largest ratio of a view's elements at those dims to the bound's
        # (exact for work that follows the output, an upper bound for a reduction over a changing axis)
        # (flat: the values' indices and bounds of every view's axes, where each view and each step starts)
        idx_of, flat, views, steps, works = g.ranges._by_step, [], [], [], []
        for k in self.live_raw:
            if k in self.live_big or not self.work[k]:
                continue
            first = len(views)
            for spec in [*self.live_spec[k][0], *self.live_spec[k][1]]:
                axes = [] if spec is None else \
                    [(idx_of[k][j], spec[0].shape[a]) for a, j in spec[1] if spec[0].shape[a]]
                if axes:
                    views.append(len(flat))
                    flat.extend(axes)
            if len(views) > first:
                steps.append(first)
                works.append(float(self.work[k]))
        self.live_small = (np.array([i for i, _ in flat], np.intp), np.array([b for _, b in flat], np.float64),
                           np.array(views, np.intp), np.array(steps, np.intp), np.array(works)) if works else None
        # outputs of data-dependent size (GroupQueryAttention's present): (name, axis, the scalar of its real size)
        out_index = {t.name: i for i, t in enumerate(g.outputs)}
        self.extents = [(out_index[name], axis, _view(g, r)) for name, (axis, r) in g.compiled.extents.items()]
        # per input and per output: (axis, index of its value) for each axis that follows the dims
        io_axes: dict[str, list[list[tuple[int, int]]]] = {"I": [[] for _ in g.inputs], "O": [[] for _ in g.outputs]}
        for i in g.ranges._io:
            kind, index, axis = g.ranges.entries[i][0]
            io_axes[kind][int(index)].append((int(axis), i))
        self.io_axes = (io_axes["I"], io_axes["O"])
        # launches of the steps that touch IO tensors but do not change, bound to the internal IO buffers
        self.internal_io: list[Any] | None = None
        self.merged: dict[tuple[int, ...], tuple[list[dict[int, Made]], dict[int, Made]]] = {}  # _at's merges
        # raw launch lists by their changed steps (the dict a group shares among states): (steps, launches, kv)
        self.raw_lists: dict[int, tuple[dict[int, Made], list[Any], tuple[int, int] | None]] = {}
        self.kernels_reading: dict[frozenset[str], Step | None] = {}  # kernel_reading's answers
        # per IO tensor, the steps touching it (feeds.plan: one only known native calls touch is not copied)
        self.users: dict[str, list[int]] = {}
        # shared launch lists by their recording (slots.py), and the launches of the run in progress per step
        self.shared: dict[int, slots.Shared] = {}
        self.cur: list[Any] = []
        # the plan whose arrays the calls of the last run on arrays pointed at (feeds.py): its fields are put back
        # on the buffers before another list runs or is planned (a call shared by two lists would keep pointing at
        # the other run's array: a new batch size's output copied out of a buffer nothing wrote)
        self.bound_plan: feeds.Plan | None = None
        for k, step in enumerate(g.compiled.steps):
            for r in {r.key for r in [*step.inputs, *step.outputs] if r is not None and r.space in (INPUT, OUTPUT)}:
                self.users.setdefault(r, []).append(k)

    def release(self) -> None:
        """Drop every launch and state (they hold views of the context's arena; the live launches also this
        runner): a freed program's memory goes at once, not at the garbage collector's next cycle."""
        self.live, self.live_raw, self.states, self.last = {}, {}, OrderedDict(), (None, None)
        self.cache.clear()
        self.group_cache.clear()
        self.raw_lists.clear()
        self.merged.clear()
        self.shared.clear()
        self.cur = []
        self.by_shape.clear()
        self.internal_io, self.extents = None, []

    @classmethod
    def build(cls, g: Graph) -> ExtentRunner | None:
        """The runner for `g`, or None where child graphs run it (not the CPU, CPU partitions of another backend,
        value inputs)."""
        if g.ctx.backend.name != "cpu" or g._host is not None or g._values:
            return None
        from ctxrt.backends.cpu.extents import maker

        makers = {}
        for k in g.ranges._by_step:
            step, kernel = g.compiled.steps[k], g._kernels[k]
            makers[k] = maker(step, g.compiled.opset)
            if makers[k] is None and getattr(kernel, "any_shape", False) and (
                    not kernel.scratch or getattr(kernel, "scratch_grows", False) and native.library() is not None):
                # AnyRows, DepthwiseRows, PlanarRows, ShapeFree, native 1-D convs and MaxPools: one for all shapes
                # (a kernel whose scratch grows with its shapes binds the upper bound's at every one)
                makers[k] = _any_shape(kernel, [_view(g, r) for r in step.scratch])
            if makers[k] is None and native.library() is not None:
                # a GEMM of a few rows by small weights at the upper bound: the GEMV on one thread at every count
                # (a classifier in a batch loop; a decoder's larger GEMVs take the idle cores, made per row count)
                makers[k] = small_rows(step, live=True)
        return cls(g, makers)

    def _live(self, k: int, idx: list[int], raw: bool) -> Any:
        """Step k's launch at any dims (a live step: its maker's, from views at the upper bound's places with the
        shapes of the dims in `self.vals`, and its own copies of the small constants that follow them), made when
        a run first meets its integers' values and kept for the latest LIVE_KEPT of them: no per-dims state, no
        recording. `raw`: its IO tensors are the internal IO buffers."""
        g = self.g
        step = g.compiled.steps[k]
        ins_spec, outs_spec = self.live_spec[k]
        make = self.makers[k]
        tmpl = _Step(step.op, step.attrs, list(step.inputs), list(step.outputs))
        fills = self.fills.get(k, {})

        def place(spec: Any, n: int = -1) -> Any:
            if spec is None:
                return None
            r, axes = spec
            if n in fills:  # a small integer constant, its elements that follow the dims set at each run
                array = np.array(g.ctx.host_weights[r.key]).reshape(r.shape)
                return (array, [(flat, idx[j]) for flat, j in fills[n]])
            if r.space == ARENA:
                buf, base = g.ctx.arena
                array, offset = buf.array, base + r.offset
            elif r.space == CONST:
                return _view(g, r)  # constants keep their shape
            elif raw:
                buf, offset = g._io_place(r.key)
                array = buf.array
            else:
                raise AssertionError(f"step {k} reads IO tensor {r.key!r}: not a live step for bound handles")
            if not axes:
                return np.ndarray(r.shape, r.dtype, array, offset)
            return (array, offset, np.dtype(r.dtype), list(r.shape), [(axis, idx[j]) for axis, j in axes])

        ins, outs = [place(x, n) for n, x in enumerate(ins_spec)], [place(x) for x in outs_spec]
        runner, ndarray, nothing, stats = self, np.ndarray, _nothing, g.ctx.stats
        made: OrderedDict[tuple[int, ...], Any] = OrderedDict()  # launches by the values of the step's integers

        def views(specs: list[Any], vals: list[int]) -> list[Any]:
            got = []
            for spec in specs:
                if spec.__class__ is not tuple:
                    got.append(spec)
                    continue
                if len(spec) == 2:  # a constant of this launch's own, its elements set
                    array, elements = spec
                    array = array.copy()
                    flat = array.reshape(-1)
                    for j, i in elements:
                        flat[j] = vals[i]
                    got.append(array)
                    continue
                array, offset, dtype, shape, axes = spec
                for axis, i in axes:
                    shape[axis] = vals[i]
                got.append(ndarray(tuple(shape), dtype, array, offset))
            return got

        def at(vals: list[int]) -> Any:
            """The step's launch at the program's integers `vals` (made on first need)."""
            key = tuple([vals[i] for i in idx])
            run = made.get(key)
            if run is None:
                y = views(outs, vals)
                run = nothing if any(not t.size for t in y) else make(tmpl, views(ins, vals), y)
                made[key] = run
                stats["range_live_launches_made"] += 1
                if len(made) > LIVE_KEPT:
                    made.popitem(last=False)
            return run

        def launch() -> None:
            at(runner.vals)()
        launch.at = at  # type: ignore[attr-defined]  # a state resolves its live launches once (AtDims.resolved)
        return launch

    # -- dims ------------------------------------------------------------------------------------------
    def at(self, inputs: Mapping[str, Any]) -> AtDims:
        g = self.g
        if inputs.keys() != g._input_names:
            missing, extra = sorted(g._input_names - set(inputs)), sorted(set(inputs) - g._input_names)
            raise ShapeError(f"graph {g.name!r} inputs: missing {missing}, unknown {extra}")
        shapes = [getattr(inputs[t.name], "shape", None) for t in g.inputs]
        if shapes == self.last[0]:  # the shapes of the last feeds (a session's run asks more than once)
            return self.last[1]
        try:  # the dims as the readers' axes give them: a known set whose every input shape these are needs no check
            st = self.states.get(tuple([shapes[i][a] for i, a in g.ranges.readers]))
        except (TypeError, IndexError):
            st = None
        if st is not None and st.in_shapes == shapes:
            self.states.move_to_end(st.dims)
            self.last = (shapes, st)
            return st
        dims = g.ranges.bind(g.inputs, shapes)  # checked against the ranges and the static axes
        st = self.states.get(dims)
        if st is not None:
            self.states.move_to_end(dims)
            self.last = (shapes, st)
            return st
        with g.ctx.lock:
            built = self.kernels_built
            st = self.states[dims] = self._at(dims)
            st.built = self.kernels_built != built
            while len(self.states) > MAX_STATES:
                self.states.popitem(last=False)
            g.ctx.stats["range_specializations"] += 1
        self.last = (shapes, st)
        return st

    def _at(self, dims: tuple[int, ...]) -> AtDims:
        g, r = self.g, self.g.ranges
        ext = r.extend(dims)  # (the derived dims too: the groups' masks name them)
        values = r.evaluate(ext)
        vals = values.tolist()
        ins, outs = [], []
        for infos, places, got in ((g.inputs, self.io_axes[0], ins), (g.outputs, self.io_axes[1], outs)):
            for t, axes in zip(infos, places, strict=True):
                if not axes:
                    got.append(t)
                    continue
                shape = list(t.shape)
                for axis, i in axes:
                    shape[axis] = vals[i]
                got.append(t.with_shape(tuple(shape)))
        steps: Mapping[int, Made] = _NO_STEPS
        largest = self.live_work
        gemv, parts, total = 0, [], self.static_total
        for k in self.live_big:  # live steps large at the upper bound: their work at these dims
            if largest is None:
                break
            ins_spec, outs_spec = self.live_spec[k]
            key = tuple([vals[i] for i in r._by_step[k]])
            work = step_work(_Step(g.compiled.steps[k].op, g.compiled.steps[k].attrs,
                                   [None if x is None else _shaped(x[0], x[1], key) for x in ins_spec],
                                   [_shaped(x[0], x[1], key) for x in outs_spec]))
            largest = None if work is None else max(largest, work)
            total += work or 0
        if self.live_small is not None:
            idx, bounds, view_at, step_at, works = self.live_small
            ratios = np.multiply.reduceat(values[idx] / bounds, view_at)  # per view: its elements / the bound's
            total += int(np.maximum.reduceat(ratios, step_at) @ works)
        for mask, members in self.groups_made.items():  # the steps that follow the same dims change together
            if not members:
                continue
            made = self._group(mask, members, ext, vals)
            parts.append(made[0])
            largest = None if largest is None or made[1] is None else max(largest, made[1])
            gemv = max(gemv, made[2])
            total += made[3]
        if len(parts) == 1:
            steps = parts[0]  # the group's own dict, shared by every state at its values (read only)
        elif parts:  # the groups' dicts merged, once per combination (so that states can share recordings)
            key = tuple(id(p) for p in parts)
            hit = self.merged.get(key)
            if hit is None or any(a is not b for a, b in zip(hit[0], parts, strict=True)):
                hit = self.merged[key] = (parts, {k: m for p in parts for k, m in p.items()})
                while len(self.merged) > PER_STEP:
                    self.merged.pop(next(iter(self.merged)))
            steps = hit[1]
        cap = None if largest is None or largest >= SMALL_WORK or splits(total, len(self.work)) else 1
        # a decoder's token without the native extension: its GEMMs are GEMVs on NumPy (small_rows), memory-bound,
        # faster on every idle core (768 x 2048: 157 us on one thread, 81 on two); OpenBLAS's threads then spin
        # ~0.1 s, so only when no large oneDNN kernel runs beside them (a prompt's oneDNN GEMMs keep BLAS at one
        # thread; an int4 prompt's dequantized tiles are BLAS GEMMs, Kernel.blas)
        blas = cap is None and gemv >= SMALL_WORK and self.static_work is not None and all(
            m.blas or m.work is not None and m.work < SMALL_WORK for m in steps.values()) and \
            self.static_work < SMALL_WORK
        st = AtDims(dims, ins, outs, steps, cap, blas)
        st.vals = vals
        st.internal = _Views(g, ins + outs)
        return st

    def _group(self, mask: int, members: list[tuple[int, list[int]]], dims: tuple[int, ...], vals: list[int]
               ) -> tuple[dict[int, Made], int | None, int, int]:
        """The steps whose integers follow exactly the dims in `mask`, at these dims (kept per their values),
        their largest work, the largest work of those run by BLAS, and their work together."""
        cache = self.group_cache[mask]
        key = tuple([d for j, d in enumerate(dims) if mask >> j & 1])
        hit = cache.get(key)
        if hit is not None:
            cache.move_to_end(key)
            return hit
        r = self.g.ranges
        steps: dict[int, Made] = {}
        largest: int | None = 0
        for k, idx in members:
            step_key = tuple([vals[i] for i in idx])
            per_step = self.cache[k]
            made = per_step.get(step_key)
            if made is None:
                made = per_step[step_key] = self._pure(k, step_key) if k in self.pure else \
                    self._make(k, [(r.entries[i][0], vals[i]) for i in idx])
                while len(per_step) > PER_STEP:
                    per_step.popitem(last=False)
            steps[k] = made
            if largest is not None:
                largest = None if made.work is None else max(largest, made.work)
        hit = cache[key] = (steps, largest, max((m.work or 0 for m in steps.values() if m.blas), default=0),
                            sum(m.work or 0 for m in steps.values()))
        while len(cache) > PER_STEP:
            cache.popitem(last=False)
        return hit

    def _make(self, k: int, changes: list[tuple[list[Any], int]], launch: bool = True) -> Made:
        """Step k at new values of its integers: its launch maker, or a kernel made for its shapes; its launch
        now when it touches no IO tensor."""
        g = self.g
        ctx, be = g.ctx, g.ctx.backend
        consts: dict[tuple[int, int], list[tuple[int, int]]] = {}
        step = _apply(g.compiled.steps[k], changes, consts, k)
        if step.outputs and all(0 in o.shape for o in step.outputs):
            return Made(None)
        made = Made(step)
        made.work = step_work(step)
        for (_, i), elements in consts.items():  # small integer constants that follow the dims
            ref = step.inputs[i]
            made.consts[i] = filled(ctx.host_weights[ref.key], elements).reshape(ref.shape)
        made.make = self.makers[k]
        if made.make is None:
            made.make = small_rows(step)
            made.blas = made.make is not None and native.library() is None  # NumPy's GEMV (else the native one)
        if made.make is None:
            weights = ctx.host_weights
            spec = NodeSpec(step.op, step.name, step.attrs,
                            [TensorSpec(r.shape, np.dtype(r.dtype)) if r else None for r in step.inputs],
                            [TensorSpec(r.shape, np.dtype(r.dtype)) for r in step.outputs],
                            [made.consts.get(i, weights[r.key]) if r is not None and r.space == CONST else None
                             for i, r in enumerate(step.inputs)], g.compiled.opset)
            late = RUN_TIME_CONSTS.get(step.op, frozenset())
            shapes = None
            if consts and {i for _, i in consts} <= late:  # a kernel made for these shapes serves every value
                shapes = (k, tuple(r.shape if r else None for r in [*step.inputs, *step.outputs, *step.scratch]),
                          tuple((i, made.consts[i].tobytes()) for i in sorted(made.consts) if i not in late))
                made.kernel = self.by_shape.get(shapes)
            if made.kernel is None:
                made.kernel, _ = select_kernel(be, spec, step.backend or None, step.params)
                ctx.stats["range_kernels_built"] += 1
                self.kernels_built += 1
                if shapes is not None:
                    self.by_shape[shapes] = made.kernel
                    if len(self.by_shape) > PER_STEP * 4:
                        self.by_shape.pop(next(iter(self.by_shape)))
        if made.kernel is not None:
            made.blas = bool(made.kernel.blas)
            planned = [ref.nbytes for ref in step.scratch]
            sizes = [int(n) for n in made.kernel.scratch]
            if len(sizes) == len(planned) and all(n <= p for n, p in zip(sizes, planned, strict=True)):
                made.scratch = [_view(g, ref) for ref in step.scratch]
            else:  # this shape's kernel needs other scratch than the upper bound's planned: its own
                for n in sizes:
                    buf = be.alloc_device(max(n, 1))
                    made.held.append(buf)
                    made.scratch.append(be.view(buf, 0, (n,), np.uint8))
                    ctx.stats["range_private_scratch_bytes"] += n
        if launch and k not in self.io_steps:
            made.launch = self._launch(made, lambda ref: _view(g, ref))
        return made

    def _pure(self, k: int, key: tuple[int, ...], launch: bool = True) -> Made:
        """Step k, whose integers are extents only, at these values: refs of the new shapes (the same places)
        and its maker's launch; no Step and no kernel are made (about 5 us)."""
        g = self.g
        step = g.compiled.steps[k]
        ins_spec, outs_spec = self.pure[k]
        ins = [None if x is None else _shaped(x[0], x[1], key) for x in ins_spec]
        outs = [_shaped(r, axes, key) for r, axes in outs_spec]
        if outs and all(0 in o.shape for o in outs):
            return Made(None)
        at = _Step(step.op, step.attrs, ins, outs)
        made = Made(at)  # type: ignore[arg-type]
        made.work = step_work(at)
        made.make = self.makers[k]
        if launch and k not in self.io_steps:
            made.launch = made.make(at, [None if r is None else _view(g, r) for r in ins],
                                    [_view(g, r) for r in outs])
        return made

    def _launch(self, made: Made, view: Any) -> Any:
        step = made.step
        ins = [None if r is None else made.consts[i] if i in made.consts else view(r)
               for i, r in enumerate(step.inputs)]
        outs = [view(r) for r in step.outputs]
        if made.make is not None:
            return made.make(step, ins, outs)
        return made.kernel.bind(ins, outs, made.scratch)

    # -- recording -------------------------------------------------------------------------------------
    def _record(self, st: AtDims, bound: tuple[MemHandle | None, ...]) -> None:
        g = self.g
        if all(h is None for h in bound):  # arrays fed and returned: the internal IO buffers, views at these dims
            views = st.internal  # (made as a launch or a copy first asks)
        else:
            views = {info.name: h.view if h is not None else st.internal[info.name]  # (made on first use)
                     for info, h in zip(st.inputs + st.outputs, bound, strict=True)}
            strided = {info.name for info, h in zip(st.inputs + st.outputs, bound, strict=True)
                       if h is not None and h.strides is not None}
            if strided:
                self._check_strided(strided)

        def view(r: Any) -> Any:
            if r.space in (ARENA, CONST):
                return _view(g, r)
            v = views[r.key]
            return v if v.shape == r.shape else in_place_reshape(v, r.shape)

        raw = views is st.internal
        if raw:
            hit = self.raw_lists.get(id(st.steps))
            if hit is not None and hit[0] is st.steps:  # the changed steps' launches on the internal buffers follow
                st.launches, st.kv, st.bound = hit[1], hit[2], bound  # their own integers: the list of another
                g.ctx.stats["recordings_reused"] += 1  # state with the same steps (a new past length) serves
                return
            launches = list(self._internal_base(view))  # unchanged steps' launches: the same at any dims
        else:
            makers = self.makers
            launches = [None if k in makers else g._launches[k] if k not in self.io_steps else
                        g._kernels[k].bind([view(r) if r else None for r in step.inputs],
                                           [view(r) for r in step.outputs], [view(r) for r in step.scratch])
                        for k, step in enumerate(g.compiled.steps)]
            for k, live in self.live.items():
                launches[k] = live
            by_step = g.ranges._by_step
            for k in self.live_raw.keys() - self.live.keys():  # live steps on bound handles: made for these dims
                vals = [st.vals[i] for i in by_step[k]]
                made = self._pure(k, tuple(vals), launch=False) if k in self.pure else \
                    self._make(k, [(self.g.ranges.entries[i][0], st.vals[i]) for i in by_step[k]], launch=False)
                launches[k] = _nothing if made.step is None else self._launch(made, view)
        for k, made in st.steps.items():
            if made.step is None:
                launches[k] = _nothing
            elif made.launch is not None:
                launches[k] = made.launch
            elif raw:  # on the internal IO buffers its views follow its own integers only: made once
                if made.raw is None:
                    made.raw = self._launch(made, view)
                launches[k] = made.raw
            else:
                launches[k] = self._launch(made, view)
        st.launches, st.bound = launches, bound
        # only a Concat's launch made for these views appends in place: on the internal buffers, this state's own
        kept = [launch for launch in ([launches[k] for k in st.steps] if raw else launches)
                if getattr(launch, "kept_bytes", 0)]
        st.kv = (sum(x.kept_bytes for x in kept), sum(x.appended_bytes for x in kept)) if kept else None
        if raw:
            self.raw_lists[id(st.steps)] = (st.steps, launches, st.kv)
            while len(self.raw_lists) > PER_STEP:
                self.raw_lists.pop(next(iter(self.raw_lists)))
        g.ctx.stats["recordings"] += 1

    def kernel_reading(self, names: set[str]) -> Step | None:
        """The first step whose kernel (not a launch maker, which takes any view) reads or writes one of these IO
        tensors: a kernel bound to addresses assumes C-contiguous tensors, not strided windows (Tensor.window)."""
        key = frozenset(names)  # the same windows at every token: looked up once
        if key not in self.kernels_reading:
            self.kernels_reading[key] = next(
                (step for k in sorted(self.io_steps) if self.makers.get(k) is None
                 for step in [self.g.compiled.steps[k]]
                 if any(r is not None and r.space in (INPUT, OUTPUT) and r.key in key
                        for r in step.inputs + step.outputs)), None)
        return self.kernels_reading[key]

    def _check_strided(self, names: set[str]) -> None:
        step = self.kernel_reading(names)
        if step is not None:
            raise RegistrationError(f"a strided window is bound to an IO tensor of step {step.name!r} "
                                    f"({step.op}), whose kernel needs a whole tensor; bind a whole tensor")

    def _internal_base(self, view: Any) -> list[Any]:
        """The launch list on the internal IO buffers with the changed steps left None (made once)."""
        if self.internal_io is None:
            g = self.g
            self.internal_io = [self.live_raw.get(k) if k in self.makers else g._launches[k]
                                if k not in self.io_steps else
                                g._kernels[k].bind([view(r) if r else None for r in step.inputs],
                                                   [view(r) for r in step.outputs], [view(r) for r in step.scratch])
                                for k, step in enumerate(g.compiled.steps)]
        return self.internal_io

    def _shared(self, st: AtDims) -> slots.Shared | None:
        """The shared list a run of `st` on arrays uses, its structs and launches in place (slots.py); None where
        the state runs its own list."""
        sh = st.shared
        if sh is None or sh is not False and sh[0] is not st.launches:
            sh = st.shared = self._share(st)
        if sh is False:
            return None
        _, shared, cur, block = sh
        self.cur = cur
        if shared.loaded is not block:  # another set's structs in the block (a run rewrites every feed field)
            np.copyto(shared.block, block)
            shared.loaded = block
        if shared.batched is None:  # a native slot left alone between Python launches: a batch of its own (its
            # Python call would make its launch at these dims, which predicted structs spare)
            shared.batched = [strided.Batch([x]) if x.__class__ is slots.NativeSlot else x
                              for x in batched(self.g.ctx.backend, shared.template, self.g._batches)]
        return shared

    def _share(self, st: AtDims) -> tuple[list[Any], slots.Shared, list[Any], np.ndarray] | bool:
        vals, recording = st.vals, st.launches
        shared = self.shared.get(id(recording))
        fits = not self.g.ranges.floors  # (the structs' polynomials are over the dims: a strided length is none)
        if shared is not None and shared.recording is recording and fits:
            got = shared.predicted(st.dims, vals)
            if got is not None:
                self.g.ctx.stats["range_structs_predicted"] += len(shared.fit.done)
                return recording, shared, *got
        cur = _at_dims(recording, vals)
        if shared is None or shared.recording is not recording:
            shared = slots.share(self, recording, cur)
            if shared is None:
                return False
            self.shared[id(recording)] = shared
            self.g.ctx.stats["range_shared_lists"] += 1
            while len(self.shared) > PER_STEP:
                self.shared.pop(next(iter(self.shared)))
        block = shared.state_block(cur)
        if block is None:
            return False
        if fits and not shared.samples and not st.steps:  # (every changed step live: all sizes share it)
            self._learn_ahead(shared, recording, st.dims)
        if fits:
            shared.learn(st.dims, block)
        return recording, shared, cur, block

    def _learn_ahead(self, shared: slots.Shared, recording: list[Any], dims: tuple[int, ...]) -> None:
        """A new shared list of a program with one ranged dim (a batch loop) whose changed steps are all live (one
        recording for every size) learns its structs' polynomials now, from the slots' launches at the next values
        of that dim: the sizes a loop meets next are predicted from the first (MobileNetV3's batch cycle 1..12:
        sizes 2-5 made their launches, ~0.35 ms each of 33 steps, before any was predicted). Where a size has
        kernels of its own (a recording of its own, never shared: PP-OCR's recognizer, a new size 77 -> 35 ms
        without it), and in a program of several ranged dims (a decoder's past and sequence), the fit is learnt from
        the sets run, whose varying dims are the ones it needs."""
        ranged = [j for j, (_, lo, hi) in enumerate(self.g.ranges.dims) if hi > lo]
        if len(ranged) != 1:
            return
        j, (_, lo, hi) = ranged[0], self.g.ranges.dims[ranged[0]]
        first = max(lo, slots.FIT_FROM)
        values = [v for v in range(first, min(hi, first + slots.FIT_SAMPLES) + 1) if v != dims[j]]
        for v in values[:slots.FIT_SAMPLES]:
            at = dims[:j] + (v,) + dims[j + 1:]
            block = shared.state_block(_at_dims(recording, self.g.ranges.evaluate(at).tolist()))
            if block is None:
                return
            shared.learn(at, block)

    def _plan(self, st: AtDims, launches: list[Any], shared: slots.Shared | None) -> feeds.Plan | None:
        """The feeds a run of the batched list `launches` reads in place, at the run's thread key (made once per
        state; a shared list's, made once and rebased on each state's structs)."""
        if st.plans[0] is not launches:
            st.plans = (launches, {})
        key = (threads.openmp_now(), threads.idle_now())
        if key not in st.plans[1]:
            ins, outs = [t.name for t in st.inputs], [t.name for t in st.outputs]
            if shared is None:
                self._unbind()  # (planned on the calls' pointers as the buffers')
                got = feeds.plan(_at_dims(st.launches, st.vals), launches, key, st.internal, ins, outs, self.users)
            else:
                if key in shared.plans:
                    got = shared.plans[key]
                else:  # made on this state's structs (in the list's block now)
                    self._unbind()
                    got = feeds.plan(shared.template, launches, key, st.internal, ins, outs, self.users)
                    got = got and got.on_block(shared.block)
                    if not any(0 in t.shape for t in st.inputs + st.outputs):  # (an empty one has no fields)
                        shared.plans[key] = got
                got = got and got.rebased(st.shared[3].view(np.int64))
            st.plans[1][key] = got
        return st.plans[1][key]

    def _placed(self, st: AtDims, launches: list[Any], shared: slots.Shared | None) -> feeds.Plan | None:
        """`_plan`, the plan bound last put back on the buffers first where it is another's (not the same shared
        list's at other dims: the new one's bind sets every field the last one did)."""
        got = self._plan(st, launches, shared)
        last = self.bound_plan
        if last is not None and last is not got and not (got is not None and got.fields is last.fields
                                                          and got.blk is last.blk):
            last.restore()
        self.bound_plan = got
        return got

    def _unbind(self) -> None:
        """The calls the last run on arrays pointed at its arrays back on the buffers."""
        if self.bound_plan is not None:
            self.bound_plan.restore()
            self.bound_plan = None

    # -- running ---------------------------------------------------------------------------------------
    def execute(self, inputs: Mapping[str, Any], outputs: Mapping[str, Any] | None, fresh_outputs: bool = False
                ) -> Mapping[str, tuple[int, ...]]:
        g = self.g
        ctx = g.ctx
        st = self.at(inputs)
        outputs = outputs or {}
        g._check_io(st.inputs, st.outputs, inputs, outputs)
        with ctx.lock:
            if not same_binding(st.bound, st.inputs, st.outputs, inputs, outputs):
                bound = binding(st.inputs, st.outputs, inputs, outputs)
                hit = st.recordings.get(bound)
                if hit is not None and all(h is None or h.registered for h in bound):
                    (st.launches, st.kv), st.bound = hit, bound
                    st.recordings.move_to_end(bound)
                else:
                    g._check_overlap(bound)
                    self._record(st, bound)
                    st.recordings[bound] = (st.launches, st.kv)
                    while len(st.recordings) > RECORDINGS:
                        st.recordings.popitem(last=False)
            self.vals = st.vals  # what the live launches read
            raw = all(h is None for h in st.bound)
            shared = self._shared(st) if raw else None
            if shared is not None:
                launches = shared.batched
                ctx.stats["range_shared_runs"] += 1
            else:
                resolved = st.resolved
                if resolved is None or resolved[0] is not st.launches:
                    resolved = st.resolved = [st.launches, _at_dims(st.launches, st.vals), 0]
                resolved[2] += 1
                if resolved[2] == (1 if st.built else BATCH_AT[len(self.states) > FEW_STATES]):
                    resolved[1] = batched(ctx.backend, resolved[1], g._batches)
                launches = resolved[1]
            place = None
            if raw:  # on arrays: feeds its batches read in place are not copied
                place = lambda: self._placed(st, launches, shared)  # noqa: E731
            else:  # on handles: the calls on the buffers
                self._unbind()
            run_recorded(ctx, inputs, outputs, st.inputs, st.outputs, st.internal, launches, st.cap, st.blas,
                         place, fresh_outputs)
            if st.kv is not None:  # a KV cache appended in place: what its Concats did not copy, and did
                ctx.stats["kv_bytes_kept_in_place"] += st.kv[0]
                ctx.stats["kv_bytes_appended"] += st.kv[1]
            if not self.extents:
                return _NO_SHAPES
            shapes = {}
            for index, axis, size in self.extents:  # the real shapes: the leading part of the bounded axis
                info = st.outputs[index]
                shapes[info.name] = info.shape[:axis] + (int(size),) + info.shape[axis + 1:]
            return shapes


# The run of a set of dims (and recording) from which its launches are batched (CpuBackend.batch): the second
# while the program holds at most FEW_STATES sets (a batch loop: a few shapes, each met again soon; MobileNetV3's
# batch sizes 1..12 cycled: 0.74 -> 0.67 ms a call, A/B), else the third: a GPT-2 token's ~10 batches at new dims cost
# ~0.4 ms to list, more than they save in one run, and a generation meets each past length once per generation
# (its second generation would list at every token). The first where kernels were built for the dims (AtDims.built:
# a batch size's convs, milliseconds of oneDNN primitives): listing is a small part of that run, and the next runs
# at those dims are all fast (MobileNetV3's second cycle of batch sizes 0.5-0.9 -> 0.3-0.8 ms a call).
BATCH_AT = (2, 3)
FEW_STATES = 16


def batched(backend: Any, launches: list[Any], cache: dict[Any, Any]) -> list[Any]:
    """The list a run replays for these launches: merged by the backend where it can (`batch`, serving runs it
    merged before from `cache`), else as they are."""
    batch = getattr(backend, "batch", None)
    return list(launches) if batch is None else batch(launches, cache)


def run_recorded(ctx: Any, inputs: Mapping[str, Any], outputs: Mapping[str, Any], ins: list[TensorInfo],
                 outs: list[TensorInfo], internal: Mapping[str, Any], launches: list[Any], cap: int | None,
                 blas: bool = False, place: Any = None, fresh_outputs: bool = False) -> None:
    """One run of recorded launches (under the context's lock): array feeds copied into their internal IO
    buffers, the launches on the context's threads (`cap`: the program's thread cap; `blas`: its large kernels
    are BLAS calls, which then get the threads), array outputs copied out. `place()`: the feeds.Plan of a list
    run on arrays (feeds it reads and outputs it writes in place, not copied), or None; outputs only where
    `fresh_outputs` (arrays the caller made for this run: written in place, they cannot overlap a feed)."""
    backend, stats = ctx.backend, ctx.stats
    pool = ctx.threads
    pool.cap, pool.blas = cap, blas
    placed: list[bool] | None = None  # per IO tensor (inputs, then outputs): its caller's array used in place
    with pool:
        plan = place() if place is not None else None
        if plan is not None:
            placed = plan.bind(inputs, outputs if fresh_outputs else _NO_OUTPUTS)
        skipped = []
        for i, info in enumerate(ins):
            v = inputs[info.name]
            if placed is not None and placed[i]:
                skipped.append(info.name)
                continue
            if not isinstance(v, MemHandle):
                dst = internal[info.name]
                backend.copy_in(dst, v)
                stats["copies_in"] += 1
                stats["bytes_in"] += dst.nbytes
        written = [o.name for o, p in zip(outs, placed[len(ins):], strict=True) if p] if placed is not None else []
        if skipped or written:
            stats["feeds_read_in_place"] += len(skipped)
            stats["outputs_written_in_place"] += len(written)
            fell: list[bool] = []

            def prepare() -> None:  # the rest of a batch runs through NumPy, on the program's buffers: the rest
                for n in skipped:  # of the run on them too
                    backend.copy_in(internal[n], inputs[n])
                for n in written:  # what the native calls wrote so far, where NumPy goes on from
                    backend.copy_in(internal[n], outputs[n])
                plan.restore()
                fell.append(True)
            strided.FALLBACK.prepare = prepare
            try:
                backend.run(launches)
            finally:
                strided.FALLBACK.prepare = None
            if fell:
                placed = None  # every output copied out of the buffers
        else:
            backend.run(launches)
    for k, info in enumerate(outs):
        if placed is not None and placed[len(ins) + k]:
            continue  # written in place
        v = outputs.get(info.name)
        if v is not None and not isinstance(v, MemHandle):
            src = internal[info.name]
            backend.copy_out(v, src)
            stats["copies_out"] += 1
            stats["bytes_out"] += src.nbytes
    stats["runs"] += 1


def binding(ins: list[TensorInfo], outs: list[TensorInfo], inputs: Mapping[str, Any], outputs: Mapping[str, Any]
            ) -> tuple[MemHandle | None, ...]:
    """Per IO tensor, the handle bound to it (None: an array, through the internal buffer)."""
    bound = tuple(v if isinstance(v, MemHandle) else None for v in
                  [inputs[i.name] for i in ins] + [outputs.get(o.name) for o in outs])
    for h in bound:
        if h is not None and not h.registered:  # deregistered by another thread meanwhile
            raise RegistrationError("memory handle was deregistered")
    return bound


def same_binding(bound: tuple[Any, ...] | None, ins: list[TensorInfo], outs: list[TensorInfo],
                 inputs: Mapping[str, Any], outputs: Mapping[str, Any]) -> bool:
    """True when launches recorded for `bound` (a handle, or None for the internal buffer, per IO tensor) serve
    exactly these feeds and outputs. Allocates nothing."""
    if bound is None:
        return False
    k = 0
    for info in ins:
        v = inputs[info.name]
        if (v if isinstance(v, MemHandle) else None) is not bound[k]:
            return False
        k += 1
    for info in outs:
        v = outputs.get(info.name)
        if (v if isinstance(v, MemHandle) else None) is not bound[k]:
            return False
        k += 1
    return True


def _any_shape(kernel: Any, scratch: list[Any] | None = None) -> Make:
    """The launch maker of a kernel that binds arrays of any shape (`any_shape`), on `scratch` (the upper bound's,
    where its need grows with the shapes: `scratch_grows`): its step is live."""
    bind, pad = kernel.bind, scratch or []

    def make(step: Any, ins: list[Any], outs: list[Any]) -> Any:
        return bind(ins, outs, pad)
    return make


def _view(g: Graph, r: Any) -> Any:
    """The tensor an arena or constant ref names (constants as kernels read them)."""
    if r.space == ARENA:
        buf, base = g.ctx.arena
        # the CPU backend's view, made directly (numpy checks the bounds): the hot path of a new set of dims
        return np.ndarray(r.shape, r.dtype, buf.array, base + r.offset)
    return dtypes.as_ref(g._weights[r.key], r.shape, r.dtype)


class _Step:
    """A step at some dims as a launch maker reads it (op, attributes, refs): cheaper than a Step."""

    __slots__ = ("op", "attrs", "inputs", "outputs")

    def __init__(self, op: str, attrs: dict[str, Any], inputs: list[Any], outputs: list[Any]) -> None:
        self.op, self.attrs, self.inputs, self.outputs = op, attrs, inputs, outputs


class _Ref:
    """A ref at some dims: the upper bound's place, another shape."""

    __slots__ = ("space", "key", "offset", "shape", "dtype")

    def __init__(self, r: Any, shape: tuple[int, ...]) -> None:
        self.space, self.key, self.offset, self.dtype, self.shape = r.space, r.key, r.offset, r.dtype, shape


def _shaped(r: Any, axes: Any, key: tuple[int, ...]) -> Any:
    if not axes:
        return r
    shape = list(r.shape)
    for axis, j in axes:
        shape[axis] = key[j]
    return _Ref(r, tuple(shape))
