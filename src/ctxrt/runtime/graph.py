"""An executable graph: kernels built once, launches recorded against fixed views, replayed per run."""

from __future__ import annotations

from collections import ChainMap, OrderedDict
from collections.abc import Mapping
from dataclasses import replace
from types import MappingProxyType, SimpleNamespace
from typing import TYPE_CHECKING, Any

import numpy as np

from ctxrt import dtypes
from ctxrt.backends import select_kernel
from ctxrt.backends.kernel import Kernel, Launch, NodeSpec, TensorSpec, check_indices, leads
from ctxrt.compiler.program import ARENA, CONST, INPUT, OUTPUT, CompiledGraph, Ref, Step, TensorInfo
from ctxrt.compiler.ranges import filled
from ctxrt.errors import FormatError, LifecycleError, RegistrationError, ShapeError
from ctxrt.runtime.extents import AtDims, ExtentRunner, batched, binding, run_recorded, same_binding
from ctxrt.runtime.memhandle import MemHandle
from ctxrt.runtime.partition import HostSteps
from ctxrt.runtime.work import SMALL_WORK, blas_run, splits, step_work, thread_cap

if TYPE_CHECKING:
    from ctxrt.runtime.context import Context


# op -> (input, output) positions the op's kernel updates in place when both are bound to one buffer:
# GroupQueryAttention's past and present key and value (onnxruntime-genai's past_present_share_buffer)
IN_PLACE = {"com.microsoft.GroupQueryAttention": ((3, 1), (4, 2))}


def in_place_pairs(steps: list[Any]) -> frozenset[tuple[str, str]]:
    """(graph output, graph input) pairs that may be one buffer: an IN_PLACE op reads the input (and nothing
    else does) and writes the output."""
    readers: dict[str, int] = {}
    for step in steps:
        for r in step.inputs:
            if r is not None and r.space == INPUT:
                readers[r.key] = readers.get(r.key, 0) + 1
    pairs = set()
    for step in steps:
        for i, o in IN_PLACE.get(step.op, ()):
            src = step.inputs[i] if i < len(step.inputs) else None
            dst = step.outputs[o] if o < len(step.outputs) else None
            if src is not None and dst is not None and src.space == INPUT and dst.space == OUTPUT \
                    and readers[src.key] == 1:
                pairs.add((dst.key, src.key))
    return frozenset(pairs)


def append_pairs(steps: list[Any]) -> dict[tuple[str, str], int]:
    """(graph output, graph input) -> axis for each Concat that makes an output from an input and new rows along
    an axis (a decoder's present from its past): bound as windows of one tensor (`Tensor.window`), the input
    the output's leading rows, the Concat writes only the new ones (backends/cpu/extents.py)."""
    pairs = {}
    for step in steps:
        if step.op != "Concat" or not step.inputs or not step.outputs:
            continue
        src, dst = step.inputs[0], step.outputs[0]
        if src is not None and src.space == INPUT and dst.space == OUTPUT and len(dst.shape):
            pairs[(dst.key, src.key)] = int(step.attrs.get("axis", 0)) % len(dst.shape)
    return pairs


