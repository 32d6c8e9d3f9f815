"""Range programs: one compile valid for every shape inside given ranges of a model's dynamic dims
(docs/shapes-and-control-flow.md), as TensorRT's optimization profiles are.

The model is compiled with ctxrt's static pipeline at a few *probe* points of the ranges: the upper bound U (every
dim at its maximum; the program's arena is planned there), U - 1 and U - e_j for all dims but the last, then one
or two points to verify. The programs must have the same structure (kernels, storage, fusions, layouts); every
integer that differs between them (a tensor's extent, a Reshape target or Slice bound folded from a Shape chain, a
small integer constant such as Range's limit or Trilu's k) is fitted as an affine function of the dims with integer
coefficients (where a check point refutes that, as a multilinear polynomial over every corner of the box
{U, U - 1}^k) and evaluated at run time from the feeds' shapes. A constant that depends on a dim in
any other way (a mask or a positional slice folded at compile time) is not folded: the nodes making it run as
kernels, and the probes are compiled again. Sizes must not grow when a dim shrinks, so every tensor fits the
arena planned at U.

At run time, a graph with ranges builds, per distinct set of dim values, the kernels of the steps whose shapes
or attributes changed (the others are the upper bound's), bound to views at the same arena offsets: no compile.
"""

from __future__ import annotations

import ast
import contextlib
import itertools
import math
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from ctxrt.compiler import floors as strided
from ctxrt.compiler.floors import MAX_FLOORS
from ctxrt.compiler.program import ARENA, CONST, Body, CompiledGraph, Ref, Step, TensorInfo
from ctxrt.errors import CtxrtError, ShapeError
from ctxrt.ir import memo

if TYPE_CHECKING:
    from ctxrt.backends import Backend
    from ctxrt.tuning.tuner import Tuner

MAX_DIMS = 4  # dynamic dims of one range program (its probes: k + 2 or k + 3 compiles, 2^k + 1 at most)
_DYN_CONST_MAX = 64  # integer constants up to this many elements may vary with the dims (fitted per element)
_KEEP_ROUNDS = 8


class RangeError(CtxrtError):
    """The model cannot be compiled as one program for these ranges (the reason says why). `splits`: per dim
    name, sizes where a piece of the program starts (a clamp, a comparison of a dim with a constant): between
    them the ranges may compile (a session splits its range there, runtime/session.py)."""

    def __init__(self, message: str, splits: Mapping[str, Iterable[int]] | None = None) -> None:
        super().__init__(message)
        self.splits = {k: sorted(v) for k, v in (splits or {}).items() if v}


class _Unreadable(RangeError):
    """A program follows a dim that none of its inputs has as an extent; `names`: the model values folded into
    its integer constants that follow that dim."""

    def __init__(self, message: str, dim: int, names: frozenset[str] = frozenset()) -> None:
        super().__init__(message)
        self.dim, self.names = dim, names


class _Lattice(RangeError):
    """Strided nodes' lengths follow dims of the ranges (compiler/floors.py): the probes start again on a lattice."""

    def __init__(self, forms: dict[int, list[tuple[int, int]]], steps: dict[int, int], unknown: set[int],
                 least: dict[int, int]) -> None:
        super().__init__("strided lengths")
        self.forms, self.steps, self.unknown, self.least = forms, steps, unknown, least


class _Refuted(RangeError):
    """A check point refutes the fit; `single`: every integer it refutes follows one dim only at the probes (not
    a product of dims: a fit over every corner would be refuted too); `follows`: the names of the dims they
    follow (a session ranges the others: runtime/session.py)."""

    def __init__(self, message: str, single: bool, follows: frozenset[str] = frozenset()) -> None:
        super().__init__(message)
        self.single, self.follows = single, follows


