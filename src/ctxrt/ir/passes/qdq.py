"""Group DequantizeLinear -> op -> QuantizeLinear node units (as onnxruntime's QDQ transformer and QNN's node units
do) into integer ops with the requantization fused: the QLinear* ops and QGemm, whose kernels compute on the
integers (backends/cpu/quant/, and oneDNN's int8 primitives where it runs them).

Each rule is a *selector* (which unit shapes qualify) and an *action* (what replaces them), registered in `RULES`
against the op types it applies to (onnxruntime's qdq_selector_action_transformer):

- weighted (Conv -> QLinearConv, MatMul -> QLinearMatMul, Gemm -> QGemm): activations per tensor, constant weights
  per tensor or per output channel; a float bias becomes the int32 bias at scale x_scale * w_scale, only where it
  lies on that grid (the quantizer's DequantizeLinear of an int32 bias, folded by the frontend);
- binary (Add, Mul, a Sum of two -> QLinearAdd, QLinearMul; an Add -> Relu whose QuantizeLinear's zero point is
  its type's minimum -> QLinearAdd, the Relu implied by saturation), unary (AveragePool, GlobalAveragePool, a
  ReduceMean over H and W -> their QLinear op; 8-bit only), variadic (Concat -> QLinearConcat; 8-bit only); not Softmax:
  onnxruntime's QLinearSoftmax scales by floor(1 / y_scale), which is not the unit's float semantics;
- drop (MaxPool and data movement): with the same scale and zero point on both sides the op commutes with the
  quantization and runs on the integers as they are;
- lookup (a chain of element-wise float ops, `CHAIN`, of 8-bit values -> ctxrt's QLinearLookup): the unit's float
  computation made once at compile time into a 256-byte table, one lookup per value at run time; a
  BatchNormalization as an affine map per channel (y = round(x a + b), within a step of the float unit);
- gather (a Gather from a DequantizeLinear of a constant table): the integer rows gathered, then dequantized;
- requantize (a QuantizeLinear of a DequantizeLinear's output, e.g. around a Dropout removed at inference): an
  Identity of the integers, or with other parameters a one-part QLinearConcat (one table lookup per value).

A unit qualifies when its op's float output goes only to one QuantizeLinear with a scalar constant scale, every
quantized input comes from a DequantizeLinear whose scale and zero point are constants, and the integer types are
8- or 16-bit. Anything else keeps its float DequantizeLinear -> op -> QuantizeLinear, with the spec's semantics.
DequantizeLinear nodes left without readers are removed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ctxrt.ir.canonical import PARAM_INPUTS
from ctxrt.ir.graph import Graph, Node, Value
from ctxrt.ir.passes.base import Pass, PassResult, check_topological
from ctxrt.ir.passes.eliminate import EliminateDead

UNIT = "qdq_unit"  # attribute of a fused node: the float op it replaces
EIGHT = {np.dtype(np.uint8), np.dtype(np.int8)}
INTS = EIGHT | {np.dtype(np.uint16), np.dtype(np.int16)}  # the integer products and QLinearAdd/Mul take 16-bit
MS = "com.microsoft"


@dataclass
class Quant:
    """A quantized operand: the integer tensor, its scale and zero point (value names)."""

    x: str
    scale: str
    zp: str


@dataclass
class Unit:
    node: Node
    q: Node  # the QuantizeLinear of its output
    ins: list[Quant | None]  # per input of the node: its DequantizeLinear's operand, or None
    out: Quant


class _Match:
    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.producers = graph.producers()
        self.consumers = graph.consumers()
        self.zeros: dict[str, str] = {}
        self.dropped: set[int] = set()  # nodes an action replaced besides its op and its QuantizeLinear

    def const(self, name: str) -> np.ndarray | None:
        return self.graph.const(name) if name else None

    def scalar(self, name: str) -> bool:
        c = self.const(name)
        return c is not None and c.size == 1

    def zero_point(self, node: Node, dtype: np.dtype) -> str:
        """The node's zero point input, or a constant 0 of the integer type."""
        if len(node.inputs) > 2 and node.inputs[2]:
            return node.inputs[2]
        name = f"zero_{dtype.name}"
        if name not in self.graph.values:
            self.graph.values[name] = Value(name, dtype, (), np.zeros((), dtype))
        return name

    def dequantized(self, name: str, per_axis: int | None = None) -> Quant | None:
        """The operand of the DequantizeLinear that makes `name`: per tensor, or (per_axis given) per channel
        along that axis of a constant integer tensor."""
        d = self.producers.get(name)
        if d is None or d.op != "DequantizeLinear" or d.attrs.get("block_size") or len(d.inputs) < 2:
            return None
        x, scale = d.inputs[0], d.inputs[1]
        xt = np.dtype(self.graph.values[x].dtype)
        zp = d.inputs[2] if len(d.inputs) > 2 else ""
        if xt not in INTS or self.const(scale) is None or (zp and self.const(zp) is None):
            return None
        if self.graph.values[scale].dtype != np.float32:
            return None
        if not self.scalar(scale):
            shape = self.graph.values[x].shape
            axis = int(d.attrs.get("axis", 1)) % len(shape) if shape else 0
            if per_axis is None or axis != per_axis % len(shape) or self.const(x) is None:
                return None
        return Quant(x, scale, self.zero_point(d, xt))

    def value(self, name: str) -> np.ndarray | None:
        """The constant `name`, or the float32 value of a DequantizeLinear of a constant 1-D (or scalar) tensor."""
        c = self.const(name)
        return c if c is not None else self.dequantized_const(name)

    def dequantized_const(self, name: str) -> np.ndarray | None:
        """The float32 value of a DequantizeLinear of a constant 1-D or scalar integer tensor (an int32 bias the
        frontend did not fold, a BatchNormalization scale the quantizer made int8), or None."""
        d = self.producers.get(name)
        if d is None or d.op != "DequantizeLinear" or len(d.inputs) < 2:
            return None
        x, scale = self.const(d.inputs[0]), self.const(d.inputs[1])
        zp = self.const(d.inputs[2]) if len(d.inputs) > 2 and d.inputs[2] else np.zeros((), np.int64)
        if x is None or scale is None or zp is None or x.ndim > 1 or scale.size not in (1, x.size):
            return None
        return ((x.astype(np.float32) - zp.astype(np.float32).reshape(-1)) * scale.reshape(-1)).astype(np.float32)

    def quantized(self, node: Node) -> Node | None:
        """The QuantizeLinear that alone reads the node's only output (per tensor, constant parameters)."""
        out = node.outputs[0]
        readers = self.consumers.get(out, [])
        if len([o for o in node.outputs if o]) != 1 or out in self.graph.outputs or len(readers) != 1:
            return None
        q = readers[0]
        return q if q.inputs[0] == out and self.per_tensor(q) else None

    def per_tensor(self, q: Node) -> bool:
        """A QuantizeLinear per tensor with constant parameters, to 8 or 16 bits."""
        if q.op != "QuantizeLinear" or not self.scalar(q.inputs[1]):
            return False
        zp = q.inputs[2] if len(q.inputs) > 2 else ""
        if self.graph.values[q.inputs[1]].dtype != np.float32 or (zp and not self.scalar(zp)):
            return False
        return np.dtype(self.graph.values[q.outputs[0]].dtype) in INTS and not q.attrs.get("output_dtype")

    def same(self, a: Quant, b: Quant) -> bool:
        def eq(x: str, y: str) -> bool:
            return x == y or bool(np.array_equal(self.const(x), self.const(y)))
        return eq(a.scale, b.scale) and eq(a.zp, b.zp) and \
            self.graph.values[a.x].dtype == self.graph.values[b.x].dtype


