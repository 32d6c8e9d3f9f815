"""Graphs whose nodes are valid but not listed in topological order (onnxconverter_common's float16 conversion with
`keep_io_types` appends its input Casts after the nodes that read them): sorted before anything reads them, as
onnxruntime accepts them. The checker and shape inference both walk nodes in list order."""

from __future__ import annotations

import heapq

import onnx

from ctxrt.frontend.control import subgraphs


def sorted_model(proto: onnx.ModelProto) -> onnx.ModelProto:
    """The model itself when every graph (subgraphs too) is in order; else a copy with its nodes sorted (stably:
    each node as early in the original order as its inputs allow). A cycle is left for the checker to report."""
    if _in_order(proto.graph, set()):
        return proto
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    _sort(copy.graph, set())
    return copy


def _known(graph: onnx.GraphProto, outer: set[str]) -> set[str]:
    return outer | {v.name for v in graph.input} | {i.name for i in graph.initializer} | \
        {i.values.name for i in graph.sparse_initializer} | {""}


def _in_order(graph: onnx.GraphProto, outer: set[str]) -> bool:
    ready = _known(graph, outer)
    for node in graph.node:
        if any(name not in ready for name in node.input):
            return False
        if not all(_in_order(sub, ready) for sub in subgraphs(node)):
            return False
        ready.update(node.output)
    return True


def _sort(graph: onnx.GraphProto, outer: set[str]) -> None:
    nodes = list(graph.node)
    made = {o: k for k, node in enumerate(nodes) for o in node.output if o}
    ready = _known(graph, outer)
    needs = [{made[n] for n in _reads(node) if n not in ready and n in made} for node in nodes]
    readers: dict[int, list[int]] = {k: [] for k in range(len(nodes))}
    for k, deps in enumerate(needs):
        for d in deps:
            readers[d].append(k)
    waiting = [len(d) for d in needs]
    heap = [k for k, w in enumerate(waiting) if w == 0]
    heapq.heapify(heap)
    order = []
    while heap:
        k = heapq.heappop(heap)
        order.append(k)
        for r in readers[k]:
            waiting[r] -= 1
            if waiting[r] == 0:
                heapq.heappush(heap, r)
    if len(order) != len(nodes):
        return  # a cycle: the checker names it
    del graph.node[:]
    graph.node.extend(nodes[k] for k in order)
    available = set(ready)
    for node in graph.node:
        for sub in subgraphs(node):
            _sort(sub, available)
        available.update(node.output)


def _reads(node: onnx.NodeProto) -> set[str]:
    """The node's inputs and the outer values its subgraphs read (they must exist before it runs)."""
    names = set(node.input)
    for sub in subgraphs(node):
        inner = {v.name for v in sub.input} | {i.name for i in sub.initializer}
        for n in sub.node:
            names.update(x for x in _reads(n) if x not in inner)
            inner.update(n.output)
    return names