class Graph:
    """One program of a context. Use `run(feeds)` or `execute(inputs, outputs)`."""

    def __init__(self, ctx: Context, compiled: CompiledGraph, cap: int | None | bool = False) -> None:
        self.ctx = ctx
        self.compiled = compiled
        self.name = compiled.name
        self.inputs: list[TensorInfo] = compiled.inputs
        self.outputs: list[TensorInfo] = compiled.outputs
        self._info = {t.name: t for t in self.inputs + self.outputs}
        self._input_names = {t.name for t in self.inputs}
        self._output_names = {t.name for t in self.outputs}
        self._kernels: list[Kernel] = []
        self._launches: list[Launch | None] = []
        self._plan: list[Launch] = []  # what a run replays: the launches as the backend batches them
        self._batches: dict[Any, Any] = {}  # the backend's merged runs of launches, by their launches
        self._views: dict[str, Any] = {}  # IO name -> the tensor the IO launches are bound to
        self._internal: dict[str, Any] = {}  # IO name -> internal IO buffer view (raw runs)
        self._bound: tuple[MemHandle | None, ...] | None = None  # IO bindings the launches are recorded for
        self._io_order: list[str] = []
        self._io_steps: list[int] = []
        self._io_step_set: set[int] = set()
        self._host_weights: Mapping[str, np.ndarray] | None = None  # what its kernels were built with
        self._host: HostSteps | None = None  # steps on the backend's fallback (CPU partitions), if any
        # Value inputs (docs/shapes-and-control-flow.md): (name, the value compiled for); bounded outputs: (name, axis,
        # size view).
        self.value_inputs: dict[str, np.ndarray] = dict(compiled.value_inputs)
        self._values = [(t, compiled.value_inputs[t.name]) for t in self.inputs if t.name in compiled.value_inputs]
        # a device backend's gathers and scatters whose indices are graph inputs: checked on the host (`_indexed`)
        self._index_checks: list[tuple[str, Any, Any]] | None = None
        self._extents: list[tuple[TensorInfo, int, Any]] = []
        # 1 when every kernel is small: one thread, no barrier per kernel (runtime/work.py); None: the idle cores
        self.thread_cap: int | None = thread_cap(compiled.steps) if cap is False else cap
        self._view: Any = None  # Ref -> the backend's tensor, made at _prepare
        # A range program (compiler/ranges.py): one child graph per set of dim values met lately, sharing this
        # graph's arena, weights, unchanged kernels and IO buffers. `_io_places`: IO name -> (buffer, offset).
        self.ranges = compiled.ranges
        self._children: OrderedDict[tuple[int, ...], Graph] = OrderedDict()
        self._io_places: dict[str, tuple[Any, int]] = {}
        self._parent: Graph | None = None
        self.dims: tuple[int, ...] = ()  # a range program's child: the dim values it runs
        self._held: list[Any] = []  # a child's buffers of varying integer constants and private scratch
        self._private: dict[str, Any] = {}  # a child's private scratch views by key
        # A range program's kernels (and IO-free launches) of changed steps, by (step, its integers' values): a
        # decoder's token steps differ from each other in a few attention steps only.
        self._step_cache: dict[int, OrderedDict[tuple[int, ...], tuple[Step, Kernel, Launch | None]]] = {}
        self._steps_made: dict[tuple[int, tuple[int, ...]], Step] = {}
        self._work: list[int | None] | None = None  # a range program's per-step work at the upper bound
        self._work_made: dict[tuple[int, tuple[int, ...]], int | None] = {}  # and of its changed steps, by values
        # A range program whose changed steps all take run-time extents runs every set of dims from one launch list
        # (runtime/extents.py) instead of child graphs.
        self._extent: ExtentRunner | None = None
        self._weights: Mapping[str, Any] = {}

    @property
    def spillfill_size(self) -> int:
        return self.compiled.spillfill_size

    @property
    def lower_bound(self) -> int:
        return self.compiled.lower_bound

    @property
    def partitions(self) -> list[dict[str, Any]]:
        """Runs of consecutive steps on one backend (`{backend, steps, ops}`): which nodes run where."""
        return self.compiled.partitions()

    @property
    def programs(self) -> list[Any]:
        """The device programs this graph's kernels need (built once, at finalize)."""
        return list(dict.fromkeys(p for k in self._kernels for p in k.programs))

    # -- preparation (at finalize) -------------------------------------------------------------
    def _build_kernels(self, weights: Mapping[str, np.ndarray], reuse: Mapping[int, Kernel] | None = None) -> None:
        """Instantiate every step's kernel on the backend the step was compiled for; `weights` are host arrays.
        `reuse`: kernels already built for some steps (by index; a range program's unchanged steps)."""
        backend = self.ctx.backend
        self._kernels = []
        self._host_weights = weights
        for k, step in enumerate(self.compiled.steps):
            if reuse and k in reuse:
                self._kernels.append(reuse[k])
                continue
            spec = NodeSpec(step.op, step.name, step.attrs,
                            [TensorSpec(r.shape, np.dtype(r.dtype)) if r else None for r in step.inputs],
                            [TensorSpec(r.shape, np.dtype(r.dtype)) for r in step.outputs],
                            [weights[r.key] if r is not None and r.space == CONST else None
                             for r in step.inputs],
                            self.compiled.opset)
            kernel, _ = select_kernel(backend, spec, step.backend or None, step.params)
            planned = [r.nbytes for r in step.scratch]
            fits = len(kernel.scratch) == len(planned) and all(n <= p for n, p in zip(kernel.scratch, planned,
                                                                                      strict=True))
            if not fits and self._parent is not None:  # a range program's kernel at another shape: its own scratch
                self.compiled.steps[k] = step = self._private_scratch(step, kernel.scratch)
                fits = True
            if not fits:
                raise FormatError(f"graph {self.name!r}, node {step.name!r} ({step.op}): its kernel needs scratch "
                                  f"{list(kernel.scratch)} bytes but the program plans {planned}: the context was "
                                  "compiled by another version of ctxrt's kernels, or on a CPU with another core "
                                  "count (oneDNN sizes some scratchpads by it); compile it again")
            self._kernels.append(kernel)
        self._blas = blas_run(self.compiled.steps, self._kernels)  # its runs give BLAS the threads

    def _private_scratch(self, step: Step, sizes: tuple[int, ...]) -> Step:
        """The step with scratch buffers of its own (kernel-private bytes): where a range program's kernel at this
        shape needs other scratch than the upper bound's kernel planned."""
        refs = []
        for j, n in enumerate(sizes):
            key = f"{step.name}#private{j}"
            buf = self.ctx.backend.alloc_device(max(int(n), 1))
            self._held.append(buf)
            self._private[key] = self.ctx.backend.view(buf, 0, (int(n),), np.uint8)
            self.ctx.stats["range_private_scratch_bytes"] += int(n)
            refs.append(Ref("private", key, 0, (int(n),), "|u1"))
        return replace(step, scratch=refs)

    def _prepare(self, arena: tuple[Any, int], internal: Mapping[str, Any], weights: Mapping[str, Any],
                 reuse: Mapping[int, Launch] | None = None) -> None:
        """Bind every launch that touches no IO tensor now; IO launches are bound per set of IO bindings
        (at once when every IO tensor has an internal buffer, else at the first execute). `reuse`: launches
        already bound (by step index) to the same views."""
        backend = self.ctx.backend
        arena_buf, base = arena

        def view(r: Ref) -> Any:
            if r.space == ARENA:
                return backend.view(arena_buf, base + r.offset, r.shape, r.dtype)
            if r.space == "private":
                return self._private[r.key]
            if r.space == CONST:  # a 4-bit weight stays packed: its kernel unpacks it
                return dtypes.as_ref(weights[r.key], r.shape, r.dtype)
            return self._views[r.key].reshape(r.shape)

        self._view = view
        self._weights = weights
        self._extents = [(self._info[name], axis, self._host_scalar(view(r)))
                         for name, (axis, r) in self.compiled.extents.items()]
        self._internal = dict(internal)
        host = [s.backend not in ("", backend.name) for s in self.compiled.steps]
        self._host = HostSteps(self.ctx, self.compiled.steps, host, self._host_weights) if any(host) else None
        self._io_order = [t.name for t in self.inputs + self.outputs]
        self._in_place = in_place_pairs(self.compiled.steps)
        self._append = append_pairs(self.compiled.steps)
        self._io_steps = [k for k, step in enumerate(self.compiled.steps)
                          if any(r is not None and r.space in (INPUT, OUTPUT) for r in step.inputs + step.outputs)]
        io_steps = self._io_step_set = set(self._io_steps)
        reuse = reuse or {}
        self._launches = [None if k in io_steps else reuse[k] if k in reuse else self._bind_step(k)
                          for k in range(len(self.compiled.steps))]
        self._bound = None
        if all(name in self._internal for name in self._io_order):
            self._record((None,) * len(self._io_order))
        if self.ranges is not None and self._parent is None:
            self._extent = ExtentRunner.build(self)

    def _host_scalar(self, tensor: Any) -> tuple[Any, np.ndarray, bool]:
        """(tensor, a host array holding its value after a run, whether that needs a copy): a zero-copy host view
        where the backend has one, else a host array the value is copied into."""
        host = self.ctx.backend.host_view(tensor)
        return (tensor, host, False) if host is not None else (tensor, np.zeros(tensor.shape, tensor.dtype), True)

    def _bind_step(self, k: int) -> Launch:
        if self._host is not None and self._host.runs(k):
            return self._host.bind(k, self._kernels[k], self._view)
        step, view = self.compiled.steps[k], self._view
        return self._kernels[k].bind([view(r) if r else None for r in step.inputs], [view(r) for r in step.outputs],
                                     [view(r) for r in step.scratch])

    def _record(self, bound: tuple[MemHandle | None, ...]) -> None:
        """Re-bind the launches that read or write IO tensors to `bound` (a handle, or None for the internal
        buffer, per IO tensor); the rest of the launch list is kept."""
        ctx = self.ctx
        self._check_overlap(bound)
        for name, h in zip(self._io_order, bound, strict=True):
            if h is None and name not in self._internal:  # prepared as memhandle, now run raw
                info = self._info[name]
                buf, off = self._parent._io_place(name) if self._parent is not None else self._io_place(name)
                self._internal[name] = ctx.backend.view(buf, off, info.shape, info.dtype)
        self._views = {name: (h.view if h is not None else self._internal[name])
                       for name, h in zip(self._io_order, bound, strict=True)}
        old = {id(self._launches[k]) for k in self._io_steps}
        for k in self._io_steps:
            self._launches[k] = self._bind_step(k)
        # the batches of the launches replaced are never met again: dropped (they hold the views bound before)
        self._batches = {key: b for key, b in self._batches.items() if old.isdisjoint(key)}
        self._plan = batched(ctx.backend, self._launches, self._batches)
        self._bound = bound
        ctx.stats["recordings"] += 1
        if self._parent is None and ctx.finalized:  # a range program's children share its kernels: counted once,
            ctx._count_kernel_bytes()  # by the parent; IO launches bound anew may hold constants of their own
            # (while the context is being finalized, `finalize` counts them once, after every graph's first record)

    def _io_place(self, name: str) -> tuple[Any, int]:
        """(buffer, offset) of an IO tensor's internal buffer, allocated now (at the upper bound of a range
        program, so every child graph uses the same bytes) when it has none yet."""
        if name not in self._io_places:
            ctx = self.ctx
            self._io_places[name] = (ctx._alloc(self._info[name].nbytes, "io"), 0)
            ctx.stats["lazy_allocs"] += 1
        return self._io_places[name]

    # -- range programs ------------------------------------------------------------------------------
    MAX_CHILDREN = 16  # sets of dim values whose kernels and launches a range program keeps

    def _child(self, inputs: Mapping[str, Any]) -> Graph | AtDims:
        """The graph for the dim values of these feeds (made on first need, least recently used dropped); with
        run-time extents, the program at those dims (`inputs`, `outputs`, `dims`)."""
        if self._extent is not None:
            return self._extent.at(inputs)
        if inputs.keys() != self._input_names:
            missing, extra = sorted(self._input_names - set(inputs)), sorted(set(inputs) - self._input_names)
            raise ShapeError(f"graph {self.name!r} inputs: missing {missing}, unknown {extra}")
        dims = self.ranges.bind(self.inputs, [getattr(inputs[t.name], "shape", None) for t in self.inputs])
        child = self._children.get(dims)
        if child is not None:
            self._children.move_to_end(dims)
            return child
        with self.ctx.lock:
            child = self._specialize(dims)
            self._children[dims] = child
            while len(self._children) > self.MAX_CHILDREN:
                self._children.popitem(last=False)[1]._release()
        return child

    def _specialize(self, dims: tuple[int, ...]) -> Graph:
        ctx, be = self.ctx, self.ctx.backend
        compiled, origin, keys, consts = self.ranges.specialize(self.compiled, dims, self._steps_made)
        host, device, held = {}, {}, []
        if consts:  # small integer constants that follow the dims (Range limits, Trilu's k, ...)
            where = {k: c for c, k in enumerate(origin)}
            for (k, i), elements in consts.items():
                if k not in where:
                    continue
                step = compiled.steps[where[k]]
                ref = step.inputs[i]
                base = ref.key.split("@", 1)[0]  # a step made for other dims names its constant base@dims
                array = filled(ctx.host_weights[base], elements)
                key = f"{base}@{'x'.join(map(str, dims))}"
                buf = be.alloc_device(max(array.nbytes, 1))
                tensor = be.view(buf, 0, array.shape, array.dtype)
                be.copy_in(tensor, array)
                held.append(buf)
                host[key], device[key] = array, tensor
                compiled.steps[where[k]] = replace(step, inputs=[replace(r, key=key) if c == i else r
                                                                 for c, r in enumerate(step.inputs)])
        # Its thread cap from the upper bound's per-step work where a step did not change (a kernel's work at the
        # upper bound bounds it anywhere in the ranges) and from the changed steps' own.
        if self._work is None:
            self._work = [step_work(s) for s in self.compiled.steps]
        made = self._work_made
        work = []
        for c, k in enumerate(origin):
            if k not in keys:
                work.append(self._work[k])
                continue
            w = made.get((k, keys[k]), made)
            if w is made:
                if len(made) > 4096:
                    made.clear()
                w = made[(k, keys[k])] = step_work(compiled.steps[c])
            work.append(w)
        cap = None if any(w is None for w in work) or max(work, default=0) >= SMALL_WORK or \
            splits(sum(work), len(work)) else 1
        child = Graph(ctx, compiled, cap)
        child._parent, child._held, child.dims = self, held, dims
        kernels: dict[int, Kernel] = {}
        launches: dict[int, Launch] = {}
        for c, k in enumerate(origin):
            if k not in keys:  # unchanged: the upper bound's kernel and launch
                kernels[c] = self._kernels[k]
                if self._launches[k] is not None:
                    launches[c] = self._launches[k]
                continue
            hit = self._step_cache.get(k, {}).get(keys[k])
            if hit is not None:
                kernels[c] = hit[1]
                if hit[2] is not None:
                    launches[c] = hit[2]
        child._build_kernels(ChainMap(host, ctx.host_weights), kernels)
        if be.programs is not None:
            be.programs.prepare(dict.fromkeys(p for kern in child._kernels for p in kern.programs), ctx.stats)
        internal = {name: be.view(*self._io_places[name], info.shape, info.dtype)
                    for name, info in child._info.items() if name in self._io_places}
        child._prepare(ctx.arena, internal, ChainMap(device, ctx.weights), launches)
        for c, k in enumerate(origin):
            if k in keys:
                cache = self._step_cache.setdefault(k, OrderedDict())
                step = compiled.steps[c]
                if (k, keys[k]) not in self._steps_made:  # the step before its constants were renamed
                    self._steps_made[(k, keys[k])] = step
                cache[keys[k]] = (step, child._kernels[c], child._launches[c])
                cache.move_to_end(keys[k])
                while len(cache) > self.MAX_CHILDREN:
                    self._steps_made.pop((k, cache.popitem(last=False)[0]), None)
        ctx.stats["range_specializations"] += 1
        ctx.stats["range_kernels_built"] += len(compiled.steps) - len(kernels)
        return child

    def _check_overlap(self, bound: tuple[MemHandle | None, ...]) -> None:
        """An output handle may not share bytes with any other IO handle: kernels would read what they
        already overwrote. (Inputs may overlap each other: they are only read.) The exception: an input and an
        output that one kernel updates in place (`in_place_pairs`) may be exactly the same bytes."""
        n_in = len(self.inputs)
        for k, out in enumerate(bound[n_in:], n_in):
            if out is None:
                continue
            for j, other in enumerate(bound):
                if j == k or other is None or other.buffer is not out.buffer:
                    continue
                pair = (self._io_order[k], self._io_order[j])
                if pair in self._in_place and other.offset == out.offset and other.nbytes == out.nbytes:
                    continue
                if pair in self._append and j < n_in and leads(other.view, out.view, self._append[pair]):
                    continue  # the past the present's leading rows: its Concat appends in place
                lo, hi = max(other.offset, out.offset), min(other.offset + other.span, out.offset + out.span)
                if other is out or lo < hi:
                    raise RegistrationError(f"output {self._io_order[k]!r} and {self._io_order[j]!r} are bound to "
                                            "overlapping bytes of one shared buffer")

    # -- running ---------------------------------------------------------------------------------
    def _check_io(self, ins: list[TensorInfo], outs: list[TensorInfo], inputs: Mapping[str, Any],
                  outputs: Mapping[str, Any]) -> None:
        """Every feed, and every output given, of the IO shapes `ins` and `outs` (a range program's at its dims)."""
        if not outputs.keys() <= self._output_names:
            raise ShapeError(f"graph {self.name!r} has no outputs {sorted(set(outputs) - self._output_names)}")
        for info in ins:
            self._check_feed(info, inputs[info.name], "input")
        for info in outs:
            if info.name in outputs:
                self._check_feed(info, outputs[info.name], "output")

    def _check_feed(self, info: TensorInfo, array: Any, role: str) -> None:
        if array.__class__ is np.ndarray and array.shape == info.shape and array.dtype == dtypes.dtype_of(info.dtype):
            return  # the common case first: an array of the right shape and type
        if isinstance(array, MemHandle):
            h = array
            if h.context is not self.ctx:
                raise RegistrationError(f"{role} {info.name!r}: memory handle belongs to another context")
            if not h.registered:
                raise RegistrationError(f"{role} {info.name!r}: memory handle was deregistered")
            if h.shape != info.shape or h.dtype != np.dtype(info.dtype):
                raise ShapeError(f"{role} {info.name!r} expects {np.dtype(info.dtype)}{list(info.shape)}, "
                                 f"memory handle is {h.dtype}{list(h.shape)}")
            if h.strides is not None and self._extent is None:
                raise RegistrationError(f"{role} {info.name!r}: a strided window is taken by a range program on the "
                                        "cpu backend only (its kernels read views); bind a whole tensor")
            return
        if not isinstance(array, np.ndarray):
            raise ShapeError(f"{role} {info.name!r} must be a numpy.ndarray or a MemHandle, "
                             f"got {type(array).__name__}")
        if array.shape != info.shape or array.dtype != np.dtype(info.dtype):
            raise ShapeError(f"{role} {info.name!r} expects {np.dtype(info.dtype)}{list(info.shape)}, "
                             f"got {array.dtype}{list(array.shape)}")

    def execute(self, inputs: Mapping[str, np.ndarray | MemHandle],
                outputs: Mapping[str, np.ndarray | MemHandle] | None = None, *,
                fresh_outputs: bool = False) -> Mapping[str, tuple[int, ...]]:
        """Run once. Each input is an ndarray (raw: copied in) or a MemHandle (bound, no copy); each output
        given is an ndarray (raw: the result is copied into it) or a MemHandle (written in place).
        `fresh_outputs`: the output arrays share no memory with the feeds (the caller made them for this run): a
        range program on the CPU may then write them in place (runtime/feeds.py).

        Returns the real shapes of the outputs whose size depends on the data (NonZero, ...; their tensors
        have an upper-bound shape, the real data in the leading part of the bounded axis); {} when none."""
        ctx = self.ctx
        if not ctx.finalized:
            raise LifecycleError(f"graph {self.name!r}: context was freed" if ctx.freed
                                 else f"graph {self.name!r}: context is not finalized; call finalize()")
        if self.compiled.carriers:
            inputs = self.carry(inputs)
        if self._extent is not None:
            return self._extent.execute(inputs, outputs, fresh_outputs)
        if self.ranges is not None:
            return self._child(inputs).execute(inputs, outputs)
        if inputs.keys() != self._input_names:
            missing, extra = sorted(self._input_names - set(inputs)), sorted(set(inputs) - self._input_names)
            raise ShapeError(f"graph {self.name!r} inputs: missing {missing}, unknown {extra}")
        outputs = outputs or {}
        self._check_io(self.inputs, self.outputs, inputs, outputs)
        for info, value in self._values:
            self._check_value(info, inputs[info.name], value)
        backend = ctx.backend
        if self._index_checks is None or self._index_checks:  # (the CPU's kernels check their own: none here)
            self.check_indices(inputs)
        with ctx.lock:
            if not same_binding(self._bound, self.inputs, self.outputs, inputs, outputs):  # pinned: replay
                self._record(binding(self.inputs, self.outputs, inputs, outputs))  # re-record the IO launches
            run_recorded(ctx, inputs, outputs, self.inputs, self.outputs, self._internal, self._plan,
                         self.thread_cap, self._blas)
            if not self._extents:
                return _NO_SHAPES
            shapes = {}
            for info, axis, (tensor, host, copy) in self._extents:
                if copy:
                    backend.copy_out(host, tensor)
                shapes[info.name] = info.shape[:axis] + (int(host),) + info.shape[axis + 1:]
            return shapes

    def check_indices(self, feeds: Mapping[str, Any]) -> None:
        """On a device backend: the host arrays among `feeds` that are indices of a gather or scatter, checked
        against their axis (an InvalidInputError, as the CPU's kernels raise; `_indexed`). A session checks its
        feeds before it copies them into device tensors."""
        checks = self._index_checks
        if checks is None:
            checks = self._index_checks = _indexed(self.compiled, self.ctx.backend.name)
        for name, node, n in checks:
            fed = feeds.get(name)
            if isinstance(fed, np.ndarray):
                check_indices(node, fed, n)

    def _check_value(self, info: TensorInfo, fed: np.ndarray | MemHandle, value: np.ndarray) -> None:
        if isinstance(fed, MemHandle):
            got = self.ctx.backend.host_view(fed.view)
            if got is None:
                got = np.empty(fed.shape, fed.dtype)
                self.ctx.backend.copy_out(got, fed.view)
        else:
            got = fed
        if not np.array_equal(got, value):
            raise ShapeError(f"input {info.name!r} is a value input compiled for {value.reshape(-1).tolist()}; got "
                             f"{np.asarray(got).reshape(-1).tolist()[:16]} (it decides a shape or a branch: compile "
                             f"again with --value {info.name}=..., or run the .onnx model through InferenceSession)")

    def _release(self) -> None:
        """Drop everything that reaches the context's memory (the view maker holds its weights and arena)."""
        self._launches, self._views, self._internal, self._kernels, self._bound = [], {}, {}, [], None
        self._plan, self._batches = [], {}
        self._host, self._extents = None, []
        if self._extent is not None:
            self._extent.release()
        self._view, self._extent, self._weights = None, None, {}
        for child in self._children.values():
            child._release()
        self._children.clear()
        self._held, self._host_weights, self._private = [], None, {}
        self._step_cache.clear()
        self._steps_made.clear()

    def carry(self, feeds: Mapping[str, Any]) -> Mapping[str, Any]:
        """The feeds with each value input the program takes as lengths (`ctxrt compile --dim limit=1:64`,
        frontend/carriers.py) given as those lengths; feeds that give the lengths already pass."""
        from ctxrt.frontend.carriers import carry

        records = self.compiled.carriers
        if not any(r[0] in feeds for r in records):
            return feeds
        bounds = {n: (lo, hi) for n, lo, hi in self.ranges.dims} if self.ranges is not None else {}
        for name, dt, shape, elements in records:
            x = feeds.get(name)
            if x is None:
                raise ShapeError(f"graph {self.name!r} inputs: missing [{name!r}]")
            if not isinstance(x, np.ndarray | np.generic) or x.dtype != np.dtype(dt) or x.shape != shape:
                got = f"{x.dtype}{list(x.shape)}" if isinstance(x, np.ndarray | np.generic) else type(x).__name__
                raise ShapeError(f"input {name!r} expects {np.dtype(dt)}{list(shape)} (a value input ranged, given "
                                 f"as an array), got {got}")
            for j, (e, v) in enumerate(zip(elements, np.asarray(x).reshape(-1).tolist(), strict=True)):
                lo, hi = bounds.get(e, (0, v)) if isinstance(e, str) else (v, v)
                if not lo <= v <= hi:
                    raise ShapeError(f"input {name!r}{f' element {j}' if len(elements) > 1 else ''} is {v}, outside "
                                     f"the range {lo}..{hi} this program was compiled for (dim {e!r})")
                if not isinstance(e, str) and v != e:
                    raise ShapeError(f"input {name!r}: element {j} is compiled for the value {e}; got {v} (range it "
                                     f"with --dim {name}[{j}]=MIN:MAX)")
        out = carry(feeds, tuple((name, elements) for name, _, _, elements in records))
        assert out is not None  # (checked above)
        return out

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run once and return new arrays for every output (of their real shapes, see `execute`)."""
        if self.compiled.carriers:
            feeds = self.carry(feeds)
        if self.ranges is not None and self.ctx.finalized and self._extent is None:
            return self._child(feeds).run(feeds)
        infos = self._extent.at(feeds).outputs if self._extent is not None and self.ctx.finalized else self.outputs
        outs = {o.name: np.empty(o.shape, np.dtype(o.dtype)) for o in infos}
        for name, shape in self.execute(feeds, outs, fresh_outputs=True).items():
            outs[name] = np.ascontiguousarray(outs[name][tuple(slice(0, d) for d in shape)])
        return outs

    def __repr__(self) -> str:
        return (f"Graph({self.name!r}, inputs={[(i.name, i.shape) for i in self.inputs]}, "
                f"spillfill={self.spillfill_size})")


_NO_SHAPES: Mapping[str, tuple[int, ...]] = MappingProxyType({})  # shared: a run without bounded outputs makes none


def io_buffer_layout(infos: list[TensorInfo], alignment: int) -> list[tuple[str, int, int]]:
    """(name, offset, nbytes) of each IO tensor packed into one buffer."""
    out, offset = [], 0
    for info in infos:
        out.append((info.name, offset, info.nbytes))
        offset += -(-max(info.nbytes, 1) // alignment) * alignment
    return out


__all__ = ["Graph", "io_buffer_layout"]


_INDEXED = frozenset({"Gather", "GatherElements", "GatherND", "ScatterND", "ScatterElements"})


def _indexed(compiled: CompiledGraph, backend: str) -> list[tuple[str, Any, Any]]:
    """(input name, the node (op, name), the axis size or, for GatherND / ScatterND, the index tuple's dims) of each
    gather and scatter run on a device backend whose indices are a graph input: an index outside its axis is an
    InvalidInputError before the run, as the CPU's kernels raise it (a device kernel wraps it, memory-safe). Indices
    computed on the device, or fed as a MemHandle, are not read back to be checked (docs/opencl.md)."""
    if backend == "cpu":
        return []
    out = []
    for s in compiled.steps:
        if s.op not in _INDEXED or s.backend not in ("", backend) or len(s.inputs) < 2 or s.inputs[1] is None \
                or s.inputs[1].space != INPUT or s.inputs[0] is None:
            continue
        data, idx = s.inputs[0].shape, s.inputs[1].shape
        if s.op in ("GatherND", "ScatterND"):
            b = int(s.attrs.get("batch_dims", 0)) if s.op == "GatherND" else 0
            if not idx or not 0 <= b < len(data):
                continue
            n: Any = np.array(data[b:b + idx[-1]], np.int64)
        else:
            axis = int(s.attrs.get("axis", 0))
            if not -len(data) <= axis < len(data):
                continue
            n = data[axis]
        out.append((s.inputs[1].key, SimpleNamespace(op=s.op, name=s.name), n))
    return out