Action = Callable[[_Match, Node], Node | list[Node] | None]


def _unit(m: _Match, node: Node, quantized: tuple[int, ...], weights: dict[int, int] | None = None,
          ints: set[np.dtype] = INTS) -> Unit | None:
    """The unit around `node` whose inputs `quantized` come from DequantizeLinear (those in `weights` maybe per
    channel, along the axis given), all of integer types `ints`; or None."""
    q = m.quantized(node)
    if q is None or np.dtype(m.graph.values[q.outputs[0]].dtype) not in ints:
        return None
    ins: list[Quant | None] = [None] * len(node.inputs)
    for i in quantized:
        if i >= len(node.inputs) or not node.inputs[i]:
            return None
        ins[i] = m.dequantized(node.inputs[i], (weights or {}).get(i))
        if ins[i] is None or np.dtype(m.graph.values[ins[i].x].dtype) not in ints:
            return None
    yt = np.dtype(m.graph.values[q.outputs[0]].dtype)
    return Unit(node, q, ins, Quant(q.outputs[0], q.inputs[1], m.zero_point(q, yt)))


def _node(unit: Unit, op: str, inputs: list[str], attrs: dict, domain: str = "") -> Node:
    return Node(op, unit.node.name, inputs, [unit.out.x], {**attrs, UNIT: unit.node.op}, domain)


