"""A node spec that came from outside (the target server's requests) checked against ONNX's own shape inference.

A kernel sizes its launch from the shapes it is given; a spec whose declared outputs disagree with what the op
computes from its inputs would make it read or write outside its buffers. `check_node` rebuilds the node in ONNX
form (ctxrt's canonical attributes moved back to inputs, its fused epilogues and prepacked weights checked and
peeled off), runs onnx's strict shape inference, the same the compiler runs on a model, and refuses any spec whose
declared outputs are not exactly the inferred ones. docs/protocol.md.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ctxrt.backends.kernel import NodeSpec, TensorSpec
from ctxrt.errors import CtxrtError
from ctxrt.ir.canonical import OUTPUTS_PRESENT, PARAM_INPUTS, SLOTTED_OUTPUTS, output_slots

_FLOAT_PARAMS = {"min", "max", "constant_value"}  # parameter inputs of the data's dtype
_REAL_PARAMS = {"roi", "scales"}
_SHAPE_NEUTRAL = {None, "Relu", "Gelu"}
_CONST_LIMIT = 4096  # elements of a constant given to inference (it reads the values of small int inputs)


class SpecError(CtxrtError):
    """A node spec whose declared outputs, attributes or inputs are not what the op computes."""


def check_node(spec: NodeSpec) -> None:
    """Raise SpecError unless `spec.outputs` are exactly the outputs ONNX infers for the rest of `spec`."""
    where = f"{spec.op} node {spec.name[:80]!r}"
    try:
        schema = onnx.defs.get_schema(spec.op, int(spec.opset), "")
    except (onnx.defs.SchemaError, ValueError, OverflowError):
        raise SpecError(f"{where}: no ONNX operator {spec.op!r} at opset {spec.opset}") from None
    inputs, consts = list(spec.inputs), list(spec.consts) + [None] * (len(spec.inputs) - len(spec.consts))
    attrs = dict(spec.attrs)
    n_inputs = _peel_epilogue(spec, attrs, inputs, where)
    inputs, consts = inputs[:n_inputs], consts[:n_inputs]
    _unpack_weights(spec, attrs, inputs, consts, where)
    if spec.op == "MatMul" and attrs.pop("transB", 0):  # weights stored [N, K] for a MatMul [K, N]
        w = inputs[1]
        if w is None or len(w.shape) != 2:
            raise SpecError(f"{where}: transB needs 2-D weights")
        inputs[1], consts[1] = TensorSpec((w.shape[1], w.shape[0]), w.dtype), None
    names = [f"in{i}" if t is not None else "" for i, t in enumerate(inputs)]
    inits = [numpy_helper.from_array(c, names[i]) for i, c in enumerate(consts)  # small ints: Reshape-like values
             if isinstance(c, np.ndarray) and names[i] and c.dtype.kind in "iub" and c.size <= _CONST_LIMIT]
    for pos, key in PARAM_INPUTS.get(spec.op, {}).items():
        if key in attrs and key not in schema.attributes:
            value = attrs.pop(key)
            if value is None:
                continue
            names += [""] * (pos + 1 - len(names))
            names[pos] = f"param{pos}"
            inits.append(numpy_helper.from_array(_param(key, value, inputs, where), names[pos]))
    declared = list(spec.outputs)
    out_names = [f"out{k}" for k in range(len(declared))]
    if spec.op in SLOTTED_OUTPUTS and OUTPUTS_PRESENT in attrs:
        slots = output_slots(attrs, len(declared), len(schema.outputs))
        out_names = [f"out{k}" if k is not None else "" for k in slots]
        while out_names and not out_names[-1]:
            out_names.pop()
    attrs.pop(OUTPUTS_PRESENT, None)
    onnx_attrs = _attributes(schema, attrs, where)
    graph_inputs = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(np.dtype(t.dtype)), t.shape)
                    for n, t in zip(names, inputs, strict=False) if n and t is not None]
    node = helper.make_node(spec.op, names, out_names, **onnx_attrs)
    model = helper.make_model(
        helper.make_graph([node], "spec", graph_inputs, [helper.make_tensor_value_info(n, 0, None)
                                                        for n in out_names if n], initializer=inits),
        opset_imports=[helper.make_opsetid("", int(spec.opset))])
    try:
        ctx = onnx.checker.C.CheckerContext()
        ctx.ir_version, ctx.opset_imports = model.ir_version, {"": int(spec.opset)}
        onnx.checker.check_node(node, ctx)
        inferred = onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True, data_prop=True)
    except Exception as e:  # onnx's checker and inference raise several types, all meaning "not a valid node"
        detail = " ".join(str(e).split())[:300]
        raise SpecError(f"{where}: not a valid ONNX node: {detail}") from None
    present = [n for n in out_names if n]
    if len(present) != len(declared):
        raise SpecError(f"{where}: {len(declared)} outputs declared, the op has {len(present)}")
    got = {vi.name: vi.type.tensor_type for vi in inferred.graph.output}
    for k, (name, t) in enumerate(zip(present, declared, strict=True)):
        tt = got.get(name)
        shape = (tuple(d.dim_value if d.HasField("dim_value") else -1 for d in tt.shape.dim)
                 if tt is not None and tt.HasField("shape") else None)
        if tt is None or not tt.elem_type or shape is None or -1 in shape:
            raise SpecError(f"{where}: output {k}'s shape cannot be inferred from its inputs")
        dtype = helper.tensor_dtype_to_np_dtype(tt.elem_type)
        if shape != tuple(t.shape) or dtype != np.dtype(t.dtype):
            raise SpecError(f"{where}: output {k} is declared {np.dtype(t.dtype).name}{list(t.shape)}, the op "
                            f"computes {dtype.name}{list(shape)}")


def _peel_epilogue(spec: NodeSpec, attrs: dict[str, Any], inputs: list[TensorSpec | None], where: str) -> int:
    """Check the inputs a fused epilogue adds (bias, residual) against the output; how many inputs the op itself
    has."""
    act = attrs.pop("activation", None)
    if act not in _SHAPE_NEUTRAL:
        raise SpecError(f"{where}: unknown fused activation {str(act)[:40]!r}")
    if spec.op != "Gelu":
        attrs.pop("approximate", None)
    out = spec.outputs[0] if spec.outputs else None
    n, extra, expected = len(inputs), [], None
    if spec.op == "Conv" and attrs.pop("residual", 0):
        n, extra, expected = 3, [3], 4
    elif spec.op == "MatMul":
        bias, residual = bool(attrs.pop("bias", 0)), bool(attrs.pop("residual", 0))
        n, expected = 2, 2 + bias + residual
        if bias:
            b = inputs[2] if len(inputs) > 2 else None
            if b is None or out is None or not out.shape or math.prod(b.shape) != out.shape[-1] or (
                    b.shape and b.shape[-1] != out.shape[-1]):
                raise SpecError(f"{where}: a folded bias must have the output's last dim")
            _same_dtype(b, out, where)
        if residual:
            extra = [2 + bias]
    if expected is not None and len(inputs) != expected:
        raise SpecError(f"{where}: {len(inputs)} inputs, the fused node has {expected}")
    for i in extra:
        r = inputs[i]
        if r is None or out is None or tuple(r.shape) != tuple(out.shape):
            raise SpecError(f"{where}: a folded residual must have the output's shape")
        _same_dtype(r, out, where)
    return n


def _same_dtype(a: TensorSpec, b: TensorSpec, where: str) -> None:
    if np.dtype(a.dtype) != np.dtype(b.dtype):
        raise SpecError(f"{where}: a folded input of {np.dtype(a.dtype).name} for an output of "
                        f"{np.dtype(b.dtype).name}")


def _unpack_weights(spec: NodeSpec, attrs: dict[str, Any], inputs: list[TensorSpec | None],
                    consts: list[Any], where: str) -> None:
    """Weights prepacked at compile time (`kernel` and `weight_shape`): the same elements in another order."""
    attrs.pop("kernel", None)
    attrs.pop("weights_tag", None)
    attrs.pop("prepacked", None)
    shape = attrs.pop("weight_shape", None)
    if shape is None:
        return
    if not (isinstance(shape, list) and 0 < len(shape) <= 8 and all(type(d) is int and 0 <= d < 1 << 31
                                                                     for d in shape)):
        raise SpecError(f"{where}: weight_shape must be a list of dims")
    w = inputs[1] if len(inputs) > 1 else None
    if w is None or math.prod(w.shape) != math.prod(shape):
        raise SpecError(f"{where}: prepacked weights of {list(w.shape) if w else None} do not hold "
                        f"weight_shape {shape}")
    inputs[1], consts[1] = TensorSpec(tuple(shape), w.dtype), None


def _param(key: str, value: Any, inputs: list[TensorSpec | None], where: str) -> np.ndarray:
    try:
        if key in _FLOAT_PARAMS:
            x = inputs[0]
            return np.asarray(value, dtype=np.dtype(x.dtype) if x is not None else np.float32)
        arr = np.asarray(value, dtype=np.float32 if key in _REAL_PARAMS else np.int64)
    except (TypeError, ValueError, OverflowError):
        raise SpecError(f"{where}: attribute {key!r} is not a list of numbers") from None
    if arr.ndim > 1 or arr.size > _CONST_LIMIT:
        raise SpecError(f"{where}: attribute {key!r} is not a short list")
    return arr


_KINDS = {onnx.AttributeProto.FLOAT: float, onnx.AttributeProto.INT: int, onnx.AttributeProto.STRING: str}
_LISTS = {onnx.AttributeProto.FLOATS: float, onnx.AttributeProto.INTS: int, onnx.AttributeProto.STRINGS: str}


def _attributes(schema: Any, attrs: dict[str, Any], where: str) -> dict[str, Any]:
    """The attributes as the schema types them; an attribute the op does not have is an error."""
    out = {}
    for key, value in attrs.items():
        a = schema.attributes.get(key)
        if a is None:
            raise SpecError(f"{where}: {schema.name} has no attribute {str(key)[:40]!r}")
        if value is None:
            continue
        try:
            if a.type in _KINDS:
                if isinstance(value, (list, dict)):
                    raise TypeError
                out[key] = _KINDS[a.type](value)
            elif a.type in _LISTS:
                if not isinstance(value, list):
                    raise TypeError
                out[key] = [_LISTS[a.type](v) for v in value]
            else:
                raise SpecError(f"{where}: attribute {key!r} of this type is not accepted from a client")
        except (TypeError, ValueError, OverflowError):
            raise SpecError(f"{where}: attribute {key!r} has the wrong type") from None
    return out
