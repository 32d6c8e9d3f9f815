"""Einsum as views, reductions and batched matmuls.

Operands are contracted left to right. A repeated label within an operand is its diagonal (a strided view); a
label that no later operand and not the output needs is summed out first; a pair of operands becomes one batched
matmul [batch..., M, K] x [batch..., K, N] whose operands are views of the inputs where their axes can be grouped
that way without a copy (either orientation: BLAS takes transposed operands), else a copy into planned scratch.
The last result is written straight into the output when its axes allow, else reduced or transposed into it.
The same planner runs at construction, on shape-only stand-ins, to size the scratch, and at bind on the real views.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ctxrt.backends.kernel import Kernel, Launch, NodeSpec, scratch_view
from ctxrt.errors import UnsupportedOpError

Step = tuple[Callable[..., Any], tuple, dict]


def _fail(spec: NodeSpec, what: str) -> UnsupportedOpError:
    return UnsupportedOpError(f"Einsum node {spec.name!r}: {what} is not supported")


def parse(spec: NodeSpec) -> tuple[list[str], str]:
    """Per input its labels (one per axis, '...' expanded to symbols that are not letters), and the output's."""
    eq = str(spec.attr("equation", "")).replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(spec.inputs):
        raise _fail(spec, f"equation {eq!r} for {len(spec.inputs)} inputs")
    ranks = [len(t.shape) for t in spec.inputs]
    ell = max((r - len(t.replace("...", "")) for t, r in zip(terms, ranks, strict=True) if "..." in t), default=0)
    symbols = "".join(chr(0x3B1 + k) for k in range(ell))  # Greek letters stand for the broadcast axes
    labels = []
    for t, r in zip(terms, ranks, strict=True):
        n = r - len(t.replace("...", ""))
        full = t.replace("...", symbols[ell - n:] if n else "")
        if len(full) != r or not all(c.isalpha() for c in full):
            raise _fail(spec, f"equation {eq!r} term {t!r} for an input of rank {r}")
        labels.append(full)
    if arrow:
        out = rhs.replace("...", symbols)
    else:  # implicit: the broadcast axes, then the letters seen once, in alphabetical order
        once = [c for c in sorted(set(lhs)) if c.isalpha() and lhs.count(c) == 1]
        out = symbols + "".join(once)
    if len(set(out)) != len(out) or not set(out) <= set("".join(labels)):
        raise _fail(spec, f"equation {eq!r} output {out!r}")
    return labels, out


def _merge(a: np.ndarray, nbatch: int, groups: list[int]) -> np.ndarray | None:
    """a's axes after the first nbatch, taken `groups` at a time, merged into one axis each (a view), or None."""
    shape, k = list(a.shape[:nbatch]), nbatch
    for g in groups:
        shape.append(int(np.prod(a.shape[k:k + g], dtype=np.int64)))
        k += g
    try:
        return np.reshape(a, shape, copy=False)
    except ValueError:
        return None


def _blasable(m: np.ndarray) -> bool:
    """The last two axes are a row-major matrix (unit column stride) that BLAS reads directly."""
    s = m.strides
    return m.shape[-1] <= 1 or s[-1] == m.itemsize