def _bias(m: _Match, unit: Unit, i: int, a: Quant, w: Quant) -> str | None:
    """The float bias at input `i` as int32 at scale a_scale * w_scale ('' if none), or None where it is not on
    that grid (then the unit stays float)."""
    if i >= len(unit.node.inputs) or not unit.node.inputs[i]:
        return ""
    b = m.const(unit.node.inputs[i])
    if b is None:
        b = m.dequantized_const(unit.node.inputs[i])
    if b is None:
        return None
    scale = m.const(a.scale).astype(np.float64).reshape(()) * m.const(w.scale).astype(np.float64).reshape(-1)
    b64 = b.astype(np.float64).reshape(-1)
    ints = np.rint(b64 / scale)
    if np.abs(ints).max(initial=0) >= 2**31 or not np.allclose(ints * scale, b64, rtol=1e-5, atol=1e-12):
        return None
    name = f"{unit.node.inputs[i]}#int32"
    m.graph.values[name] = Value(name, np.dtype(np.int32), tuple(ints.shape), ints.astype(np.int32))
    return name


def _conv(m: _Match, node: Node) -> Node | None:
    unit = _unit(m, node, (0, 1), {1: 0})
    if unit is None:
        return None
    x, w = unit.ins[0], unit.ins[1]
    bias = _bias(m, unit, 2, x, w)
    if bias is None:
        return None
    return _node(unit, "QLinearConv", [x.x, x.scale, x.zp, w.x, w.scale, w.zp, unit.out.scale, unit.out.zp, bias],
                 node.attrs)


def _matmul(m: _Match, node: Node) -> Node | None:
    if node.attrs.get("transB"):  # B read transposed (FoldTransposeIntoMatMul): QLinearMatMul has no such form
        return None
    unit = _unit(m, node, (0, 1), {1: -1})
    if unit is None:
        return None
    a, b = unit.ins[0], unit.ins[1]
    if not m.scalar(a.scale):
        return None
    return _node(unit, "QLinearMatMul", [a.x, a.scale, a.zp, b.x, b.scale, b.zp, unit.out.scale, unit.out.zp], {})


def _gemm(m: _Match, node: Node) -> Node | None:
    unit = _unit(m, node, (0, 1), {1: 0 if node.attrs.get("transB") else 1})
    if unit is None or float(node.attrs.get("beta", 1.0)) != 1.0:
        return None
    a, b = unit.ins[0], unit.ins[1]
    bias = _bias(m, unit, 2, a, b)
    if bias is None or (bias and len(m.graph.values[bias].shape) != 1):
        return None
    attrs = {k: node.attrs[k] for k in ("alpha", "transA", "transB") if k in node.attrs}
    return _node(unit, "QGemm", [a.x, a.scale, a.zp, b.x, b.scale, b.zp, bias, unit.out.scale, unit.out.zp],
                 attrs, MS)


def _binary(op: str) -> Action:
    def action(m: _Match, node: Node) -> Node | None:
        if len(node.inputs) != 2:  # (a Sum of two)
            return None
        unit = _unit(m, node, (0, 1))
        if unit is None:
            return _add_relu(m, node) if op == "QLinearAdd" else None
        a, b = unit.ins[0], unit.ins[1]
        return _node(unit, op, [a.x, a.scale, a.zp, b.x, b.scale, b.zp, unit.out.scale, unit.out.zp], {}, MS)
    return action


