"""Fuse the exact GELU that exporters spell out, x * 0.5 * (1 + Erf(x / sqrt(2))), into one Gelu node.

Five passes over the FFN activation become one kernel that works in cache-sized blocks. Both torch
exporters' spellings match: the two final Muls (by x and by 0.5) may come in either order.
"""

from __future__ import annotations

import math

import numpy as np

from ctxrt.ir.graph import Graph, Node
from ctxrt.ir.passes.base import Pass, PassResult, check_topological


def _scalar(graph: Graph, name: str) -> float | None:
    v = graph.values[name]
    return float(v.const.reshape(-1)[0]) if v.is_const and v.const.size == 1 else None


class FuseGelu(Pass):
    def call(self, graph: Graph) -> PassResult:
        consumers, producers = graph.consumers(), graph.producers()
        removed: set[int] = set()
        replace: dict[int, Node] = {}

        def only_consumer(name: str) -> Node | None:
            users = consumers.get(name, [])
            return users[0] if len(users) == 1 and name not in graph.outputs else None

        for erf in graph.nodes:
            if erf.op != "Erf":
                continue
            scale = producers.get(erf.inputs[0])
            if scale is None or scale.op not in ("Div", "Mul") or only_consumer(erf.inputs[0]) is not erf:
                continue
            c = _scalar(graph, scale.inputs[1])
            want = math.sqrt(2.0) if scale.op == "Div" else 1.0 / math.sqrt(2.0)
            if c is None or not np.isclose(c, want, rtol=1e-6):
                continue
            x = scale.inputs[0]
            add = only_consumer(erf.outputs[0])
            if add is None or add.op != "Add" or _scalar(graph, add.inputs[1 - add.inputs.index(erf.outputs[0])]) != 1:
                continue
            chain, cur, needed = [scale, erf, add], add.outputs[0], {"x", "half"}
            while needed:
                mul = only_consumer(cur)
                if mul is None or mul.op != "Mul" or len(mul.inputs) != 2:
                    break
                other = mul.inputs[1 - mul.inputs.index(cur)] if cur in mul.inputs else None
                if other == x and "x" in needed:
                    needed.discard("x")
                elif other is not None and _scalar(graph, other) == 0.5 and "half" in needed:
                    needed.discard("half")
                else:
                    break
                chain.append(mul)
                cur = mul.outputs[0]
            if needed or any(id(n) in removed for n in chain):
                continue
            gelu = Node("Gelu", f"{erf.name}/gelu", [x], [cur], {"approximate": "none"})
            for n in chain:
                removed.add(id(n))
            replace[id(chain[-1])] = gelu
        if not replace:
            return PassResult(graph, False)
        graph.nodes = [replace.get(id(n), n) for n in graph.nodes if id(n) not in removed or id(n) in replace]
        graph.prune_values()
        return PassResult(graph, True)

    def ensures(self, graph: Graph) -> None:
        check_topological(graph)
