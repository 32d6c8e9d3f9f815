"""Strided lengths in range programs (docs/shapes-and-control-flow.md, "Strided lengths").

A conv's or pool's output length along an axis that follows a dim n is floor((e + P - D(K - 1) - 1) / s) + 1 of its
input's length e; through a chain of them, floor((n + a) / S) + c (nested floors of integers fold into one:
floor((floor(x / p) + b) / q) = floor((x + p b) / (p q))). No affine function of n fits such a length, so a range
compile finds these *derived dims* (a, S) from the model's strided nodes (`families`), probes the dim only at sizes
U - t L on a lattice of step L (the lcm of their S: every derived dim is affine in t there), and fits each integer
there; then each integer that follows the dim is written over one of the dim itself or a derived dim (`convert`),
the one its values at sizes off the lattice agree with (`check_points` chooses those sizes so that any two
candidates, and each derived dim's rounding, differ at one of them).

Pure functions over frontend graphs and integer arrays; compiler/ranges.py does the probing.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

# nodes whose output length along a spatial axis is a floor of their input's (stride > 1)
STRIDED = frozenset({"Conv", "ConvInteger", "QLinearConv", "MaxPool", "AveragePool", "LpPool"})
MAX_FLOORS = 16  # derived dims of one range program
MAX_LATTICE = 4096  # the largest lattice step (a product of strides) a dim takes
MAX_CHECKS = 4  # check points off the lattice (each a probe compile)
_GRID = 1 << 16  # sizes two candidates of an integer are compared at (`convert`)


def families(graphs: Mapping[tuple[int, ...], Any], spec: Sequence[tuple[str, int, int]],
             stepped: Sequence[int] = ()
             ) -> tuple[dict[int, list[tuple[int, int]]], set[int], dict[int, int], set[int]] | None:
    """(Per dim, the derived dims (a, S) (0 <= a < S) that strided nodes' output lengths follow (in the frontend
    graphs read at the points `graphs` names, each point the dims' sizes), in graph order, dims with none left
    out; the dims a strided node's length follows in a way not found (its input's length matches more than one
    known form at every point, its output's none); per dim, the least size where every strided node's output has
    a frame (onnxruntime refuses a conv's empty input); the unknown dims whose points could not tell which dim a
    length follows (more points may)). None where a strided node's input length matches no known form
    (which dim it follows cannot be told): then no dim is probed on a lattice."""
    points = list(graphs)
    if len(points) < 3:
        return {}, set(), {}, set()
    top = graphs[points[0]]
    known: dict[int, list[tuple[int, int]]] = {j: [(0, 1)] for j in range(len(spec)) if j not in stepped}
    unknown: set[int] = set()  # dims a strided node's length follows in a way not found
    ambiguous: set[int] = set()  # ... of those, where the points could not tell which dim (more points may)
    least: dict[int, int] = {}  # per dim, the least size every strided node's output has a frame at
    # per rank and axis, the dim the inputs' extents there are (an image's H at axis 2 of every NCHW tensor after):
    # which dim a strided node's length follows where two dims take the same sizes at the points
    hint: dict[tuple[int, int], set[int]] = {}
    for name in top.inputs:
        shapes = [graphs[p].values[name].shape if name in graphs[p].values else None for p in points]
        if any(sh is None or len(sh) != len(shapes[0]) for sh in shapes):
            continue
        for axis in range(len(shapes[0])):
            hint.setdefault((len(shapes[0]), axis), set()).update(
                j for j in known if all(sh[axis] == p[j] for sh, p in zip(shapes, points, strict=True)))
    for node in top.nodes:
        if node.op not in STRIDED or not node.inputs or not node.outputs:
            continue
        x, y = node.inputs[0], node.outputs[0]
        ins = [g.values[x].shape if x in g.values else None for g in (graphs[p] for p in points)]
        outs = [g.values[y].shape if y in g.values else None for g in (graphs[p] for p in points)]
        if any(s is None or len(s) != len(ins[0]) for s in (*ins, *outs)) or len(ins[0]) < 3:
            continue
        strides = list(node.attrs.get("strides") or [1] * (len(ins[0]) - 2))
        for axis in range(2, len(ins[0])):
            s = int(strides[axis - 2]) if axis - 2 < len(strides) else 1
            e, o = [sh[axis] for sh in ins], [sh[axis] for sh in outs]
            if s <= 1 or len(set(e)) == 1:
                continue
            matches = [(j, a, big, c) for j, forms in known.items() for a, big in forms
                       if (c := _offset(e, points, j, a, big)) is not None]
            if len({j for j, _, _, _ in matches}) > 1:  # two dims of the same sizes at the points: the axis's
                along = hint.get((len(ins[0]), axis), set())
                matches = [m for m in matches if m[0] in along]
            if not matches:
                return None  # no known form: which dim it follows cannot be told (no lattice, no floors)
            if len({(j, a, big) for j, a, big, _ in matches}) != 1:
                unknown.update(j for j, _, _, _ in matches)  # several: those dims take no lattice
                ambiguous.update(j for j, _, _, _ in matches)
                continue
            j, a, big, c = matches[0]
            for t in _structural(node, axis, s, top.values):
                a2, s2 = a + big * (c + t), big * s
                if _offset(o, points, j, a2, s2) == 0:  # (exactly the node's formula at every point)
                    form = (a2 % s2, s2)
                    if form not in known[j]:
                        known[j].append(form)
                    # its output has a frame from n = s2 - a2 on (floor((n + a2) / s2) >= 1)
                    least[j] = max(least.get(j, 0), s2 - a2)
                    break
            else:  # (a point where the model has no graph there, shapes inferred past it: an image's fixed height)
                unknown.add(j)
    return {j: [*forms[1:]] for j, forms in known.items() if len(forms) > 1 and j not in unknown}, unknown, \
        {j: n for j, n in least.items() if j not in unknown}, ambiguous


def _offset(values: Sequence[int], points: Sequence[tuple[int, ...]], j: int, a: int, s: int) -> int | None:
    """c where values[i] == floor((points[i][j] + a) / s) + c at every point, else None."""
    c = values[0] - (points[0][j] + a) // s
    return c if all(v == (p[j] + a) // s + c for v, p in zip(values, points, strict=True)) else None


def _structural(node: Any, axis: int, s: int, values: Mapping[str, Any]) -> list[int]:
    """The t of floor((e + t) / s) that a strided node's attributes give for its output length (SAME padding's
    ceil(e / s), else its explicit pads'); none where they do not say."""
    i = axis - 2
    kernel = node.attrs.get("kernel_shape")
    if kernel is None and len(node.inputs) > 1 and node.inputs[1] in values:
        w = values[node.inputs[1]].shape  # (QLinearConv's weight is input 3)
        w = values[node.inputs[3]].shape if node.op == "QLinearConv" and node.inputs[3] in values else w
        kernel = w[2:]
    if str(node.attrs.get("auto_pad", "NOTSET")) in ("SAME_UPPER", "SAME_LOWER"):
        return [s - 1]  # ceil(e / s)
    out = []
    if kernel is not None and i < len(kernel):
        pads = list(node.attrs.get("pads") or [0] * (2 * len(kernel)))
        dil = list(node.attrs.get("dilations") or [1] * len(kernel))
        k_eff = int(dil[i] if i < len(dil) else 1) * (int(kernel[i]) - 1) + 1
        begin, end = (int(pads[i]), int(pads[i + len(kernel)])) if len(pads) == 2 * len(kernel) else (0, 0)
        if int(node.attrs.get("ceil_mode", 0) or 0):
            # ceil((e + P - K) / s) + 1, less 1 where the last window would start past the input and its begin
            # pad (onnxruntime's and PyTorch's rule): floor((e + P - K + s - 1 + min(max(K - end, 0), s)) / s)
            out.append(begin + end - k_eff + s - 1 + min(max(k_eff - end, 0), s))
        else:  # floor((e + P - K) / s) + 1
            out.append(begin + end - k_eff + s)
    return out


def lattice(forms: Mapping[int, list[tuple[int, int]]], spec: Sequence[tuple[str, int, int]]) -> dict[int, int]:
    """Per dim with derived dims, its lattice step (the lcm of their S) where its range holds two lattice points
    at least one step apart above 1."""
    out = {}
    for j, fs in forms.items():
        step = math.lcm(*(s for _, s in fs))
        _, lo, hi = spec[j]
        if step <= MAX_LATTICE and hi - step >= max(lo, 1):
            out[j] = step
    return out


def check_points(spec: Sequence[tuple[str, int, int]], hi: Sequence[int], steps: Mapping[int, int],
                 forms: Mapping[int, list[tuple[int, int]]], others: Sequence[tuple[int, ...]]
                 ) -> list[tuple[int, ...]]:
    """Points off the lattice (two to MAX_CHECKS): each lattice dim at sizes chosen so that any two of its
    candidate forms (the dim itself and its derived dims) predict different values at one of them at least where
    that can be (greedily: the first far from U, at the usual check point's size, the others anywhere in
    [U - 2L, U)), and each derived dim rounds differently there than on the lattice; the other dims as `others` (the
    usual check points) give them. Candidates no point tells apart are refused where an integer could take
    either (`convert`)."""
    picks: dict[int, list[int]] = {}
    base = list(others) or [tuple(hi)]
    for j, step in steps.items():
        _, lo, top = spec[j]
        fs = [(0, 1), *forms[j]]
        # the usual check point's size (a form missed would show there, far from U), at least where every derived
        # dim is 2 (a length of 1 compiles otherwise: a 1 x 1 map's transposes dropped, the program that runs there
        # is the upper bound's)
        two = max(2 * s - a for a, s in forms[j])
        far = min(max(base[0][j], two), top - 1)
        least = max(lo, 1, min(two, top - 1))
        windows = [range(max(least, far - step), min(top, far + step + 1)), range(max(least, top - 2 * step), top)]
        good = {n for w in windows for n in w if (top - n) % step}
        # and, only where those tell two candidates nowhere apart, any size off the lattice (a derived dim of 1
        # there may compile otherwise: then the range is refused, as it would be for those two candidates)
        sizes = np.array(sorted(good | {n for n in range(max(lo, 1), top, max(1, (top - lo) // 4096))
                                        if (top - n) % step}), np.int64)
        if not good:
            return []
        fine = np.isin(sizes, np.array(sorted(good), np.int64))
        near = np.isin(sizes, np.array(list(windows[1]), np.int64)) & fine
        shift = np.stack([(sizes + a) % s - (top + a) % s for a, s in fs])  # where each rounds unlike the lattice
        pairs = list(itertools.combinations(range(len(fs)), 2))
        tells = np.stack([shift[x] != shift[y] for x, y in pairs]) if pairs else np.zeros((0, len(sizes)), bool)
        rounds = (shift[1:] != 0).sum(0)
        chosen: list[int] = []
        left = np.ones(len(pairs), bool)
        while len(chosen) < MAX_CHECKS and (len(chosen) < 2 or left.any()):
            told = tells[left].sum(0)
            free = ~np.isin(sizes, chosen)
            if not chosen:  # the first far from U, the second near it, the others in either window
                pool = fine & ~near if (fine & ~near).any() else fine
            else:
                pool = near if len(chosen) == 1 and near.any() else fine
            if chosen and left.any() and not (told * (pool & free)).any():
                pool = told > 0  # no size of the windows tells the pairs left apart: any size that does
            score = np.where(pool & free, told * 1000 + rounds, -1)
            i = len(score) - 1 - int(np.argmax(score[::-1]))  # (of equal scores the largest size: nearer U)
            if score[i] < 0:
                break
            chosen.append(int(sizes[i]))
            left &= ~tells[:, i]
        picks[j] = chosen
    count = max((len(c) for c in picks.values()), default=2)
    return [tuple(picks[j][min(n, len(picks[j]) - 1)] if j in picks else base[min(n, len(base) - 1)][j]
                  for j in range(len(hi))) for n in range(count)]


def convert(coeffs: np.ndarray, k: int, steps: Mapping[int, tuple[int, int]],
            forms: Sequence[tuple[int, int, int]], checks: Sequence[tuple[tuple[int, ...], np.ndarray]],
            top: Sequence[int] = ()) -> tuple[list[dict[int, int]], int | None]:
    """Integers fitted over the lattice (`coeffs`: the dims' monomials x integers, each lattice dim j as
    t = (n - r) / L with `steps` j -> (L, r)) written over the dims and the derived dims `forms` ((dim, a, S)
    each, derived dim i bit k + i): (per integer, its coefficient by monomial; the first integer no candidate holds
    at every check point ((the dims and derived dims there, the integers there) each), or two that differ
    somewhere do (`top`: the upper bound, near which every residue is compared), else None). An integer takes one
    of each lattice dim's candidates (the dim itself first) for every monomial of it."""
    out: list[dict[int, int]] = [{m: int(v) for m, v in enumerate(col) if v} for col in coeffs.T.tolist()]
    cands = {j: [(1 << j, step, r)] + [(1 << (k + i), step // s, (r + a) // s)
                                        for i, (d, a, s) in enumerate(forms) if d == j]
             for j, (step, r) in steps.items()}
    for e, col in enumerate(out):
        deps = [j for j in steps if any(m >> j & 1 for m in col)]
        if not deps:
            continue
        held = [got for combo in itertools.product(*(cands[j] for j in deps))
                if (got := _substituted(col, deps, combo)) is not None
                and all(value(got, at) == int(v[e]) for at, v in checks)]
        if not held or any(not _same(held[0], other, k, forms, deps, steps, top) for other in held[1:]):
            return out, e
        out[e] = held[0]
    return out, None


def _same(a: Mapping[int, int], b: Mapping[int, int], k: int, forms: Sequence[tuple[int, int, int]],
          deps: Sequence[int], steps: Mapping[int, tuple[int, int]], top: Sequence[int]) -> bool:
    """Whether two candidate polynomials of an integer are one function: equal at every size of two lattice
    steps below the upper bound along each lattice dim they follow (their difference repeats with the lattice),
    the other dims at the bound; where that grid is too large, only where their coefficients are the same."""
    if a == b:
        return True
    if not top:
        return False
    axes = [np.arange(max(1, top[j] - 2 * steps[j][0]), top[j] + 1, dtype=np.int64) for j in deps]
    if math.prod(len(x) for x in axes) > _GRID:
        return False
    grid = np.meshgrid(*axes, indexing="ij")
    cols = [np.full(grid[0].size, int(top[j]), np.int64) for j in range(k)]
    for j, g in zip(deps, grid, strict=True):
        cols[j] = g.reshape(-1)
    cols += [(cols[d] + a) // s for d, a, s in forms]

    def at(p: Mapping[int, int]) -> np.ndarray:
        total = np.zeros(grid[0].size, np.int64)
        for m, c in p.items():
            term = np.full(grid[0].size, c, np.int64)
            for j, col in enumerate(cols):
                if m >> j & 1:
                    term *= col
            total += term
        return total
    return bool(np.array_equal(at(a), at(b)))


def value(coeffs: Mapping[int, int], ext: Sequence[int]) -> int:
    """A polynomial (coefficient by monomial) at the dims and derived dims `ext`."""
    return sum(c * math.prod(x for j, x in enumerate(ext) if m >> j & 1) for m, c in coeffs.items())


def _substituted(col: Mapping[int, int], deps: Sequence[int], combo: Sequence[tuple[int, int, int]]
                 ) -> dict[int, int] | None:
    """A polynomial in t_j = (x_j - b) / L over each lattice dim j as one in x_j (bit `bit`); None where a
    coefficient is not an integer then."""
    c = dict(col)
    for j, (bit, step, b) in zip(deps, combo, strict=True):
        new: dict[int, int] = {}
        for m, v in c.items():
            if m >> j & 1:
                if v % step:
                    return None
                q = v // step
                rest = m & ~(1 << j)
                new[rest | bit] = new.get(rest | bit, 0) + q
                new[rest] = new.get(rest, 0) - q * b
            else:
                new[m] = new.get(m, 0) + v
        c = {m: v for m, v in new.items() if v}
    return c


def one_per_family(integers: Sequence[Sequence[int]], k: int, forms: Sequence[tuple[int, int, int]]) -> bool:
    """Whether no integer (the monomials it has a nonzero coefficient for, each) takes a dim with one of its derived
    dims, or two derived dims of one dim, in any of its monomials: then every integer is monotone along each dim
    where it is along the box's edges (floor(n / 2) - 2 floor(n / 4) is not: n mod 4 // 2)."""
    fams = [(1 << j) | sum(1 << (k + i) for i, (d, _, _) in enumerate(forms) if d == j) for j in range(k)]
    for monomials in integers:
        used = 0
        for m in monomials:
            used |= int(m)
        if any((used & f).bit_count() > 1 for f in fams):
            return False
    return True
