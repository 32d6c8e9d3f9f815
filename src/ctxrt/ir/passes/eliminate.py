"""Remove nodes that compute nothing at inference: Identity, Dropout, a Cast to the type its input already has
(torch's exports of Llama-style RMS norms cast float32 to float32 twice a norm), a Concat of one input (torch's
legacy export of a KV cache's first update: its present is then a Concat of the past input itself, which appends
in place, docs/generate.md), and nodes nobody reads."""

from __future__ import annotations

import numpy as np

from ctxrt.ir.graph import Graph
from ctxrt.ir.passes.base import Pass, PassResult, check_topological

_NOOPS = {"Identity", "Dropout"}


class EliminateIdentity(Pass):
    """Rewire readers of Identity/Dropout outputs to their input.

    When the output is a graph output, the producer of the input is renamed to it instead; if that
    is impossible (the input is a graph input, a constant or another output) the node stays as a copy.
    """

    def call(self, graph: Graph) -> PassResult:
        kept, modified = [], False
        producers = graph.producers()
        for node in graph.nodes:
            if not (node.op in _NOOPS or _same_type_cast(graph, node) or _one_input_concat(node)) or (
                    len(node.outputs) > 1 and node.outputs[1]):
                kept.append(node)
                continue
            src, dst = node.inputs[0], node.outputs[0]
            if dst in graph.outputs:
                if src in graph.inputs or src in graph.outputs or graph.values[src].is_const:
                    node.op, node.attrs = "Identity", {}
                    kept.append(node)
                    continue
                _rename(graph, src, dst, producers[src])
            else:
                _replace_uses(graph, dst, src)
            modified = True
        graph.nodes = kept
        graph.prune_values()
        return PassResult(graph, modified)

    def ensures(self, graph: Graph) -> None:
        check_topological(graph)


def _one_input_concat(node) -> bool:
    return node.op == "Concat" and len(node.inputs) == 1 and bool(node.inputs[0])


def _same_type_cast(graph: Graph, node) -> bool:
    if node.op != "Cast" or len(node.inputs) != 1 or not node.inputs[0]:
        return False
    src, dst = graph.values.get(node.inputs[0]), graph.values.get(node.outputs[0])
    return src is not None and dst is not None and np.dtype(src.dtype) == np.dtype(dst.dtype)


def _replace_uses(graph: Graph, old: str, new: str) -> None:
    for node in graph.nodes:
        node.inputs = [new if n == old else n for n in node.inputs]


def _rename(graph: Graph, old: str, new: str, producer) -> None:
    producer.outputs = [new if n == old else n for n in producer.outputs]
    _replace_uses(graph, old, new)
    graph.values[new].dtype, graph.values[new].shape = graph.values[old].dtype, graph.values[old].shape


class EliminateDead(Pass):
    """Drop nodes none of whose outputs reaches a graph output."""

    def call(self, graph: Graph) -> PassResult:
        live = set(graph.outputs)
        kept = []
        for node in reversed(graph.nodes):
            if any(o in live for o in node.outputs if o):
                kept.append(node)
                live.update(n for n in node.inputs if n)
        modified = len(kept) != len(graph.nodes)
        graph.nodes = kept[::-1]
        graph.prune_values()
        return PassResult(graph, modified)

    def ensures(self, graph: Graph) -> None:
        check_topological(graph)