def _add_relu(m: _Match, node: Node) -> Node | None:
    """DequantizeLinear x 2 -> Add (or Sum) -> Relu -> QuantizeLinear whose zero point is its type's minimum (a
    ResNet's residual; the quantizer puts no QuantizeLinear between): QLinearAdd, the Relu implied by saturation
    (quantization is monotonic, and 0 quantizes to the minimum). The Relu and the QuantizeLinear go."""
    readers = m.consumers.get(node.outputs[0], [])
    if len(readers) != 1 or readers[0].op != "Relu" or node.outputs[0] in m.graph.outputs:
        return None
    relu = readers[0]
    unit = _unit(m, relu, (), ints=EIGHT)
    ins = [m.dequantized(n) for n in node.inputs]
    if unit is None or any(q is None or np.dtype(m.graph.values[q.x].dtype) not in EIGHT for q in ins):
        return None
    yt = np.dtype(m.graph.values[unit.out.x].dtype)
    if m.const(unit.out.zp).reshape(()) != np.iinfo(yt).min:
        return None
    m.dropped.update((id(relu), id(unit.q)))
    a, b = ins
    return Node("QLinearAdd", node.name, [a.x, a.scale, a.zp, b.x, b.scale, b.zp, unit.out.scale, unit.out.zp],
                [unit.out.x], {UNIT: f"{node.op}+Relu"}, MS)


def _unary(op: str, keep: tuple[str, ...] = ()) -> Action:
    def action(m: _Match, node: Node) -> Node | None:
        unit = _unit(m, node, (0,), ints=EIGHT)  # lookup tables and pools of 8-bit values
        if unit is None or len([n for n in node.inputs if n]) != 1:
            return None
        x = unit.ins[0]
        attrs = {k: node.attrs[k] for k in keep if k in node.attrs} if keep != ("*",) else dict(node.attrs)
        return _node(unit, op, [x.x, x.scale, x.zp, unit.out.scale, unit.out.zp], attrs, MS)
    return action


def _concat(m: _Match, node: Node) -> Node | None:
    unit = _unit(m, node, tuple(range(len(node.inputs))), ints=EIGHT)
    if unit is None:
        return None
    inputs = [unit.out.scale, unit.out.zp]
    for q in unit.ins:
        inputs += [q.x, q.scale, q.zp]
    return _node(unit, "QLinearConcat", inputs, {"axis": node.attrs.get("axis", 0)}, MS)


def _drop(m: _Match, node: Node) -> Node | None:
    """The op on the integers: its input's and output's quantizations are the same."""
    unit = _unit(m, node, (0,))
    if unit is None or not m.same(unit.ins[0], unit.out):
        return None
    return Node(node.op, node.name, [unit.ins[0].x, *node.inputs[1:]], [unit.out.x], {**node.attrs, UNIT: "drop"},
                node.domain)


# element-wise float ops a unit of 8-bit values runs as a 256-byte table (BatchNormalization: an affine map)
LOOKUP = {"BatchNormalization", "Relu", "Clip", "HardSigmoid", "HardSwish", "Tanh", "Elu", "Selu", "Celu", "Softplus",
          "Softsign", "Gelu", "Mish", "Erf", "Sqrt", "Exp", "Log", "Neg", "Abs", "Round", "Floor", "Ceil",
          "ThresholdedRelu", "Sigmoid", "LeakyRelu"}
# and with one operand a constant of one value, as links of a chain (GELU's x / sqrt(2) -> Erf)
ARITH = {"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min"}
CHAIN = (LOOKUP - {"BatchNormalization"}) | ARITH
CHAIN_MAX = 8


