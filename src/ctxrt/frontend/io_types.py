"""A model's inputs and outputs as onnxruntime reports them: declared types, and for what the model leaves
undeclared, onnx shape inference run on the model with its symbolic input dims (as onnxruntime does)."""

from __future__ import annotations

import copy
import os
import re
from typing import Any

import numpy as np
import onnx
from onnx import helper

from ctxrt import dtypes
from ctxrt.errors import ModelError

# name, dtype (None: neither declared nor inferred), dims (None: rank unknown; a dim None: unknown, unnamed)
IOType = tuple[str, np.dtype | None, list[int | str | None] | None]
Dims = list[int | str | None] | None

_SMALL = 64  # initializers up to this many elements go to inference as data (Reshape targets, ...)
_GENERATED = re.compile(r"unk__\d+")  # names onnx inference gives unknown dims (onnxruntime shows None)


def declared_io(model: str | os.PathLike | bytes | onnx.ModelProto) -> tuple[list[IOType], list[IOType]]:
    """The model's inputs (initializers excluded) and outputs: (name, dtype, dims), a dim being an int, its
    symbolic name, or None when unnamed. What an output leaves undeclared (its shape, a dim, its dtype) comes
    from onnx shape inference over the symbolic input dims; None when inference cannot tell either (dims None:
    rank unknown). Reads no external data."""
    from ctxrt.frontend.external import file_key, remember, structure
    from ctxrt.frontend.onnx import load_model

    key = None
    if isinstance(model, str | os.PathLike):
        key = file_key(model)
        if key in _DECLARED:  # (a session's open and its first compile read it: ~5 ms for a 4-layer decoder)
            return copy.deepcopy(_DECLARED[key])
        try:
            m = structure(model)
        except Exception as e:
            raise ModelError(f"cannot read ONNX model {model}: {e}") from e
    else:
        m = load_model(model)
    inits = {i.name for i in m.graph.initializer}
    inferred = _infer(m)
    named = {d.dim_param for v in list(m.graph.input) + list(m.graph.output) + list(m.graph.value_info)
             for d in v.type.tensor_type.shape.dim if d.dim_param}
    ins = [_io(v, None, named) for v in m.graph.input if v.name not in inits]
    got = ins, [_io(v, inferred.get(v.name), named) for v in m.graph.output]
    remember(_DECLARED, key, copy.deepcopy(got))
    return got


_DECLARED: dict[Any, tuple[list[IOType], list[IOType]]] = {}  # file_key -> its declared IO (external.KEPT files)


def to_json(io: tuple[list[IOType], list[IOType]]) -> list[list[list[Any]]]:
    """`declared_io`'s result as JSON values (dtypes by their strings)."""
    return [[[name, None if dt is None else dtypes.name(dt), dims] for name, dt, dims in side] for side in io]


def from_json(value: Any) -> tuple[list[IOType], list[IOType]]:
    """`to_json`'s inverse; ValueError or TypeError where the value is not one of its results."""
    def dim(d: Any) -> int | str | None:
        if d is None or isinstance(d, str) or isinstance(d, int) and not isinstance(d, bool):
            return d
        raise ValueError(f"not a dim: {d!r}")

    def one(item: Any) -> IOType:
        name, dt, dims = item
        if not isinstance(name, str) or not (dt is None or isinstance(dt, str)) or \
                not (dims is None or isinstance(dims, list)):
            raise ValueError(f"not an IO type: {item!r}")
        return name, None if dt is None else dtypes.dtype_of(dt), None if dims is None else [dim(d) for d in dims]
    ins, outs = value
    return [one(x) for x in ins], [one(x) for x in outs]


def _io(vi: onnx.ValueInfoProto, inferred: onnx.ValueInfoProto | None, named: set[str]) -> IOType:
    from ctxrt.frontend.onnx import np_dtype

    tt = vi.type.tensor_type
    it = inferred.type.tensor_type if inferred is not None and inferred.type.HasField("tensor_type") else None
    elem = tt.elem_type or (it.elem_type if it is not None else 0)
    dt = np_dtype(elem, f"{vi.name!r}") if elem else None
    guess = _dims(it, named) if it is not None else None
    dims = _dims(tt, set()) if tt.HasField("shape") else guess
    if dims is not None and guess is not None and len(guess) == len(dims):  # unnamed declared dims: inferred
        dims = [g if d is None else d for d, g in zip(dims, guess, strict=True)]
    return vi.name, dt, dims


def _dims(tt: onnx.TypeProto.Tensor, named: set[str]) -> Dims:
    """An int, a name, or None per dim (some exporters write -1 for a dynamic dim); None when no shape. Names
    onnx inference made up for unknown dims (`unk__3`, not in the model) are None, as in onnxruntime."""
    if not tt.HasField("shape"):
        return None
    out: list[int | str | None] = []
    for d in tt.shape.dim:
        if d.HasField("dim_value") and d.dim_value >= 0:
            out.append(d.dim_value)
        elif d.dim_param and not (_GENERATED.fullmatch(d.dim_param) and d.dim_param not in named):
            out.append(d.dim_param)
        else:
            out.append(None)
    return out


def _infer(m: onnx.ModelProto) -> dict[str, onnx.ValueInfoProto]:
    """Output types from onnx shape inference on a weight-free copy (small initializers kept as data, larger
    ones as typed inputs); {} when inference fails (compiling reports the model's problems)."""
    g = m.graph
    skeleton = onnx.GraphProto(name=g.name, node=g.node, output=g.output, value_info=g.value_info)
    listed = {v.name for v in g.input}
    skeleton.input.extend(g.input)
    for init in g.initializer:
        external = init.data_location == onnx.TensorProto.EXTERNAL
        if not external and int(np.prod(init.dims, dtype=np.int64)) <= _SMALL:
            skeleton.initializer.append(init)
        elif init.name not in listed:
            skeleton.input.append(helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))
    model = onnx.ModelProto(ir_version=max(m.ir_version, 4), opset_import=m.opset_import, graph=skeleton,
                            functions=m.functions)
    try:
        out = onnx.shape_inference.infer_shapes(model, data_prop=True).graph.output
    except Exception:  # noqa: BLE001 - any failure: report what the model declares
        return {}
    return {o.name: o for o in out}
