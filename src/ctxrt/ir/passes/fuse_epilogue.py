"""Fold what follows a provider's MatMul into its epilogue: a constant bias Add, then a residual Add of a tensor
of the output's shape, then a Gelu or Relu (a transformer layer's projections: MatMul, Add bias, Add residual,
or MatMul, Add bias, Gelu), or another activation the provider names (the CPU's oneDNN: Swish, a gated MLP's
SiLU). The MatMul gets the bias as input 2 (`bias=1`), the residual as input 3 (`residual=1`) and `activation`,
and writes the last folded node's output.

Only for nodes a kernel provider runs (their `kernel` attribute), whose kernels take these epilogues as
post-ops; `supports` is asked again for the fused node, and a fusion it refuses is not made.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ctxrt.ir.graph import Graph, Node
from ctxrt.ir.passes.base import Pass, PassResult, check_topological

ACTIVATIONS = {"Relu", "Gelu"}


class FuseMatMulEpilogue(Pass):
    def __init__(self, provider: str, supports: Callable[[Graph, Node], bool],
                 activations: frozenset[str] | set[str] = ACTIVATIONS) -> None:
        self.provider, self.supports, self.activations = provider, supports, activations

    def call(self, graph: Graph) -> PassResult:
        dropped: set[str] = set()
        for node in graph.nodes:
            if node.op == "MatMul" and node.attrs.get("kernel") == self.provider and node.name not in dropped:
                dropped |= self._fuse(graph, node)
        if not dropped:
            return PassResult(graph, False)
        graph.nodes = [n for n in graph.nodes if n.name not in dropped]
        graph.prune_values()
        return PassResult(graph, True)

    def _next(self, graph: Graph, node: Node) -> Node | None:
        """The only consumer of the node's output, when the output is not a graph output."""
        out = node.outputs[0]
        users = [n for n in graph.nodes if out in n.inputs]
        return users[0] if len(users) == 1 and out not in graph.outputs else None

    def _other(self, graph: Graph, node: Node, add: Node | None) -> str | None:
        """The operand `add` adds to the node's output, if `add` is such an Add."""
        if add is None or add.op != "Add" or len(add.inputs) != 2 or add.inputs[0] == add.inputs[1]:
            return None
        other = add.inputs[1] if add.inputs[0] == node.outputs[0] else add.inputs[0]
        return other if graph.values[other].dtype == graph.values[node.outputs[0]].dtype else None

    def _try(self, graph: Graph, node: Node, inputs: list[str], after: Node, attrs: dict) -> bool:
        trial = Node(node.op, node.name, inputs, list(after.outputs), {**node.attrs, **attrs})
        if not self.supports(graph, trial):
            return False
        node.inputs, node.outputs, node.attrs = trial.inputs, trial.outputs, trial.attrs
        return True

    def _fuse(self, graph: Graph, node: Node) -> set[str]:
        dropped: set[str] = set()
        shape = tuple(graph.values[node.outputs[0]].shape)
        add = self._next(graph, node)
        bias = self._other(graph, node, add)
        if bias is not None and graph.values[bias].is_const and tuple(graph.values[bias].shape) == shape[-1:] \
                and self._try(graph, node, node.inputs[:2] + [bias], add, {"bias": 1}):
            dropped.add(add.name)
            add = self._next(graph, node)
            res = self._other(graph, node, add)
            # the residual must exist when the MatMul runs: produced before it, or a graph input
            earlier = {o for n in graph.nodes[:graph.nodes.index(node)] for o in n.outputs} | set(graph.inputs)
            if res is not None and res in earlier and tuple(graph.values[res].shape) == shape \
                    and self._try(graph, node, node.inputs + [res], add, {"residual": 1}):
                dropped.add(add.name)
        act = self._next(graph, node)
        extra = {"alpha": float(act.attrs.get("alpha", 1.0))} if act is not None and act.op == "Swish" else {}
        if act is not None and act.op in self.activations and len(act.inputs) == 1 and self._try(
                graph, node, list(node.inputs), act,
                {"activation": act.op, "approximate": act.attrs.get("approximate", "none"), **extra}):
            dropped.add(act.name)
        return dropped

    def ensures(self, graph: Graph) -> None:
        check_topological(graph)


