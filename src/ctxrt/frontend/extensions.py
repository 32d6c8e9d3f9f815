"""Ops onnx has no shape inference for: onnxruntime's contrib ops that onnxruntime-genai's model builder writes
(com.microsoft GroupQueryAttention, RotaryEmbedding, SkipLayerNormalization, SkipSimplifiedLayerNormalization;
SimplifiedLayerNormalization in the default domain); MaxUnpool with an `output_shape` input (onnx types its rank
only, not reading the values); STFT without `onesided` (onnx's inference takes 0 for it, the schema's default, the
reference and onnxruntime 1).

Shape inference sees each as a *stand-in*: a few standard ops whose outputs have the op's output types (a
LayerNormalization for the statistics outputs, a Reshape-Slice-Transpose-Concat for GroupQueryAttention's
present key and value), so one inference pass types a whole decoder. GroupQueryAttention's present key and value
are planned at an upper bound (past + new tokens): their real length is max(total_sequence_length, past length),
known at run time (ir/dynamic.py), which covers both a growing cache and onnxruntime-genai's shared buffer.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import onnx
from onnx import helper

from ctxrt.errors import ShapeError
from ctxrt.frontend.checks import op_key
from ctxrt.frontend.control import attr

MS = "com.microsoft."
GQA = MS + "GroupQueryAttention"


class _Builder:
    """Stand-in nodes for one node, with intermediate names no model uses."""

    def __init__(self, node: onnx.NodeProto) -> None:
        self.prefix = f"ctxrt.infer/{next((o for o in node.output if o), node.name)}"
        self.nodes: list[onnx.NodeProto] = []
        self.count = 0

    def tmp(self) -> str:
        self.count += 1
        return f"{self.prefix}/{self.count}"

    def add(self, op: str, inputs: list[str], output: str = "", **attrs: Any) -> str:
        output = output or self.tmp()
        self.nodes.append(helper.make_node(op, inputs, [output], **attrs))
        return output

    def ints(self, *values: int) -> str:
        return self.add("Constant", [], value=helper.make_tensor("v", onnx.TensorProto.INT64, [len(values)], values))


def _outputs(node: onnx.NodeProto, count: int) -> list[str]:
    return (list(node.output) + [""] * count)[:count]


def _inputs(node: onnx.NodeProto, count: int) -> list[str]:
    return (list(node.input) + [""] * count)[:count]


def _statistics(b: _Builder, x: str, outs: list[str], axis: int, stash: int, opset: int) -> None:
    """Mean and inverse std-dev outputs ("" where absent) typed as LayerNormalization's (opset 17+)."""
    if opset >= 17 and any(outs):
        b.nodes.append(helper.make_node("LayerNormalization", [x, x], [b.tmp(), *outs], axis=axis, stash_type=stash))


def _skip_norm(node: onnx.NodeProto, opset: int) -> list[onnx.NodeProto]:
    b = _Builder(node)
    y, mean, inv, total = _outputs(node, 4)
    for out in (y, total):
        if out:
            b.add("Identity", [node.input[0]], out)
    _statistics(b, node.input[0], [mean, inv], -1, 1, opset)
    return b.nodes


def _simplified_norm(node: onnx.NodeProto, opset: int) -> list[onnx.NodeProto]:
    b = _Builder(node)
    x, scale = _inputs(node, 2)
    y, inv = _outputs(node, 2)
    if y:  # Y has the scale's type
        b.add("CastLike", [x, scale], y) if opset >= 15 else b.add("Identity", [x], y)
    axis, stash = attr(node, "axis"), attr(node, "stash_type")
    _statistics(b, x, ["", inv], -1 if axis is None else int(axis), 1 if stash is None else int(stash), opset)
    return b.nodes


def _rotary(node: onnx.NodeProto, opset: int) -> list[onnx.NodeProto]:
    return [helper.make_node("Identity", [node.input[0]], [node.output[0]])]