def _lookup(m: _Match, node: Node) -> Node | None:
    """DequantizeLinear -> element-wise ops -> QuantizeLinear of 8-bit values (a chain of CHAIN ops, each one's
    other operands constants of one value) as QLinearLookup (ctxrt's): the chain's float computation
    (onnx.reference's kernels) run once, at compile time, on the 256 values an input byte can dequantize to,
    quantized as QuantizeLinear does; at run time one table lookup per value (backends/cpu/quant/elementwise.py).
    A BatchNormalization alone: its affine form."""
    consts = {n: m.value(n) for n in node.inputs if n}
    at = [i for i, n in enumerate(node.inputs) if n and consts[n] is None]  # the activation operand
    if len(at) != 1 or (node.op in ARITH and at[0] > 1) or (node.op not in ARITH and at[0] != 0):
        return None
    x = m.dequantized(node.inputs[at[0]])
    if x is None or np.dtype(m.graph.values[x.x].dtype) not in EIGHT:
        return None
    if node.op == "BatchNormalization":
        q = m.quantized(node)
        shape = tuple(m.graph.values[x.x].shape)
        if q is None or np.dtype(m.graph.values[q.outputs[0]].dtype) not in EIGHT or len(shape) < 2 or \
                node.attrs.get("training_mode"):
            return None
        out = Quant(q.outputs[0], q.inputs[1], m.zero_point(q, np.dtype(m.graph.values[q.outputs[0]].dtype)))
        return _affine(m, node, consts, x, out)  # (a table per channel would be read scattered, channels last)
    chain, q = [node], m.quantized(node)
    while q is None and len(chain) < CHAIN_MAX:  # follow the only reader while it is an element-wise link
        out = chain[-1].outputs[0]
        readers = m.consumers.get(out, [])
        if len(readers) != 1 or out in m.graph.outputs or len([o for o in chain[-1].outputs if o]) != 1:
            return None
        link = readers[0]
        if link.op not in CHAIN or link.inputs.count(out) != 1:
            return None
        consts.update((n, m.value(n)) for n in link.inputs if n and n != out)
        chain.append(link)
        q = m.quantized(link)
    if q is None or any(consts[n] is None or consts[n].size != 1 for c in chain for n in c.inputs
                        if n and n in consts and n != node.inputs[at[0]]):
        return None
    xt, yt = np.dtype(m.graph.values[x.x].dtype), np.dtype(m.graph.values[q.outputs[0]].dtype)
    if yt not in EIGHT or tuple(m.graph.values[q.outputs[0]].shape) != tuple(m.graph.values[x.x].shape):
        return None  # (a constant of one value that broadcasts to a higher rank: not element-wise in place)
    out = Quant(q.outputs[0], q.inputs[1], m.zero_point(q, yt))
    values = (np.arange(256, dtype=np.uint8).view(xt).astype(np.float32) - m.const(x.zp).astype(np.float32)) \
        * m.const(x.scale).astype(np.float32)  # DequantizeLinear's arithmetic
    try:
        y = _evaluate(chain, node.inputs[at[0]], {k: v for k, v in consts.items() if v is not None}, values,
                      m.graph.opset).astype(np.float32).reshape(1, 256)
    except Exception:  # noqa: BLE001  onnx.reference cannot run the chain (a type it does not take): it stays float
        return None
    lo, hi = np.iinfo(yt).min, np.iinfo(yt).max
    with np.errstate(invalid="ignore", over="ignore"):
        t = np.rint(y / m.const(out.scale).astype(np.float32)) + m.const(out.zp).astype(np.float32)
    if np.isnan(t).any():
        return None  # a NaN would saturate to an integer the float unit does not give
    tables = np.clip(t, lo, hi).astype(yt).view(np.uint8)
    name = f"{out.x}#lookup"
    m.graph.values[name] = Value(name, np.dtype(np.uint8), tables.shape, np.ascontiguousarray(tables))
    m.dropped.update(id(c) for c in chain[1:])
    m.dropped.add(id(q))
    return Node("QLinearLookup", node.name, [x.x, name], [out.x],
                {"axis": -1, UNIT: "+".join(c.op for c in chain)}, "ctxrt")


def _arith(op: str) -> Action:
    """Add or Mul: a unit of two quantized operands (QLinearAdd/Mul; Add -> Relu too), else a chain's lookup."""
    binary = _binary(op)
    return lambda m, node: binary(m, node) or _lookup(m, node)


