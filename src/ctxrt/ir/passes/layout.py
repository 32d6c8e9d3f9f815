"""Assign each 4-D activation a memory layout and insert reorders only where a consumer needs another one.

A kernel provider (oneDNN on the CPU) runs convolutions, pools, LRN and BatchNormalization fastest in one
layout `L` (channels-last or blocked channels; plain NCHW was 2.5x slower than onnxruntime). Values flow in
`L` through chains of those nodes and of layout-agnostic ones (element-wise ops over same-shape operands,
Concat along channels, ChannelShuffle); every other consumer reads plain NCHW, through a `Reorder` node
made once per value. Graph inputs and outputs stay plain. Rules, in graph order:

- a provider node whose input is in `L` runs in `L` when the provider supports it there, else its input is
  reordered to plain and a plain kernel runs it;
- a Conv (or ConvTranspose) reading a plain input writes `L` when some consumer can take `L`: reading it directly
  where it has fewer than 8 channels (a network's first conv) and the provider has a kernel for that, else
  through a reorder;
- a value of one pixel per image (e.g. GlobalAveragePool's output) is stored identically in `L` and plain:
  it is always kept plain, so it never needs a reorder;
- where L is channels-last, a Transpose from channels-first to channels-last of a value in L, or back from a plain
  channels-last value some consumer reads in L, is a view of the stored bytes (ConvNeXt's permutes around its
  LayerNorms), not a reorder and a copy;
- 8-bit activations (a QDQ model's, after ir/passes/qdq.py) flow the same way, through QLinearConv and MaxPool
  (provider nodes) and the quantized ops that do not care where channels are: QLinearAdd and QLinearMul of
  same-shape operands (or one per-channel operand), QLinearConcat along channels, QLinearGlobalAveragePool (its
  `channels_last`), ctxrt's QLinearLookup (its affine map's `axis`), and per-tensor QuantizeLinear /
  DequantizeLinear around a float island — when `L` is channels-last (a blocked `L` keeps them plain).

The chosen nodes get `kernel` (the provider's name), `src_layout` and `dst_layout` attributes; values in `L`
get their stored shape (ctxrt/ir/layouts.py). Ops the provider runs on plain tensors (MatMul, Gemm, Softmax) get only
`kernel`, where it supports them. Reorders are ordinary nodes: the planner gives their outputs
arena space like any tensor, and `ctxrt inspect --kernels` lists them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from ctxrt.ir.graph import Graph, Node, Value
from ctxrt.ir.layouts import PLAIN, Layout, same_bytes
from ctxrt.ir.passes.base import Pass, PassResult, check_topological

# Element-wise ops whose output is laid out like their operands.
UNARY = {"Relu", "LeakyRelu", "Sigmoid", "HardSigmoid", "HardSwish", "Softplus", "Tanh", "Erf", "Gelu", "Sqrt", "Exp",
         "Log", "Neg", "Abs", "Reciprocal", "Floor", "Ceil", "Round", "Sign", "Clip", "Identity", "Swish", "Elu",
         "Selu", "Mish", "Softsign"}
BINARY = {"Add", "Sub", "Mul", "Div", "Max", "Min", "Sum", "Mean"}
CHANNEL_OPS = {"Concat", "ChannelShuffle"}  # along the channel axis: the attribute follows the layout
# onnxruntime's quantized ops (com.microsoft) that run channels-last unchanged: element-wise ones over two
# same-shape operands (inputs 0 and 3), a concatenation along channels (inputs 2, 5, ...), a global pool
QUANT_BINARY = {"QLinearAdd", "QLinearMul"}
QUANT_LAID = QUANT_BINARY | {"QLinearConcat", "QLinearGlobalAveragePool", "QLinearLookup"}
CONVS = {"Conv", "QLinearConv", "ConvTranspose"}
RESIZES = {"Resize", "Upsample"}  # run on a channels-last L with constant scales (resize_in_l)
ACTIVATION_TYPES = {np.dtype(np.float32), np.dtype(np.uint8), np.dtype(np.int8)}
SMALL_INPUT = 8  # channels under which a conv reads its plain input directly (a network's first conv)

# supports(graph, node, src, dst): the provider runs `node` reading input 0 in `src`, writing `dst`.
Supports = Callable[[Graph, Node, Layout, Layout], bool]


class AssignLayouts(Pass):
    """`ops`: what the provider runs in `layout`; `plain_ops`: what it runs on plain tensors (MatMul, Gemm)."""

    def __init__(self, layout: Layout, provider: str, ops: set[str], plain_ops: set[str], supports: Supports) -> None:
        self.layout, self.provider, self.supports = layout, provider, supports
        self.ops, self.plain_ops = set(ops), set(plain_ops)

    def call(self, graph: Graph) -> PassResult:
        return PassResult(*_Assign(self, graph).run())

    def ensures(self, graph: Graph) -> None:
        check_topological(graph)


class _Assign:
    def __init__(self, p: AssignLayouts, graph: Graph) -> None:
        self.p, self.graph, self.L = p, graph, p.layout
        self.logical = {name: tuple(v.shape) for name, v in graph.values.items()}
        self.lay: dict[str, Layout] = {name: PLAIN for name in graph.values}
        self.copies: dict[tuple[str, str], str] = {}  # (value, layout name) -> its reordered copy
        self.consumers = graph.consumers()
        self.nodes: list[Node] = []

    def run(self) -> tuple[Graph, bool]:
        for node in self.graph.nodes:
            self.visit(node)
        changed = len(self.nodes) != len(self.graph.nodes) or any(
            lay is not PLAIN and not same_bytes(self.logical[n], lay) for n, lay in self.lay.items())
        self.finish_outputs()
        values = dict(self.graph.values)
        for name, lay in self.lay.items():
            if lay is not PLAIN and name in values:
                values[name] = replace(values[name], shape=lay.physical(self.logical[name]))
        return replace(self.graph, nodes=self.nodes, values=values), changed

    # -- helpers -------------------------------------------------------------------------------------------
    def is_act(self, name: str) -> bool:
        """A 4-D float32 or 8-bit activation (not a constant); 8-bit ones only where L is channels-last."""
        v = self.graph.values.get(name) if name else None
        if v is None or v.is_const or len(self.logical[name]) != 4 or np.dtype(v.dtype) not in ACTIVATION_TYPES:
            return False
        return np.dtype(v.dtype) == np.float32 or self.L.channels_last and not self.L.block

    def can_take_l(self, name: str) -> bool:
        """Whether some consumer of `name` could read it in L (by op kind; lookahead of one node)."""
        return any(c.op in self.p.ops or c.op in UNARY or c.op in BINARY or c.op in CHANNEL_OPS or c.op in QUANT_LAID
                   or c.op in RESIZES and self.L.channels_last and not self.L.block
                   for c in self.consumers.get(name, []))

    def convert(self, name: str, to: Layout) -> str:
        """`name` in layout `to`: itself, or the output of a Reorder made once and inserted here."""
        src = self.lay[name]
        if src is to or not name:
            return name
        key = (name, to.name)
        if key not in self.copies:
            out = f"{name}#{to.name}"
            v = self.graph.values[name]
            self.graph.values[out] = Value(out, v.dtype, self.logical[name])
            self.logical[out], self.lay[out] = self.logical[name], to
            if same_bytes(self.logical[name], to) and same_bytes(self.logical[name], src):
                # one pixel per image: the same bytes in both layouts, so a view of the other shape (the planner
                # aliases a Reshape) instead of a copy
                shape = list(to.physical(self.logical[name]))
                self.nodes.append(Node("Reshape", f"{out}/view", [name], [out], {"shape": shape}))
            else:
                self.nodes.append(Node("Reorder", f"{out}/reorder", [name], [out],
                                       {"from": src.name, "to": to.name}, "ctxrt"))
            self.copies[key] = out
        return self.copies[key]

    def set_inputs(self, node: Node, layouts: dict[int, Layout]) -> None:
        node.inputs = [self.convert(n, layouts[i]) if i in layouts else n for i, n in enumerate(node.inputs)]

    def emit(self, node: Node, out: Layout) -> None:
        for o in node.outputs:
            if o:
                self.lay[o] = out
        self.nodes.append(node)

    def plain(self, node: Node) -> None:
        self.set_inputs(node, {i: PLAIN for i, n in enumerate(node.inputs) if n and self.lay[n] is not PLAIN})
        self.emit(node, PLAIN)

    # -- per node ------------------------------------------------------------------------------------------
    def visit(self, node: Node) -> None:
        L, ins = self.L, node.inputs
        x = ins[0] if ins else ""
        if node.op == "ReduceMean" and "GlobalAveragePool" in self.p.ops and self.spatial_mean(node):
            # the mean over H and W, kept 4-D (a squeeze-and-excitation block's): GlobalAveragePool, which the
            # provider runs in L (no reorder of its input to plain)
            node = Node("GlobalAveragePool", node.name, [x], list(node.outputs), {}, node.domain)
        if node.op in self.p.ops and self.is_act(x) and self.is_act(node.outputs[0]):
            self.provider_node(node)
        elif node.op in self.p.plain_ops:
            self.plain(node)
            if self.p.supports(self.graph, node, PLAIN, PLAIN):
                node.attrs = {**node.attrs, "kernel": self.p.provider}
        elif node.op in UNARY and self.is_act(x) and all(self.one_value(n) for n in ins[1:] if n):
            self.emit(node, self.lay[x])  # (Clip's min and max: one value each)
        elif node.op in BINARY and len(ins) > 1 and all(self.is_act(n) for n in ins) \
                and len({self.logical[n] for n in ins}) == 1 and any(self.lay[n] is L for n in ins):
            self.set_inputs(node, dict.fromkeys(range(len(ins)), L))
            self.emit(node, L)
        elif node.op in BINARY and len(ins) == 2 and self.scalar_in_l(node):
            pass  # emitted by scalar_in_l
        elif node.op in BINARY and len(ins) == 2 and self.per_channel_in_l(node):
            pass  # emitted by per_channel_in_l
        elif node.op in RESIZES and self.resize_in_l(node):
            pass  # emitted by resize_in_l
        elif node.op in CHANNEL_OPS and self.channel_op_in_l(node, list(range(len(ins)))):
            self.set_inputs(node, dict.fromkeys(range(len(ins)), L))
            node.attrs = {**node.attrs, "axis": L.channel_axis}
            self.emit(node, L)
        elif node.op in QUANT_LAID and self.quant_in_l(node):
            pass  # emitted by quant_in_l
        elif node.op == "Transpose" and self.permute_is_view(node):
            pass  # emitted by permute_is_view
        elif node.op in ("QuantizeLinear", "DequantizeLinear") and self.is_act(x) and self.lay[x] is L \
                and self.is_act(node.outputs[0]) and self.per_tensor(node):
            self.emit(node, L)  # element-wise: a float island between integer ops stays in L
        else:
            self.plain(node)

    def permute_is_view(self, node: Node) -> bool:
        """A Transpose between channels-first and channels-last where L is channels-last (ConvNeXt's permutes around
        its LayerNorms): NCHW -> NHWC of a value stored in L, or NHWC -> NCHW whose output some consumer reads in L,
        is the stored bytes themselves: a view (a Reshape the planner aliases), not a reorder and a copy (ConvNeXt's
        28 Transposes and 22 Reorders took 2.9 ms against onnxruntime's 0.65)."""
        L, x, y = self.L, node.inputs[0], node.outputs[0]
        if not L.channels_last or L.block or not self.is_act(x):
            return False
        perm = [int(p) for p in node.attrs.get("perm") or ()]
        v = self.graph.values.get(y)
        if v is None or np.dtype(v.dtype) != np.dtype(self.graph.values[x].dtype) or \
                np.dtype(v.dtype) not in ACTIVATION_TYPES:
            return False
        if perm == [0, 2, 3, 1] and self.lay[x] is L:  # out: plain (N, H, W, C), x's bytes
            self.nodes.append(Node("Reshape", node.name, [x], [y], {"shape": list(self.logical[y])}))
            self.lay[y] = PLAIN
            return True
        if perm == [0, 3, 1, 2] and self.lay[x] is PLAIN and self.is_act(y) and L.fits(self.logical[y]) and \
                self.can_take_l(y) and y not in self.graph.outputs:  # out: NCHW stored NHWC, x's bytes
            self.nodes.append(Node("Reshape", node.name, [x], [y], {"shape": list(L.physical(self.logical[y]))}))
            self.lay[y] = L
            return True
        return False

    def per_tensor(self, node: Node) -> bool:
        """A QuantizeLinear or DequantizeLinear whose scale and zero point are one constant value each."""
        params = [self.graph.values.get(n) for n in node.inputs[1:3] if n]
        return not node.attrs.get("block_size") and all(v is not None and v.is_const and math.prod(v.shape) == 1
                                                        for v in params)

    def quant_in_l(self, node: Node) -> bool:
        """One of onnxruntime's quantized ops (QUANT_LAID) run on its 8-bit operands in L, where most of them are
        in L already (QLinearGlobalAveragePool: where its input is)."""
        L, ins, y = self.L, node.inputs, node.outputs[0]
        if node.op in QUANT_BINARY:
            pos = [0, 3]
            if len(ins) < 4 or not all(self.is_act(ins[i]) for i in pos):
                return False
            if len({self.logical[ins[i]] for i in pos} | {self.logical[y]}) != 1:
                return self.per_channel_in_l(node, pos)
            if not any(self.lay[ins[i]] is L for i in pos):
                return False
        elif node.op == "QLinearConcat":
            pos = list(range(2, len(ins), 3))
            if not self.channel_op_in_l(node, pos):
                return False
            node.attrs = {**node.attrs, "axis": L.channel_axis}
        elif node.op == "QLinearLookup":  # ctxrt's (ir/passes/qdq.py): one table, or an affine map per channel
            pos = [0]
            if self.lay[ins[0]] is not L or not self.is_act(ins[0]):
                return False
            if node.attrs.get("axis", -1) != -1:
                node.attrs = {**node.attrs, "axis": L.channel_axis}
        else:  # QLinearGlobalAveragePool: [N, H, W, C] in, [N, 1, 1, C] out (the same bytes as plain)
            pos = [0]
            if self.lay[ins[0]] is not L or not self.is_act(ins[0]) or node.attrs.get("channels_last", 0):
                return False
            node.attrs = {**node.attrs, "channels_last": 1}
        self.set_inputs(node, dict.fromkeys(pos, L))
        self.emit(node, L)
        return True

    def spatial_mean(self, node: Node) -> bool:
        x, y = node.inputs[0], node.outputs[0]
        if len(node.inputs) > 1 and node.inputs[1] or not (self.is_act(x) and self.is_act(y)):
            return False
        axes = node.attrs.get("axes")
        return (node.attrs.get("keepdims", 1) == 1 and axes is not None
                and sorted(int(a) % 4 for a in axes) == [2, 3] and len(axes) == 2)

    def one_value(self, name: str) -> bool:
        """A plain value of one element (a scalar constant, [1] or [1, 1, 1, 1]): the same in every layout."""
        v = self.graph.values.get(name)
        if v is None or self.lay.get(name, PLAIN) is not PLAIN:
            return False
        return math.prod(self.logical.get(name, v.shape)) == 1

    def scalar_in_l(self, node: Node) -> bool:
        """A value in L plus (times, ...) one value (hard-swish written out, x * clip(x + 3, 0, 6) / 6, as Paddle
        exports it): run in L, a scalar reading the same in any layout, instead of a reorder to plain and back
        around each op (PP-OCR's direction classifier: 71 reorders)."""
        a, b = node.inputs
        big = a if self.is_act(a) and self.lay[a] is self.L else b if self.is_act(b) and self.lay[b] is self.L \
            else None
        if big is None:
            return False
        other = b if big == a else a
        v, y = self.graph.values.get(other), node.outputs[0]
        if v is None or not self.one_value(other) or np.dtype(v.dtype) != np.dtype(self.graph.values[big].dtype) \
                or self.logical.get(y) != self.logical[big]:
            return False
        self.emit(node, self.L)
        return True

    def resize_in_l(self, node: Node) -> bool:
        """A Resize (Upsample) of a value in channels-last L whose scales, sizes and roi are attributes (constants
        the frontend moved there): the CPU kernel resizes each stored axis (`channels_last` maps the attributes'
        NCHW axes onto them), instead of a reorder to plain and back around it (PP-OCR's detector: its FPN's
        nearest 2x upsamples, 10 reorders)."""
        L, x, y = self.L, node.inputs[0], node.outputs[0]
        if not L.channels_last or L.block or self.lay[x] is not L or not self.is_act(x) or not self.is_act(y) \
                or any(node.inputs[1:]) or node.attrs.get("channels_last"):
            return False
        node.attrs = {**node.attrs, "channels_last": 1}
        self.emit(node, L)
        return True

    def per_channel_in_l(self, node: Node, pos: tuple[int, int] | list[int] = (0, 1)) -> bool:
        """A value in channels-last L times (plus, ...) a per-channel one (a squeeze-and-excitation block's
        scale, [N, C, 1, 1], [1, C, 1, 1] or [C, 1, 1]; the operands at `pos`): run in L, the per-channel operand
        viewed as [N, 1, 1, C] (the same bytes; a Reshape the planner aliases), instead of a reorder of the large
        one to plain and back."""
        L, (a, b) = self.L, [node.inputs[i] for i in pos]
        if not L.channels_last or L.block:
            return False
        big = 0 if self.is_act(a) and self.lay[a] is L else 1 if self.is_act(b) and self.lay[b] is L else None
        if big is None:
            return False
        x, c = (a, b) if big == 0 else (b, a)
        n, ch, _, _ = self.logical[x]
        v = self.graph.values.get(c)
        if v is None or np.dtype(v.dtype) != np.dtype(self.graph.values[x].dtype) or \
                self.lay.get(c, PLAIN) is not PLAIN:
            return False
        shape = tuple(self.logical[c]) if c in self.logical else tuple(v.shape)
        if shape not in ((n, ch, 1, 1), (1, ch, 1, 1), (ch, 1, 1)) or self.logical[node.outputs[0]] != self.logical[x]:
            return False
        lead = shape[0] if len(shape) == 4 else 1
        view = f"{c}#per_channel"
        if view not in self.graph.values:
            self.graph.values[view] = Value(view, v.dtype, (lead, 1, 1, ch))
            self.logical[view], self.lay[view] = (lead, 1, 1, ch), PLAIN
            self.nodes.append(Node("Reshape", f"{view}/reshape", [c], [view], {"shape": [lead, 1, 1, ch]}))
        inputs = list(node.inputs)
        inputs[pos[0]], inputs[pos[1]] = (x, view) if big == 0 else (view, x)
        node.inputs = inputs
        self.emit(node, L)
        return True

    def channel_op_in_l(self, node: Node, positions: list[int]) -> bool:
        """A Concat (QLinearConcat) along channels or a ChannelShuffle whose inputs at `positions` are mostly in L."""
        L, ins = self.L, [node.inputs[i] for i in positions]
        y = node.outputs[0]
        if not all(self.is_act(n) and L.fits(self.logical[n]) for n in ins) or not self.is_act(y) or \
                not L.fits(self.logical[y]):
            return False
        if node.op == "ChannelShuffle" and L.block:
            return False  # a block mixes channels of several groups
        if node.op in ("Concat", "QLinearConcat") and node.attrs.get("axis") not in (1, -3):
            return False
        return sum(self.lay[n] is L for n in ins) * 2 >= len(ins)  # most inputs are in L already

    def provider_node(self, node: Node) -> None:
        L, x, y = self.L, node.inputs[0], node.outputs[0]
        dst = PLAIN if same_bytes(self.logical[y], L) else L
        if self.lay[x] is L:
            candidates = [L]
        elif node.op in CONVS and self.can_take_l(y) and L.fits(self.logical[y]):
            candidates = [PLAIN, L] if self.logical[x][1] < SMALL_INPUT else [L]
        else:
            candidates = []
        src = next((c for c in candidates if (c is PLAIN or L.fits(self.logical[x]))
                    and self.p.supports(self.graph, node, c, dst)), None)
        if src is None:
            self.plain(node)
            if node.op in self.p.plain_ops and self.p.supports(self.graph, node, PLAIN, PLAIN):
                node.attrs = {**node.attrs, "kernel": self.p.provider}  # the provider's kernel, on plain tensors
            return
        residual = {3: dst} if node.op == "Conv" and node.attrs.get("residual") and len(node.inputs) > 3 else {}
        self.set_inputs(node, {0: src, **residual})
        node.attrs = {**node.attrs, "kernel": self.p.provider, "src_layout": src.name, "dst_layout": dst.name}
        self.emit(node, dst)

    def finish_outputs(self) -> None:
        """Graph outputs are plain: a value in L is renamed and reordered into the output's name at the end."""
        for out in self.graph.outputs:
            lay = self.lay.get(out, PLAIN)
            if lay is PLAIN or same_bytes(self.logical[out], lay):
                continue
            inner = f"{out}#{lay.name}"
            v = self.graph.values[out]
            self.graph.values[inner] = Value(inner, v.dtype, self.logical[out])
            self.logical[inner], self.lay[inner], self.lay[out] = self.logical[out], lay, PLAIN
            for node in self.nodes:
                node.inputs = [inner if n == out else n for n in node.inputs]
                node.outputs = [inner if n == out else n for n in node.outputs]
            self.nodes.append(Node("Reorder", f"{out}/reorder", [inner], [out], {"from": lay.name, "to": PLAIN.name},
                                   "ctxrt"))
