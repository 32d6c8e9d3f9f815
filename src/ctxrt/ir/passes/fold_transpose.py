"""Read a MatMul's right-hand operand through a Transpose of its last two axes: MatMul(A, Transpose(K)) becomes
MatMul(A, K) with transB=1 (as onnxruntime's FusedMatMul).

Attention's scores Q.K^T are spelled so by both torch exporters: each token copied the whole key cache into its
transposed layout before the product (a GPT-2-style decoder of 4 layers at past 60: 4 launches a token, ~6 us
each, and the launches a range program re-makes at each new past length). The kernels read K as stored (NumPy's
matmul on the swapped view, BLAS's transposed operand; the OpenCL GEMM's B as [N, K]). The Transpose stays while
anything else reads its output (EliminateDead drops it otherwise). Constant operands are folded before this pass
and stored transposed by TransposeMatMulWeights.
"""

from __future__ import annotations

import numpy as np

from ctxrt.ir.graph import Graph
from ctxrt.ir.passes.base import Pass, PassResult, check_topological


def swaps_last_two(perm: list[int] | None, rank: int) -> bool:
    """Whether Transpose's `perm` on a tensor of `rank` exchanges its last two axes and keeps the others."""
    return rank >= 2 and perm is not None and [int(p) for p in perm] == [*range(rank - 2), rank - 1, rank - 2]


class FoldTransposeIntoMatMul(Pass):
    def call(self, graph: Graph) -> PassResult:
        producers = graph.producers()
        changed = False
        for node in graph.nodes:
            if node.op != "MatMul" or node.domain or node.attrs or len(node.inputs) != 2 or not node.inputs[1]:
                continue
            t = producers.get(node.inputs[1])
            if t is None or t.op != "Transpose" or t.domain or not t.inputs or not t.inputs[0]:
                continue
            k = graph.values[t.inputs[0]]
            if k.is_const or k.dtype not in (np.dtype(np.float32), np.dtype(np.float16)) or \
                    not swaps_last_two(t.attrs.get("perm"), len(k.shape)):
                continue
            a = graph.values[node.inputs[0]]
            if len(a.shape) < 2 or a.dtype != k.dtype:
                continue  # a vector times a matrix: left as exported
            node.inputs[1] = t.inputs[0]
            node.attrs["transB"] = 1
            changed = True
        if changed:
            graph.prune_values()
        return PassResult(graph, changed)

    def ensures(self, graph: Graph) -> None:
        check_topological(graph)
