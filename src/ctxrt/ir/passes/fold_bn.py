"""Fold an inference BatchNormalization into the Conv or ConvTranspose that feeds it (new weights, no BN at run
time)."""

from __future__ import annotations

import numpy as np

from ctxrt.ir.graph import Graph, Node, Value
from ctxrt.ir.passes.base import Pass, PassResult, check_topological

CONVS = ("Conv", "ConvTranspose")


def output_channels(node: Node, w: np.ndarray) -> int:
    """The number of output channels of a Conv's ([M, C/g, ...]) or ConvTranspose's ([C, M/g, ...]) weights."""
    return w.shape[0] if node.op == "Conv" else w.shape[1] * int(node.attrs.get("group", 1))


def scale_outputs(node: Node, w: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """The weights of a Conv or ConvTranspose whose output channel m is multiplied by scale[m] (float64 product)."""
    if node.op == "Conv":
        return w * scale.reshape(-1, *[1] * (w.ndim - 1))
    g = int(node.attrs.get("group", 1))  # [C, M/g, ...]: input channel c in group c // (C/g) writes M/g outputs
    grouped = w.reshape(g, w.shape[0] // g, w.shape[1], *w.shape[2:])
    return (grouped * scale.reshape(g, 1, w.shape[1], *[1] * (w.ndim - 2))).reshape(w.shape)


class FoldBatchNormIntoConv(Pass):
    def call(self, graph: Graph) -> PassResult:
        consumers = graph.consumers()
        producers = graph.producers()
        removed: set[int] = set()
        for bn in graph.nodes:
            if bn.op != "BatchNormalization" or len([o for o in bn.outputs if o]) != 1:
                continue
            conv = producers.get(bn.inputs[0])
            params = [graph.const(n) for n in bn.inputs[1:5]]
            if (conv is None or conv.op not in CONVS or any(p is None for p in params)
                    or len(consumers[bn.inputs[0]]) != 1 or bn.inputs[0] in graph.outputs):
                continue
            w = graph.const(conv.inputs[1])
            b = graph.const(conv.inputs[2]) if len(conv.inputs) > 2 and conv.inputs[2] else None
            if w is None or (len(conv.inputs) > 2 and conv.inputs[2] and b is None):
                continue
            gamma, beta, mean, var = (p.astype(np.float64) for p in params)
            scale = gamma / np.sqrt(var + float(bn.attrs.get("epsilon", 1e-5)))
            new_w = scale_outputs(conv, w, scale).astype(w.dtype)
            bias = np.zeros(output_channels(conv, w)) if b is None else b.astype(np.float64)
            new_b = ((bias - mean) * scale + beta).astype(w.dtype)
            wname, bname = f"{conv.name}/bn_folded_W", f"{conv.name}/bn_folded_B"
            graph.values[wname] = Value(wname, w.dtype, new_w.shape, new_w)
            graph.values[bname] = Value(bname, w.dtype, new_b.shape, new_b)
            conv.inputs = [conv.inputs[0], wname, bname]
            conv.outputs = [bn.outputs[0]]
            removed.add(id(bn))
        graph.nodes = [n for n in graph.nodes if id(n) not in removed]
        graph.prune_values()
        return PassResult(graph, bool(removed))

    def ensures(self, graph: Graph) -> None:
        check_topological(graph)
