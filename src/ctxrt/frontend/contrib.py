"""onnxruntime's `com.microsoft` operators that ctxrt runs: the quantized ops its quantizer writes.

Only these ops are accepted from that domain (any other domain, or another op of it, is an unsupported operator).
onnx's shape inference does not know them, so their output types are decided here once their inputs are typed
(`output_types`), from the same rules onnxruntime's schemas give: shapes come from the default-domain op each one
quantizes (a pooling, a convolution, a Gemm), inferred by onnx on a one-node stand-in. `widens` is the rule
that keeps quantized weights from being folded into float copies.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import onnx
from onnx import helper

from ctxrt import dtypes
from ctxrt.errors import ShapeError, UnsupportedOpError

DOMAIN = "com.microsoft"
OPS = {"QuantizeLinear", "DequantizeLinear", "QLinearAdd", "QLinearMul", "QLinearSigmoid", "QLinearLeakyRelu",
       "QLinearConcat", "QLinearGlobalAveragePool", "QLinearAveragePool", "QLinearSoftmax", "QLinearConv", "QGemm",
       "MatMulIntegerToFloat", "DynamicQuantizeMatMul", "MatMulNBits", "GatherBlockQuantized",
       "DynamicQuantizeLSTM"}

Type = tuple[np.dtype, tuple[int, ...]]
_F32, _U8 = np.dtype(np.float32), np.dtype(np.uint8)


def accepted(node: onnx.NodeProto) -> bool:
    return node.domain == DOMAIN and node.op_type in OPS


def _attrs(node: onnx.NodeProto) -> dict[str, Any]:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _stand_in(op: str, shapes: list[tuple[int, ...] | None], attrs: dict[str, Any],
              dtypes: list[np.dtype] | None = None) -> tuple[int, ...]:
    """The output shape onnx infers for the default-domain `op` on float inputs of these shapes."""
    names = [f"i{k}" if s is not None else "" for k, s in enumerate(shapes)]
    dts = dtypes or [_F32] * len(shapes)
    inputs = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(dt), s)
              for n, s, dt in zip(names, shapes, dts, strict=True) if n]
    node = helper.make_node(op, names, ["y"], **attrs)
    model = helper.make_model(helper.make_graph([node], "stand_in", inputs, [helper.make_tensor_value_info(
        "y", onnx.TensorProto.UNDEFINED, None)]), opset_imports=[helper.make_opsetid("", 21)])
    out = onnx.shape_inference.infer_shapes(model, strict_mode=True).graph.output[0].type.tensor_type
    return tuple(d.dim_value for d in out.shape.dim)


def _broadcast(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(np.broadcast_shapes(*shapes))


def _quantize(n: onnx.NodeProto, t: Callable[[int], Type | None], a: dict[str, Any]) -> list[Type]:
    zp = t(2)
    return [(zp[0] if zp else _U8, t(0)[1])]


def _dequantize(n: onnx.NodeProto, t: Callable[[int], Type | None], a: dict[str, Any]) -> list[Type]:
    return [(t(1)[0], t(0)[1])]


def _same(n: onnx.NodeProto, t: Callable[[int], Type | None], a: dict[str, Any]) -> list[Type]:
    return [t(0)]


def _binary(n: onnx.NodeProto, t: Callable[[int], Type | None], a: dict[str, Any]) -> list[Type]:
    return [(t(0)[0], _broadcast(t(0)[1], t(3)[1]))]


def _concat(n: onnx.NodeProto, t: Callable[[int], Type | None], a: dict[str, Any]) -> list[Type]:
    parts = [t(k)[1] for k in range(2, len(n.input), 3)]
    axis = int(a["axis"]) % len(parts[0])
    shape = list(parts[0])
    shape[axis] = sum(p[axis] for p in parts)
    return [(t(1)[0], tuple(shape))]


def _global_pool(n: onnx.NodeProto, t: Callable[[int], Type | None], a: dict[str, Any]) -> list[Type]:
    dt, s = t(0)
    if a.get("channels_last", 0):
        return [(dt, (s[0],) + (1,) * (len(s) - 2) + (s[-1],))]
    return [(dt, s[:2] + (1,) * (len(s) - 2))]


def _pool(n: onnx.NodeProto, t: Callable[[int], Type | None], a: dict[str, Any]) -> list[Type]:
    dt, s = t(0)
    last = bool(a.pop("channels_last", 0))
    shape = (s[0], s[-1], *s[1:-1]) if last else s
    out = _stand_in("AveragePool", [shape], a)
    return [(dt, (out[0], *out[2:], out[1]) if last else out)]


def _conv(n: onnx.NodeProto, t: Callable[[int], Type | None], a: dict[str, Any]) -> list[Type]:
    if a.pop("channels_last", 0):
        raise UnsupportedOpError(f"QLinearConv node {n.name!r}: channels_last=1 is not supported")
    shapes = [t(k)[1] if t(k) else None for k in range(len(n.input))]
    dts = [t(k)[0] if t(k) else _F32 for k in range(len(n.input))]
    return [(t(7)[0], _stand_in("QLinearConv", shapes, a, dts))]


def _qgemm(n: onnx.NodeProto, t: Callable[[int], Type | None], a: dict[str, Any]) -> list[Type]:
    attrs = {k: a[k] for k in ("transA", "transB") if k in a}
    shape = _stand_in("Gemm", [t(0)[1], t(3)[1]], attrs)
    yz = t(8)
    return [(yz[0] if yz else _F32, shape)]


def _matmul_to_float(scale: int) -> Callable[..., list[Type]]:
    def infer(n: onnx.NodeProto, t: Callable[[int], Type | None], a: dict[str, Any]) -> list[Type]:
        return [(t(scale)[0], _stand_in("MatMul", [t(0)[1], t(1)[1]], {}))]
    return infer


def _nbits(n: onnx.NodeProto, t: Callable[[int], Type | None], a: dict[str, Any]) -> list[Type]:
    dt, s = t(0)
    return [(dt, (*s[:-1], int(a["N"])))]


def _gather_block_quantized(n: onnx.NodeProto, t: Callable[[int], Type | None], a: dict[str, Any]) -> list[Type]:
    """data's shape with axis 0 replaced by the indices' shape; uint8 data's last axis holds 8 / bits values a
    byte; the scales' dtype."""
    (dt, data), (_, idx), (st, _) = t(0), t(1), t(2)
    g = int(a.get("gather_axis", 0)) % len(data)
    shape = [*data[:g], *idx, *data[g + 1:]]
    if dt == _U8:  # the last axis (the quantized one) packs 8 / bits values a byte
        shape[-1] *= 8 // int(a.get("bits", 4))
    return [(st, tuple(shape))]


