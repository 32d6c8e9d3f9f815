"""Fold Mul/Add by a per-channel constant into the Conv, ConvTranspose or BatchNormalization that feeds it.

Caffe2-converted models (DenseNet-121, Inception-v2) follow each Conv and BatchNormalization with
`Mul(x, scale[C,1,1])` and `Add(x, bias[C,1,1])`: two extra passes over every activation.
"""

from __future__ import annotations

import numpy as np

from ctxrt.ir.graph import Graph, Node, Value
from ctxrt.ir.passes.base import Pass, PassResult, check_topological
from ctxrt.ir.passes.fold_bn import CONVS, output_channels, scale_outputs


def _per_channel(c: np.ndarray, out_shape: tuple[int, ...]) -> np.ndarray | None:
    """The constant as a [C] vector if it only varies along axis 1 of out_shape, else None."""
    if c.dtype.kind != "f" or c.ndim > len(out_shape) or len(out_shape) < 2:
        return None
    if np.broadcast_shapes(c.shape, out_shape) != tuple(out_shape):
        return None
    full = (1,) * (len(out_shape) - c.ndim) + c.shape
    if any(d != 1 for i, d in enumerate(full) if i != 1):
        return None
    return np.broadcast_to(c.reshape(-1) if full[1] > 1 else c.reshape(1), (out_shape[1],))


class FoldChannelAffine(Pass):
    def call(self, graph: Graph) -> PassResult:
        consumers, producers = graph.consumers(), graph.producers()
        removed: set[int] = set()
        for node in graph.nodes:
            if node.op not in ("Mul", "Add") or len(node.inputs) != 2:
                continue
            const_pos = [i for i, n in enumerate(node.inputs) if graph.values[n].is_const]
            if len(const_pos) != 1:
                continue
            x = node.inputs[1 - const_pos[0]]
            src = producers.get(x)
            if (src is None or id(src) in removed or src.op not in (*CONVS, "BatchNormalization")
                    or len(consumers[x]) != 1 or x in graph.outputs):
                continue
            out_shape = graph.values[node.outputs[0]].shape
            vec = _per_channel(graph.values[node.inputs[const_pos[0]]].const, out_shape)
            if vec is None or graph.values[x].shape != out_shape:
                continue
            if not _apply(graph, src, node.op, vec.astype(np.float64)):
                continue
            src.outputs = [node.outputs[0]] + src.outputs[1:]
            producers[node.outputs[0]] = src
            removed.add(id(node))
        graph.nodes = [n for n in graph.nodes if id(n) not in removed]
        graph.prune_values()
        return PassResult(graph, bool(removed))

    def ensures(self, graph: Graph) -> None:
        check_topological(graph)


def _apply(graph: Graph, src: Node, op: str, vec: np.ndarray) -> bool:
    """Rewrite src's constant parameters so that it computes `src(x) op vec`."""
    if src.op in CONVS:
        w = graph.const(src.inputs[1])
        has_b = len(src.inputs) > 2 and bool(src.inputs[2])
        b = graph.const(src.inputs[2]) if has_b else np.zeros(output_channels(src, w) if w is not None else 0,
                                                                np.float32)
        if w is None or b is None:
            return False
        if op == "Mul":
            w = scale_outputs(src, w, vec)
            b = b * vec
        else:
            b = b + vec
        src.inputs = [src.inputs[0], _const(graph, f"{src.name}/affine_W", w), _const(graph, f"{src.name}/affine_B", b)]
        return True
    params = [graph.const(n) for n in src.inputs[1:3]]  # BatchNormalization scale, bias
    if any(p is None for p in params):
        return False
    gamma, beta = params
    if op == "Mul":
        gamma, beta = gamma * vec, beta * vec
    else:
        beta = beta + vec
    src.inputs = [src.inputs[0], _const(graph, f"{src.name}/affine_scale", gamma),
                  _const(graph, f"{src.name}/affine_bias", beta)] + src.inputs[3:]
    return True


def _const(graph: Graph, name: str, value: np.ndarray) -> str:
    arr = np.ascontiguousarray(value, dtype=np.float32)
    while name in graph.values:  # a second fold into the same node gets a fresh name
        name += "'"
    graph.values[name] = Value(name, arr.dtype, arr.shape, arr)
    return name
