"""Model split: cut one graph into K consecutive parts where few bytes are live, balancing weights.

A cut before node p carries every non-constant value made before p (or fed to the model) and read at
or after p. Cuts are chosen by dynamic programming over a cost that adds the parts' weight imbalance
and the bytes carried across the cuts (see choose_cuts). Each part is then an ordinary graph:
its inputs are the values it reads but does not make, its outputs the values it makes that the model
returns or a later part reads.
"""

from __future__ import annotations

from dataclasses import replace

from ctxrt.errors import PlanError, UnsupportedOpError
from ctxrt.ir.graph import Graph


def cut_costs(graph: Graph) -> tuple[list[int], list[int]]:
    """For each cut position p in 0..n: bytes carried across it, and weight bytes first used before it."""
    n = len(graph.nodes)
    made = {name: -1 for name in graph.inputs}
    last = {}
    first_const: dict[str, int] = {}
    for k, node in enumerate(graph.nodes):
        for name in node.inputs:
            if not name:
                continue
            if graph.values[name].is_const:
                first_const.setdefault(name, k)
            else:
                last[name] = k
        for name in node.outputs:
            if name:
                made[name] = k
    carried = [0] * (n + 1)
    for name, k in made.items():
        end = last.get(name, k)
        size = graph.values[name].nbytes
        for p in range(k + 1, min(end, n) + 1):
            carried[p] += size
    weights = [0] * (n + 1)
    for name, k in first_const.items():
        weights[k + 1] += graph.values[name].nbytes
    for p in range(1, n + 1):
        weights[p] += weights[p - 1]
    return carried, weights


def choose_cuts(carried: list[int], weights: list[int], k: int) -> list[int]:
    """K - 1 cut positions (each in 1..n-1, increasing), minimizing

        sum over parts of (part weights / (total / K) - 1)^2  +  sum over cuts of carried bytes / C

    where C is the median bytes carried across a cut: balance counts most when parts are far from their
    share, and among near-balanced choices the cuts where fewest bytes are live win. Without weights,
    parts are balanced by node count."""
    n = len(carried) - 1
    if k < 1:
        raise PlanError(f"--split needs K >= 1, got {k}")
    if k > n:
        raise PlanError(f"cannot split a graph of {n} nodes into {k} parts")
    if k == 1:
        return []
    if weights[n] == 0:
        weights = list(range(n + 1))
    target = weights[n] / k
    positive = sorted(c for c in carried[1:n] if c > 0)
    scale = positive[len(positive) // 2] if positive else 1

    def part(q: int, p: int) -> float:
        return ((weights[p] - weights[q]) / target - 1.0) ** 2

    inf = float("inf")
    # best[j][p]: the least cost of parts 0..j-1 with the j-th cut before node p
    best = [[inf] * (n + 1) for _ in range(k)]
    back = [[-1] * (n + 1) for _ in range(k)]
    best[0][0] = 0.0
    for j in range(1, k):
        for p in range(j, n - (k - 1 - j)):
            cut = carried[p] / scale
            for q in range(j - 1, p):
                if best[j - 1][q] < inf:
                    cand = best[j - 1][q] + part(q, p) + cut
                    if cand < best[j][p]:
                        best[j][p], back[j][p] = cand, q
    end = min(range(k - 1, n), key=lambda p: best[k - 1][p] + part(p, n))
    cuts = []
    for j in range(k - 1, 0, -1):
        cuts.append(end)
        end = back[j][end]
    return sorted(cuts)


def cut_bounds(graph: Graph, k: int) -> list[int]:
    """[0, the K - 1 cut positions, the node count]: where `split_graph` cuts."""
    carried, weights = cut_costs(graph)
    return [0, *choose_cuts(carried, weights, k), len(graph.nodes)]


def split_graph(graph: Graph, k: int, bounds: list[int] | None = None) -> list[Graph]:
    """The K parts, in order, each a valid graph over a subset of the values. `bounds` (from `cut_bounds`, e.g.
    of the same model lowered at another shape) cuts at those node positions instead of choosing them."""
    bounds = cut_bounds(graph, k) if bounds is None else bounds
    if len(bounds) != k + 1 or bounds[-1] != len(graph.nodes):
        raise PlanError(f"cuts {bounds[1:-1]} were chosen for {bounds[-1]} nodes; this graph has {len(graph.nodes)}")
    read_later: list[set[str]] = [set() for _ in range(k + 1)]  # values read by parts >= i
    for i in range(k - 1, -1, -1):
        read_later[i] = set(read_later[i + 1])
        for node in graph.nodes[bounds[i]:bounds[i + 1]]:
            read_later[i].update(n for n in node.inputs if n)
    outputs = set(graph.outputs)
    parts = []
    for i in range(k):
        nodes = graph.nodes[bounds[i]:bounds[i + 1]]
        made = [o for node in nodes for o in node.outputs if o]
        made_set = set(made)
        ins: list[str] = []
        for node in nodes:
            for name in node.inputs:
                if name and name not in made_set and not graph.values[name].is_const and name not in ins:
                    ins.append(name)
        order = {name: j for j, name in enumerate(graph.inputs)}
        ins.sort(key=lambda name: order.get(name, len(order)))  # model inputs first, in the model's order
        outs = [o for o in made if o in outputs or o in read_later[i + 1]]
        names = set(ins) | {n for node in nodes for n in node.inputs + node.outputs if n}
        values = {name: graph.values[name] for name in graph.values if name in names}
        parts.append(replace(graph, name=f"part{i}", nodes=list(nodes), values=values, inputs=ins, outputs=outs))
    return parts


def check_links(graph: Graph, parts: list[Graph]) -> None:
    """UnsupportedOpError when a tensor of data-dependent size (ir/dynamic.py: NonZero's, a GroupQueryAttention's
    present, ...) would pass from one part to a later one: a context binary's inputs have planned shapes. As a
    model output it is fine (its real shape is returned)."""
    from ctxrt.compiler.build import _bounded

    bounded = _bounded(graph)
    for i, part in enumerate(parts[:-1]):
        later = {n for p in parts[i + 1:] for n in p.inputs}
        crossing = [o for o in part.outputs if o in bounded and o in later]
        if crossing:
            raise UnsupportedOpError(f"--split: {crossing[:5]} have a data-dependent size and would pass between "
                                     "context binaries; choose another K")
