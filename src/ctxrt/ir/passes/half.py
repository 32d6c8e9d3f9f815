"""Compute float16 and bfloat16 graphs in float32, converting only at the edges (docs/quantization.md).

A CPU has no fast half-precision arithmetic: NumPy's float16 kernels convert every operand on every call (a small
CNN ran 100x slower than in float32). This pass retypes every half-precision activation that an op of `WIDENED`
reads or writes to float32, and converts at the boundaries only:

- a half-precision graph input is cast to float32 once, where a widened op first reads it; a graph output a widened
  op writes is cast back once, at the end;
- an op outside `WIDENED` (a random generator, a quantizer, anything whose result depends on its float type) keeps
  its types: a widened value it reads is cast back to its half type (once per value), and its half outputs are
  cast to float32 where a widened op reads them;
- Cast nodes to a half type now cast to float32, so the conversion pairs float16 converters write around a
  `keep_io_types` model (float32 input -> Cast float16 -> ... -> Cast float32 -> output) become copies, removed;
- constants stay in the weights as the model gives them: a small one (a bias, a norm's scale, a scalar; at most
  `SMALL` elements or one axis) is stored widened, a float32 copy of a few bytes; a large one (a layer's weights)
  stays half-precision in the binary, and its node lists the input in its `widen` attribute: the kernel widens it
  once, when it is built (backends/cpu/widen.py), into memory of its own;
- a Gather from a large half table (an embedding) runs in half precision, on the table as stored, and its rows are
  cast: widening the table would double it in memory.

Graphs with control flow (If, Loop, Scan) are left as they are: their bodies are typed by the values they read.
"""

from __future__ import annotations

import numpy as np

from ctxrt import dtypes
from ctxrt.ir.graph import Graph, Node, Value
from ctxrt.ir.passes.base import Pass, PassResult, check_topological
from ctxrt.ir.passes.eliminate import EliminateIdentity

HALF = (np.dtype(np.float16), dtypes.BFLOAT16)
F32 = np.dtype(np.float32)
WIDEN = "widen"  # node attribute: indices of half-precision constant inputs its kernel widens when built
SMALL = 4096  # elements up to which a half constant is stored widened (any count along a single axis)
_ONNX_FLOAT, _ONNX_TYPES = 1, {np.dtype(np.float16): 10, dtypes.BFLOAT16: 16}

# Ops whose float types are interchangeable: computing them in float32 is computing them more precisely.
WIDENED = {
    # element-wise
    "Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sum", "Mean", "Neg", "Abs", "Reciprocal", "Sqrt", "Exp",
    "Log", "Erf", "Tanh", "Sigmoid", "Relu", "LeakyRelu", "PRelu", "HardSigmoid", "HardSwish", "Swish", "Softplus",
    "Softsign", "Elu", "Selu", "Celu", "Mish", "Gelu", "Sin", "Cos", "Tan", "Asin", "Acos",
    "Atan", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh", "Floor", "Ceil", "Round", "Sign",
    "ThresholdedRelu", "Shrink", "Clip", "Where", "IsNaN", "IsInf", "Equal", "Less", "Greater", "LessOrEqual",
    "GreaterOrEqual",
    # contractions, windows, normalizations, reductions
    "Conv", "ConvTranspose", "MatMul", "Gemm", "Einsum", "MaxPool", "AveragePool", "GlobalAveragePool",
    "GlobalMaxPool", "LRN", "BatchNormalization", "InstanceNormalization", "LayerNormalization",
    "GroupNormalization", "RMSNormalization", "SimplifiedLayerNormalization", "com.microsoft.SkipLayerNormalization",
    "com.microsoft.SkipSimplifiedLayerNormalization", "LpNormalization", "MeanVarianceNormalization",
    "Softmax", "LogSoftmax", "Hardmax", "Det", "ReduceMean", "ReduceSum",
    "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2", "ReduceSumSquare", "ReduceLogSum",
    "ReduceLogSumExp", "ArgMax", "ArgMin", "CumSum", "CumProd", "TopK", "DFT", "STFT",
    # data movement
    "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Concat", "Split", "Slice", "Gather",
    "GatherElements", "GatherND", "Expand", "Tile", "Pad", "Resize", "Upsample", "DepthToSpace", "SpaceToDepth",
    "GridSample", "Identity", "Trilu", "ScatterND", "ScatterElements", "ChannelShuffle",
    "Cast",
}
_GATHERS = {"Gather", "GatherElements", "GatherND"}


def is_half(dtype: object) -> bool:
    return np.dtype(dtype) in HALF