def _affine(m: _Match, node: Node, consts: dict[str, np.ndarray], x: Quant, out: Quant) -> Node | None:
    """A BatchNormalization unit as QLinearLookup's affine form: dequantization, normalization and quantization
    folded into a and b per channel (float64, then float32): within a step of the float unit, not its bytes."""
    f = {k: np.asarray(consts[n], np.float64).reshape(-1) for k, n in zip("sbmv", node.inputs[1:5], strict=True)}
    sx, zx = float(m.const(x.scale).reshape(())), float(m.const(x.zp).reshape(()))
    sy, zy = float(m.const(out.scale).reshape(())), float(m.const(out.zp).reshape(()))
    g = f["s"] / np.sqrt(f["v"] + float(node.attrs.get("epsilon", 1e-5)))
    ab = np.stack([sx * g / sy, (f["b"] - f["m"] * g - zx * sx * g) / sy + zy]).astype(np.float32)
    if not np.isfinite(ab).all():
        return None
    name = f"{out.x}#affine"
    m.graph.values[name] = Value(name, np.dtype(np.float32), ab.shape, ab)
    return Node("QLinearLookup", node.name, [x.x, "", name], [out.x], {"axis": 1, UNIT: node.op}, "ctxrt")


def _evaluate(chain: list[Node], x_name: str, consts: dict[str, np.ndarray], x: np.ndarray, opset: int
              ) -> np.ndarray:
    """The chain's last output for its input `x_name` = x, the other inputs the constants given, by onnx.reference."""
    import onnx
    from onnx import helper, numpy_helper
    from onnx.reference import ReferenceEvaluator

    consts, nodes = dict(consts), []
    for node in chain:
        known = set(onnx.defs.get_schema(node.op, opset, "").attributes)  # not the attributes ctxrt's passes add
        attrs = {k: v for k, v in node.attrs.items() if k in known}
        inputs = list(node.inputs)
        for pos, key in PARAM_INPUTS.get(node.op, {}).items():  # Clip's bounds: the frontend made them attributes
            if key in node.attrs and node.attrs[key] is not None:
                inputs += [""] * (pos + 1 - len(inputs))
                inputs[pos] = f"{node.name}/param{pos}"
                consts[inputs[pos]] = np.asarray(node.attrs[key], np.float32)
        nodes.append(helper.make_node(node.op, inputs, list(node.outputs[:1]), **attrs))
    used = {n for node in nodes for n in node.input}
    graph = helper.make_graph(
        nodes, "lookup", [helper.make_tensor_value_info(x_name, onnx.TensorProto.FLOAT, list(x.shape))],
        [helper.make_tensor_value_info(chain[-1].outputs[0], onnx.TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.asarray(c), n) for n, c in consts.items() if n in used and n != x_name])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    return np.asarray(ReferenceEvaluator(model).run(None, {x_name: x})[0])


def _requantize(m: _Match, q: Node) -> Node | None:
    """A QuantizeLinear of a DequantizeLinear's output (what is left of DQ -> Dropout -> Q once Dropout is gone, or
    between two units kept apart): an Identity of the integers where both quantizations are the same, else the
    requantization as a one-part QLinearConcat (a 256-byte table, backends/cpu/quant/elementwise.py). It replaces
    the QuantizeLinear; the DequantizeLinear goes where nothing else reads it."""
    a = m.dequantized(q.inputs[0]) if m.per_tensor(q) else None
    if a is None:
        return None
    yt, xt = np.dtype(m.graph.values[q.outputs[0]].dtype), np.dtype(m.graph.values[a.x].dtype)
    out = Quant(q.outputs[0], q.inputs[1], m.zero_point(q, yt))
    if m.same(a, out):
        return Node("Identity", q.name, [a.x], [out.x], {UNIT: "requantize"})
    rank = len(m.graph.values[a.x].shape)
    if xt != yt or xt not in EIGHT or rank == 0:
        return None
    return Node("QLinearConcat", q.name, [out.scale, out.zp, a.x, a.scale, a.zp], [out.x],
                {"axis": 1 if rank > 1 else 0, UNIT: "requantize"}, MS)


