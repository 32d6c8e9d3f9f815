"""Fuse the RMS normalization that torch exports spell out (Llama, Qwen2, Mistral, T5 layer norms) into one
RMSNormalization node: x * (1 / sqrt(mean(x^2, last axis) + eps)) * gamma, with x^2 as Pow(x, 2) or x * x, the
reciprocal as Reciprocal(s), Div(1, s), or a Div(x, s) in place of the product, and the float32 Casts such exports
put around it (Cast to the type it already has: gone before this pass, EliminateIdentity) .

Seven launches and two row-sized intermediates become one kernel (the native RMS rows where the extension is
built, docs/cpu.md). gamma must be a constant of the last axis' size; the statistic's intermediates must feed
nothing else.
"""

from __future__ import annotations

import numpy as np

from ctxrt.ir.graph import Graph, Node
from ctxrt.ir.passes.base import Pass, PassResult, check_topological, replace_nodes


def _scalar(graph: Graph, name: str) -> float | None:
    v = graph.values.get(name)
    return float(v.const.reshape(-1)[0]) if v is not None and v.is_const and v.const.size == 1 else None


class FuseRms(Pass):
    def call(self, graph: Graph) -> PassResult:
        consumers, producers = graph.consumers(), graph.producers()
        removed: set[int] = set()
        replace: dict[int, Node] = {}

        def made_for(name: str, op: str, users: int = 1) -> Node | None:
            """The `op` node making `name` when `name` feeds nothing but `users` nodes and is no graph output."""
            node = producers.get(name)
            if node is None or node.op != op or id(node) in removed or name in graph.outputs:
                return None
            return node if len(consumers.get(name, [])) == users else None

        def squared(name: str, x: str) -> Node | None:
            node = producers.get(name)
            if node is None or id(node) in removed or len(consumers.get(name, [])) != 1:
                return None
            if node.op == "Pow" and node.inputs[0] == x and _scalar(graph, node.inputs[1]) == 2.0:
                return node
            if node.op == "Mul" and node.inputs == [x, x]:
                return node
            return None

        def statistic(s: str, x: str) -> tuple[list[Node], float] | None:
            """The nodes making s = sqrt(mean(x^2, -1, keepdims) + eps) from x, and eps."""
            sqrt = made_for(s, "Sqrt")
            add = sqrt and made_for(sqrt.inputs[0], "Add")
            if add is None or len(add.inputs) != 2:
                return None
            for k in (0, 1):
                eps = _scalar(graph, add.inputs[1 - k])
                mean = made_for(add.inputs[k], "ReduceMean")
                if eps is None or mean is None or not int(mean.attrs.get("keepdims", 1)):
                    continue
                axes = mean.attrs.get("axes")
                if axes is None and len(mean.inputs) > 1 and mean.inputs[1]:
                    const = graph.values[mean.inputs[1]]
                    axes = const.const.reshape(-1).tolist() if const.is_const else None
                rank = len(graph.values[x].shape or ())
                if axes is None or rank == 0 or [int(a) % rank for a in axes] != [rank - 1]:
                    continue
                sq = squared(mean.inputs[0], x)
                if sq is not None:
                    return [sq, mean, add, sqrt], eps
            return None

        for mul in graph.nodes:  # the last Mul: normalized * gamma (either order)
            if mul.op != "Mul" or len(mul.inputs) != 2 or id(mul) in removed:
                continue
            for g in (0, 1):
                gamma, normed = graph.values.get(mul.inputs[g]), mul.inputs[1 - g]
                if gamma is None or not gamma.is_const or gamma.const.ndim != 1:
                    continue
                found = self._normalized(graph, normed, made_for, statistic)
                if found is None:
                    continue
                x, nodes, eps = found
                shape = graph.values[x].shape
                if not shape or shape[-1] != gamma.const.size or graph.values[x].dtype != np.float32 or \
                        gamma.const.dtype != np.float32 or graph.values[mul.outputs[0]].shape != shape:
                    continue
                replace[id(mul)] = Node("RMSNormalization", f"{mul.name}/rms", [x, mul.inputs[g]],
                                        list(mul.outputs), {"axis": -1, "epsilon": eps, "stash_type": 1})
                removed.update(id(n) for n in nodes)
                break
        return replace_nodes(graph, replace, removed)

    @staticmethod
    def _normalized(graph: Graph, name: str, made_for, statistic) -> tuple[str, list[Node], float] | None:
        """(x, the nodes, eps) where `name` = x * (1 / s) or x / s, s the RMS statistic of x."""
        node = made_for(name, "Mul") or made_for(name, "Div")
        if node is None or len(node.inputs) != 2:
            return None
        if node.op == "Div":  # x / s
            x, s = node.inputs
            found = statistic(s, x)
            return None if found is None else (x, [node, *found[0]], found[1])
        for k in (0, 1):
            x, inv = node.inputs[1 - k], node.inputs[k]
            recip = made_for(inv, "Reciprocal")
            if recip is not None:
                s = recip.inputs[0]
            else:
                div = made_for(inv, "Div")
                if div is None or _scalar(graph, div.inputs[0]) != 1.0:
                    continue
                recip, s = div, div.inputs[1]
            found = statistic(s, x)
            if found is not None:
                return x, [node, recip, *found[0]], found[1]
        return None

    def ensures(self, graph: Graph) -> None:
        check_topological(graph)