def small(value: Value) -> bool:
    return value.const is not None and (value.const.size <= SMALL or sum(d > 1 for d in value.shape) <= 1)


class ComputeHalfInFloat(Pass):
    def call(self, graph: Graph) -> PassResult:
        if not any(is_half(v.dtype) for v in graph.values.values()) or any(
                isinstance(a, Graph) for node in graph.nodes for a in node.attrs.values()):
            return PassResult(graph, False)
        _Widen(graph).run()
        graph = EliminateIdentity()(graph).graph  # the Casts that became copies
        graph.prune_values()
        return PassResult(graph, True)

    def ensures(self, graph: Graph) -> None:
        check_topological(graph)


class _Widen:
    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.half: dict[str, np.dtype] = {}  # widened activation -> the half type it had
        self.copies: dict[tuple[str, str], str] = {}  # (value, dtype name) -> its converted copy
        self.nodes: list[Node] = []

    def widens(self, node: Node) -> bool:
        if node.op not in WIDENED:
            return False
        if node.op in _GATHERS:  # rows of a large table: gathered as stored, then cast
            table = self.graph.values[node.inputs[0]]
            return not (table.is_const and is_half(table.dtype) and not small(table))
        return True

    def run(self) -> None:
        g = self.graph
        widening = [self.widens(node) for node in g.nodes]
        finals = self._rename_outputs(widening)
        for node, widen in zip(g.nodes, widening, strict=True):
            if widen:
                self._widen(node)
            else:
                node.inputs = [self.convert(n, self.half[n]) if n in self.half else n for n in node.inputs]
            self.nodes.append(node)
        for inner, out in finals:
            self.nodes.append(Node("Cast", f"{out}/narrow", [inner], [out], {"to": _ONNX_TYPES[g.values[out].dtype]}))
        g.nodes = self.nodes

    def _rename_outputs(self, widening: list[bool]) -> list[tuple[str, str]]:
        """Half graph outputs written by widened nodes: the node writes `out#f32`, cast into `out` at the end."""
        g = self.graph
        finals = []
        for node, widen in zip(g.nodes, widening, strict=True):
            for k, out in enumerate(node.outputs):
                if not widen or out not in g.outputs or not is_half(g.values[out].dtype):
                    continue
                inner = f"{out}#f32"
                v = g.values[out]
                g.values[inner] = Value(inner, v.dtype, v.shape)
                node.outputs[k] = inner
                for other in g.nodes:
                    other.inputs = [inner if n == out else n for n in other.inputs]
                finals.append((inner, out))
        return finals

    def _widen(self, node: Node) -> None:
        g = self.graph
        widen = []
        for i, name in enumerate(node.inputs):
            v = g.values[name] if name else None
            if v is None or not is_half(v.dtype):
                continue
            if not v.is_const:
                node.inputs[i] = self.convert(name, F32)
            elif small(v):
                node.inputs[i] = self.widened_const(name)
            else:
                widen.append(i)
        if widen:
            node.attrs = {**node.attrs, WIDEN: widen}
        for out in node.outputs:
            if out and is_half(g.values[out].dtype):
                self.half[out] = np.dtype(g.values[out].dtype)
                g.values[out].dtype = F32
        if node.op == "Cast" and node.attrs.get("to") in _ONNX_TYPES.values():
            node.attrs = {**node.attrs, "to": _ONNX_FLOAT}
        if node.op == "Cast" and np.dtype(g.values[node.inputs[0]].dtype) == np.dtype(g.values[node.outputs[0]].dtype):
            node.op, node.attrs = "Identity", {}

    def widened_const(self, name: str) -> str:
        key = (name, F32.name)
        if key not in self.copies:
            v = self.graph.values[name]
            new = f"{name}#f32"
            self.graph.values[new] = Value(new, F32, v.shape, v.const.astype(F32))
            self.copies[key] = new
        return self.copies[key]

    def convert(self, name: str, dtype: np.dtype) -> str:
        """`name` converted to `dtype` by a Cast made once, here (before the node that first needs it)."""
        key = (name, np.dtype(dtype).name)
        if key not in self.copies:
            v = self.graph.values[name]
            new = f"{name}#{'f32' if dtype == F32 else np.dtype(dtype).name}"
            self.graph.values[new] = Value(new, np.dtype(dtype), v.shape)
            to = _ONNX_FLOAT if dtype == F32 else _ONNX_TYPES[np.dtype(dtype)]
            self.nodes.append(Node("Cast", f"{new}/cast", [name], [new], {"to": to}))
            self.copies[key] = new
        return self.copies[key]
