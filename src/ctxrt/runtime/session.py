"""`InferenceSession`: onnxruntime's API over contexts, with a tensor cache and pinning (docs/architecture.md).

The session passes every input and output to its graphs as a memory handle of a device `Tensor`. NumPy
feeds are copied into tensors from the session's cache; after the run the tensors go back to the cache,
and the next run takes the same tensor for the same input again, so the graph's recorded launches stay
valid (pinning) and nothing is created, registered or recorded in a steady loop.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import warnings
import weakref
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ctxrt import dtypes
from ctxrt.backends import Backend, get_backend
from ctxrt.compiler.program import TensorInfo
from ctxrt.compiler.ranges import is_dim_name, is_expression
from ctxrt.errors import CtxrtError, CtxrtWarning, LifecycleError, RegistrationError, ShapeError, ValueInputError
from ctxrt.ir import memo
from ctxrt.runtime.compile_cache import VariantCompiler
from ctxrt.runtime.context import Context
from ctxrt.runtime.graph import Graph
from ctxrt.runtime.options import is_session_options, threads_of
from ctxrt.runtime.ort_api import IOBinding, NodeArg, cut, node_arg
from ctxrt.runtime.tensor import Tensor, TensorCache
from ctxrt.runtime.variant import HELD, Stage, Variant, array_of, held_stats, variants_warning

# A dynamic dim's default upper bound in a session's range program (docs/shapes-and-control-flow.md): each is compiled
# for [0 or 1, max(DEFAULT_DIM_MAX, twice the first size met)], its arena planned there; a larger feed widens it.
DEFAULT_DIM_MAX = 16
# ... and a dim first met empty (a generation's past: a KV cache that grows by a token a run) for
# [0, max(default_dim_max, DEFAULT_CACHE_MAX)]: at 16 a 64-token generation compiled four programs (16, 32, 64,
# 128), ~0.6 s each for a 4-layer GPT-2, and its second generation met every past length anew in the last one.
# The arena's pages past what a run touches are never resident (a past read in place is not even copied).
DEFAULT_CACHE_MAX = 256


class InferenceSession:
    """Run a model the way onnxruntime does: `.onnx` (compiled in memory, or through `cache_dir`), `.ctx`,
    or an EPContext `_ctx.onnx` model (several contexts run as a chain sharing one spill-fill buffer).

    Options: `shapes` binds dynamic input dimensions; `graph` picks a graph of a multi-graph context (or
    of an EPContext file holding several models; default: the first); `cache_dir` keeps compiled context
    binaries keyed by the model (its bytes and its external-data files), the options, the shapes and values,
    their weights once per content in `cache_dir/weights/`; `tensor_cache_bytes` caps the bytes of tensors the
    cache keeps; `enable_tensor_cache=False` destroys a run's tensors after it; `enable_pinning=False` stops
    preferring last run's tensor for each input and output (both only to measure what they save);
    `max_shape_variants` bounds how many input-shape variants of an ONNX model stay compiled (each holds its
    own arena, all share one copy of the weights; the least recently used is freed first, with the tensors
    the cache kept for it; a session that keeps compiling warns once). `sess_options` (ctxrt.SessionOptions
    or onnxruntime's, also accepted second, in onnxruntime's order): `intra_op_num_threads` sets the threads
    of every run."""

    def __init__(self, path_or_bytes: str | os.PathLike | bytes, backend: str | Backend = "cpu", *,
                 sess_options: Any = None, shapes: Mapping[str, Sequence[int]] | None = None, graph: str | None = None,
                 cache_dir: str | os.PathLike | None = None, tensor_cache_bytes: int | None = None,
                 enable_tensor_cache: bool = True, enable_pinning: bool = True, max_shape_variants: int = 4,
                 dim_ranges: Mapping[str, Any] | None = None, default_dim_max: int = DEFAULT_DIM_MAX) -> None:
        if max_shape_variants < 1:
            raise CtxrtError(f"max_shape_variants must be >= 1, got {max_shape_variants}")
        if default_dim_max < 0:
            raise CtxrtError(f"default_dim_max must be >= 0 (0: compile for exact shapes), got {default_dim_max}")
        # Ranges of dynamic dims (docs/shapes-and-control-flow.md): a model with symbolic dims compiles one range
        # program; a feed outside compiles one wider range. default_dim_max=0 compiles a variant per input shape
        # instead.
        self._ranges: dict[str, Any] = {}
        # per dim, the step its sizes take in range programs (an image's height through strided convs: a multiple
        # of 32: `_unfixed`)
        self._steps: dict[str, int] = {}
        self._pending: dict[str, int] = {}  # steps of the compile in progress (kept once it compiles)
        self._range_failing: str | None = None  # why no range compiled for the feeds being compiled
        self._trial: set[str] = set()  # those of them the next attempt tries (dropped if it fails)
        self._step_refused: set[tuple[str, int]] = set()  # (dim, step) that did not compile (not tried again)
        self.dim_ranges = dim_ranges or {}
        self._default_dim_max = default_dim_max
        self._range_failed: str | None = None  # why this model cannot be a range program, once known
        # dims a range program over all of them could not follow (an image's height through a strided conv): each
        # program is compiled for one value of these, its other dims ranged (a batch loop at a fixed image size)
        self._fixed_dims: set[str] = set()
        self._cuts: dict[str, set[int]] = {}  # per dim, sizes that start a piece no range program crosses
        # per dim, the least size its strided convs and pools leave an output at (a range program's lower bound
        # raised there, compiler/floors.py): a feed below it is refused before any compile
        self._least: dict[str, int] = {}
        # symbolic dim names the feeds gave two sizes in one run (an exporter naming two lengths alike, as
        # onnxruntime lets it): each axis of theirs ranged as its own dim, INPUT:AXIS, from then on (`_key`)
        self._untied: set[str] = set()
        self._range_error: str | None = None  # why the last range compile failed (then exact shapes were compiled)
        # integer value inputs of a few elements met with several values, made of lengths (frontend/carriers.py):
        # their elements (a value, or the dim it is), their own dims' ranges, those that could not be, the values
        # each was compiled for, and the values and dims of the last compiles
        self._carry_specs: dict[str, tuple[int | str, ...]] = {}
        self._carry_ranges: dict[str, tuple[int, int]] = {}
        self._carry_failed: set[str] = set()
        self._values_seen: dict[str, set[tuple[int, ...]]] = {}
        self._met: list[tuple[dict[str, tuple[int, ...]], dict[str, int]]] = []  # (values, dims) per compile
        if sess_options is None and is_session_options(backend):  # onnxruntime's order: (model, sess_options)
            backend, sess_options = "cpu", backend
        self._num_threads = threads_of(sess_options)
        self._max_variants = max_shape_variants
        self.backend = get_backend(backend)
        self._lock = threading.RLock()
        self._closed = True  # until loaded
        self._counters: Counter[str] = Counter()
        self._user_tensors: weakref.WeakSet[Tensor] = weakref.WeakSet()
        self._orphans: list[list[Tensor]] = []  # session tensors of IOBindings deleted since the last run
        self._source: Any = None  # an ONNX model (path or bytes) that can be compiled for other shapes
        self._cache_dir = cache_dir
        self._compiler: VariantCompiler | None = None  # for an ONNX model: its compiles share one WeightStore
        self._dims: dict[tuple[str, int], set[int]] = {}  # sizes each input axis was compiled for
        self._warned = False
        self._variants: dict[int, Variant] = {}  # least recently used first
        self._variant_ids = 0
        self._retired: Counter[str] = Counter()  # counters of freed variants' contexts
        # name -> (dtype, dims) of the model's inputs and outputs: an ONNX model's as declared, what it leaves
        # out inferred (symbolic dims; None: unknown; dims None: rank unknown)
        self._in_decl: dict[str, tuple[np.dtype, list[int | str | None] | None]]
        self._out_decl: dict[str, tuple[np.dtype, list[int | str | None] | None]]
        default = self._load(path_or_bytes, shapes, graph)
        if self._source is None:
            self._in_decl = {t.name: (np.dtype(t.dtype), list(t.shape)) for t in default.inputs}
            self._out_decl = {t.name: (np.dtype(t.dtype), list(t.shape)) for t in default.outputs}
            if default.ranged is not None:  # a range program: its dims by name, as the ONNX model had them
                from ctxrt.compiler.ranges import io_dims

                g = default.ranged
                if default.chain is not None:
                    in_dims, out_dims = default.chain.io_dims()
                else:
                    io = [[{"shape": t.shape} for t in ts] for ts in (g.inputs, g.outputs)]
                    in_dims, out_dims = io_dims(g.ranges.to_meta(), *io)
                self._in_decl = {t.name: (np.dtype(t.dtype), d) for t, d in zip(g.inputs, in_dims, strict=True)}
                self._out_decl = {t.name: (np.dtype(t.dtype), d) for t, d in zip(g.outputs, out_dims, strict=True)}
                records = getattr(getattr(g, "compiled", None), "carriers", ())  # (a split chain has none)
                if records:  # value inputs it takes as lengths: fed as the values (frontend/carriers.py)
                    from ctxrt.frontend.carriers import carrier

                    made = {carrier(n, j, len(e)) for n, _, _, e in records for j in range(len(e))}
                    self._in_decl = {**{k: v for k, v in self._in_decl.items() if k not in made},
                                     **{n: (np.dtype(dt), list(shape)) for n, dt, shape, _ in records}}
                    default.carriers = tuple((n, e) for n, _, _, e in records)
                    default.carried = frozenset(n for n, _, _, _ in records)
        if default is not None:
            self._keep(default)
        self._current: Variant | None = default
        self._closed = False
        self._cache = TensorCache(self, tensor_cache_bytes, enable_tensor_cache)
        self._pinning = enable_pinning

    # -- loading -------------------------------------------------------------------------------------
    def _load(self, source: Any, shapes: Any, graph: str | None) -> Variant | None:
        """The variant for the given (or declared) shapes; None for an ONNX model with dynamic dimensions and
        no `shapes`: it is compiled at the first run, for the feeds' shapes."""
        from ctxrt.format.layout import MAGIC
        from ctxrt.runtime.loader import context_from_binary

        if isinstance(source, bytes):
            if source.startswith(MAGIC):
                return self._single(context_from_binary(source, self.backend), graph)
            self._source = source
            self._compiler = VariantCompiler(source, self.backend, self._cache_dir, self._counters)
            return self._compile_default(shapes, graph)
        path = Path(source)
        if not path.is_file():
            raise CtxrtError(f"no such model file: {path}")
        with open(path, "rb") as f:
            head = f.read(len(MAGIC))
        if head == MAGIC:
            return self._single(context_from_binary(path, self.backend), graph)
        from ctxrt.frontend.epcontext import is_epcontext

        self._compiler = VariantCompiler(path, self.backend, self._cache_dir, self._counters)
        if self._compiler.remembered("epcontext", lambda: is_epcontext(path), decode=_boolean):
            self._compiler = None
            from ctxrt.runtime.group import ContextGroup

            group = ContextGroup.from_epcontext(path, self.backend, graph=graph)
            stages = [Stage(s.context, s.context.graph(s.graph), s.inputs, s.outputs) for s in group.steps]
            return Variant(self, [c for c in group.contexts if c is not None], stages, list(group.inputs),
                            list(group.outputs), dict(group._chain_handles), group)
        self._source = path
        return self._compile_default(shapes, graph)

    def _compile_default(self, shapes: Any, graph: str | None) -> Variant | None:
        """Compiled now when every dynamic dim is bound (declared or in `shapes`) and no input decides a
        shape or a branch; otherwise at the first run, for its feeds."""
        from ctxrt.frontend.io_types import declared_io, from_json, to_json

        assert self._compiler is not None
        ins, outs = self._compiler.remembered("io", lambda: declared_io(self._source), to_json, from_json)
        self._in_decl = {n: (dt, dims) for n, dt, dims in ins}
        self._out_decl = {n: (dt, dims) for n, dt, dims in outs}
        dynamic = {name for name, _, dims in ins if dims is None or not all(isinstance(d, int) for d in dims)}
        if dynamic - set(shapes or {}):
            return None
        try:
            variant = self._single(self._compile(shapes), graph)
        except ValueInputError:
            return None
        extents = variant.stages[0].graph.compiled.extents
        for t in variant.outputs if not dynamic else ():  # what inference left unknown, as compiled
            dt, dims = self._out_decl[t.name]
            if t.name not in extents and (dims is None or None in dims):  # not an upper bound of a size
                self._out_decl[t.name] = (dt, list(t.shape))
        return variant

    def _single(self, ctx: Context, graph: str | None) -> Variant:
        g = ctx.graph(graph)
        stage = Stage(ctx, g, [t.name for t in g.inputs], [t.name for t in g.outputs])
        return Variant(self, [ctx], [stage], list(g.inputs), list(g.outputs), {})

    def _keep(self, variant: Variant) -> None:
        self._variant_ids += 1
        self._variants[self._variant_ids] = variant

    def _variant(self, feeds: Mapping[str, Any]) -> Variant:
        """The contexts for these feeds' shapes (and values of value inputs): the current ones, an earlier
        variant, or (for an ONNX model) a new compile for them."""
        current = self._current
        if current is not None and current.matches(feeds):
            return current
        decl = self._in_decl
        if feeds.keys() != decl.keys():
            missing, extra = sorted(set(decl) - set(feeds)), sorted(set(feeds) - set(decl))
            raise ShapeError(f"inputs: missing {missing}, unknown {extra}")
        for name, (dt, dims) in decl.items():
            v = feeds[name]
            if not isinstance(v, np.ndarray | Tensor):
                raise ShapeError(f"input {name!r} must be a numpy.ndarray or a ctxrt.Tensor, got {type(v).__name__}")
            got = v.shape
            if v.dtype != dt or dims is not None and (len(got) != len(dims) or any(
                    isinstance(d, int) and d != g for d, g in zip(dims, got, strict=True))):
                fixed = " (a context binary has fixed shapes)" if self._source is None and v.dtype == dt else ""
                raise ShapeError(f"input {name!r} expects {dt}{dims}, got {v.dtype}{list(got)}{fixed}")
        key = next((k for k, v in self._variants.items() if v.matches(feeds)), None)
        if key is not None:
            variant = self._variants.pop(key)
        elif self._source is None:  # a context binary: the one variant, compiled for other values
            only = next(iter(self._variants.values()))
            if only.ranged is not None:  # outside the ranges: the ShapeError naming the dim, its value and range
                g = only.ranged
                given = g.carry({k: array_of(v) for k, v in feeds.items()}) if only.carriers else feeds
                g.ranges.bind(g.inputs, [getattr(given[t.name], "shape", None) for t in g.inputs])
            name, value = next((n, a) for n, a in only.values if not np.array_equal(array_of(feeds[n]), a))
            raise ShapeError(f"input {name!r} is a value input compiled for {value.reshape(-1).tolist()}; got "
                             f"{np.asarray(array_of(feeds[name])).reshape(-1).tolist()[:16]} (a context binary is "
                             "compiled for one value)")
        else:
            for key, least in self._least.items():
                if self._needed(feeds, key) < least:
                    name, axis = self._axis_of(key) or ("?", 0)
                    raise ShapeError(f"input {name!r} axis {axis} (dim {key!r}) is {self._needed(feeds, key)}: the "
                                     f"model's strided convs and pools leave no output below {least}")
            variant = self._carried_variant(feeds)  # value inputs met with other values: ranged as lengths
            self._pending, self._trial, self._range_failing = {}, set(), None
            dims = None if variant is not None else self._range_dims(feeds)
            prior, replaced = None, []
            if dims:  # a wider range replaces the ranges compiled before (whose fit it tries first) once it compiles
                # (where it cannot, a bound clamped inside it, the narrower one still runs its sizes); with dims kept
                # fixed (`_fixed_dims`), only the program for the same sizes of those: the others stay
                replaced = [k for k, old in self._variants.items() if old.ranged is not None and all(
                    self._size_in(old, key) == dims[key][0] for key in self._fixed_dims if key in dims) and
                    self._within(old, dims)]
                prior = next((self._variants[k].ranged.ranges for k in replaced), None)
            while variant is None and len(self._variants) >= self._max_variants:  # free the least recently used
                self._retire(self._variants.pop(next(iter(self._variants))))
            if dims:
                from ctxrt.compiler.ranges import RangeError

                # an upper bound past what the model allows (a position table's rows) fails to compile: the
                # bounds halved (down to the feeds' sizes) until one compiles, 256 -> 128 for a GPT-2 of 256
                # positions at sequence 16, rather than the feeds' sizes at once (then widened at every doubling)
                attempts, last = [dims], dims
                while True:
                    last = {k: v if isinstance(v, str) else (v[0], max(v[0], self._needed(feeds, k), v[1] // 2))
                            for k, v in last.items()}
                    if last == attempts[-1]:
                        break
                    attempts.append(last)
                stepped = self._unfixed(feeds, dims)
                if stepped is not None:  # dims kept fixed whose sizes share a step: one program over its multiples
                    attempts.insert(0, stepped)
                varied = self._varied(feeds)
                if varied is not None:  # a dim that never changed may be one the model cannot vary (a head size)
                    attempts.append({k: v if isinstance(v, str) or k in varied else (n := self._needed(feeds, k), n)
                                     for k, v in dims.items()})
                failed = None
                with memo.shared():  # the attempts share the model as loaded, its arrays and constant chains
                    for i, attempt in enumerate(attempts):
                        if all(not isinstance(v, str) and v[0] == v[1] for v in attempt.values()):
                            continue  # nothing left to range
                        try:  # the upper bound may be past what the model allows (e.g. its position table): then tight
                            variant = self._single(self._compile(None, feeds, self._with_steps(attempt), prior), None)
                        except CtxrtError as e:
                            for k in self._trial:  # steps tried that did not make it compile: not kept (nor tried
                                self._step_refused.add((k, self._pending.pop(k, 0)))  # again)
                            self._trial = set()
                            # only its message: its tracebacks' frames hold the failed compile's probes, which the
                            # next attempt would compile beside (a GPT-2 whose bound 256 fails: peak RSS beyond its
                            # weights 36.5 -> 24.2 MiB)
                            if not isinstance(e, RangeError) and not getattr(e, "inside", False):
                                failed = f"{type(e).__name__}: {e}"
                                continue  # (at the upper bound: a narrower range may compile)
                            if self._split(getattr(e, "splits", {}), attempt):  # a clamp or a comparison of a dim
                                # changes piece inside the ranges: the attempts left kept within the feeds' piece
                                rest = [self._piece(feeds, a) for a in (attempt, *attempts[i + 1:])]
                                attempts[i + 1:] = [a for j, a in enumerate(rest) if a not in rest[:j]]
                                failed = f"{type(e).__name__}: {e}"
                                del e
                                continue
                            # the programs differ between shapes of the ranges, or the model has no graph at a point
                            # inside them (shapes that do not fit each other at odd sizes: narrower ranges fail there
                            # too): one dim ranged, the others fixed
                            reason = RangeError(str(e))
                            reason.follows = getattr(e, "follows", frozenset())  # type: ignore[attr-defined]
                            del e
                            variant, attempt = self._one_ranged_dim(feeds, attempt, prior, reason)
                            if variant is None:
                                break
                        self._fixed_dims -= {k for k in self._trial if isinstance(attempt.get(k), tuple)
                                             and attempt[k][0] < attempt[k][1]}  # (stepped now)
                        self._trial = set()
                        self._ranges.update({k: v for k, v in attempt.items() if k not in self._fixed_dims})
                        if variant.ranged is not None and variant.ranged.ranges.floors:  # (bounds raised)
                            for n, lo, _, _ in variant.ranged.ranges.natural():
                                if isinstance(self._ranges.get(n), tuple) and lo > self._ranges[n][0]:
                                    self._least[n] = lo
                                    self._ranges[n] = (lo, self._ranges[n][1])
                        # (the steps it compiled with)
                        self._steps = {k: st for k, st in {**self._steps, **self._pending}.items() if st > 1}
                        self._counters["range_programs_compiled"] += 1
                        if variant.ranged is not None and variant.ranged.ranges.widened:
                            self._counters["range_programs_widened"] += 1  # two compiles: the narrower fit held
                        break
                if variant is None and failed is not None:
                    self._counters["range_compiles_failed"] += 1
                    self._range_error = failed
                if variant is not None and variant.ranged is not None:
                    for k in replaced:  # (not a program for another piece of a dim: `_cuts`)
                        if k in self._variants and self._within(self._variants[k], attempt):
                            self._retire(self._variants.pop(k))
            if variant is None:
                variant = self._single(self._compile({n: feeds[n].shape for n in decl}, feeds), None)
                if self._range_failing is not None:  # no range program for the model, not feeds it cannot take
                    self._range_failed, self._range_failing = self._range_failing, None
                    warnings.warn(f"InferenceSession compiles this model for exact input shapes: it cannot be one "
                                  f"program for ranges of its dims ({self._range_failed})", CtxrtWarning,
                                  stacklevel=3)
            self._counters["shape_variants_compiled"] += 1
            self._cache.keep_only(variant.io_keys().union(*(v.io_keys() for v in self._variants.values())))
            self._note_compile(variant, feeds)
        self._keep(variant)  # most recently used last
        self._current = variant
        return variant

    def _carried_variant(self, feeds: Mapping[str, Any]) -> Variant | None:
        """A range program for these feeds whose integer value inputs of a few elements (that decide shapes but no
        branch) have each element that met several values (none negative) made the length of an input
        (frontend/carriers.py): the dim of the model it equalled at every compile (a Reshape's batch), else a dim of
        its own, [0 or 1, max(default_dim_max, twice the largest met)], widened as dims are; its other dims ranged
        as `_range_dims` gives them. None where no such element varied, or the program does not compile (those
        inputs then stay value inputs, compiled per value)."""
        from ctxrt.frontend.carriers import carriable, carrier

        if not self._values_seen or self._compiler is None:
            return None
        sizes = self._dim_sizes(feeds)
        specs: dict[str, tuple[int | str, ...]] = {}
        ranges: dict[str, tuple[int, int]] = {}
        for name, (dt, decl) in self._in_decl.items():
            seen = self._values_seen.get(name)
            if seen is None or name in self._carry_failed or not carriable(dt, decl):
                continue
            value = tuple(int(v) for v in np.asarray(array_of(feeds[name])).reshape(-1).tolist())
            before = self._carry_specs.get(name, ())
            varied = {j for j in range(len(value)) if len({t[j] for t in seen | {value}}) > 1 or
                      j < len(before) and isinstance(before[j], str)}
            if not varied or name not in self._compiler.shape_only_inputs():  # (the model read once, on need)
                continue
            if any(value[j] < 0 or min(t[j] for t in seen) < 0 for j in varied):
                continue  # a negative value: not a length (this input compiled per value)
            elements: list[int | str] = list(value)
            for j in sorted(varied):
                dim = before[j] if j < len(before) and isinstance(before[j], str) else None
                if dim is None or dim in sizes and sizes[dim] != value[j]:  # (a dim it no longer equals: its own)
                    dim = next((d for d, n in sizes.items() if n == value[j] and all(
                        values.get(name, ())[j:j + 1] == (met.get(d),) for values, met in self._met)), None)
                if dim is None or dim not in sizes:  # a dim of its own
                    dim, n = carrier(name, j, len(value)), value[j]
                    met_j = {t[j] for t in seen} | {n}
                    lo, hi = self._carry_ranges.get(dim, (0 if 0 in met_j else 1, max(
                        self._default_dim_max, 2 * (1 << max(max(met_j) - 1, 0).bit_length()))))
                    if not lo <= n <= hi:
                        lo, hi = min(lo, n), max(2 * hi, 1 << max(n - 1, 0).bit_length())
                    ranges[dim] = (lo, hi)
                elements[j] = dim
            specs[name] = tuple(elements)
        dims = self._range_dims(feeds) if specs else None
        if dims is None or any(isinstance(e, str) and e not in ranges and e not in dims
                               for elements in specs.values() for e in elements):
            return None
        replaced = [k for k, old in self._variants.items() if old.carried == specs.keys()]  # freed once this compiles
        prior = next((self._variants[k].ranged.ranges for k in replaced if self._variants[k].ranged is not None),
                     None)
        while len(self._variants) >= self._max_variants:
            self._retire(self._variants.pop(next(iter(self._variants))))
        # all of them, else each alone (the others compiled per value); an upper bound past what the model allows
        # (TopK's K past its axis) fails: halved down to the value met
        needed = {e: int(np.asarray(array_of(feeds[name])).reshape(-1)[j]) for name, elements in specs.items()
                  for j, e in enumerate(elements) if e in ranges}
        variant, names = None, list(specs)
        with memo.shared():
            for group in [names, *([[n] for n in names] if len(names) > 1 else [])]:
                spec = tuple(sorted((n, specs[n]) for n in group))
                own = {e: ranges[e] for _, elements in spec for e in elements if e in ranges}
                attempts = [own]
                while True:
                    last = {e: (lo, max(lo, needed[e], hi // 2)) for e, (lo, hi) in attempts[-1].items()}
                    if last == attempts[-1]:
                        break
                    attempts.append(last)
                for attempt in attempts:
                    try:
                        variant = self._single(self._compile(None, feeds, {**dims, **attempt}, prior, spec), None)
                        break
                    except CtxrtError as e:
                        self._range_error = f"{type(e).__name__}: {e}"
                if variant is not None:
                    break
        if variant is None:
            self._carry_failed |= specs.keys()
            return None
        for k in replaced:
            if k in self._variants:
                self._retire(self._variants.pop(k))
        self._carry_failed |= specs.keys() - dict(spec).keys()
        variant.carriers, variant.carried = spec, frozenset(dict(spec))
        variant.carried_dims = {carrier(n, j, len(elements)): at for n, elements in spec for j, e in enumerate(elements)
                                if isinstance(e, str) and e in sizes and (at := self._axis_of(e)) is not None}
        self._carry_specs.update(spec)
        self._carry_ranges.update(attempt)
        self._ranges.update({k: v for k, v in dims.items() if k not in self._fixed_dims})
        self._counters["range_programs_compiled"] += 1
        self._counters["value_inputs_ranged"] = len(self._carry_specs.keys() - self._carry_failed)
        return variant

    def _dim_sizes(self, feeds: Mapping[str, Any]) -> dict[str, int]:
        """The size of each named dim of the model's inputs in these feeds."""
        out: dict[str, int] = {}
        for name, (_, decl) in self._in_decl.items():
            shape = getattr(feeds.get(name), "shape", None)
            for axis, d in enumerate(decl or ()):
                if isinstance(d, str) and is_dim_name(d) and shape is not None and axis < len(shape):
                    out.setdefault(self._key(name, axis, d), int(shape[axis]))
        return out

    def _key(self, name: str, axis: int, d: Any) -> str:
        """The dim an input's axis declared `d` (not a number) is ranged as: its symbolic name, else (unnamed, a
        placeholder such as "?", or a name `_untied`) INPUT:AXIS."""
        return d if is_dim_name(d) and d not in self._untied else f"{name}:{axis}"

    def _untie(self, feeds: Mapping[str, Any]) -> None:
        """Names of dims these feeds give two sizes (`_untied`): onnxruntime checks no symbolic name across
        inputs (a BART exported with one "seq" for its encoder's and decoder's tokens runs there)."""
        sizes: dict[str, set[int]] = {}
        for name, (_, decl) in self._in_decl.items():
            shape = getattr(feeds.get(name), "shape", None)
            for axis, d in enumerate(decl or ()):
                if is_dim_name(d) and d not in self._untied and shape is not None and axis < len(shape):
                    sizes.setdefault(d, set()).add(int(shape[axis]))
        self._untied |= {d for d, got in sizes.items() if len(got) > 1}

    def _one_ranged_dim(self, feeds: Mapping[str, Any], attempt: dict[str, Any], prior: Any, error: Exception
                        ) -> tuple[Variant | None, dict[str, Any]]:
        """After a range compile over several dims failed with `error`: a program ranged over the dims the integers
        it refuted do not follow, or over dims of one range and one size in these feeds (silero VAD's batch, in its
        audio and its state, not its samples), else over one of them (in the order the inputs declare them: a batch
        first), the others fixed at these feeds' sizes, and those kept fixed from now on (a later size of theirs
        compiles one such program for it); (None, attempt) where none compiles, and the session compiles exact
        shapes from now on."""
        ranged = [k for k, v in attempt.items() if not isinstance(v, str) and v[0] != v[1]]
        follows = getattr(error, "follows", frozenset())
        rest = [k for k in ranged if k not in follows]
        groups = [rest] if follows and len(rest) > 1 else []
        alike: dict[Any, list[str]] = {}  # dims of one range and one size in these feeds: a batch in two inputs
        for k in ranged:
            alike.setdefault((attempt[k], self._needed(feeds, k)), []).append(k)
        groups += [g for g in alike.values() if 1 < len(g) < len(ranged) and g not in groups]
        groups += [[k] for k in ranged] if len(ranged) > 1 else []
        for group in groups:
            one = {k: v if isinstance(v, str) or k in group else (self._needed(feeds, k),) * 2
                   for k, v in attempt.items()}
            try:
                variant = self._single(self._compile(None, feeds, self._with_steps(one), prior), None)
            except CtxrtError:  # (a RangeError too)
                continue
            self._fixed_dims = set(ranged) - set(group)
            what = " and ".join(repr(k) for k in group)
            warnings.warn(f"InferenceSession compiles this model as one program for a range of {what} only, for "
                          f"each size of {sorted(self._fixed_dims)} met: it cannot be one program for ranges of "
                          f"them all ({error})", CtxrtWarning, stacklevel=4)
            return variant, one
        self._range_failing = str(error)  # (ranges given up once these feeds compile exact: `_variant`)
        return None, attempt

    def _retire(self, old: Variant) -> None:
        """Free a variant: its contexts (and the weights no other variant shares), the handles tensors kept of
        them; its event counters stay in sess.stats."""
        for ctx in old.contexts:
            self._retired.update({k: n for k, n in ctx.stats.items() if k not in HELD})
        old.free()
        if self._current is old:
            self._current = None  # not run again should the next compile fail
        for t in list(self._user_tensors):
            t.drop_stale_handles()
        self._counters["shape_variants_freed"] += 1

    def _note_compile(self, variant: Variant, feeds: Mapping[str, Any]) -> None:
        from ctxrt.frontend.carriers import MAX_ELEMENTS

        values = {}  # integer value inputs of a few elements and the dims with them: may be ranged as lengths
        for name, value in variant.values:
            if value.size <= MAX_ELEMENTS and value.dtype.kind in "iu":
                values[name] = tuple(int(v) for v in value.reshape(-1).tolist())
        for name in variant.carried:
            values[name] = tuple(int(v) for v in np.asarray(array_of(feeds[name])).reshape(-1).tolist())
        for name, value in values.items():
            self._values_seen.setdefault(name, set()).add(value)
        if values:
            self._met = [*self._met[-15:], (values, self._dim_sizes(feeds))]
        for info in variant.inputs:
            if info.name not in self._in_decl:
                continue  # a value input's carrier (frontend/carriers.py): not an input the user feeds
            for axis, d in enumerate(info.shape):
                self._dims.setdefault((info.name, axis), set()).add(d)
        if not self._warned:
            message = variants_warning(self._counters["shape_variants_compiled"], self._dims, self._in_decl,
                                       self._max_variants)
            if message:
                self._warned = True
                warnings.warn(message, CtxrtWarning, stacklevel=4)

    def _compile(self, shapes: Any, feeds: Mapping[str, Any] | None = None,
                 dims: Mapping[str, tuple[int, int]] | None = None, prior: Any = None, carried: Any = ()) -> Context:
        """Online prepare with memhandle IO (the session binds every IO tensor); through `cache_dir` when set.
        Value inputs are taken from `feeds`; `dims`: ranges of a range program (`prior`: a narrower one's);
        `carried`: value inputs made of lengths (`_carried_variant`)."""
        assert self._compiler is not None
        return self._compiler.compile(shapes, feeds, dims, prior, carried)

    def _varied(self, feeds: Mapping[str, Any]) -> set[str] | None:
        """After a range compile failed (not for a reason ranges cannot fix): the dims whose size changed between
        the compiles so far and these feeds (the others are then fixed); None before."""
        if not self._counters["range_compiles_failed"]:
            return None
        out = set()
        for name, (_, decl) in self._in_decl.items():
            for axis, d in enumerate(decl or ()):
                if isinstance(d, int):
                    continue
                seen = self._dims.get((name, axis), set()) | {int(feeds[name].shape[axis])}
                if len(seen) > 1:
                    out.add(self._key(name, axis, d))
        return out

    def _axis_of(self, key: str) -> tuple[str, int] | None:
        """The first (input, axis) whose extent is dim `key` (a symbolic name, or INPUT:AXIS), None where none."""
        for name, (_, decl) in self._in_decl.items():
            for axis, d in enumerate(decl or ()):
                if d == key and key not in self._untied or f"{name}:{axis}" == key:
                    return name, axis
        return None

    def _size_in(self, variant: Variant, key: str) -> int | None:
        """The size of dim `key` in the inputs `variant` was compiled for (a fixed dim's), None where none has it."""
        at = self._axis_of(key)
        return None if at is None or at[0] not in variant.in_info else int(variant.in_info[at[0]].shape[at[1]])

    def _needed(self, feeds: Mapping[str, Any], key: str) -> int:
        """The size of dim `key` in these feeds."""
        at = self._axis_of(key)
        return 0 if at is None else int(feeds[at[0]].shape[at[1]])

    @staticmethod
    def _within(old: Variant, dims: Mapping[str, Any]) -> bool:
        """Whether a range program's ranges lie within `dims` (a dim not ranged there: any)."""
        return all(not isinstance(dims.get(n), tuple) or dims[n][0] <= lo and hi <= dims[n][1]
                   for n, lo, hi, _ in old.ranged.ranges.natural())

    def _with_steps(self, attempt: Mapping[str, Any]) -> dict[str, Any]:
        """The attempt's ranges of stepped dims with their step (`_steps`, `_pending`), as ctxrt.compile takes
        them."""
        out = dict(attempt)
        for k, s in {**self._steps, **self._pending}.items():
            v = out.get(k)
            if isinstance(v, tuple) and v[0] < v[1] and not v[0] % s and not v[1] % s:
                out[k] = (v[0], v[1], s)
        return out

    def _unfixed(self, feeds: Mapping[str, Any], dims: Mapping[str, Any]) -> dict[str, Any] | None:
        """`dims` with the dims kept fixed (`_fixed_dims`: an image's height through strided convs) whose sizes
        met so far (two or more) are all multiples of a power of two of at least 4 ranged over multiples of it
        (at most 64; a strided conv's output follows them linearly there: PP-OCR's detector at multiples of 32),
        tried once per dim and step; None where none is."""
        out: dict[str, Any] = {}
        for k in self._fixed_dims:
            at = self._axis_of(k)
            if at is None or not isinstance(dims.get(k), tuple):
                continue
            n = self._needed(feeds, k)
            sizes = self._dims.get(at, set()) | {n}
            g = math.gcd(*sizes)
            s = min(64, g & -g)
            if len(sizes) < 2 or s < 4 or (k, s) in self._step_refused:
                continue
            out[k] = (0 if 0 in sizes else s,
                      max(self._default_dim_max, 2 * (1 << max(max(sizes) - 1, 0).bit_length())) // s * s)
            self._pending[k] = s
        if not out:
            return None
        self._trial = set(out)
        return {**dims, **out}

    def _split(self, splits: Mapping[str, Iterable[int]], attempt: Mapping[str, Any]) -> bool:
        """The sizes where a piece of the program starts (a RangeError's `splits`) inside the attempt's ranges,
        remembered; False where there are none (the attempt cannot be narrowed to a piece)."""
        inside = {k: {c for c in cuts if isinstance(attempt.get(k), tuple) and attempt[k][0] < c <= attempt[k][1]}
                  for k, cuts in splits.items()}
        for k, cuts in inside.items():
            self._cuts.setdefault(k, set()).update(cuts)
        return any(inside.values())

    def _piece(self, feeds: Mapping[str, Any], dims: Mapping[str, Any]) -> dict[str, Any]:
        """The ranges kept within the piece of each dim (`_cuts`) that holds the feeds' size."""
        out = dict(dims)
        for k, cuts in self._cuts.items():
            if isinstance(out.get(k), tuple):
                n, (lo, hi) = self._needed(feeds, k), out[k]
                out[k] = (max([lo, *(c for c in cuts if c <= n)]), min([hi, *(c - 1 for c in cuts if c > n)]))
        return out

    def _range_dims(self, feeds: Mapping[str, Any]) -> dict[str, tuple[int, int]] | None:
        """The ranges to compile these feeds' shapes for: each symbolic dim (an unnamed one as INPUT:AXIS) in
        the range given or compiled before, widened to hold the feeds (at least doubled), else [0 or 1,
        max(default_dim_max, twice the feed's size rounded up to a power of two)] ([0, max(default_dim_max,
        DEFAULT_CACHE_MAX)] for a dim met empty: a growing cache). None: compile exact shapes."""
        if self._range_failed is not None or self._default_dim_max == 0 and not self._ranges:
            return None
        self._untie(feeds)
        seen: dict[str, int] = {}
        for name, (_, decl) in self._in_decl.items():
            if decl is None:
                return None  # rank unknown
            shape = feeds[name].shape
            for axis, d in enumerate(decl):
                if isinstance(d, int):
                    continue
                if is_expression(d) and not is_dim_name(d):
                    continue  # an expression of other dims (`past + sequence`): derived, not a dim of its own
                key = self._key(name, axis, d)
                seen[key] = max(seen.get(key, 0), int(shape[axis]))
        dims: dict[str, Any] = {k: v for k, v in self._ranges.items() if isinstance(v, str)}  # derived dims
        for key, n in seen.items():
            if key in dims:
                continue
            if key in self._fixed_dims:  # a dim no range program follows: this program is for its size
                dims[key] = (n, n)
                continue
            grown = 2 * (1 << max(n - 1, 0).bit_length())
            if key in self._ranges:
                lo, hi = self._ranges[key]
                if not lo <= n <= hi:
                    lo, hi = min(lo, n), max(2 * hi, 1 << max(n - 1, 0).bit_length())
                    if key in self._cuts:  # another piece of the dim (`_piece` clips): its first range, as new
                        hi = max(hi, self._default_dim_max, grown)
            else:
                lo, hi = (0 if n == 0 else 1), max(self._default_dim_max, grown)
                if n == 0:
                    hi = max(self._default_dim_max, DEFAULT_CACHE_MAX)
            s = self._steps.get(key, 1)
            if s > 1 and n % s:  # a size off the step: the step they share (a wider program holds both), kept
                s = self._pending[key] = math.gcd(s, n & -n) if n else s  # once that program compiles
                lo = min(lo, n)
            if s > 1:  # a stepped dim: its bounds multiples of its step
                lo, hi = (0 if n == 0 else max(s, -(-lo // s) * s)), max(n, hi // s * s)  # (0: a multiple too)
            dims[key] = (lo, hi)
        return self._piece(feeds, dims) if self._cuts else dims

    @property
    def dim_ranges(self) -> dict[str, Any]:
        """The ranges of dynamic dims: those given, widened by the compiles so far (a dim name or INPUT:AXIS ->
        (MIN, MAX), (MIN, MAX, STEP) for sizes in steps, or an expression of other dims such as
        "past_sequence_length + sequence_length"); for a context binary, those it was compiled with."""
        if self._source is None:
            v = next(iter(self._variants.values()), None) if self._variants else None
            return {} if v is None or v.ranged is None else {n: (lo, hi) if st == 1 else (lo, hi, st)
                                                              for n, lo, hi, st in v.ranged.ranges.natural()}
        return {k: (*v, self._steps[k]) if isinstance(v, tuple) and self._steps.get(k, 1) > 1 else v
                for k, v in self._ranges.items()}

    @dim_ranges.setter
    def dim_ranges(self, value: Mapping[str, Any]) -> None:
        """Ranges for the next compile (a range program compiled already keeps its own until a feed leaves it)."""
        from ctxrt.compiler.ranges import is_expression, parse_range, parse_step

        self._ranges = {k: v if is_expression(v) else parse_range(v, k) for k, v in value.items()}
        self._steps.update({k: parse_step(v, k) for k, v in value.items() if not is_expression(v)
                            and parse_step(v, k) > 1})  # (sizes in steps: `_with_steps`)

    @property
    def kv_shared(self) -> frozenset[str]:
        """Past inputs (GroupQueryAttention's) that runs bind to the same Tensor as their present outputs: a KV
        cache of the context's length written in place, each present planned with its past's shape."""
        return frozenset(self._compiler.options.get("kv_shared", ())) if self._compiler is not None else frozenset()

    @kv_shared.setter
    def kv_shared(self, names: Iterable[str]) -> None:
        """For the next compile (an ONNX model's session only)."""
        from ctxrt.compiler import compile_options

        names = frozenset(names)
        if self._compiler is None:
            raise CtxrtError("a context binary's presents keep the shapes it was compiled with")
        if not names <= self._in_decl.keys():
            raise ShapeError(f"kv_shared: no inputs {sorted(names - self._in_decl.keys())}")
        old = self._compiler.options
        self._compiler.options = compile_options(old.get("prefer", "speed"), names, bool(old.get("in_memory")))

    def kv_appends(self) -> dict[str, str]:
        """{past input: present output} of the range program the last run used, for each present its Concat
        makes from the past and new rows, which appends in place when both are bound as windows of one Tensor
        (`Tensor.window`: the past its first P rows, the present its first P + S): a KV cache of the context's
        length that only the new rows are written into (docs/generate.md). {} before a run, for a program of
        fixed shapes and off the CPU."""
        v = self._current
        if v is not None and v.chain is not None:
            return v.chain.appends()
        g = None if v is None else v.ranged
        runner = None if g is None else g._extent
        if runner is None:
            return {}
        return {past: present for (present, past) in g._append
                if runner.kernel_reading({past, present}) is None}

    # -- onnxruntime's API ---------------------------------------------------------------------------
    def get_inputs(self) -> list[NodeArg]:
        return [node_arg(n, dt, dims) for n, (dt, dims) in self._in_decl.items()]

    def get_outputs(self) -> list[NodeArg]:
        return [node_arg(n, dt, dims) for n, (dt, dims) in self._out_decl.items()]

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
            if v.carriers:  # value inputs ranged as lengths: fed as their carriers
                input_feed = v.carry(input_feed)
            names = v.all_outputs if output_names is None else self._check_outputs(v, output_names)
            if input_feed.keys() != v.in_info.keys():
                missing = sorted(set(v.in_info) - set(input_feed))
                extra = sorted(set(input_feed) - set(v.in_info))
                raise ShapeError(f"inputs: missing {missing}, unknown {extra}")
            g = v.ranged
            if g is not None and g._extent is not None and not any(x.__class__ is Tensor
                                                                    for x in input_feed.values()):
                return self._run_at_dims(g, names, input_feed)
            if v.ranged is not None and v.shapes_for(input_feed):
                self._cache.keep_only(self._io_keys())
            for info, dt, shape in zip(v.inputs, v.in_dt, v.in_shapes, strict=True):
                x = input_feed[info.name]
                if x.__class__ is Tensor:
                    self._check_tensor(info, dt, x, "input", shape)
                else:
                    _check_array(info, dt, x, "input", shape)
            if self.backend.name != "cpu":  # a device's gathers wrap an index outside their axis: checked here
                for stage in v.stages:
                    stage.graph.check_indices(input_feed)
            cache, counters, pin = self._cache, self._counters, self._pinning
            own_in, own_out = v.own_in, v.own_out  # what this run took from the cache (None: the user's)
            try:
                for i, info in enumerate(v.inputs):
                    x = input_feed[info.name]
                    if x.__class__ is Tensor:
                        v.cur_in[i] = x
                        continue
                    t = own_in[i] = cache.acquire(v.in_shapes[i], v.in_dt[i], v.last_in[i] if pin else None)
                    t.write(x)
                    counters["copies_in"] += 1
                    v.cur_in[i] = v.last_in[i] = t
                for i in range(len(v.outputs)):
                    t = own_out[i] = cache.acquire(v.out_shapes[i], v.out_dt[i], v.last_out[i] if pin else None)
                    v.cur_out[i] = v.last_out[i] = t
                v.execute()
                counters["session_runs"] += 1
                shapes = v.shapes  # outputs of data-dependent size: their real shape
                results = [cut(v.cur_out[v.out_index[n]], shapes.get(n)) for n in names]
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

    def _run_at_dims(self, g: Graph, names: list[str], feeds: Mapping[str, Any]) -> list[np.ndarray]:
        """A range program run on arrays (runtime/extents.py): the feeds copied into its IO buffers, the outputs
        asked for copied into new arrays, except those its native calls read or write in place (runtime/feeds.py;
        the context counts the copies); no session tensor is made per shape."""
        info = g._child(feeds).out_info  # the feeds' types and shapes are checked by execute, before anything runs
        outs = {n: np.empty(info[n].shape, dtypes.dtype_of(info[n].dtype)) for n in names}
        for n, shape in g.execute(feeds, outs, fresh_outputs=True).items():  # (data-dependent sizes: real shapes)
            if n in outs:
                outs[n] = np.ascontiguousarray(outs[n][tuple(slice(0, d) for d in shape)])
        counters = self._counters
        counters["session_runs"] += 1
        return [outs[n] for n in names]

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
            inputs = v.carry(binding._inputs) if v.carriers else binding._inputs
            if v.ranged is not None and v.shapes_for(inputs):
                self._cache.keep_only(self._io_keys())
            cache, pin = self._cache, self._pinning
            lent = binding._lent
            for t in lent:  # session output tensors of this binding's previous run go back to the cache first
                cache.release(t)
            lent.clear()
            own_in = v.own_in
            try:
                for i, info in enumerate(v.inputs):
                    x = inputs[info.name]
                    if x.__class__ is Tensor:
                        self._check_tensor(info, v.in_dt[i], x, "input", v.in_shapes[i])  # e.g. destroyed since
                    else:
                        _check_array(info, v.in_dt[i], x, "input", v.in_shapes[i])
                        t = own_in[i] = cache.acquire(v.in_shapes[i], v.in_dt[i], v.last_in[i] if pin else None)
                        t.write(x)
                        self._counters["copies_in"] += 1
                        v.last_in[i] = x = t
                    v.cur_in[i] = x
                for i, info in enumerate(v.outputs):
                    y = binding._outputs.get(info.name)
                    if y is None:  # a session tensor, the binding's until its next run (or its deletion)
                        y = cache.acquire(v.out_shapes[i], v.out_dt[i], v.last_out[i] if pin else None)
                        lent.append(y)
                        v.last_out[i] = y
                    else:
                        self._check_tensor(info, v.out_dt[i], y, "output", v.out_shapes[i])
                    v.cur_out[i] = y
                    binding._results[info.name] = y
                v.execute()
                binding._shapes = v.shapes
                self._counters["session_runs"] += 1
            finally:  # input copies are not needed after the run: back to the cache at once
                for i, t in enumerate(own_in):
                    if t is not None:
                        cache.release(t)
                        own_in[i] = None

    @property
    def stats(self) -> Counter[str]:
        """Session counters (runs, copies, plans, compile cache, shape variants), tensor-cache counters
        (hits, misses, created, destroyed, evicted, pruned, bytes held) and the contexts' counters (recordings,
        memory handles: freed variants' included). Memory by category is what the variants compiled now hold:
        `weights_bytes` and `weights_prepacked_bytes` count each weight shared by several variants once."""
        total = held_stats(self._retired, [ctx for v in self._variants.values() for ctx in v.contexts],
                           None if self._compiler is None else self._compiler.store)
        for v in self._variants.values():  # a chain's one spill-fill buffer and the tensors between its parts
            if v.group is not None:
                total["alloc_spillfill_bytes"] += v.group.buffer.nbytes if v.group.buffer is not None else 0
                total["alloc_chain_bytes"] += getattr(v.group, "chain_bytes", 0)
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
            self._current = None
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

    def _check_tensor(self, info: TensorInfo, dt: np.dtype, t: Tensor, role: str,
                      shape: tuple[int, ...] | None = None) -> None:
        if t.session is not self:
            raise RegistrationError(f"{role} {info.name!r}: the Tensor belongs to another session")
        t._check()
        shape = info.shape if shape is None else shape
        if t.shape != shape or t.dtype != dt:
            raise ShapeError(f"{role} {info.name!r} expects {dt}{list(shape)}, "
                             f"got a Tensor {t.dtype}{list(t.shape)}")

    def _io_keys(self) -> set[tuple[tuple[int, ...], str]]:
        return set().union(*(v.io_keys() for v in self._variants.values()))

    @staticmethod
    def _check_outputs(v: Variant, output_names: Sequence[str]) -> Sequence[str]:
        for n in output_names:
            if n not in v.out_info:
                raise ShapeError(f"no output {n!r}; outputs are {v.all_outputs}")
        return output_names


def _check_array(info: TensorInfo, dt: np.dtype, value: Any, role: str, shape: tuple[int, ...] | None = None) -> None:
    if not isinstance(value, np.ndarray):
        raise ShapeError(f"{role} {info.name!r} must be a numpy.ndarray or a ctxrt.Tensor, "
                         f"got {type(value).__name__}")
    shape = info.shape if shape is None else shape
    if value.shape != shape or value.dtype != dt:
        raise ShapeError(f"{role} {info.name!r} expects {dt}{list(shape)}, got {value.dtype}{list(value.shape)}")


def _boolean(v: Any) -> bool:
    """A remembered bool (VariantCompiler.remembered's decode)."""
    if not isinstance(v, bool):
        raise ValueError(f"not a bool: {v!r}")
    return v


__all__ = ["InferenceSession", "IOBinding", "NodeArg", "Tensor"]
