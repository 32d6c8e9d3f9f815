"""Fuse ShuffleNet's channel shuffle, Reshape (N, g, C/g, H, W) -> Transpose (0, 2, 1, 3, 4) -> Reshape
(N, C, H, W), into one `ChannelShuffle` node (domain ctxrt, attributes `group` and `axis`).

One copy either way, but as one node it is a permutation of the channel axis, which the layout pass can keep
in a channels-last layout (the Reshape/Transpose pair only makes sense in NCHW, so it would force two
reorders around every shuffle).
"""

from __future__ import annotations

from ctxrt.ir.graph import Graph, Node
from ctxrt.ir.passes.base import Pass, PassResult, check_topological


class FuseChannelShuffle(Pass):
    def call(self, graph: Graph) -> PassResult:
        consumers, producers = graph.consumers(), graph.producers()
        kept = set(graph.outputs)
        fused: dict[str, Node] = {}  # last Reshape's name -> the ChannelShuffle replacing the three nodes
        dropped: set[str] = set()
        for last in graph.nodes:
            match = self._match(graph, last, consumers, producers, kept)
            if match is not None:
                first, transpose, group = match
                fused[last.name] = Node("ChannelShuffle", last.name, [first.inputs[0]], list(last.outputs),
                                        {"group": group, "axis": 1}, "ctxrt")
                dropped.update((first.name, transpose.name))
        if not fused:
            return PassResult(graph, False)
        graph.nodes = [fused.get(n.name, n) for n in graph.nodes if n.name not in dropped]
        graph.prune_values()
        return PassResult(graph, True)

    @staticmethod
    def _match(graph: Graph, last: Node, consumers, producers, kept) -> tuple[Node, Node, int] | None:
        if last.op != "Reshape" or not last.inputs:
            return None
        transpose = producers.get(last.inputs[0])
        if transpose is None or transpose.op != "Transpose" or list(transpose.attrs.get("perm", [])) != [0, 2, 1, 3, 4]:
            return None
        first = producers.get(transpose.inputs[0])
        if first is None or first.op != "Reshape":
            return None
        x, mid, out = (graph.values[n] for n in (first.inputs[0], transpose.inputs[0], last.outputs[0]))
        if x.is_const or len(x.shape) != 4 or tuple(out.shape) != tuple(x.shape) or len(mid.shape) != 5:
            return None
        n, c, h, w = x.shape
        group = mid.shape[1]
        if tuple(mid.shape) != (n, group, c // group, h, w) or group * (c // group) != c:
            return None
        for inner in (first.outputs[0], transpose.outputs[0]):  # the intermediates are read by this chain only
            if inner in kept or len(consumers[inner]) != 1:
                return None
        return first, transpose, group

    def ensures(self, graph: Graph) -> None:
        check_topological(graph)