def _lstm(n: onnx.NodeProto, t: Callable[[int], Type | None], a: dict[str, Any]) -> list[Type]:
    """DynamicQuantizeLSTM: ONNX LSTM's outputs (layout 0), X's float type; R [D, H, 4H] gives D and H."""
    (dt, x), (_, r) = t(0), t(2)
    d, h = r[0], r[1]
    hidden = a.get("hidden_size")
    if hidden is not None and int(hidden) != h:
        raise ShapeError(f"{DOMAIN}.DynamicQuantizeLSTM node {n.name!r}: hidden_size {hidden} with R of shape {r}")
    if len(x) != 3:
        raise ShapeError(f"{DOMAIN}.DynamicQuantizeLSTM node {n.name!r}: X of shape {x} (rank 3 expected)")
    return [(dt, (x[0], d, x[1], h)), (dt, (d, x[1], h)), (dt, (d, x[1], h))]


_RULES: dict[str, Callable[..., list[Type]]] = {
    "QuantizeLinear": _quantize, "DequantizeLinear": _dequantize, "QLinearAdd": _binary, "QLinearMul": _binary,
    "QLinearSigmoid": _same, "QLinearLeakyRelu": _same, "QLinearSoftmax": _same, "QLinearConcat": _concat,
    "QLinearGlobalAveragePool": _global_pool, "QLinearAveragePool": _pool, "QLinearConv": _conv, "QGemm": _qgemm,
    "MatMulIntegerToFloat": _matmul_to_float(2), "DynamicQuantizeMatMul": _matmul_to_float(0),
    "MatMulNBits": _nbits, "GatherBlockQuantized": _gather_block_quantized, "DynamicQuantizeLSTM": _lstm,
}


def output_types(node: onnx.NodeProto, type_of: Callable[[str], tuple[Any, Any]]) -> list[Type] | None:
    """The node's output (dtype, shape)s, or None while an input it needs is not typed yet (`type_of(name)`
    gives (dtype, shape), either None when unknown)."""
    def t(k: int) -> Type | None:
        if k >= len(node.input) or not node.input[k]:
            return None
        dt, shape = type_of(node.input[k])
        return None if dt is None or shape is None else (np.dtype(dt), tuple(shape))

    if any(t(k) is None for k, name in enumerate(node.input) if name):
        return None
    try:
        return _RULES[node.op_type](node, t, _attrs(node))
    except (ShapeError, UnsupportedOpError):
        raise
    except Exception as e:
        raise ShapeError(f"{DOMAIN}.{node.op_type} node {node.name or node.output[0]!r}: cannot infer its output "
                         f"shape: {e}") from e


def widens(node: onnx.NodeProto, consts: Mapping[str, np.ndarray]) -> bool:
    """Whether a DequantizeLinear's float output would take more bytes than its integer input: such a constant is
    not folded (a model's int8 weights would become float copies four times their size); an int32 bias is."""
    x, scale = consts[node.input[0]], consts[node.input[1]]
    out = next((a.i for a in node.attribute if a.name == "output_dtype"), 0)
    width = np.dtype(helper.tensor_dtype_to_np_dtype(out)).itemsize if out else scale.dtype.itemsize
    return width > (0.5 if x.dtype in dtypes.FOUR_BIT else x.dtype.itemsize)
