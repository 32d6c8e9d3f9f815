"""Scalar integer value inputs given to a range program as lengths (docs/shapes-and-control-flow.md, "Value
inputs in a range program").

A range program reads its dims from its inputs' shapes. An integer input of one element that decides a shape (Range's
limit, OneHot's depth, TopK's K) is turned into such a dim: the model is rewritten so that the input `n` is the
length of a uint8 input `n__length` (its contents never read: `Shape` gives `n`, cast back to `n`'s type), and
the session feeds a zero-stride array of that length (`carry`). Every integer that follows `n` is then fitted
and evaluated at run time like any dim's.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

SUFFIX = "__length"
_INTEGER = {TensorProto.INT64, TensorProto.INT32, TensorProto.INT16, TensorProto.INT8, TensorProto.UINT64,
            TensorProto.UINT32, TensorProto.UINT16, TensorProto.UINT8}
_ZERO = np.zeros(1, np.uint8)


def carrier(name: str) -> str:
    """The input (and dim) name that carries value input `name` as its length."""
    return name + SUFFIX


def carriable(dtype: np.dtype, dims: list[Any] | None) -> bool:
    """An input of this declared type and shape can be carried: an integer of one element."""
    return dtype.kind in "iu" and dims is not None and len(dims) <= 1 and all(d == 1 for d in dims)


def carry(x: Any) -> np.ndarray | None:
    """The carrier feed for value `x` (a zero-stride uint8 array of that length), None where `x` is not one
    non-negative integer."""
    a = np.asarray(x)
    if a.size != 1 or a.dtype.kind not in "iu":
        return None
    n = int(a.reshape(-1)[0])
    return None if n < 0 else np.broadcast_to(_ZERO, (n,))


def carried_model(model: onnx.ModelProto, names: Iterable[str]) -> onnx.ModelProto:
    """A copy of `model` whose inputs `names` (integers of one element) are the lengths of uint8 inputs."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    nodes = []
    for name in sorted(names):
        k = next(i for i, v in enumerate(graph.input) if v.name == name)
        t = graph.input[k].type.tensor_type
        elem, rank = t.elem_type, len(t.shape.dim)
        if elem not in _INTEGER or rank > 1:
            raise ValueError(f"input {name!r} is not an integer of one element")
        length = carrier(name)
        graph.input[k].CopyFrom(helper.make_tensor_value_info(length, TensorProto.UINT8, [length]))
        shaped = f"{length}/shape"
        nodes.append(helper.make_node("Shape", [length], [shaped], name=f"{length}/Shape"))
        if rank == 0:
            graph.initializer.append(numpy_helper.from_array(np.zeros(0, np.int64), f"{length}/scalar"))
            nodes.append(helper.make_node("Reshape", [shaped, f"{length}/scalar"],
                                          [name if elem == TensorProto.INT64 else f"{length}/value"],
                                          name=f"{length}/Reshape"))
            shaped = f"{length}/value"
        if elem != TensorProto.INT64:
            nodes.append(helper.make_node("Cast", [shaped], [name], to=elem, name=f"{length}/Cast"))
        elif rank == 1:
            nodes.append(helper.make_node("Identity", [shaped], [name], name=f"{length}/Identity"))
    for node in reversed(nodes):
        graph.node.insert(0, node)
    return out


__all__ = ["SUFFIX", "carriable", "carried_model", "carrier", "carry"]