def conv_activation(graph: Graph, act: Node) -> dict[str, Any] | None:
    """The attributes that fold element-wise node `act` into a Conv's epilogue (`activation`, with its parameters
    as `activation_alpha` and `activation_beta`), or None where it is not one of these (a Clip's bounds must be
    constants): the activations onnxruntime's FusedConv takes, and HardSwish, Swish, GELU and Elu."""
    a = act.attrs
    if act.op in ("Relu", "Sigmoid", "Tanh", "HardSwish"):
        params = {"HardSwish": (float(a.get("alpha", 1 / 6)), float(a.get("beta", 0.5)))}.get(act.op, (0.0, 0.0))
    elif act.op == "LeakyRelu":
        params = (float(a.get("alpha", 0.01)), 0.0)
    elif act.op == "Elu":
        params = (float(a.get("alpha", 1.0)), 0.0)
    elif act.op == "HardSigmoid":
        params = (float(a.get("alpha", 0.2)), float(a.get("beta", 0.5)))
    elif act.op == "Swish":
        params = (float(a.get("alpha", 1.0)), 0.0)
    elif act.op == "Gelu":
        return {"activation": "Gelu_tanh" if a.get("approximate", "none") == "tanh" else "Gelu"}
    elif act.op == "Clip":
        bounds = []
        for i, default in ((1, float(a.get("min", -3.4028234663852886e38))),
                           (2, float(a.get("max", 3.4028234663852886e38)))):
            name = act.inputs[i] if len(act.inputs) > i else ""
            if not name:
                bounds.append(default)
            elif graph.values[name].is_const and graph.values[name].const.size == 1:
                bounds.append(float(graph.values[name].const.reshape(-1)[0]))
            else:
                return None
        params = (bounds[0], bounds[1])
    else:
        return None
    return {"activation": act.op, "activation_alpha": params[0], "activation_beta": params[1]}


class FuseConvActivation(Pass):
    """Fold the element-wise activation that alone reads a provider's Conv (the `kernel` attribute) into its
    epilogue (conv_activation), where `supports` accepts the fused node: HardSwish after MobileNetV3's convs,
    Swish after EfficientNet's, Clip (ReLU6) after MobileNetV2's run while each output block is in cache, with
    one launch fewer each. Generic Relu fusion is FuseActivation's, for every backend."""

    def __init__(self, provider: str, supports: Callable[[Graph, Node], bool]) -> None:
        self.provider, self.supports = provider, supports

    def call(self, graph: Graph) -> PassResult:
        consumers = graph.consumers()
        dropped: set[str] = set()
        for node in graph.nodes:
            if node.op not in ("Conv", "ConvTranspose") or node.attrs.get("kernel") != self.provider \
                    or "activation" in node.attrs:
                continue
            out = node.outputs[0]
            users = consumers.get(out, [])
            if len(users) != 1 or out in graph.outputs:
                continue
            act = users[0]
            if act.inputs[0] != out or len(act.outputs) != 1 or \
                    graph.values[act.outputs[0]].dtype != graph.values[out].dtype:
                continue
            extra = conv_activation(graph, act)
            if extra is None:
                continue
            trial = Node(node.op, node.name, list(node.inputs), list(act.outputs), {**node.attrs, **extra})
            if not self.supports(graph, trial):
                continue
            node.outputs, node.attrs = trial.outputs, trial.attrs
            dropped.add(act.name)
        if not dropped:
            return PassResult(graph, False)
        graph.nodes = [n for n in graph.nodes if n.name not in dropped]
        graph.prune_values()
        return PassResult(graph, True)

    def ensures(self, graph: Graph) -> None:
        check_topological(graph)