class _Planner:
    """Builds the launch steps; `alloc(shape)` returns scratch (recorded at construction, real at bind)."""

    def __init__(self, dtype: np.dtype, alloc: Callable[[tuple[int, ...]], np.ndarray]) -> None:
        self.dt, self.alloc, self.steps = dtype, alloc, []

    def diagonal(self, a: np.ndarray, labels: str) -> tuple[np.ndarray, str]:
        uniq = "".join(dict.fromkeys(labels))
        if uniq == labels:
            return a, labels
        shape = [a.shape[labels.index(c)] for c in uniq]
        strides = [sum(s for s, l in zip(a.strides, labels, strict=True) if l == c) for c in uniq]
        return as_strided(a, shape, strides, writeable=False), uniq

    def sum_out(self, a: np.ndarray, labels: str, keep: set[str]) -> tuple[np.ndarray, str]:
        axes = tuple(k for k, c in enumerate(labels) if c not in keep)
        if not axes:
            return a, labels
        kept = "".join(c for c in labels if c in keep)
        r = self.alloc(tuple(a.shape[k] for k, c in enumerate(labels) if c in keep))
        self.steps.append((np.add.reduce, (a,), {"axis": axes, "out": r, "dtype": self.dt}))
        return r, kept

    def operand(self, a: np.ndarray, labels: str, batch: str, first: str, second: str) -> np.ndarray:
        """a as [batch..., prod(first), prod(second)]: a view in this or the swapped orientation, else a copy."""
        for one, two, swap in ((first, second, False), (second, first, True)):
            perm = [labels.index(c) for c in batch + one + two]
            m = _merge(a.transpose(perm), len(batch), [len(one), len(two)])
            if m is not None and _blasable(m):
                return m.swapaxes(-1, -2) if swap else m
        perm = [labels.index(c) for c in batch + first + second]
        t = a.transpose(perm)
        c = self.alloc(t.shape)
        self.steps.append((np.copyto, (c, t), {}))
        return _merge(c, len(batch), [len(first), len(second)])

    def contract(self, a: np.ndarray, la: str, b: np.ndarray, lb: str, later: set[str],
                 y: np.ndarray | None, out: str) -> tuple[np.ndarray, str, bool]:
        batch = "".join(c for c in la if c in lb and c in later)
        con = "".join(c for c in la if c in lb and c not in later)
        ma = "".join(c for c in la if c not in lb)
        nb = "".join(c for c in lb if c not in la)
        size = {c: max(a.shape[la.index(c)] if c in la else 1, b.shape[lb.index(c)] if c in lb else 1)
                for c in la + lb}
        am = self.operand(a, la, batch, ma, con)
        bm = self.operand(b, lb, batch, con, nb)
        labels = batch + ma + nb
        full = tuple(size[c] for c in labels)
        if y is not None and sorted(labels) == sorted(out):
            direct = _merge(y.transpose([out.index(c) for c in labels]), len(batch), [len(ma), len(nb)])
            if direct is not None and _blasable(direct) and direct.shape[:len(batch)] == full[:len(batch)]:
                self.steps.append((np.matmul, (am, bm), {"out": direct}))
                return y, out, True
        r = self.alloc(full)
        self.steps.append((np.matmul, (am, bm), {"out": _merge(r, len(batch), [len(ma), len(nb)])}))
        return r, labels, False

    def finish(self, x: np.ndarray, lx: str, y: np.ndarray, out: str) -> None:
        axes = tuple(k for k, c in enumerate(lx) if c not in out)
        kept = "".join(c for c in lx if c in out)
        view = y.transpose([out.index(c) for c in kept])
        if axes:
            self.steps.append((np.add.reduce, (x,), {"axis": axes, "out": view, "dtype": self.dt}))
        else:
            self.steps.append((np.copyto, (view, x), {}))


class Einsum(Kernel):
    algorithm = "matmul"

    def __init__(self, spec: NodeSpec) -> None:
        self.labels, self.out = parse(spec)
        self.dt = np.dtype(spec.outputs[0].dtype)
        for t, lab in zip(spec.inputs, self.labels, strict=True):
            for c in set(lab):
                dims = {n for n, l in zip(t.shape, lab, strict=True) if l == c}
                if len(dims) > 1:
                    raise _fail(spec, f"label {c!r} on axes of sizes {sorted(dims)}")
        sizes: list[int] = []

        def record(shape: tuple[int, ...]) -> np.ndarray:
            sizes.append(max(1, int(np.prod(shape, dtype=np.int64))) * self.dt.itemsize)
            return _standin(shape, self.dt)

        self._plan([_standin(t.shape, np.dtype(t.dtype)) for t in spec.inputs],
                   _standin(spec.outputs[0].shape, self.dt), record)
        self.scratch = tuple(sizes)

    def _plan(self, ins: list[np.ndarray], y: np.ndarray, alloc: Callable) -> list[Step]:
        p = _Planner(self.dt, alloc)
        ops = [p.diagonal(a, lab) for a, lab in zip(ins, self.labels, strict=True)]
        out = self.out
        while len(ops) > 1:
            (a, la), (b, lb) = ops[0], ops[1]
            rest = ops[2:]
            later = set(out).union(*(set(lab) for _, lab in rest))
            # a contracted label broadcast (size 1) on one side: summed out on both sides first
            odd = {c for c in set(la) & set(lb) - later if a.shape[la.index(c)] != b.shape[lb.index(c)]}
            a, la = p.sum_out(a, la, (later | set(lb)) - odd)
            b, lb = p.sum_out(b, lb, (later | set(la)) - odd)
            r, lr, done = p.contract(a, la, b, lb, later, y if not rest else None, out)
            if done:
                return p.steps
            ops = [(r, lr)] + rest
        p.finish(*ops[0], y, out)
        return p.steps

    def bind(self, ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        bufs = iter(scratch)

        def take(shape: tuple[int, ...]) -> np.ndarray:
            return scratch_view(next(bufs), shape, self.dt)

        steps = self._plan(list(ins), outs[0], take)

        def run() -> None:
            for f, args, kw in steps:
                f(*args, **kw)
        return run


def _standin(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """A C-contiguous array's shape and strides over one element: planning only looks, never reads."""
    strides = [dtype.itemsize] * len(shape)
    for k in range(len(shape) - 2, -1, -1):
        strides[k] = strides[k + 1] * max(shape[k + 1], 1)
    return as_strided(np.zeros(1, dtype), shape, strides, writeable=False)


KERNELS = {"Einsum": Einsum}
