"""Fuse what follows a Conv or Gemm into its epilogue: a residual Add/Sum and a Relu.

The kernel applies them to each output block while the block is still in cache, instead of one more
pass over the whole tensor per op. A fused residual add moves the Conv to the Add's place in the order,
where its inputs are still available and the other addend has been computed.
"""

from __future__ import annotations

from ctxrt.ir.graph import Graph, Node
from ctxrt.ir.passes.base import Pass, PassResult, check_topological

FUSABLE = {"Conv", "Gemm"}


def _sole_producer(graph: Graph, name: str, ops: set[str], consumers, producers) -> Node | None:
    src = producers.get(name)
    if src is None or src.op not in ops or len(consumers[name]) != 1 or name in graph.outputs:
        return None
    return src


class FuseActivation(Pass):
    def call(self, graph: Graph) -> PassResult:
        modified = self._fuse_residual(graph)
        consumers, producers = graph.consumers(), graph.producers()
        removed: set[int] = set()
        for node in graph.nodes:
            src = _sole_producer(graph, node.inputs[0], FUSABLE, consumers, producers) if node.op == "Relu" else None
            if src is None or "activation" in src.attrs:
                continue
            src.attrs["activation"] = "Relu"
            src.outputs = [node.outputs[0]]
            removed.add(id(node))
        graph.nodes = [n for n in graph.nodes if id(n) not in removed]
        graph.prune_values()
        return PassResult(graph, modified or bool(removed))

    def _fuse_residual(self, graph: Graph) -> bool:
        """Conv -> Add/Sum(conv, other) of the same shape: the Conv adds `other` as its 4th input."""
        consumers, producers = graph.consumers(), graph.producers()
        moved: dict[int, Node] = {}
        for node in graph.nodes:
            if node.op not in ("Add", "Sum") or len(node.inputs) != 2 or node.inputs[0] == node.inputs[1]:
                continue
            out = graph.values[node.outputs[0]]
            for k in (0, 1):
                conv = _sole_producer(graph, node.inputs[k], {"Conv"}, consumers, producers)
                other = graph.values[node.inputs[1 - k]]
                if (conv is None or id(conv) in moved or "residual" in conv.attrs or other.is_const
                        or other.shape != out.shape or other.dtype != out.dtype or len(conv.inputs) != 3):
                    continue
                conv.attrs["residual"] = 1
                conv.inputs = conv.inputs + [other.name]
                conv.outputs = [node.outputs[0]]
                moved[id(node)] = conv
                break
        if not moved:
            return False
        fused = {id(c) for c in moved.values()}
        graph.nodes = [moved.get(id(n), n) for n in graph.nodes if id(n) not in fused]
        graph.prune_values()
        return True

    def ensures(self, graph: Graph) -> None:
        check_topological(graph)
