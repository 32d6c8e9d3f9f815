"""Fuse a Relu into the Conv or Gemm that feeds it: the kernel applies it to each output block while
the block is still in cache, instead of one more pass over the whole tensor."""

from __future__ import annotations

from ctxrt.ir.graph import Graph
from ctxrt.ir.passes.base import Pass, PassResult, check_topological

FUSABLE = {"Conv", "Gemm"}


class FuseActivation(Pass):
    def call(self, graph: Graph) -> PassResult:
        consumers, producers = graph.consumers(), graph.producers()
        removed: set[int] = set()
        for node in graph.nodes:
            if node.op != "Relu":
                continue
            src = producers.get(node.inputs[0])
            x = node.inputs[0]
            if (src is None or src.op not in FUSABLE or "activation" in src.attrs
                    or len(consumers[x]) != 1 or x in graph.outputs):
                continue
            src.attrs["activation"] = "Relu"
            src.outputs = [node.outputs[0]]
            removed.add(id(node))
        graph.nodes = [n for n in graph.nodes if id(n) not in removed]
        graph.prune_values()
        return PassResult(graph, bool(removed))

    def ensures(self, graph: Graph) -> None:
        check_topological(graph)