def _gqa(node: onnx.NodeProto, opset: int) -> list[onnx.NodeProto]:
    b = _Builder(node)
    n, kv = int(attr(node, "num_heads") or 1), int(attr(node, "kv_num_heads") or 1)
    q, k, v, past_k, past_v = _inputs(node, 5)
    out, present_k, present_v = _outputs(node, 3)
    if k:
        b.add("Identity", [q], out)
        new_k, new_v = (b.add("Reshape", [t, b.ints(0, 0, kv, -1)]) for t in (k, v))
    else:
        qkv = b.add("Reshape", [q, b.ints(0, 0, n + 2 * kv, -1)])
        heads = b.add("Slice", [qkv, b.ints(0), b.ints(n), b.ints(2)])
        b.add("Reshape", [heads, b.ints(0, 0, -1)], out)
        new_k, new_v = (b.add("Slice", [qkv, b.ints(n + j * kv), b.ints(n + (j + 1) * kv), b.ints(2)]) for j in (0, 1))
    for new, past, present in ((new_k, past_k, present_k), (new_v, past_v, present_v)):
        if present:
            bnsh = b.add("Transpose", [new], perm=[0, 2, 1, 3])
            b.add("Concat", [past, bnsh], present, axis=2) if past else b.add("Identity", [bnsh], present)
    return b.nodes


def _max_unpool(node: onnx.NodeProto, opset: int) -> list[onnx.NodeProto]:
    x, _, shape = _inputs(node, 3)
    if not shape:
        return [node]
    b = _Builder(node)  # X's type, output_shape's shape: a scalar of X broadcast to it
    b.add("Expand", [b.add("ReduceMax", [x], keepdims=0), shape], node.output[0])
    return b.nodes


def _stft(node: onnx.NodeProto, opset: int) -> list[onnx.NodeProto]:
    if any(a.name == "onesided" for a in node.attribute):
        return [node]
    typed = onnx.NodeProto()
    typed.CopyFrom(node)
    typed.attribute.append(helper.make_attribute("onesided", 1))
    return [typed]


STAND_INS: dict[str, Callable[[onnx.NodeProto, int], list[onnx.NodeProto]]] = {
    GQA: _gqa,
    MS + "RotaryEmbedding": _rotary,
    MS + "SkipLayerNormalization": _skip_norm,
    MS + "SkipSimplifiedLayerNormalization": _skip_norm,
    "SimplifiedLayerNormalization": _simplified_norm,
    "MaxUnpool": _max_unpool,
    "STFT": _stft,
}
ONNX_OPS = {"MaxUnpool", "STFT"}  # ops onnx defines among these (onnx.checker checks them; only their typing stands in)


def stand_in(node: onnx.NodeProto, opset: int) -> list[onnx.NodeProto] | None:
    """Standard nodes typing this node's outputs for shape inference, or None for an op onnx knows."""
    rule = STAND_INS.get(op_key(node))
    return None if rule is None else rule(node, opset)


def gqa_bounds(node: onnx.NodeProto, shape: Callable[[str], Any], const: Mapping[str, np.ndarray],
               shared: frozenset[str] = frozenset()) -> dict[int, tuple[np.dtype | None, tuple[int, ...]]] | None:
    """GroupQueryAttention's outputs: attention (B, S, num_heads * H); present key and value (B, kv_num_heads,
    past + S, H), an upper bound of their length max(total_sequence_length, past); for a past input in `shared`
    (one buffer of the context's length bound to past and present, onnxruntime-genai's shared buffer), the past's
    own shape: total_sequence_length never exceeds it there (the kernel checks)."""
    q, k, _, past_k = _inputs(node, 4)
    sq, sp = shape(q), shape(past_k) if past_k else ()
    if sq is None or sp is None:
        return None
    n, kv = int(attr(node, "num_heads") or 0), int(attr(node, "kv_num_heads") or 0)
    label = f"GroupQueryAttention node {node.name or node.output[0]!r}"
    heads = n if k else n + 2 * kv
    if len(sq) != 3 or n <= 0 or kv <= 0 or sq[2] % heads:
        raise ShapeError(f"{label}: query of shape {list(sq)} for num_heads={n}, kv_num_heads={kv}")
    batch, s, h = sq[0], sq[1], sq[2] // heads
    past = sp[2] if len(sp) == 4 else 0
    present = (batch, kv, past if past_k in shared and past else past + s, h)
    bounds = {0: (None, (batch, s, n * h)), 1: (None, present), 2: (None, present)}
    if len(node.output) > 3 and node.output[3]:  # output_qk: refused by the kernel, typed here to say so
        bounds[3] = (None, (batch, n, s, past + s))
    return bounds