def _gather(m: _Match, node: Node) -> list[Node] | None:
    """Gather from a DequantizeLinear of a constant table (a quantized embedding): the rows gathered as integers,
    then dequantized: never the whole table in float at each run (BERT-6's 30522 x 384 words: ~4 ms and 45 MiB).
    Per tensor, or per axis along the table's last axis gathering along the first."""
    d = m.producers.get(node.inputs[0])
    if d is None or d.op != "DequantizeLinear" or len(d.inputs) < 2 or d.attrs.get("block_size"):
        return None
    table = m.const(d.inputs[0])
    scale = m.const(d.inputs[1])
    if table is None or scale is None or np.dtype(table.dtype) not in INTS or table.ndim < 1:
        return None
    axis, dq_attrs = int(node.attrs.get("axis", 0)) % table.ndim, {}
    if scale.size != 1:
        if int(d.attrs.get("axis", 1)) % table.ndim != table.ndim - 1 or axis != 0 or table.ndim < 2:
            return None
        dq_attrs["axis"] = -1
    out = node.outputs[0]
    rows = f"{out}#rows"
    m.graph.values[rows] = Value(rows, np.dtype(table.dtype), tuple(m.graph.values[out].shape))
    return [Node("Gather", node.name, [d.inputs[0], *node.inputs[1:]], [rows], dict(node.attrs), node.domain),
            Node("DequantizeLinear", f"{d.name}/rows", [rows, *d.inputs[1:]], [out], dq_attrs)]


def _spatial_mean(m: _Match, node: Node) -> Node | None:
    """ReduceMean over H and W of a 4-D tensor, kept 4-D (a squeeze-and-excitation block's): the unit as
    QLinearGlobalAveragePool."""
    shape = m.graph.values[node.inputs[0]].shape
    axes = node.attrs.get("axes")
    if len(shape) != 4 or node.attrs.get("keepdims", 1) != 1 or axes is None or \
            sorted(int(a) % 4 for a in axes) != [2, 3] or len([n for n in node.inputs if n]) != 1:
        return None
    return _unary("QLinearGlobalAveragePool")(m, node)


DROP = ("MaxPool", "Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "Slice", "Expand", "Tile",
        "DepthToSpace", "SpaceToDepth", "Identity")
RULES: dict[str, Action] = {
    "Conv": _conv, "MatMul": _matmul, "Gemm": _gemm,
    **dict.fromkeys(CHAIN, _lookup), "Add": _arith("QLinearAdd"), "Mul": _arith("QLinearMul"),
    "AveragePool": _unary("QLinearAveragePool", ("*",)), "GlobalAveragePool": _unary("QLinearGlobalAveragePool"),
    "Concat": _concat, "QuantizeLinear": _requantize, "Sum": _binary("QLinearAdd"),
    **dict.fromkeys(DROP, _drop), "BatchNormalization": _lookup, "Gather": _gather, "ReduceMean": _spatial_mean,
}


class FuseQDQUnits(Pass):
    def call(self, graph: Graph) -> PassResult:
        if not any(n.op in ("QuantizeLinear", "DequantizeLinear") for n in graph.nodes):
            return PassResult(graph, False)
        m = _Match(graph)
        replaced: dict[int, Node] = {}
        dropped: set[int] = set()
        for node in graph.nodes:
            rule = RULES.get(node.op)
            fused = rule(m, node) if rule is not None and node.outputs else None
            if fused is not None:
                replaced[id(node)] = fused
                if node.op not in ("QuantizeLinear", "Gather"):  # a unit's op: its QuantizeLinear goes with it
                    dropped.add(id(m.consumers[node.outputs[0]][0]))
        dropped |= m.dropped
        if not replaced:
            return PassResult(graph, False)
        nodes = [replaced.get(id(n), n) for n in graph.nodes if id(n) not in dropped]
        graph.nodes = [k for n in nodes for k in (n if isinstance(n, list) else [n])]
        graph = EliminateDead()(graph).graph
        return PassResult(graph, True)

    def ensures(self, graph: Graph) -> None:
        check_topological(graph)
