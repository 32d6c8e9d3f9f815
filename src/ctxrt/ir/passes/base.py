"""Pass infrastructure: a pass checks what it requires, transforms, then checks what it ensures."""

from __future__ import annotations

from dataclasses import dataclass

from ctxrt.errors import PlanError
from ctxrt.ir.graph import Graph, Node


@dataclass
class PassResult:
    graph: Graph
    modified: bool


def replace_nodes(graph: Graph, replace: dict[int, Node], removed: set[int]) -> PassResult:
    """A fusion's result: each node whose id is in `replace` swapped for its replacement (kept in its place), the
    ones in `removed` dropped, values nobody uses any more pruned; unmodified when there is nothing to replace."""
    if not replace:
        return PassResult(graph, False)
    graph.nodes = [replace.get(id(n), n) for n in graph.nodes if id(n) not in removed or id(n) in replace]
    graph.prune_values()
    return PassResult(graph, True)


class Pass:
    def requires(self, graph: Graph) -> None:
        """Raise if the graph is not in a state this pass can handle."""

    def call(self, graph: Graph) -> PassResult:
        raise NotImplementedError

    def ensures(self, graph: Graph) -> None:
        """Raise if the pass left the graph in a wrong state (checked where it says it modified the graph)."""

    def __call__(self, graph: Graph) -> PassResult:
        self.requires(graph)
        result = self.call(graph)
        if result.modified or result.graph is not graph:  # an unchanged graph is as its producer left it
            self.ensures(result.graph)
        return result


def check_topological(graph: Graph) -> None:
    """Every node input is a graph input, a constant or an earlier node's output."""
    ready = {n for n, v in graph.values.items() if v.is_const} | set(graph.inputs)
    for node in graph.nodes:
        for name in node.inputs:
            if name and name not in ready:
                raise PlanError(f"node {node.name!r} ({node.op}) reads {name!r} before it is produced")
        ready.update(node.outputs)  # ('' too: a missing optional input is skipped above)
    missing = [o for o in graph.outputs if o not in ready]
    if missing:
        raise PlanError(f"graph outputs never produced: {missing}")


def run_passes(graph: Graph, passes: list[Pass]) -> Graph:
    check_topological(graph)  # once here: each pass checks what it changed
    for p in passes:
        graph = p(graph).graph
    return graph
