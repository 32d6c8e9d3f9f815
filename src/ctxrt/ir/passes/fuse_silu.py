"""Fuse the gated activations exporters split in two: Sigmoid(x) * x into Swish(x) (torch's SiLU, as both
torch exporters write it), HardSigmoid(x) * x into HardSwish(x) (torch's hardswish below opset 14); and, first
(`FuseHardGates`), the hard gates written out in arithmetic, as Paddle exports them: clip(x + b, 0, c) / c into
HardSigmoid(x) (alpha 1/c, beta b/c) and x * clip(x + b, 0, c) / c into HardSwish(x) (b = 3, c = 6: PP-OCR's
backbones, whose every conv was followed by four element-wise steps).

Two passes over the tensor and an intermediate as large as it become one blocked kernel. The Mul's operands may
come in either order; the gate must feed nothing else.
"""

from __future__ import annotations

import numpy as np

from ctxrt.ir.graph import Graph, Node
from ctxrt.ir.passes.base import Pass, PassResult, check_topological, replace_nodes

# gate op -> (fused op, attributes copied from the gate with their ONNX defaults)
_GATES: dict[str, tuple[str, dict[str, float]]] = {
    "Sigmoid": ("Swish", {}),
    "HardSigmoid": ("HardSwish", {"alpha": 0.2, "beta": 0.5}),
}


class FuseSilu(Pass):
    def call(self, graph: Graph) -> PassResult:
        consumers, producers = graph.consumers(), graph.producers()
        removed: set[int] = set()
        replace: dict[int, Node] = {}
        for mul in graph.nodes:
            if mul.op != "Mul" or len(mul.inputs) != 2 or mul.inputs[0] == mul.inputs[1]:
                continue
            for k in (0, 1):
                gate, x = producers.get(mul.inputs[k]), mul.inputs[1 - k]
                if (gate is None or gate.op not in _GATES or id(gate) in removed or gate.inputs[0] != x
                        or len(consumers[mul.inputs[k]]) != 1 or mul.inputs[k] in graph.outputs
                        or graph.values[x].shape != graph.values[mul.outputs[0]].shape):
                    continue
                op, defaults = _GATES[gate.op]
                attrs = {key: float(gate.attrs.get(key, v)) for key, v in defaults.items()}
                replace[id(mul)] = Node(op, f"{mul.name}/{op.lower()}", [x], list(mul.outputs), attrs)
                removed.add(id(gate))
                break
        return replace_nodes(graph, replace, removed)

    def ensures(self, graph: Graph) -> None:
        check_topological(graph)


class FuseHardGates(Pass):
    """clip(x + b, 0, c) / c -> HardSigmoid(x, 1/c, b/c); x * clip(x + b, 0, c) / c -> HardSwish(x, 1/c, b/c)
    (the division may be a multiplication by 1/c; the operands of Add and Mul in either order; b, c constants of
    one value each, c > 0; every intermediate feeds only the next step)."""

    def call(self, graph: Graph) -> PassResult:
        consumers, producers = graph.consumers(), graph.producers()
        removed: set[int] = set()
        replace: dict[int, Node] = {}

        def only(name: str) -> Node | None:  # the producer of a value the chain alone reads
            node = producers.get(name)
            if node is None or id(node) in removed or len(consumers[name]) != 1 or name in graph.outputs:
                return None
            return node

        def scalar(name: str) -> float | None:
            v = graph.const(name) if name in graph.values else None
            return float(np.asarray(v).reshape(-1)[0]) if v is not None and v.size == 1 and v.dtype.kind == "f" \
                else None

        def gate(name: str) -> tuple[str, float, float, list[Node]] | None:  # clip(x + b, 0, c): (x, b, c, nodes)
            clip = only(name)
            if clip is None or clip.op != "Clip":
                return None
            bounds = [scalar(n) if n else None for n in clip.inputs[1:3]] if len(clip.inputs) > 1 else \
                [clip.attrs.get("min"), clip.attrs.get("max")]
            bounds += [None] * (2 - len(bounds))
            add = only(clip.inputs[0])
            if bounds[0] != 0.0 or bounds[1] is None or bounds[1] <= 0 or add is None or add.op != "Add":
                return None
            for k in (0, 1):
                b = scalar(add.inputs[1 - k])
                if b is not None and graph.values[add.inputs[k]].const is None:
                    return add.inputs[k], b, float(bounds[1]), [clip, add]
            return None

        for node in graph.nodes:
            if id(node) in removed or node.op not in ("Div", "Mul") or len(node.inputs) != 2:
                continue
            s = scalar(node.inputs[1])
            if s is None or s == 0.0:
                continue
            c = s if node.op == "Div" else 1.0 / s
            head = node.inputs[0]
            found = gate(head)
            op, x, chain = "HardSigmoid", None, []
            if found is not None:
                x, b, cmax, chain = found
            else:
                mul = only(head)
                if mul is None or mul.op != "Mul" or len(mul.inputs) != 2:
                    continue
                for k in (0, 1):
                    found = gate(mul.inputs[k])
                    if found is not None and found[0] == mul.inputs[1 - k]:
                        op, (x, b, cmax, chain) = "HardSwish", found
                        chain = [*chain, mul]
                        break
                if x is None:
                    continue
            if not np.isclose(cmax, c, rtol=1e-6) or graph.values[x].shape != graph.values[node.outputs[0]].shape \
                    or graph.values[x].dtype != graph.values[node.outputs[0]].dtype:
                continue
            replace[id(node)] = Node(op, f"{node.name}/{op.lower()}", [x], list(node.outputs),
                                     {"alpha": 1.0 / c, "beta": b / c})
            removed.update(id(n) for n in chain)
        return replace_nodes(graph, replace, removed)

    def ensures(self, graph: Graph) -> None:
        check_topological(graph)
