"""Store the constant right-hand matrix of MatMul transposed ([N, K]) and mark the node transB=1.

OpenBLAS packs B on every call; reading it from a [N, K] layout (an "NT" GEMM) streams the weights
faster when they are not in cache, which is every run for a model larger than the cache: 8 % on a
BERT feed-forward MatMul (128x384 @ 384x1536) measured cold. The weights are stored once, transposed, in
the context binary: no copy at load time. Compiled to run from memory (`keep_mapped`), weights read in place from
a model's external data file (ctxrt.mapped) keep their layout: a transposed copy would be a second copy of them
in memory (oneDNN and NumPy read either layout), and so do the ones read from the model file itself
(`frozen`: the transposed copy would double the compile's peak); written to a binary, they are transposed there
(a decoder's GEMVs at two threads: 65 vs 81 us for 768 x 2048, 68 vs 88 for 2048 x 768).
"""

from __future__ import annotations

import numpy as np

from ctxrt.ir.graph import Graph, Value
from ctxrt.ir.memo import memo
from ctxrt.ir.passes.base import Pass, PassResult, check_topological
from ctxrt.mapped import frozen, region


class TransposeMatMulWeights(Pass):
    def __init__(self, keep_mapped: bool = False) -> None:
        self.keep_mapped = keep_mapped

    def call(self, graph: Graph) -> PassResult:
        consumers = graph.consumers()
        changed = False
        for node in graph.nodes:
            if node.op != "MatMul" or node.attrs.get("transB") or len(node.inputs) != 2:
                continue
            name = node.inputs[1]
            v = graph.values[name]
            if not v.is_const or v.const.ndim != 2 or name in graph.outputs or \
                    self.keep_mapped and (region(v.const) is not None or frozen(v.const)):
                continue
            if len(graph.values[node.inputs[0]].shape) < 2:  # a vector times a matrix: keep it
                continue
            if any(c.op != "MatMul" or c.inputs[1] != name or c.inputs[0] == name for c in consumers[name]):
                continue  # read by something else too: keep one layout
            t_name = f"{name}__T"
            if t_name not in graph.values:
                const = memo("transposed", v.const, None, lambda v=v: np.ascontiguousarray(v.const.T))
                graph.values[t_name] = Value(t_name, v.dtype, (v.shape[1], v.shape[0]), const)
            for c in consumers[name]:
                c.inputs[1] = t_name
                c.attrs["transB"] = 1
            changed = True
        if changed:
            graph.prune_values()
        return PassResult(graph, changed)

    def ensures(self, graph: Graph) -> None:
        check_topological(graph)
