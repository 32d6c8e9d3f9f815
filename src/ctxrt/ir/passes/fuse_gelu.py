"""Fuse the GELUs that exporters spell out into one Gelu node: the exact one, x * 0.5 * (1 + Erf(x / sqrt(2))),
and the tanh approximation GPT-2 uses, x * 0.5 * (1 + Tanh(sqrt(2 / pi) * (x + 0.044715 * x^3))) (`approximate`
"tanh"), with x^3 as Pow(x, 3) or x * (x * x).

Five to nine passes over the FFN activation become one kernel, or a post-op of the MatMul before it. Both torch
exporters' spellings match: the two final Muls (by x and by 0.5) may come in either order, scalar operands on
either side.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ctxrt.ir.graph import Graph, Node
from ctxrt.ir.passes.base import Pass, PassResult, check_topological, replace_nodes


def _near(c: float, want: float, rtol: float) -> bool:
    """c is `want` (to rtol), or `want` rounded to float16: a float16 model's constant (computed in float32 here,
    ir/passes/half.py; the fused GELU's exact constants differ from it by less than its own float16 precision)."""
    return bool(np.isclose(c, want, rtol=rtol)) or c == float(np.float16(want))


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

        def other(node: Node, name: str) -> str | None:
            """The operand of binary `node` that is not `name`."""
            if len(node.inputs) != 2 or name not in node.inputs:
                return None
            return node.inputs[1 - node.inputs.index(name)]

        def scaled(name: str, want: float) -> str | None:
            """x where `name` is made (for this use only) by Mul(x, c) or Mul(c, x), c close to `want`."""
            mul = producers.get(name)
            if mul is None or mul.op != "Mul" or only_consumer(name) is None or len(mul.inputs) != 2:
                return None
            for k in (0, 1):
                c = _scalar(graph, mul.inputs[k])
                if c is not None and _near(c, want, 1e-5):
                    return mul.inputs[1 - k]
            return None

        def cube_of(name: str) -> str | None:
            """x where `name` is Pow(x, 3) or x * (x * x) (for this use only)."""
            node = producers.get(name)
            if node is None or only_consumer(name) is None:
                return None
            if node.op == "Pow":
                return node.inputs[0] if _scalar(graph, node.inputs[1]) == 3.0 else None
            if node.op != "Mul" or len(node.inputs) != 2:
                return None
            for k in (0, 1):
                sq = producers.get(node.inputs[k])
                x = node.inputs[1 - k]
                if sq is not None and sq.op == "Mul" and list(sq.inputs) == [x, x] and \
                        only_consumer(sq.outputs[0]) is node:
                    return x
            return None

        for erf in graph.nodes:
            if erf.op == "Tanh":
                tanh = self._tanh_form(graph, erf, producers, only_consumer, other, scaled, cube_of)
                if tanh is not None and not any(id(n) in removed for n in tanh[0]):
                    chain, gelu = tanh
                    removed.update(id(n) for n in chain)
                    replace[id(chain[-1])] = gelu
                continue
            if erf.op != "Erf":
                continue
            scale = producers.get(erf.inputs[0])
            if scale is None or scale.op not in ("Div", "Mul") or only_consumer(erf.inputs[0]) is not erf:
                continue
            c = _scalar(graph, scale.inputs[1])
            want = math.sqrt(2.0) if scale.op == "Div" else 1.0 / math.sqrt(2.0)
            if c is None or not _near(c, want, 1e-6):
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
        return replace_nodes(graph, replace, removed)

    @staticmethod
    def _tanh_form(graph: Graph, tanh: Node, producers: dict[str, Node], only_consumer: Any, other: Any,
                   scaled: Any, cube_of: Any) -> tuple[list[Node], Node] | None:
        """(the nodes of a tanh GELU around `tanh`, in graph order of their roles, the Gelu replacing them)."""
        inner = scaled(tanh.inputs[0], math.sqrt(2.0 / math.pi))  # x + 0.044715 x^3
        add = producers.get(inner) if inner is not None else None
        if add is None or add.op != "Add" or only_consumer(inner) is not producers[tanh.inputs[0]]:
            return None
        x = None
        for k in (0, 1):
            cubed = scaled(add.inputs[k], 0.044715)
            if cubed is not None and cube_of(cubed) == add.inputs[1 - k]:
                x = add.inputs[1 - k]
                cube_node = producers[cubed]
                chain = [producers[add.inputs[k]], cube_node]
                if cube_node.op == "Mul":
                    chain.insert(1, producers[next(i for i in cube_node.inputs if i != x)])
                break
        if x is None:
            return None
        chain = [*chain[::-1], add, producers[tanh.inputs[0]], tanh]
        one = only_consumer(tanh.outputs[0])
        if one is None or one.op != "Add" or _scalar(graph, other(one, tanh.outputs[0]) or "") != 1:
            return None
        chain.append(one)
        cur, needed = one.outputs[0], {"x", "half"}
        while needed:
            mul = only_consumer(cur)
            if mul is None or mul.op != "Mul":
                break
            b = other(mul, cur)
            if b == x and "x" in needed:
                needed.discard("x")
            elif b is not None and b in graph.values and _scalar(graph, b) == 0.5 and "half" in needed:
                needed.discard("half")
            else:
                break
            chain.append(mul)
            cur = mul.outputs[0]
        if needed:
            return None
        return chain, Node("Gelu", f"{tanh.name}/gelu", [x], [cur], {"approximate": "tanh"})

    def ensures(self, graph: Graph) -> None:
        check_topological(graph)
