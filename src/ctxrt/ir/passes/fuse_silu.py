"""Fuse the gated activations exporters split in two: Sigmoid(x) * x into Swish(x) (torch's SiLU, as both
torch exporters write it), HardSigmoid(x) * x into HardSwish(x) (torch's hardswish below opset 14).

Two passes over the tensor and an intermediate as large as it become one blocked kernel. The Mul's operands may
come in either order; the gate must feed nothing else.
"""

from __future__ import annotations

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