@dataclass
class Ranges:
    """A compiled graph's dynamic dims and how its integers depend on them (stored in the context binary).

    `dims`: (name, lo, hi) each; `readers`: per dim, the (input index, axis) whose extent is that dim;
    `entries`: (where, coefficients) per integer that varies, `where` one of ["in"|"out", step, input or output
    index, axis], ["attr", step, key, index path...], ["const", step, input index, flat index], ["I"|"O", io index,
    axis]; the coefficients are over the monomials of the dims (bit j of a monomial's index: dim j is a factor)."""

    dims: list[tuple[str, int, int]]
    readers: list[tuple[int, int]]
    entries: list[tuple[list[Any], list[int]]]
    # the model values left unfolded because they follow the dims (compile time only: not stored)
    keep: frozenset[str] = frozenset()
    widened: bool = False  # made from a narrower program's fit (compile_ranges's `prior`): two compiles
    # per dim, the step its sizes take (empty: every dim 1); a stepped dim's `dims` bounds and the values the
    # program takes are its sizes / step (the extent its reader reads is step times that)
    steps: tuple[int, ...] = ()
    # derived dims, each (dim j, a, s): floor((size of dim j + a) / s), a strided conv's or pool's output length
    # along a dim (`_floor_families`); the coefficients are over the monomials of the dims then these, in order
    floors: tuple[tuple[int, int, int], ...] = ()
    # the monomials the coefficients are over (bit j: dim or derived dim j a factor); empty: every monomial of the
    # dims, in order (a program with derived dims lists the few its integers use: 2^(dims + derived dims) would
    # be thousands)
    basis: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        k = len(self.dims) + len(self.floors)
        self._basis = self.basis or tuple(range(1 << k))
        self._coeffs = np.array([c for _, c in self.entries], np.int64).reshape(len(self.entries), len(self._basis))
        # (each monomial of the basis as the indices of its factors: `evaluate` of a program with derived dims)
        self._factors = [[j for j in range(k) if m >> j & 1] for m in self._basis] if self.basis else None
        self._by_step: dict[int, list[int]] = {}
        for i, (where, _) in enumerate(self.entries):
            if where[0] not in ("I", "O"):
                self._by_step.setdefault(int(where[1]), []).append(i)
        # a step's entries as one slice of the values where they are contiguous (as compile_ranges writes them)
        self._slices = {k: (idx[0], idx[-1] + 1) for k, idx in self._by_step.items()
                        if idx == list(range(idx[0], idx[-1] + 1))}
        self._io = [i for i, (where, _) in enumerate(self.entries) if where[0] in ("I", "O")]
        names = self.names()
        self._in_axes: dict[int, dict[int, str]] = {}  # input -> its axes that follow the dims -> their formula
        for where, coeffs in self.entries:
            if where[0] == "I":
                self._in_axes.setdefault(int(where[1]), {})[int(where[2])] = _expression_of(coeffs, names,
                                                                                              self._basis)
        self._steps = self.steps or (1,) * len(self.dims)  # (bind's, every run)
        self._fixed_axes: tuple[Any, list[tuple[int, list[tuple[int, int]]]]] = (None, [])  # bind's, per inputs
        self._last_bound: tuple[Any, tuple[Any, ...], tuple[int, ...]] = (None, (), ())  # bind's last (inputs, shapes)

    def names(self) -> list[str]:
        """The dims' names, then each derived dim's as an expression of its dim (`floors`)."""
        names = [d[0] for d in self.dims]
        return names + [f"(({names[j]} + {a}) // {s})" if a else f"({names[j]} // {s})" for j, a, s in self.floors]

    def extend(self, dims: Sequence[int]) -> tuple[int, ...]:
        """The dims' values then the derived dims' (`floors`) at them."""
        if not self.floors or len(dims) != len(self.dims):
            return tuple(dims)
        return (*dims, *((int(dims[j]) + a) // s for j, a, s in self.floors))

    def step_of(self) -> list[int]:
        """Each dim's step (1 where none)."""
        return list(self._steps)

    def natural(self) -> list[tuple[str, int, int, int]]:
        """Each dim as its sizes go: (name, min size, max size, step)."""
        return [(n, lo * s, hi * s, s) for (n, lo, hi), s in zip(self.dims, self.step_of(), strict=True)]

    def to_meta(self) -> dict[str, Any]:
        """As docs/format.md stores it: a stepped dim [name, min size, max size, step] (its sizes, not steps)."""
        meta = {"dims": [[n, lo, hi, s] if s > 1 else [n, lo, hi] for n, lo, hi, s in self.natural()],
                "readers": [list(r) for r in self.readers],
                "entries": [[list(w), list(c)] for w, c in self.entries]}
        if self.floors:
            meta["floors"] = [list(f) for f in self.floors]
        if self.basis:
            meta["basis"] = list(self.basis)
        return meta

    # -- run time ------------------------------------------------------------------------------------------
    def bind(self, inputs: Sequence[TensorInfo], shapes: Sequence[tuple[int, ...] | None]) -> tuple[int, ...]:
        """The dims' values read from the feeds' shapes (in input order), checked against the ranges; a
        ShapeError names the dim, its value and its range. (The last shapes bound are remembered: a run checks its
        feeds against a program's ranges up to three times, silero VAD's ~3 us each.)"""
        key = tuple(s if s.__class__ is tuple or s is None else tuple(s) for s in shapes)
        last = self._last_bound
        if last[0] is inputs and last[1] == key:
            return last[2]
        values = []
        for (name, lo, hi), (i, axis), step in zip(self.dims, self.readers, self._steps, strict=True):
            shape = shapes[i]
            if shape is None or axis >= len(shape):
                raise ShapeError(f"input {inputs[i].name!r} expects rank {len(inputs[i].shape)}, got shape "
                                 f"{None if shape is None else list(shape)}")
            d = int(shape[axis])
            if step != 1:  # a stepped dim: the program takes size / step
                if d % step or not lo <= d // step <= hi:
                    raise ShapeError(f"input {inputs[i].name!r} axis {axis} (dim {name!r}) is {d}, outside the "
                                     f"sizes {lo * step}..{hi * step} in steps of {step} this program was compiled "
                                     "for")
                d //= step
            elif not lo <= d <= hi:
                raise ShapeError(f"input {inputs[i].name!r} axis {axis} (dim {name!r}) is {d}, outside the range "
                                 f"{lo}..{hi} this program was compiled for")
            values.append(d)
        of, fixed = self._fixed_axes
        if of is not inputs:  # per input: its rank and its axes that do not follow the dims, made once
            fixed = [(len(t.shape), [(a, u) for a, u in enumerate(t.shape) if a not in self._in_axes.get(i, {})])
                     for i, t in enumerate(inputs)]
            self._fixed_axes = (inputs, fixed)
        for i, (t, shape) in enumerate(zip(inputs, shapes, strict=True)):  # the axes that do not follow the dims
            rank, static = fixed[i]
            if shape is None or len(shape) != rank or any(shape[a] != u for a, u in static):
                varying = self._in_axes.get(i, {})
                want = [varying.get(a, u) for a, u in enumerate(t.shape)]
                raise ShapeError(f"input {t.name!r} expects shape {want}, got "
                                 f"{None if shape is None else list(shape)}")
        self._last_bound = (inputs, key, tuple(values))
        return self._last_bound[2]

    def evaluate(self, dims: Sequence[int]) -> np.ndarray:
        """Every varying integer at these dims' values (the derived dims' added where not given)."""
        if self._factors is None:
            return self._coeffs @ _monomials(dims)
        ext = self.extend(dims)
        return self._coeffs @ np.array([math.prod(ext[j] for j in f) for f in self._factors], np.int64)

    def monomial_masks(self, i: int) -> list[int]:
        """The monomials (bit j: dim or derived dim j a factor) integer `i` has a nonzero coefficient for."""
        return [self._basis[c] for c in np.flatnonzero(self._coeffs[i]).tolist()]

    def specialize(self, g: CompiledGraph, dims: Sequence[int], made: Mapping[tuple[int, tuple[int, ...]], Step]
                   ) -> tuple[CompiledGraph, list[int], dict[int, tuple[int, ...]], dict[tuple[int, int], list[Any]]]:
        """(g's program at these dim values, the index in g of each of its steps, the values of the varying
        integers of each step that has any (by index in g), the elements (flat index, value) of the varying
        integer constants by (step in g, input index)). `made`: steps specialized before, by (index, values).
        Steps whose outputs are all empty are dropped (nothing to compute); every arena place is the upper
        bound's."""
        vals = self.evaluate(dims).tolist()
        io = {"I": [list(t.shape) for t in g.inputs], "O": [list(t.shape) for t in g.outputs]}
        for i in self._io:
            kind, index, axis = self.entries[i][0]
            io[kind][index][axis] = vals[i]
        consts: dict[tuple[int, int], list[Any]] = {}
        steps: list[Step] = []
        origin: list[int] = []
        keys: dict[int, tuple[int, ...]] = {}
        by_step, entries, slices = self._by_step, self.entries, self._slices
        for k, step in enumerate(g.steps):
            idx = by_step.get(k)
            if idx is not None:
                cut = slices.get(k)
                key = keys[k] = tuple(vals[cut[0]:cut[1]]) if cut is not None else tuple([vals[i] for i in idx])
                known = made.get((k, key))
                if known is None:
                    step = _apply(step, [(entries[i][0], v) for i, v in zip(idx, key, strict=True)], consts, k)
                else:
                    step = known
                    for i, v in zip(idx, key, strict=True):
                        if entries[i][0][0] == "const":
                            consts.setdefault((k, entries[i][0][2]), []).append((entries[i][0][3], v))
                if all(0 in r.shape for r in step.outputs) and step.outputs:
                    continue
            steps.append(step)
            origin.append(k)
        inputs = [TensorInfo(t.name, tuple(s), t.dtype, t.mem_type) for t, s in zip(g.inputs, io["I"], strict=True)]
        outputs = [TensorInfo(t.name, tuple(s), t.dtype, t.mem_type) for t, s in zip(g.outputs, io["O"], strict=True)]
        child = replace(g, inputs=inputs, outputs=outputs, steps=steps, ranges=None)
        return child, origin, keys, consts


def io_dims(meta: Mapping[str, Any], inputs: Sequence[Any], outputs: Sequence[Any]
            ) -> tuple[list[list[int | str]], list[list[int | str]]]:
    """The IO shapes of a range program (META's graph entry `ranges`, IO as META lists them), each dim that
    follows the ranges named: a dim's own name, or an expression such as `past_sequence + sequence`."""
    names = [d[0] if len(d) < 4 else f"({d[0]} / {d[3]})" for d in meta["dims"]]  # (a stepped dim's program dim)
    names += [f"(({names[j]} + {a}) // {s})" if a else f"({names[j]} // {s})" for j, a, s in meta.get("floors", ())]
    basis = meta.get("basis") or range(1 << len(names))
    dims = [[list(t["shape"]) for t in inputs], [list(t["shape"]) for t in outputs]]
    for where, coeffs in meta["entries"]:
        if where[0] in ("I", "O"):
            text = _expression_of(coeffs, names, basis)
            for d in meta["dims"]:  # its reader's extent: the dim's own name
                if len(d) > 3:
                    text = re.sub(rf"^{d[3]} \* \({re.escape(str(d[0]))} / {d[3]}\)$", str(d[0]), text)
            dims[where[0] == "O"][where[1]][where[2]] = text
    return dims[0], dims[1]


def _expression_of(coeffs: Sequence[int], names: Sequence[str], basis: Sequence[int] | None = None) -> str:
    terms = []
    for i, c in enumerate(coeffs):
        if not c:
            continue
        s = basis[i] if basis is not None else i
        factors = [n for j, n in enumerate(names) if s >> j & 1]
        if not factors:
            terms.append(str(c))
        else:
            terms.append(" * ".join(([str(c)] if c != 1 else []) + factors))
    return " + ".join(terms).replace("+ -", "- ") or "0"


def _monomials(dims: Sequence[int]) -> np.ndarray:
    """The products of the dims' subsets, subset s at index s (bit j: dims[j] a factor); made in Python lists,
    not element by element in NumPy (a range program's run evaluates them at every new set of dims)."""
    m = [1]
    for d in dims:
        m += [x * int(d) for x in m]
    return np.array(m, np.int64)


def _apply(step: Step, changes: list[tuple[list[Any], int]], consts: dict[tuple[int, int], list[tuple[int, int]]],
           k: int) -> Step:
    ins = [None if r is None else list(r.shape) for r in step.inputs]
    outs = [list(r.shape) for r in step.outputs]
    attrs = None
    bodies: dict[tuple[Any, ...], list[tuple[list[Any], int]]] = {}  # a control-flow body's integers, by its path
    for where, v in changes:
        kind = where[0]
        if kind == "in":
            ins[where[2]][where[3]] = v
        elif kind == "out":
            outs[where[2]][where[3]] = v
        elif kind == "attr":
            if attrs is None:
                attrs = _copy(step.attrs)
            n = _body_at(step.attrs, where[2:])
            if n:
                bodies.setdefault(tuple(where[2:2 + n]), []).append((where[2 + n:], v))
            else:
                _set(attrs, where[2:], v)
        else:  # an element of a small integer constant
            consts.setdefault((k, where[2]), []).append((where[3], v))
    for path, body_changes in bodies.items():
        _set(attrs, path, _apply_body(_get(step.attrs, path), body_changes))
    if step.op == "Softmax" and step.attrs.get("kernel") == "onednn":  # a primitive per shape costs more than
        attrs = {k: v for k, v in (attrs or step.attrs).items() if k not in ("kernel", "threads")}  # it saves
    new_in = [None if r is None else Ref(r.space, r.key, r.offset, tuple(s), r.dtype)
              for r, s in zip(step.inputs, ins, strict=True)]
    new_out = [Ref(r.space, r.key, r.offset, tuple(s), r.dtype) for r, s in zip(step.outputs, outs, strict=True)]
    return Step(step.op, step.name, step.attrs if attrs is None else attrs, new_in, new_out, step.scratch,
                step.algorithm, step.backend, step.params)


def filled(constant: np.ndarray, elements: Iterable[tuple[int, int]]) -> np.ndarray:
    """A copy of a small integer constant with the elements (flat index, value) that follow the dims set."""
    array = np.array(constant)
    flat = array.reshape(-1)
    for j, v in elements:
        flat[j] = v
    return array


def _apply_body(body: Body, changes: list[tuple[list[Any], int]]) -> Body:
    """A control-flow body at new values of its integers (places relative to the body, as a program's: "I", "O",
    "in", "out", "attr"); its arena places and size stay the upper bound's."""
    io = {"I": [list(t.shape) for t in body.inputs], "O": [list(t.shape) for t in body.outputs]}
    per_step: dict[int, list[tuple[list[Any], int]]] = {}
    for where, v in changes:
        if where[0] in io:
            io[where[0]][where[1]][where[2]] = v
        else:
            per_step.setdefault(int(where[1]), []).append((where, v))
    steps = [_apply(s, per_step[k], {}, k) if k in per_step else s for k, s in enumerate(body.steps)]
    return Body([TensorInfo(t.name, tuple(d), t.dtype, t.mem_type) for t, d in zip(body.inputs, io["I"], strict=True)],
                [TensorInfo(t.name, tuple(d), t.dtype, t.mem_type) for t, d in zip(body.outputs, io["O"], strict=True)],
                steps, body.arena_size, body.alignment)


def _body_at(attrs: Any, path: Sequence[Any]) -> int:
    """How many leading elements of an attribute path name a control-flow body (0: none, the path is an
    attribute's integer)."""
    obj = attrs
    for n, p in enumerate(path):
        if isinstance(obj, Body):
            return n
        obj = obj[p]
    return 0


def _get(obj: Any, path: Sequence[Any]) -> Any:
    for p in path:
        obj = obj[p]
    return obj


def _copy(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _copy(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_copy(x) for x in v]
    return v


def _set(obj: Any, path: Sequence[Any], v: int) -> None:
    for p in path[:-1]:
        obj = obj[p]
    obj[path[-1]] = v


# -- compile time ------------------------------------------------------------------------------------------

DimSpec = Mapping[str, Any]  # name or "INPUT:AXIS" -> (lo, hi) | "lo:hi" | [lo, hi]


def parse_range(value: Any, what: str) -> tuple[int, int]:
    """(lo, hi) from (lo, hi), [lo, hi] or "lo:hi" (or with a step: (lo, hi, step), "lo:hi:step", `parse_step`)."""
    return parse_stepped(value, what)[:2]


def parse_step(value: Any, what: str) -> int:
    """The step of a range (1 unless given: (lo, hi, step) or "lo:hi:step", every size a multiple of it)."""
    return parse_stepped(value, what)[2]


def parse_stepped(value: Any, what: str) -> tuple[int, int, int]:
    try:
        parts = [int(x) for x in (value.split(":") if isinstance(value, str) else value)]
    except (ValueError, TypeError):
        parts = []
    if len(parts) not in (2, 3):
        raise CtxrtError(f"dim {what!r}: a range is MIN:MAX (two integers) or MIN:MAX:STEP, got {value!r}")
    lo, hi, step = (*parts, 1)[:3]
    if not 0 <= lo <= hi:
        raise CtxrtError(f"dim {what!r}: range {lo}:{hi} must have 0 <= MIN <= MAX")
    if step < 1 or lo % step or hi % step:
        raise CtxrtError(f"dim {what!r}: range {lo}:{hi}:{step}: MIN and MAX must be multiples of a STEP >= 1")
    return lo, hi, step


def resolve(declared: Sequence[tuple[str, Any, Any]], dims: DimSpec, shapes: Mapping[str, Iterable[int]] | None
            ) -> tuple[list[tuple[str, int, int]], dict[str, list[Any]]]:
    """The dims (name, lo, hi) and, per input, each axis as an int (static), ("d", dim index) (("d", dim index,
    step) for a stepped dim, whose lo and hi are then in steps: the program's dim is the size / step), or an
    expression over dim names (a derived dim such as `past + sequence`, as the dynamo exporter writes them)."""
    shapes = {k: list(v) for k, v in (shapes or {}).items()}
    ranges: dict[str, tuple[int, int]] = {}
    by_axis: dict[tuple[str, int], str] = {}
    names = {n for n, _, _ in declared}
    derived: dict[str, str] = {}
    steps: dict[str, int] = {}
    for key, value in dims.items():
        if is_expression(value):
            derived[key] = value  # a dim that follows others: "past_sequence_length + sequence_length"
            continue
        lo, hi, step = parse_stepped(value, key)
        ranges[key] = (lo // step, hi // step)  # (a stepped dim's program takes size / step: docs/format.md)
        if step > 1:
            steps[key] = step
        if ":" in key and key.rsplit(":", 1)[0] in names:
            inp, axis = key.rsplit(":", 1)
            try:
                by_axis[(inp, int(axis))] = key
            except ValueError:
                raise CtxrtError(f"dim {key!r}: INPUT:AXIS needs an integer axis") from None
    fixed = {k: lo * steps.get(k, 1) for k, (lo, hi) in ranges.items() if lo == hi}  # one value: a static dim
    order = [k for k in ranges if k not in fixed]
    ranks = {n: len(d) for n, _, d in declared if d is not None}
    for (inp, axis), key in by_axis.items():
        if inp in ranks and not 0 <= axis < ranks[inp]:
            raise CtxrtError(f"dim {key!r}: input {inp!r} has no axis {axis} (rank {ranks[inp]})")
    symbolic = {d for _, _, dd in declared for d in dd or () if isinstance(d, str)}
    unknown = [k for k in [*ranges, *derived] if k not in symbolic and k not in by_axis.values()]
    bad = [f"{k}={v!r}" for k, v in derived.items() if not _expression(v, ranges)]
    if bad:
        raise CtxrtError(f"dims {bad}: an expression of other dims with ranges (+, -, *, // and integers)")
    if unknown:
        raise CtxrtError(f"dims {unknown} are not dims of the model's inputs "
                         f"(inputs: {[(n, d) for n, _, d in declared]})")
    if len(order) > MAX_DIMS:
        raise RangeError(f"{len(order)} dynamic dims given ({order}); a range program takes at most {MAX_DIMS}")
    layout: dict[str, list[Any]] = {}
    used: set[str] = set()
    for name, _, decl in declared:
        if name in shapes:
            layout[name] = [int(d) for d in shapes[name]]
            continue
        if decl is None:
            raise RangeError(f"input {name!r} has no declared rank: give its shape")
        axes: list[Any] = []
        for axis, d in enumerate(decl):
            key = by_axis.get((name, axis))
            if key is None and isinstance(d, str) and d in ranges:
                key = d
            if key is not None and key in fixed:
                axes.append(fixed[key])
                used.add(key)
            elif key is not None:
                axes.append(("d", order.index(key), steps[key]) if key in steps else ("d", order.index(key)))
                used.add(key)
            elif isinstance(d, int) and d >= 0:
                axes.append(d)
            elif isinstance(d, str) and d in derived and _expression(derived[d], ranges):
                axes.append(derived[d])
                used |= _names(derived[d]) & ranges.keys() | {d}
            elif isinstance(d, str) and _expression(d, ranges):
                axes.append(d)
                used |= _names(d) & ranges.keys()
            else:
                raise RangeError(f"input {name!r} axis {axis} ({d!r}) has no range and no shape: give it one "
                                 f"(a range on {d!r} or {name}:{axis}, or a shape for {name!r})")
        layout[name] = axes
    unused = [k for k in [*ranges, *derived] if k not in used]
    if unused:
        raise CtxrtError(f"dims {unused} are not dims of the model's inputs "
                         f"(inputs: {[(n, d) for n, _, d in declared]})")
    if not order:
        raise RangeError(f"every dim given has one value ({fixed}): give them as shapes")
    return [(k, *ranges[k]) for k in order], layout


_DIM_NAME = re.compile(r"[A-Za-z_][\w.]*(?:\[\d+\])?")  # (NAME[J]: element J of a value input ranged)


def is_dim_name(value: Any) -> bool:
    """A model's symbolic dim that names a dim of its own ("batch", paddle2onnx's "p2o.DynamicDimension.0"), not an
    expression of others ("past_sequence + sequence")."""
    return isinstance(value, str) and _DIM_NAME.fullmatch(value) is not None


def is_expression(value: Any) -> bool:
    """A dim given as an expression of other dims ("past + sequence") rather than a range."""
    return isinstance(value, str) and any(c.isalpha() or c == "_" for c in value)


def _names(expr: str) -> set[str]:
    try:
        return {n.id for n in ast.walk(ast.parse(expr, mode="eval")) if isinstance(n, ast.Name)}
    except SyntaxError:
        return set()


def _expression(expr: str, ranges: Mapping[str, Any]) -> bool:
    names = _names(expr)
    return bool(names) and names <= ranges.keys()


def _eval(expr: str, env: Mapping[str, int]) -> int:
    def ev(n: ast.AST) -> int:
        if isinstance(n, ast.Expression):
            return ev(n.body)
        if isinstance(n, ast.Name):
            return int(env[n.id])
        if isinstance(n, ast.Constant) and isinstance(n.value, int):
            return int(n.value)
        if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Add | ast.Sub | ast.Mult | ast.FloorDiv):
            a, b = ev(n.left), ev(n.right)
            return {ast.Add: a + b, ast.Sub: a - b, ast.Mult: a * b}.get(type(n.op), a // b if b else 0)
        raise RangeError(f"dim expression {expr!r}: only +, -, * and // of dims and integers are understood")
    return ev(ast.parse(expr, mode="eval"))


def compile_ranges(model: Any, dims: DimSpec, backend: Backend, name: str = "main",
                   shapes: Mapping[str, Iterable[int]] | None = None, values: Mapping[str, Any] | None = None,
                   feeds: Mapping[str, Any] | None = None, options: Mapping[str, Any] | None = None,
                   tuner: Tuner | None = None, prior: Ranges | None = None) -> tuple[CompiledGraph, dict[str, Any]]:
    """One ONNX model compiled as a range program: (the program at the upper bound with its `ranges`, its
    constants). RangeError when the model's programs differ in structure between shapes of the ranges.

    `prior`: the ranges of the same model's program for narrower ranges of the same dims (a session widening
    them): its fit is checked at the new upper bound U and at U - 1 (two compiles, not k + 2 or more); where it does not
    hold there, the ranges are fitted anew."""
    from ctxrt.frontend.carriers import value_ranges
    from ctxrt.frontend.onnx import load_model

    with memo.shared():  # every probe lowers the same proto (the file is not read and parsed again; nor by a
        # session's next attempt, ir/memo.py) and shares its arrays, transposed and prepacked weights
        source, model = model, memo.memo("loaded", model, None, lambda: load_model(model))
        # value inputs ranged (`dims` naming them): the model rewritten to take them as lengths (frontend/carriers.py)
        model, carried = value_ranges(model, dims, values)
        if not carried and isinstance(source, str | os.PathLike):  # its file's declared IO (kept per file: the
            from ctxrt.frontend.io_types import declared_io  # session that opened it read it already)

            memo.memo("declared_io", model, None, lambda: declared_io(source))
        if carried:
            values = {k: v for k, v in (values or {}).items() if k not in {r[0] for r in carried}}
        try:
            graph, weights = _compile_ranges(model, dims, backend, name, shapes, values, feeds, options, tuner,
                                             prior)[0]
        except RangeError as e:  # where pieces start, in sizes (a stepped dim's program takes size / step)
            e.splits = {n: [c * (parse_step(dims[n], n) if n in dims and not is_expression(dims[n]) else 1)
                            for c in cuts] for n, cuts in e.splits.items()}
            raise
        graph.carriers = carried
        return graph, weights


def compile_ranges_split(model: Any, dims: DimSpec, backend: Backend, k: int,
                         options: Mapping[str, Any] | None = None, tuner: Tuner | None = None
                         ) -> list[tuple[CompiledGraph, dict[str, Any]]]:
    """One ONNX model cut into K parts (compiler/split.py, the cuts chosen at the upper bound and kept at every
    probe), each part a range program over the dims it depends on: a split model for every shape of the ranges."""
    from ctxrt.frontend.onnx import load_model

    model = load_model(model)
    with memo.shared():
        return _compile_ranges(model, dims, backend, "main", None, None, None, options, tuner, None, k)


def _compile_ranges(model: Any, dims: DimSpec, backend: Backend, name: str,
                    shapes: Mapping[str, Iterable[int]] | None, values: Mapping[str, Any] | None,
                    feeds: Mapping[str, Any] | None, options: Mapping[str, Any] | None, tuner: Tuner | None,
                    prior: Ranges | None, split: int = 0) -> list[tuple[CompiledGraph, dict[str, Any]]]:
    """The range program(s): one, or with `split` K that many parts of the model."""
    from ctxrt import progress
    from ctxrt.compiler import compile_ir, compile_options, lower_ir, read
    from ctxrt.compiler.split import check_links, cut_bounds, split_graph
    from ctxrt.frontend.io_types import declared_io

    declared, _ = memo.memo("declared_io", model, None, lambda: declared_io(model))  # (once for a session's attempts)
    spec, layout = resolve(declared, dims, shapes)
    fixed = {k: parse_range(v, k)[0] for k, v in dims.items()
             if not is_expression(v) and len(set(parse_range(v, k))) == 1}
    hi = [h for _, _, h in spec]
    alt = [h - 1 if h - 1 >= max(lo, 1) else lo for _, lo, h in spec]

    steps = [1] * len(spec)  # a stepped dim's size is its step times the program's dim (`resolve`)
    for axes in layout.values():
        for a in axes:
            if isinstance(a, tuple) and len(a) > 2:
                steps[a[1]] = a[2]
    if split and any(s > 1 for s in steps):
        raise RangeError("a split model's parts take no stepped ranges")

    def shapes_of(point: Sequence[int]) -> dict[str, list[int]]:
        env = {**fixed, **{n: v * s for (n, _, _), v, s in zip(spec, point, steps, strict=True)}}
        return {n: [point[a[1]] * steps[a[1]] if isinstance(a, tuple) else a if isinstance(a, int) else
                    _eval(a, env) for a in axes] for n, axes in layout.items()}

    # Kernels are chosen once for every shape of the ranges: no choice by size (compiler/ranges.py users: kernels
    # read options["ranges"]).
    options = {**(options or compile_options()), "ranges": True}
    keep: set[str] = set()
    Made = list[tuple[CompiledGraph, dict[str, Any]]]
    cache: dict[tuple[int, ...], tuple[Made, bool]] = {}  # per probe: (its parts' programs and weights, light)
    folded: dict[tuple[int, ...], dict[str, tuple[Any, ...]]] = {}  # per probe: what the frontend folded
    read_only: dict[tuple[int, ...], Any] = {}  # per probe: the frontend's graph not lowered further yet (this keep)
    cuts: dict[frozenset[str], list[int]] = {}  # a split's node bounds, chosen at the first probe of a round

    def light(w: Mapping[str, Any]) -> dict[str, Any]:
        """What a probe's constants are needed for once compared: the small integer ones (fitted)."""
        return {n: a for n, a in w.items() if np.asarray(a).dtype.kind in "iu" and np.asarray(a).size <= _DYN_CONST_MAX}

    def parts_of(graph: Any) -> list[Any]:
        if not split:
            return [graph]
        bounds = cuts.setdefault(frozenset(keep), cut_bounds(graph, split))
        try:
            parts = split_graph(graph, split, bounds)
        except CtxrtError as e:
            raise RangeError(f"the model lowers to other nodes at other shapes of the ranges ({e})") from e
        check_links(graph, parts)
        return parts

    @contextlib.contextmanager
    def probing(key: tuple[int, ...]) -> Iterator[None]:
        """A probe's progress line; its errors say where in the ranges they happened."""
        label = ", ".join(f"{d[0]}={v}" for d, v in zip(spec, key, strict=True))
        with progress.part(f"probe {label}"):
            try:
                yield
            except CtxrtError as e:
                if isinstance(e, RangeError):
                    raise
                # (no local holds the new error: the generator's frame would, and the error's traceback this
                # frame: a cycle that kept a failed compile's probes until a collection, 11 MB at the peak)
                raise _marked(type(e)(f"at {label} (inside the ranges): {e}"), key != tuple(hi)) from e

    def at(point: Sequence[int], full: bool = False) -> Made:
        """The program(s) at a probe point; their weights kept whole only at the upper bound (or when `full`): a
        probe holding a copy of the model's weights each would cost a copy per probe."""
        key = tuple(point)
        if key not in cache or full and key != tuple(hi) and cache[key][1]:
            with probing(key):
                graph = read_only.pop(key, None)
                graph = lower_ir(front(point) if graph is None else graph, backend, options)
                top = key == tuple(hi)  # the program that runs; the other probes are only compared
                # (the others read weights in its formats: oneDNN would choose another at a smaller image, and the
                # program that runs reads its own at every shape)
                upper = [] if top or tuple(hi) not in cache else [s for g, _ in cache[tuple(hi)][0] for s in g.steps]
                hints = {"weights_tags": {s.name: s.attrs["weights_tag"] for s in upper
                                          if isinstance(s.attrs.get("weights_tag"), str)},
                         "algorithms": {s.name: s.algorithm for s in upper if s.algorithm}}  # (kernels by size)
                made = [compile_ir(part, backend, options if top else {**options, "probe_arena": True, **hints},
                                   tuner if top else None) for part in parts_of(graph)]
                del graph
                whole = full or key == tuple(hi)
                cache[key] = ([(g, w if whole else light(w)) for g, w in made], not whole)
        return cache[key][0]

    def front(point: Sequence[int]) -> Any:
        """The frontend's graph at a probe (what it folded recorded), before the passes."""
        graph = read(model, shapes_of(point), backend, name, values, feeds, frozenset(keep), options)
        folded[tuple(point)] = graph.folded
        small[tuple(point)] = graph.small
        return graph

    def read_first() -> set[str]:
        """The values the frontend folded differently at the upper bound and below it, found by the frontend alone
        (kept, they cost no compile of either probe); the graphs lowered later when nothing was found. Then the
        other probes and the check points are read too: a model that has no graph at a check point (shapes that
        do not fit each other at odd sizes: an image net's feature pyramid), or whose output shapes are refuted
        there (`_outputs_refuted`), fails before any probe is lowered (PP-OCR's detector 1.9 -> 0.55 s to open)."""
        k = len(spec)
        few = checks[:1 if k <= 2 else 2]
        points = [tuple(hi), tuple(alt), *(tuple(alt[i] if i == j else hi[i] for i in range(k)) for j in range(k - 1))]

        def refute(at: list[tuple[int, ...]]) -> None:  # the shapes of the values the model computes (and its
            # outputs), affine over the probes, refuted at the check points `at`
            g = read_only.get(tuple(hi))
            if not at or split or g is None:
                return
            if not lattice:
                strided_dims(at)
            else:  # its lengths are fitted with derived dims (no affine refutation); the derived dims found again
                # at the lattice's points (other residues: a form that held at the first points by chance fails)
                read = {p: read_only[p] for p in (*points, *at) if p in read_only}
                fams = strided.families(read, spec, [j for j, st in enumerate(steps) if st > 1])
                if fams is None or any(fams[0].get(j) != forms[j] for j in lattice):
                    raise RangeError("the strided lengths found at the first probes do not hold on the lattice")
                return
            names = [*g.outputs, *(o for node in g.nodes for o in node.outputs if o and o not in g.outputs)]
            graphs = [read_only.get(p) for p in (*points, *at)]
            if all(x is not None and all(n in x.values and len(x.values[n].shape) == len(g.values[n].shape)
                                         for n in names) for x in graphs):
                outs = {p: [d for n in names for d in x.values[n].shape] for p, x in zip((*points, *at), graphs,
                                                                                       strict=True)}
                try:
                    _outputs_refuted(points, at, outs, spec, [f"{'output' if n in g.outputs else 'value'} {n!r} "
                                                              f"axis {a}" for n in names
                                                              for a in range(len(g.values[n].shape))])
                except _Refuted:  # a clamp or a comparison of a dim that changes piece, where one does: its error
                    pieces_checked(at)  # (which says where the pieces start: a session splits its range there)
                    raise

        def strided_dims(at: list[tuple[int, ...]], early: bool = False) -> None:
            """Strided lengths that follow a dim, found from the points read (three at least): the probes start
            again on its lattice (_Lattice, compiler/floors.py), or the dim is refuted where they are not found.
            `early` (U, U - 1 and a check point only, where two dims may take the same sizes): only the first."""
            read = {p: read_only[p] for p in (*points, *at) if p in read_only}
            fams = strided.families(read, spec, [j for j, st in enumerate(steps) if st > 1])
            found = strided.lattice(fams[0], spec) if fams else {}
            if early and (fams is None or fams[3]):
                return  # (two dims of the same sizes at these points: told apart, or not, by the other probes)
            if fams and fams[1]:  # a dim whose strided lengths no derived dim stands for: not ranged (the session
                # ranges the others), refuted before any probe is lowered
                dims = [spec[j][0] for j in sorted(fams[1])]
                raise _Refuted(f"strided nodes' lengths follow {dims} in a way ctxrt does not fit (no graph at "
                               "some size, or lengths it cannot tell apart)", True, frozenset(dims))
            if found and fams:
                raise _Lattice({j: fams[0][j] for j in found}, found, fams[1], fams[2])

        def pieces_checked(at: list[tuple[int, ...]]) -> None:
            if pieces:
                _check_pieces(pieces, small, folded, points, at, spec, rounds=bool(lattice))
            _check_slices(read_only, points, at, spec)
            _check_resizes(read_only, points, at)
            _check_bounds(read_only, points, at, spec)
        # U, U - 1, the first check point (a check point that has no graph fails early), the other probes, tested
        # at that check point before the second is read (an image net's strided H and W refuted a read sooner)
        order = (*points[:2], *few[:1], *points[2:], *few[1:])
        for n, p in enumerate(order):
            if n == 2:  # the other probes once the values kept are known (a round that keeps more reads again)
                early = _varying_folded(folded.get(tuple(hi), {}), folded.get(tuple(alt), {}), producers) - keep
                if early:
                    return early
            if n == 3 and not lattice and not split and few:  # (U, U - 1 and the first check point read: enough
                strided_dims(few[:1], early=True)  # to find strided lengths, before the other probes are read)
            if n == len(points) + 1:
                refute(few[:1])
            key = tuple(p)
            if key not in cache and key not in read_only:
                with probing(key):
                    read_only[key] = front(p)
        refute(few)
        late = _varying_folded(folded.get(tuple(hi), {}), folded.get(tuple(alt), {}), producers) - keep
        if not late and not split:
            pieces_checked(few)
        return late

    checks = _verify_points(spec, hi, alt)
    producers, pieces = memo.memo("producers", model, None, lambda: _producers(model))
    small: dict[tuple[int, ...], dict[str, Any]] = {}  # per probe: its small constants (`_check_pieces`)
    if prior is not None and [(n, lo) for n, lo, _ in prior.dims] == [(n, lo) for n, lo, _ in spec] and \
            prior.step_of() == [*steps]:
        keep = set(prior.keep)
        try:
            return [_widened(prior, spec, (hi, *at(hi)[0]), (alt, *at(alt)[0]), keep)]
        except RangeError:
            keep = set()
            cache.clear()
    lattice: dict[int, int] = {}  # lattice dims -> their step (strided lengths: compiler/floors.py)
    forms: dict[int, list[tuple[int, int]]] = {}
    unknown: set[int] = set()  # dims strided lengths follow in a way not found (compiler/floors.py)
    least: dict[int, int] = {}  # per lattice dim, the least size every strided output has a frame at
    for _ in range(_KEEP_ROUNDS):
        for _ in range(_KEEP_ROUNDS):
            try:
                early = read_first()
            except _Lattice as e:
                lattice.update(e.steps)
                forms.update(e.forms)
                unknown.update(e.unknown)
                least.update(e.least)
                alt = [hi[j] - lattice[j] if j in lattice else a for j, a in enumerate(alt)]
                checks = strided.check_points(spec, hi, lattice, forms, _verify_points(spec, hi, alt))
                # and U - 2L: three points of the lattice, where a length of another period (a Mod, a Div by 3 in
                # a shape chain) is no affine function, as every derived dim is there
                third = tuple(hi[j] - 2 * lattice[j] if j in lattice else h for j, h in enumerate(hi))
                if all(third[j] >= max(spec[j][1], least.get(j, 1), 1) for j in lattice):
                    checks.append(third)
                top = tuple(hi)  # (the upper bound's read stays: the same point, the same values kept)
                kept = (read_only.get(top), folded.get(top), small.get(top))
                cache.clear()
                read_only.clear()
                folded.clear()
                small.clear()
                if all(x is not None for x in kept):
                    read_only[top], folded[top], small[top] = kept
                continue
            if early:
                keep |= early
                cache.clear()
                read_only.clear()
                continue
            up, below = at(hi), at(alt, full=True)
            grow: set[str] = set()  # (what the frontend folded differently: none, read_first found)
            for (gu, wu), (ga, wa) in zip(up, below, strict=True):
                _same_structure(gu, ga, spec)
                grow |= {_value_of(key) for key in _varying_consts(gu, wu, wa)}
            grow -= keep
            cache[tuple(alt)] = ([(ga, light(wa)) for ga, wa in below], True)
            del below
            if not grow:
                break
            keep |= grow
            cache.clear()
            read_only.clear()
        else:
            raise RangeError(f"constants {sorted(grow)[:4]} still depend on the dims after {_KEEP_ROUNDS} rounds")
        k = len(spec)

        def corner(b: int, k: int = k, alt: list[int] = alt) -> tuple[int, ...]:
            return tuple(hi[j] if not b >> j & 1 else alt[j] for j in range(k))

        if lattice:  # every corner of {U, U - L}, checked off the lattice
            corners = [corner(b) for b in range(1 << k)]
            return [_fit_floors([at(p)[0] for p in corners], corners, [(v, at(v)[0]) for v in checks], spec,
                                frozenset(keep), lattice, forms, hi, unknown, least)]

        def fitted(terms: list[int], points: list[tuple[int, ...]], at_points: list[tuple[int, ...]],
                   kept: frozenset[str] = frozenset(keep)) -> list[tuple[CompiledGraph, dict[str, Any]]]:
            graphs = [at(p) for p in points]
            checked = [(v, at(v)) for v in at_points]
            return [_fit([g[j] for g in graphs], points, [(v, c[j]) for v, c in checked], spec, kept,
                         bool(split), terms, steps) for j in range(len(graphs[0]))]
        try:
            # Affine first, over U, U - 1 (compiled above) and U - e_j for all dims but the last: k + 1 probes,
            # then checked at one point (k = 2) or two (k > 2) that differ from U and U - 1 in every dim, where
            # each product of dims alone would be off (_shows_products): k + 2 or k + 3 probes, not 2^k + 1.
            affine = [0, *(1 << j for j in range(k))]
            points = [corner(0), corner((1 << k) - 1), *(corner(1 << j) for j in range(k - 1))]
            few = checks[:1 if k == 2 else 2]
            if k > 1 and len(few) == (1 if k == 2 else 2) and _shows_products(points, affine, few, k):
                try:
                    return fitted(affine, points, few)
                except _Refuted as e:
                    if e.single:  # not linear in one dim: no product of dims fits it (no corner compiled)
                        raise
                except _Unreadable:
                    raise
                except RangeError:
                    pass  # an integer with a product of the dims (or one that fits nothing): every corner
            return fitted(list(range(1 << k)), [corner(b) for b in range(1 << k)], checks[:1])
        except _Unreadable as e:  # a part uses a dim as a folded integer but has no input to read it from
            if not split or not e.names - keep:
                raise
            keep |= e.names  # computed at run time in the part that reads the dim, passed on as a tensor
            cache.clear()
            read_only.clear()
    raise RangeError(f"the parts still use dims none of their inputs give after {_KEEP_ROUNDS} rounds")


def _fit(graphs: list[tuple[CompiledGraph, dict[str, Any]]], corners: list[tuple[int, ...]],
         verify: list[tuple[tuple[int, ...], tuple[CompiledGraph, dict[str, Any]]]],
         spec: list[tuple[str, int, int]], keep: frozenset[str], reduce: bool, terms: Sequence[int] | None = None,
         steps: Sequence[int] = ()) -> tuple[CompiledGraph, dict[str, Any]]:
    """One program's integers fitted over `corners` (points of the box {U, U - 1}^k) as polynomials over the
    monomials `terms` (default: all, multilinear), integer coefficients, checked at each `verify` point: the upper
    bound's program with its Ranges. `reduce`: a dim none of its integers follows is left out of its ranges (a
    part of a split model that does not depend on it, and has no input to read it from)."""
    for g, _ in graphs[1:]:
        _same_structure(graphs[0][0], g, spec)
    where, top = _integers(*graphs[0])
    x = np.array([top, *(_values(g, w) for g, w in graphs[1:])], np.int64)  # corners x integers
    terms = list(range(1 << len(spec))) if terms is None else list(terms)
    coeffs = _solved(x, corners, len(spec), terms, where, graphs[0][0])
    for point, (gv, wv) in verify:
        _same_structure(graphs[0][0], gv, spec)
        got = np.array(_values(gv, wv), np.int64)
        want = coeffs.T @ _monomials(point)
        if not np.array_equal(got, want):
            bad = where[int(np.argmax(got != want))]
            # each integer the check refutes follows at most one dim at the probes: a polynomial of that dim alone,
            # and not linear in it (a stride's rounding, W // 4), which no product of dims can fit
            refuted = np.flatnonzero(got != want)
            single = all(np.count_nonzero(coeffs[[1 << j for j in range(len(spec))], i]) <= 1 for i in refuted)
            follows = frozenset(spec[j][0] for i in refuted for j in range(len(spec)) if coeffs[1 << j, i])
            raise _Refuted(f"{_label(bad, graphs[0][0])} does not follow the dims linearly (at "
                           f"{dict(zip([d[0] for d in spec], point, strict=True))})", single, follows)
    if reduce:  # the dims this program follows, the monomials over them only
        used = [j for j in range(len(spec)) if coeffs[[m for m in range(1, len(coeffs)) if m >> j & 1]].any()]
        if len(used) < len(spec):
            monomials = [sum(1 << j for t, j in enumerate(used) if m >> t & 1) for m in range(1 << len(used))]
            spec, coeffs = [spec[j] for j in used], coeffs[monomials]
    varying = [i for i in range(len(where)) if coeffs[1:, i].any()]
    entries = [(list(where[i]), [int(c) for c in coeffs[:, i]]) for i in varying]
    gu, wu = graphs[0]
    try:
        readers = _readers(spec, entries, gu, steps)
    except _Unreadable as e:
        raise _Unreadable(str(e), e.dim, frozenset(
            _value_of(gu.steps[w[1]].inputs[w[2]].key) for w, c in entries
            if w[0] == "const" and any(c[m] for m in range(len(c)) if m >> e.dim & 1))) from e
    ranges = Ranges(list(spec), readers, entries, keep, steps=tuple(steps) if any(x > 1 for x in steps) else ())
    check_fits(gu, ranges, spec)
    return replace(gu, ranges=ranges), wu


def _solved(x: np.ndarray, points: Sequence[tuple[int, ...]], k: int, terms: list[int], where: list[Any],
            g: CompiledGraph) -> np.ndarray:
    """The integer coefficients (every monomial of k dims x integers; those outside `terms` 0) of the integers `x`
    (points x integers) solved exactly over `points`; RangeError where one has none."""
    basis = np.array([_monomials(p) for p in points], np.float64)[:, terms]
    # integers the same at every point are constants (monomial 0 is 1): not solved in float64, where one as large
    # as Slice's "to the end" (2^63 - 1, torch's x[..., d:]) would not round back
    coeffs = np.zeros((1 << k, x.shape[1]), np.int64)
    coeffs[0] = x[0]
    moving = np.flatnonzero((x != x[0]).any(0))
    if len(moving):
        coeffs[np.ix_(terms, moving)] = np.rint(np.linalg.solve(basis, x[:, moving].astype(np.float64))
                                                ).astype(np.int64)
    if not np.array_equal(basis.astype(np.int64) @ coeffs[terms], x):
        bad = where[int(np.argmax((basis.astype(np.int64) @ coeffs[terms] != x).any(0)))]
        raise RangeError(f"{_label(bad, g)} is not a polynomial of the dims with integer coefficients")
    return coeffs


def _fit_floors(graphs: list[tuple[CompiledGraph, dict[str, Any]]], corners: list[tuple[int, ...]],
                verify: list[tuple[tuple[int, ...], tuple[CompiledGraph, dict[str, Any]]]],
                spec: list[tuple[str, int, int]], keep: frozenset[str], lattice: Mapping[int, int],
                forms: Mapping[int, list[tuple[int, int]]], hi: Sequence[int], unknown: Iterable[int] = (),
                least: Mapping[int, int] | None = None) -> tuple[CompiledGraph, dict[str, Any]]:
    """One program's integers fitted over the corners of {U, U - L} (each lattice dim j on its lattice of step L,
    compiler/floors.py), written over the dims and the derived dims `forms`, checked at the `verify` points off the
    lattice: the upper bound's program with its Ranges (its lattice dims' lower bounds raised to the least size where
    no extent is negative and every strided node's output has a frame, `least`: the model has no graph below it).
    `unknown`: dims strided lengths follow in a way not found, which a refutation names (a session then ranges the
    others)."""
    gu, wu = graphs[0]
    for g, _ in [*graphs[1:], *(gv for _, gv in verify)]:
        _same_structure(gu, g, spec)
    where, _ = _integers(gu, wu)
    x = np.array([_values(g, w) for g, w in graphs], np.int64)
    k = len(spec)
    rest = {j: hi[j] % step for j, step in lattice.items()}
    on = [tuple((p[j] - rest[j]) // lattice[j] if j in lattice else p[j] for j in range(k)) for p in corners]
    coeffs = _solved(x, on, k, list(range(1 << k)), where, gu)
    derived = [(j, a, s) for j in sorted(lattice) for a, s in forms[j]]
    if len(derived) > MAX_FLOORS:
        raise RangeError(f"{len(derived)} strided lengths follow the dims; a range program takes at most {MAX_FLOORS}")
    names = [d[0] for d in spec]

    def extended(point: Sequence[int]) -> tuple[int, ...]:
        return (*point, *((point[j] + a) // s for j, a, s in derived))
    checked = [(extended(v), np.array(_values(gv, wv), np.int64)) for v, (gv, wv) in verify]
    polys, bad_at = strided.convert(coeffs, k, {j: (lattice[j], rest[j]) for j in lattice}, derived, checked, hi)
    if bad_at is None:  # every integer (those of the other dims too) at the check points
        bad_at = next((i for i, p in enumerate(polys) for at, got in checked if strided.value(p, at) != got[i]), None)
    if bad_at is not None:
        raise _Refuted(f"{_label(where[bad_at], gu)} follows the dims neither linearly nor as a strided node's "
                       f"length (at {dict(zip(names, verify[0][0], strict=True))})", True,
                       frozenset(names[j] for j in (set(unknown) or lattice)))  # (a session ranges the others)
    used = sorted({i for p in polys for m in p for i in range(len(derived)) if m >> (k + i) & 1})
    bits = [*range(k), *(k + i for i in used)]  # the derived dims some integer uses, renumbered

    def renumbered(m: int) -> int:
        return sum(1 << t for t, b in enumerate(bits) if m >> b & 1)
    polys = [{renumbered(m): c for m, c in p.items()} for p in polys]
    derived = [derived[i] for i in used]
    basis = sorted({0, *(1 << j for j in range(k)), *(m for p in polys for m in p)})
    varying = [i for i, p in enumerate(polys) if any(m for m in p)]
    entries = [(list(where[i]), [polys[i].get(m, 0) for m in basis]) for i in varying]
    readers = _readers(spec, entries, gu, basis=basis)
    ranges = Ranges(list(spec), readers, entries, keep, floors=tuple(derived), basis=tuple(basis))
    spec = list(spec)
    extents = [i for i, (w, _) in enumerate(entries) if _inner(gu, w)[1][0] in ("in", "out", "I", "O")]
    for j in lattice:  # the least size where every extent that follows the dim is >= 0 (the other dims at their
        # most) and every strided node's output has a frame (`least`: onnxruntime refuses a conv's empty input)
        name, lo, top = spec[j]
        family = (1 << j) | sum(1 << (k + i) for i, (d, _, _) in enumerate(derived) if d == j)
        mine = [i for i in extents if any(m & family for m, c in zip(basis, entries[i][1], strict=True) if c)]
        high = [d[2] for d in spec]
        first = (least or {}).get(j, lo)

        def fine(n: int, j: int = j, high: list[int] = high, mine: list[int] = mine, first: int = first) -> bool:
            return n >= first and bool((ranges.evaluate([*high[:j], n, *high[j + 1:]])[mine] >= 0).all())
        if not fine(lo):
            a, b = lo, top  # fine(b) (the upper bound's program has its extents)
            while b - a > 1:
                mid = (a + b) // 2
                a, b = (a, mid) if fine(mid) else (mid, b)
            spec[j] = (name, b, top)
    if spec != ranges.dims:
        ranges = Ranges(spec, readers, entries, keep, floors=tuple(derived), basis=tuple(basis))
    check_fits(gu, ranges, spec)
    return replace(gu, ranges=ranges), wu


def _widened(prior: Ranges, spec: list[tuple[str, int, int]], upper: tuple[Any, CompiledGraph, dict[str, Any]],
             below: tuple[Any, CompiledGraph, dict[str, Any]], keep: set[str]) -> tuple[CompiledGraph, dict[str, Any]]:
    """The program at the new upper bound with the prior fit, if every integer of the programs at U and U - 1
    is what the fit gives there (a varying one) or the same at both (the others); else RangeError."""
    (point_u, gu, wu), (point_a, ga, wa) = upper, below
    _same_structure(gu, ga, spec)
    where, vu = _integers(gu, wu)
    va = _values(ga, wa)
    index = {tuple(w): i for i, w in enumerate(where)}
    pos = [index.get(tuple(w)) for w, _ in prior.entries]
    if None in pos:
        raise RangeError("the fit of the narrower ranges names integers the wider program does not have")
    ranges = Ranges(list(spec), prior.readers, prior.entries, frozenset(keep), widened=True, steps=prior.steps,
                    floors=prior.floors, basis=prior.basis)
    for point, vals in ((point_u, vu), (point_a, va)):
        want = ranges.evaluate(point)
        if any(vals[p] != int(v) for p, v in zip(pos, want, strict=True)):
            raise RangeError("the fit of the narrower ranges does not hold at the wider bound")
    fitted = set(pos)
    if any(a != b for j, (a, b) in enumerate(zip(vu, va, strict=True)) if j not in fitted):
        raise RangeError("an integer the narrower ranges found fixed follows the dims at the wider bound")
    check_fits(gu, ranges, spec)
    return replace(gu, ranges=ranges), wu


def _marked(err: CtxrtError, inside: bool) -> CtxrtError:
    """`err` marked as raised at a point inside the ranges other than their upper bound (a narrower upper bound
    would not avoid it: runtime/session.py)."""
    err.inside = inside  # type: ignore[attr-defined]
    return err


def _outputs_refuted(points: list[tuple[int, ...]], checks: list[tuple[int, ...]],
                     outs: Mapping[tuple[int, ...], list[int]], spec: list[tuple[str, int, int]], labels: list[str]
                     ) -> None:
    """Before any probe is lowered: the shapes the frontend inferred (`outs`: per point, every axis of the values
    `labels` name) at the affine fit's probes `points`, fitted and checked at `checks`; _Refuted (as _fit would
    raise after lowering every probe) where every extent refuted follows one dim only and not linearly (a stride's
    rounding, W // 4): no fit of any corners holds it either."""
    k = len(spec)
    terms = [0, *(1 << j for j in range(k))]
    basis = np.array([_monomials(p) for p in points], np.float64)[:, terms]
    x = np.array([outs[p] for p in points], np.float64)
    coeffs = np.rint(np.linalg.lstsq(basis, x, rcond=None)[0]).astype(np.int64)  # (k + 1 points: exact)
    if not np.array_equal(basis.astype(np.int64) @ coeffs, x.astype(np.int64)):
        return  # not affine over the probes themselves: left to the lowered fit
    for v in checks:
        miss = np.flatnonzero(_monomials(v)[terms] @ coeffs != np.array(outs[v], np.int64))
        single = [i for i in miss if np.count_nonzero(coeffs[1:, i]) <= 1]
        if len(miss) and len(single) == len(miss):
            raise _Refuted(f"{labels[int(miss[0])]} does not follow the dims linearly (at "
                           f"{dict(zip([d[0] for d in spec], v, strict=True))})", True,
                           frozenset(spec[j][0] for i in miss for j in range(k) if coeffs[1 + j, i]))


def _verify_points(spec: list[tuple[str, int, int]], hi: list[int], alt: list[int]) -> list[tuple[int, ...]]:
    """Up to two points whose every dim of three values or more takes a third one (inside its range, at least 1
    where possible); a dim of two values takes its upper bound (the probes' fit is exact over its two values). None
    when no range has a third value: the corners {U, U - 1}^k are then every point of the ranges."""
    per_dim = []
    for (_, lo, h), a in zip(spec, alt, strict=True):
        candidates = [v for v in dict.fromkeys((lo + (h - lo) // 3, (lo + h) // 2, lo + 1, lo, lo + 2 * (h - lo) // 3))
                      if lo <= v <= h and v not in (h, a)]
        per_dim.append([v for v in candidates if v >= 1] or candidates)
    if not any(per_dim):
        return []
    per_dim = [c or [h] for c, (_, _, h) in zip(per_dim, spec, strict=True)]
    first = tuple(c[0] for c in per_dim)
    second = tuple(c[1] if len(c) > 1 else c[0] for c in per_dim)
    return [first] if second == first else [first, second]


def _shows_products(points: list[tuple[int, ...]], terms: list[int], checks: list[tuple[int, ...]], k: int) -> bool:
    """Whether every product of dims left out of the fit (a monomial not in `terms`), alone with any nonzero
    coefficient, would make the fit over `points` miss its value at each of `checks`."""
    basis = np.array([_monomials(p) for p in points], np.float64)
    solve = np.linalg.solve(basis[:, terms], basis)  # the fit of every monomial from its values at the points
    for v in checks:
        m = _monomials(v).astype(np.float64)
        miss = m - m[terms] @ solve  # per monomial: its value at v less its fit's
        if any(abs(miss[t]) < 0.5 for t in range(1 << k) if t not in terms):
            return False
    return True


def _value_of(key: str) -> str:
    """The model value a constant's key names (a kernel's prepacked copy `w#packed`, a folded output's copy)."""
    key = key.split("#", 1)[0]
    return key[:-len("/constant")] if key.endswith("/constant") else key


def _varying_consts(g: CompiledGraph, wu: Mapping[str, Any], wa: Mapping[str, Any]) -> list[str]:
    """Constants whose contents differ between two probes, except small integer ones of one shape (fitted)."""
    out = []
    for key in g.const_names:
        a, b = np.asarray(wu[key]), np.asarray(wa[key]) if key in wa else None
        fitted = a.dtype.kind in "iu" and a.size <= _DYN_CONST_MAX  # per element, when only its values change
        if b is None or a.shape != b.shape or a.dtype != b.dtype or not (fitted or _same(a, b)):
            out.append(key)
    return out


# Ops whose result is a piecewise function of their inputs (a comparison, a clamp, a choice): folded from values
# that follow the dims, the result can be the same at every probe and differ elsewhere in the ranges (`n > 2`
# for n in 1..32: true at every probe and check point, false at 1 and 2), which no fit can see.
PIECEWISE = frozenset({"Greater", "Less", "Equal", "GreaterOrEqual", "LessOrEqual", "And", "Or", "Xor", "Not",
                       "Where", "Min", "Max", "Clip", "Abs", "Sign"})
# ... and ops whose result steps (a floor): kept where it is the same at both probes while an input is not
STEPS = frozenset({"Div", "Mod", "Floor", "Ceil", "Round", "Cast"})
# ... and lookups: a table read at an index that follows the dims is any function of them (kept where it is
# folded outside a shape; a shape that follows one is left to the fit's check points)
LOOKUPS = frozenset({"Gather", "GatherElements", "GatherND"})


def _varying_folded(hi: Mapping[str, tuple[Any, ...]], alt: Mapping[str, tuple[Any, ...]],
                    producers: Mapping[str, tuple[str, Sequence[str]]] | None = None) -> set[str]:
    """Values the frontend folded at both probes whose contents differ, except small integer ones of one shape
    (fitted per element): with the graph's varying constants, every value that follows the dims is kept in one
    round, not one link of a folded chain (Range -> Add -> Unsqueeze ...) per round and two probes each. And the
    results of piecewise ops (`producers`: value -> (op, inputs)) folded from values that differ: computed at run
    time (an If on `sequence > 2` then stays an If, its branch chosen per run), not fitted."""
    out, differ = set(), set()
    for name, (shape, dtype, digest) in hi.items():
        other = alt.get(name)
        if other is None or other[2] == digest:
            continue
        differ.add(name)
        fitted = other[0] == shape and other[1] == dtype and np.dtype(dtype).kind in "iu" and \
            math.prod(shape) <= _DYN_CONST_MAX
        if not fitted:
            out.add(name)
    for name in hi.keys() & alt.keys():
        op, inputs = (producers or {}).get(name, ("", ()))
        if (op in PIECEWISE or op in STEPS and name not in differ) and any(i in differ for i in inputs) or \
                op in LOOKUPS and len(inputs) > 1 and inputs[1] in differ:
            out.add(name)
    return out


def _producers(model: Any) -> tuple[dict[str, tuple[str, list[str]]], list[tuple[str, str, list[str]]]]:
    """(each value a node of the model or of its bodies computes -> (the node's op, its inputs), except values that
    reach a position that decides a shape; the piecewise ops' values that do, (value, op, inputs) in graph order).
    The first are kept where their inputs follow the dims; the others cannot be (the shape would be decided at
    run time: a Reshape's target through `Where(Equal(s, -1), 1, s)`, as torch's legacy exporter writes an expand)
    and are checked to keep one piece over the whole ranges (`_check_pieces`)."""
    from ctxrt.frontend.control import all_nodes
    from ctxrt.frontend.values import trace

    shapes = trace(model.graph.node, inner=True)[0]  # (a body's own Slice ends: shape positions too)
    nodes = list(all_nodes(model.graph))
    kept = {o: (n.op_type, list(n.input)) for n in nodes for o in n.output if o and o not in shapes}
    pieces = [(o, n.op_type, list(n.input)) for n in nodes for o in n.output[:1]
              if o in shapes and (n.op_type in PIECEWISE or n.op_type in STEPS)]
    return kept, pieces


def _affine_at_corners(rows: np.ndarray, points: list[tuple[int, ...]], checks: list[tuple[int, ...]],
                       spec: list[tuple[str, int, int]]) -> np.ndarray | None:
    """Integers given at `points` then `checks` (rows: points x elements), fitted as affine functions of the dims
    over the points and checked at the checks: their values at every corner of the box of ranges (corners x
    elements); None where they are not affine."""
    k = len(spec)
    terms = [0, *(1 << j for j in range(k))]
    basis = np.array([_monomials(p) for p in points], np.float64)[:, terms]
    corners = np.array([_monomials(c) for c in itertools.product(*[(lo, hi) for _, lo, hi in spec])],
                       np.float64)[:, terms]
    out = np.broadcast_to(rows[:1], (len(corners), rows.shape[1])).copy()  # the same at every point: as it is
    moving = np.flatnonzero((rows != rows[:1]).any(0))  # (not fitted: Slice's 2^63 - 1 would not round back)
    if not len(moving):
        return out
    x = rows[:len(points), moving]
    coeffs = np.linalg.lstsq(basis, x, rcond=None)[0]
    if np.array_equal(basis @ np.rint(coeffs), x):
        coeffs = np.rint(coeffs)  # integers (a dim's values): exact at the corners, as the fit of extents is
    if not np.allclose(basis @ coeffs, x) or any(
            not np.allclose(_monomials(c).astype(np.float64)[terms] @ coeffs, rows[len(points) + i, moving])
            for i, c in enumerate(checks)):
        return None
    out[:, moving] = corners @ coeffs
    return out


def _nodes_of(g: Any, wanted: Callable[[Any], bool], prefix: str = "") -> dict[str, tuple[Any, Any]]:
    """Each node of a frontend graph `g` and of its bodies (If branches, Loop bodies) that `wanted` takes: its name
    (a body's prefixed by its node's and key's) -> (its graph, the node)."""
    out = {}
    for n in g.nodes:
        if wanted(n):
            out[prefix + n.name] = (g, n)
        for key, sub in n.attrs.items():
            if hasattr(sub, "nodes") and hasattr(sub, "values"):
                out.update(_nodes_of(sub, wanted, f"{prefix}{n.name}/{key}/"))
    return out


def _varying_corners(rows: list[list[int]], points: list[tuple[int, ...]], checks: list[tuple[int, ...]],
                     spec: list[tuple[str, int, int]]) -> tuple[np.ndarray, np.ndarray | None] | None:
    """Integers at each probe then check point (one row each) as (their array, their affine values at the box's
    corners, None where not affine: `_affine_at_corners`); None where the rows differ in length or not at all."""
    if len({len(r) for r in rows}) != 1:
        return None
    flat = np.array(rows, np.float64)
    if (flat == flat[0]).all():
        return None
    return flat, _affine_at_corners(flat, points, checks, spec)


def _check_slices(graphs: Mapping[tuple[int, ...], Any], points: list[tuple[int, ...]],
                  checks: list[tuple[int, ...]], spec: list[tuple[str, int, int]]) -> None:
    """RangeError where a Slice clamps differently inside the ranges: `x[:8]` over N in 1..32 has 8 rows at every
    probe and N below 8 (its shape inference clamps the end to N), which the fit of its extent cannot see. At
    every corner of the box, each sliced axis's start and end (fitted as affine functions of the dims, as the
    axis's extent) must be negative or not, past the ends of the axis or not, and the slice empty or not alike:
    then its extent is one affine piece over the box, as the fit assumes."""
    at = [graphs.get(p) for p in (*points, *checks)]
    if any(g is None for g in at):
        return

    by_name = [_nodes_of(g, lambda n: n.op == "Slice") for g in at]
    for name in by_name[0]:
        found = [b.get(name) for b in by_name]
        if any(f is None for f in found):
            continue  # another structure at some probe: the compiled probes' comparison says so
        rows = []
        for g, n in found:
            shape = g.values[n.inputs[0]].shape
            starts, ends = list(n.attrs.get("starts", ())), list(n.attrs.get("ends", ()))
            axes = list(n.attrs.get("axes") or range(len(starts)))
            steps = list(n.attrs.get("steps") or [1] * len(starts))
            if not (len(starts) == len(ends) == len(axes) == len(steps)) or any(
                    not -len(shape) <= a < len(shape) for a in axes):
                break
            rows.append([v for a, st, en, sp in zip(axes, starts, ends, steps, strict=True)
                         for v in (shape[a % len(shape)], st, en, sp)])
        if len(rows) != len(at):
            continue
        varying = _varying_corners(rows, points, checks, spec)
        if varying is None or varying[1] is None:
            continue  # the same everywhere; or not affine: the fit of its extent refutes it
        flat, corners = varying
        for i in range(0, flat.shape[1], 4):
            dim, st, en, sp = (corners[:, i + j] for j in range(4))
            if not (sp == sp[:1]).all():
                raise RangeError(f"Slice node {name!r} takes a step that follows the dims: not one program for them")
            lo, hi = (0, dim) if sp[0] > 0 else (-1, dim - 1)
            s_eff, e_eff = np.where(st < 0, st + dim, st), np.where(en < 0, en + dim, en)
            s_c, e_c = np.clip(s_eff, 0, hi), np.clip(e_eff, lo, hi)  # (ONNX: a start within [0, hi])
            regime = np.stack([st < 0, en < 0, s_eff < 0, s_eff > hi, e_eff < lo, e_eff > hi,
                               e_c < s_c if sp[0] > 0 else e_c > s_c])  # (a length below 0: clamped to 0)
            if not (regime == regime[:, :1]).all():
                raise RangeError(f"Slice node {name!r} clamps its bounds differently inside the ranges (a bound "
                                 "past the end of its axis at some sizes only): not one program for them",
                                 _cuts([st, en, s_eff, s_eff - hi, e_eff - lo, e_eff - hi, e_c - s_c], spec))


def _check_bounds(graphs: Mapping[tuple[int, ...], Any], points: list[tuple[int, ...]],
                  checks: list[tuple[int, ...]], spec: list[tuple[str, int, int]]) -> None:
    """RangeError where a data-dependent output's upper bound takes the smaller of two sizes that cross inside the
    ranges (Compress: its condition's length and its axis; NonMaxSuppression: the boxes and the most per class):
    the bound 3 of a condition of 3 over an axis of N in 1..16 held at every probe, and its kernel crashed below
    3. The RangeError's `splits` say where the smaller one changes."""
    at = [graphs.get(p) for p in (*points, *checks)]
    if any(g is None for g in at):
        return

    def sizes(g: Any, n: Any) -> list[int] | None:
        """[the one size, then the factors of the other] (a flat Compress's axis is the product of its input's)."""
        shape = [g.values[i].shape if i in g.values else None for i in n.inputs[:2]]
        if any(s is None for s in shape):
            return None
        if n.op == "Compress":
            axis = n.attrs.get("axis")
            return [shape[1][0], *(shape[0] if axis is None else shape[0][int(axis) % len(shape[0]):][:1])]
        limit = g.values.get(n.inputs[2]) if len(n.inputs) > 2 and n.inputs[2] else None
        if limit is None or limit.const is None or len(shape[1]) != 3:
            return None
        return [int(np.asarray(limit.const).reshape(-1)[0]), shape[1][2]]
    found = [_nodes_of(g, lambda n: n.op in ("Compress", "NonMaxSuppression")) for g in at]
    for name, (_, n0) in found[0].items():
        rows = [sizes(*f[name]) if name in f else None for f in found]
        varying = None if any(r is None for r in rows) else _varying_corners(rows, points, checks, spec)
        if varying is None:
            continue
        corners = varying[1]
        if corners is None:
            raise RangeError(f"{n0.op} node {name!r}: its output's upper bound takes the smaller of two sizes that "
                             "follow the dims in no affine way: not one program for them")
        # (a product of affine extents is multilinear: its sign over the box is that at the corners)
        diff = corners[:, 0] - np.prod(corners[:, 1:], axis=1)
        if not (np.sign(diff) == np.sign(diff[0])).all():
            raise RangeError(f"{n0.op} node {name!r}: its output's upper bound takes the smaller of two sizes, "
                             "which changes inside the ranges: not one program for them", _cuts([diff], spec))


def _check_resizes(graphs: Mapping[tuple[int, ...], Any], points: list[tuple[int, ...]],
                   checks: list[tuple[int, ...]]) -> None:
    """RangeError where a Resize keeps its aspect ratio (keep_aspect_ratio_policy not_larger / not_smaller) over
    sizes or an input that follow the dims: its output size takes the smaller (larger) of the axes' ratios, a
    choice the fit of its extents cannot see (sizes [1, s] over s in 1..8 chose the first ratio at every probe, the
    second below 2)."""
    at = [graphs.get(p) for p in (*points, *checks)]
    if any(g is None for g in at):
        return

    found = [_nodes_of(g, lambda n: n.op == "Resize" and n.attrs.get("keep_aspect_ratio_policy", "stretch") in
                       ("not_larger", "not_smaller")) for g in at]
    for name in found[0]:
        seen = {(tuple(g.values[n.inputs[0]].shape), repr(n.attrs.get("sizes"))) for f in found if name in f
                for g, n in [f[name]]}
        if len(seen) > 1:
            raise RangeError(f"Resize node {name!r} keeps its aspect ratio over sizes that follow the dims (the "
                             "ratio it takes may change inside the ranges): not one program for them")


def _check_pieces(pieces: list[tuple[str, str, list[str]]], small: Mapping[tuple[int, ...], Mapping[str, Any]],
                  folded: Mapping[tuple[int, ...], Mapping[str, Any]], points: list[tuple[int, ...]],
                  checks: list[tuple[int, ...]], spec: list[tuple[str, int, int]], rounds: bool = False) -> None:
    """RangeError where a piecewise op folded into a shape (`pieces`) may change piece somewhere in the ranges:
    `min(N, 8)` over N in 1..32 is 8 at every probe and N below 8, which the fit of the shape it decides cannot
    see. Its inputs (the probes' small constants `small`) are fitted as affine functions of the dims over the
    probes `points` and checked at `checks`; then, at every corner of the box of ranges, each comparison's (Min's,
    Max's, Clip's, Abs's, Sign's) difference keeps one sign, a Where's condition and And's ... inputs one value,
    and a Div's or Floor's ... result is the affine function its input's fit gives: over the box, then, the op is
    one affine piece, as the fit assumes. `rounds`: a dim is probed on a lattice (compiler/floors.py): a Div's ...
    rounding is a strided length the fit writes over a derived dim (or refutes), not checked here."""
    corners = list(itertools.product(*[(lo, hi) for _, lo, hi in spec]))

    def fail(name: str, op: str, why: str) -> RangeError:
        return RangeError(f"a shape follows {op} value {name!r}, which {why} inside the ranges: not one program "
                          "for them")

    def corner_values(name: str, op: str, inp: str) -> np.ndarray | None:
        """The input's values at every corner (None: the same at every probe, a constant)."""
        got = [small.get(p, {}).get(inp) for p in (*points, *checks)]
        if any(g is None for g in got) or len({(g.shape, g.dtype.str) for g in got}) != 1:
            raise fail(name, op, "reads a value ctxrt cannot follow (not a small constant at every probe)")
        flat = np.array([np.asarray(g, np.float64).reshape(-1) for g in got])  # points x elements
        if (flat == flat[0]).all():
            return None
        values = _affine_at_corners(flat, points, checks, spec)
        if values is None:
            raise fail(name, op, "is no affine function of the dims and may change")
        return values.reshape((len(corners), *got[0].shape))

    for name, op, inputs in pieces:
        if not all(name in folded.get(p, {}) or name in small.get(p, {}) for p in (*points, *checks)):
            continue  # not folded (computed at run time: its shape's node says so), or not at every probe (inlined)
        if rounds and op in ("Div", "Floor", "Ceil", "Round", "Cast"):
            continue
        vals = [corner_values(name, op, i) if i else None for i in inputs]
        if all(v is None for v in vals):
            continue  # the same at every probe: a constant
        full = [v if v is not None else np.broadcast_to(np.asarray(small[points[0]][i], np.float64),
                                                         (len(corners), *np.shape(small[points[0]][i])))
                for v, i in zip(vals, inputs, strict=True) if i]
        if op in ("Greater", "Less", "Equal", "GreaterOrEqual", "LessOrEqual", "Min", "Max"):
            diffs = [a - b for a, b in itertools.combinations(full, 2)]
        elif op == "Clip":
            diffs = [full[0] - b for b in full[1:]]
        elif op in ("Abs", "Sign"):
            diffs = [full[0]]
        elif op in ("Div", "Floor", "Ceil", "Round", "Cast"):
            if op == "Div" and vals[1] is not None:
                raise fail(name, op, "divides by a value that follows the dims")
            result = small.get(points[0], {}).get(name)
            if op in ("Div", "Cast") and (result is None or result.dtype.kind not in "iu"):
                continue  # a float quotient of a constant, a cast to a float: no rounding
            fn = {"Div": lambda a: np.trunc(a[0] / a[1]), "Floor": lambda a: np.floor(a[0]),
                  "Ceil": lambda a: np.ceil(a[0]), "Round": lambda a: np.round(a[0]),
                  "Cast": lambda a: np.trunc(a[0])}[op]
            exact = np.allclose(fn(full), full[0] / full[1] if op == "Div" else full[0], rtol=0, atol=1e-9)
            if not exact:
                raise fail(name, op, "rounds a value that follows the dims")
            continue
        else:  # Where's condition, And's, Or's, Xor's, Not's, Mod's inputs: one value at every probe (a condition
            # from a comparison is checked over the box above it); Where's choices may follow the dims
            if any(v is not None for v in (vals[:1] if op == "Where" else vals)):
                raise fail(name, op, "takes inputs that follow the dims")
            continue
        for d in map(np.sign, diffs):
            if not (d == d[:1]).all():
                e = fail(name, op, "changes piece")
                e.splits = _cuts(diffs, spec)
                raise e


def _cuts(quantities: Iterable[np.ndarray], spec: list[tuple[str, int, int]]) -> dict[str, list[int]]:
    """Where affine quantities given at every corner of the box of ranges (each corners x ..., corners in
    `itertools.product` order) that follow one dim only cross zero: per dim name, the sizes that start a piece on
    which each of them keeps one sign ({ceil(x0), floor(x0) + 1} for a root x0: below it, at it, above it)."""
    k = len(spec)
    out: dict[str, set[int]] = {}
    for q in quantities:
        q = np.asarray(q, np.float64)
        for v in q.reshape(len(q), -1).T:
            grid = v.reshape((2,) * k)
            follows = [j for j in range(k) if not np.allclose(np.diff(grid, axis=j), 0)]
            if len(follows) != 1:
                continue
            j = follows[0]
            name, lo, hi = spec[j]
            a, b = float(grid.take(0, axis=j).flat[0]), float(grid.take(1, axis=j).flat[0])
            if a == b or a > 0 and b > 0 or a < 0 and b < 0:
                continue
            x0 = lo + (0 - a) * (hi - lo) / (b - a)
            out.setdefault(name, set()).update(c for c in (math.ceil(x0 - 1e-9), math.floor(x0 + 1e-9) + 1)
                                               if lo < c <= hi)
    return {n: sorted(c) for n, c in out.items() if c}


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal contents; the same memory (a weight both probes read from the model, ir/memo.py) is not read."""
    if a.__array_interface__ == b.__array_interface__:
        return True
    return bool(np.array_equal(a, b))


def _signature(g: CompiledGraph) -> list[Any]:
    sig: list[Any] = [[(t.name, t.dtype, len(t.shape)) for t in g.inputs + g.outputs], sorted(g.value_inputs),
                      sorted((k, a) for k, (a, _) in g.extents.items())]
    sig.extend(_step_signature(s) for s in g.steps)
    return sig


def _step_signature(s: Step) -> tuple[Any, ...]:
    def ref(r: Ref | None) -> Any:
        return None if r is None else (r.space, r.key, r.dtype, len(r.shape))

    algorithm = s.algorithm
    if algorithm and algorithm.startswith("onednn:"):  # (oneDNN's implementation, chosen by shape at each set of
        algorithm = ":".join(algorithm.split(":")[:2])  # dims the program runs, as at every probe: not its own)
    return (s.op, s.name, algorithm, s.backend, [ref(r) for r in s.inputs], [ref(r) for r in s.outputs],
            len(s.scratch), _attr_shape(s.attrs))


def _attr_shape(v: Any) -> Any:
    """An attribute value with its integers blanked: what must not change between probes."""
    if isinstance(v, bool):
        return v
    if isinstance(v, int):
        return int
    if isinstance(v, dict):
        return {k: _attr_shape(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_attr_shape(x) for x in v]
    if isinstance(v, np.ndarray):
        return ("array", v.dtype.str, v.shape, v.tobytes())
    if isinstance(v, Body):  # an If branch, a Loop body: its steps as a program's (its arena the upper bound's)
        return ("body", [(t.name, t.dtype, len(t.shape)) for t in v.inputs + v.outputs],
                [_step_signature(s) for s in v.steps], v.alignment)
    return repr(v)


def _same_structure(a: CompiledGraph, b: CompiledGraph, spec: Any) -> None:
    sa, sb = memo.memo("signature", a, None, lambda: _signature(a)), _signature(b)  # (the upper bound's: once)
    if len(sa) != len(sb):
        raise RangeError(f"the program has {len(a.steps)} steps at one shape and {len(b.steps)} at another (kernels "
                         "or fusions chosen by shape)")
    for x, y, step in zip(sa, sb, [None, None, None, *a.steps], strict=True):
        if x != y:
            what = "its inputs and outputs" if step is None else f"{step.op} node {step.name!r}"
            raise RangeError(f"{what} compile differently at different shapes of the ranges (another kernel, "
                             "storage or attribute)")


def _integers(g: CompiledGraph, w: Mapping[str, Any]) -> tuple[list[tuple[Any, ...]], list[int]]:
    """(where, value) of every integer of a program that may vary with the dims, in a fixed order."""
    where: list[tuple[Any, ...]] = []
    return where, _walk(g, w, where)


def _values(g: CompiledGraph, w: Mapping[str, Any]) -> list[int]:
    """`_integers`' values alone (a probe of the upper bound's structure: its places are the upper bound's)."""
    return _walk(g, w, None)


def _walk(g: CompiledGraph, w: Mapping[str, Any], where: list[tuple[Any, ...]] | None) -> list[int]:
    vals: list[int] = []
    for kind, ts in (("I", g.inputs), ("O", g.outputs)):
        for i, t in enumerate(ts):
            vals += t.shape
            if where is not None:
                where += [(kind, i, a) for a in range(len(t.shape))]
    for k, s in enumerate(g.steps):
        for kind, refs in (("in", s.inputs), ("out", s.outputs)):
            for i, r in enumerate(refs):
                if r is None:
                    continue
                vals += r.shape
                if where is not None:
                    where += [(kind, k, i, a) for a in range(len(r.shape))]
                if kind == "in" and r.space == CONST and r.key in w:  # a probe keeps its small integer ones only
                    c = np.asarray(w[r.key])
                    if c.dtype.kind in "iu" and c.size <= _DYN_CONST_MAX:
                        vals += map(int, c.reshape(-1).tolist())
                        if where is not None:
                            where += [("const", k, i, j) for j in range(c.size)]
        for path, v in _attr_ints(s.attrs, ()):
            if where is not None:
                where.append(("attr", k, *path))
            vals.append(v)
    return vals


def _attr_ints(v: Any, path: tuple[Any, ...]) -> Iterable[tuple[tuple[Any, ...], int]]:
    if isinstance(v, bool):
        return
    if isinstance(v, int):
        yield path, v
    elif isinstance(v, dict):
        for key, x in v.items():
            yield from _attr_ints(x, (*path, key))
    elif isinstance(v, list):
        for j, x in enumerate(v):
            yield from _attr_ints(x, (*path, j))
    elif isinstance(v, Body):  # its IO's and steps' extents and its steps' attributes, places as a program's
        for kind, ts in (("I", v.inputs), ("O", v.outputs)):
            for i, t in enumerate(ts):
                for a, d in enumerate(t.shape):
                    yield (*path, kind, i, a), d
        for k, s in enumerate(v.steps):
            for kind, refs in (("in", s.inputs), ("out", s.outputs)):
                for i, r in enumerate(refs):
                    if r is not None:
                        for a, d in enumerate(r.shape):
                            yield (*path, kind, k, i, a), d
            yield from _attr_ints(s.attrs, (*path, "attr", k))


def _readers(spec: list[tuple[str, int, int]], entries: list[tuple[list[Any], list[int]]], g: CompiledGraph,
             steps: Sequence[int] = (), basis: Sequence[int] | None = None) -> list[tuple[int, int]]:
    readers = []
    for j, (name, _, _) in enumerate(spec):
        step = steps[j] if steps else 1  # (a stepped dim's reader: an extent of step times the program's dim)
        unit = [step if s == 1 << j else 0 for s in (basis if basis is not None else range(1 << len(spec)))]
        found = next(((w[1], w[2]) for w, c in entries if w[0] == "I" and c == unit), None)
        if found is None:
            raise _Unreadable(f"dim {name!r} is no input's extent by itself: ctxrt reads dims from the inputs' "
                              "shapes", j)
        readers.append(found)
    return readers


def check_fits(g: CompiledGraph, ranges: Ranges, spec: list[tuple[str, int, int]]) -> None:
    """Every extent is >= 0 and no tensor in the arena is larger than at the upper bound, anywhere in the ranges
    (a multilinear extent is monotone along each dim when it is along every edge of the box of ranges)."""
    if ranges.floors and not strided.one_per_family(
            [[ranges._basis[c] for c in np.flatnonzero(row)] for row in ranges._coeffs], len(spec), ranges.floors):
        raise RangeError("an integer takes a dim with one of its derived dims (or two of them): not monotone")
    box = [tuple(c) for c in itertools.product(*[(lo, hi) for _, lo, hi in spec])]
    vals = np.stack([ranges.evaluate(p) for p in box])  # corners x entries
    top = box.index(tuple(hi for _, _, hi in spec))
    edges = [(c, box.index(tuple(spec[j][2] if t == j else x for t, x in enumerate(p))), j)
             for j in range(len(spec)) for c, p in enumerate(box) if p[j] == spec[j][1]]  # (low end, high end, dim)
    lows, highs = [c for c, _, _ in edges], [q for _, q, _ in edges]
    # every entry at once (a context binary's load checks them all: ~1.5 -> ~0.2 ms for GPT-2), then the first
    # that fails, one by one, for its message
    cols = [i for i, (where, _) in enumerate(ranges.entries) if _inner(g, where)[1][0] in ("in", "out", "I", "O")]
    sub = vals[:, cols]
    tops = np.array([_extent(g, ranges.entries[i][0]) for i in cols], dtype=vals.dtype)
    bad = (sub[top] != tops) | (sub < 0).any(axis=0) | (sub[lows] > sub[highs]).any(axis=0)
    for i in (cols[k] for k in np.flatnonzero(bad)[:1]):
        where = ranges.entries[i][0]
        col = vals[:, i]
        if col[top] != _extent(g, where):
            raise RangeError(f"{_label(where, g)} is {col[top]} at the upper bound, not the program's "
                             f"{_extent(g, where)}")
        if (col < 0).any():  # (a Range's length clamped at 0 below some size: a piece of its own, `splits`)
            raise RangeError(f"{_label(where, g)} is negative somewhere in the ranges", _cuts([col], spec))
        for c, q, j in edges:
            if col[c] > col[q]:
                raise RangeError(f"{_label(where, g)} shrinks as dim {spec[j][0]!r} grows: the arena is "
                                 "planned at the upper bound")


def _inner(g: CompiledGraph | Body, where: Sequence[Any]) -> tuple[Any, Sequence[Any], str]:
    """(the program or control-flow body an entry's integer belongs to, its place there, the steps holding that
    body, for messages): an attribute's place that passes into a body (an If branch) is a place in the body."""
    label = ""
    while where[0] == "attr":
        step = g.steps[where[1]]
        n = _body_at(step.attrs, where[2:])
        if not n:
            break
        label += f"{step.op} node {step.name!r} {'/'.join(map(str, where[2:2 + n]))}: "
        g, where = _get(step.attrs, where[2:2 + n]), where[2 + n:]
    return g, where, label


def _extent(g: CompiledGraph | Body, where: Sequence[Any]) -> int:
    g, where, _ = _inner(g, where)
    kind = where[0]
    if kind in ("I", "O"):
        return (g.inputs if kind == "I" else g.outputs)[where[1]].shape[where[2]]
    step = g.steps[where[1]]
    return (step.inputs if kind == "in" else step.outputs)[where[2]].shape[where[3]]


def entry_target(g: CompiledGraph | Body, where: Sequence[Any]) -> bool:
    """Whether `where` (an entry's place, as read from a file) names an integer of program `g` (or of a control-flow
    body of it: no constants of its own there)."""
    try:
        kind = where[0]
        if kind == "const" and isinstance(g, Body):
            return False
        if kind in ("I", "O"):
            t = (g.inputs if kind == "I" else g.outputs)[int(where[1])]
            return len(where) == 3 and int(where[1]) >= 0 and 0 <= int(where[2]) < len(t.shape)
        k = int(where[1])
        if not 0 <= k < len(g.steps):
            return False
        step = g.steps[k]
        if kind in ("in", "out"):
            r = (step.inputs if kind == "in" else step.outputs)[int(where[2])]
            return len(where) == 4 and r is not None and where[2] >= 0 and 0 <= int(where[3]) < len(r.shape)
        if kind == "const":
            r = step.inputs[int(where[2])]
            return (len(where) == 4 and r is not None and r.space == CONST and where[2] >= 0
                    and 0 <= int(where[3]) < max(math.prod(r.shape), 1) <= _DYN_CONST_MAX)
        if kind == "attr":
            obj: Any = step.attrs
            for n, p in enumerate(where[2:]):
                if isinstance(obj, Body):
                    return entry_target(obj, where[2 + n:])
                if isinstance(obj, dict) and isinstance(p, str) and p in obj or \
                        isinstance(obj, list) and isinstance(p, int) and 0 <= p < len(obj):
                    obj = obj[p]
                else:
                    return False
            return isinstance(obj, int) and not isinstance(obj, bool)
    except (IndexError, TypeError, ValueError):
        return False
    return False


def _label(where: Sequence[Any], g: CompiledGraph) -> str:
    body, where, label = _inner(g, where)
    kind = where[0]
    if kind in ("I", "O"):
        t = (body.inputs if kind == "I" else body.outputs)[where[1]]
        return f"{label}{'input' if kind == 'I' else 'output'} {t.name!r} axis {where[2]}"
    s = body.steps[where[1]]
    return f"{label}{s.op} node {s.name!r} ({kind} {list(where[2:])})"


def arena_refs(step: Step) -> list[Ref]:
    return [r for r in (*step.inputs, *step.outputs) if r is not None and r.space == ARENA]


__all__ = ["RangeError", "Ranges", "compile_ranges", "compile_ranges_split", "is_expression", "parse_range", "resolve"]
