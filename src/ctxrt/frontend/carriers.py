"""Integer value inputs given to a range program as lengths (docs/shapes-and-control-flow.md, "Value inputs in a
range program").

A range program reads its dims from its inputs' shapes. An integer input of a few elements that decides shapes
(Range's limit, OneHot's depth, TopK's K, Resize's sizes, a Reshape's target) has each element that varies turned
into such a dim: the model is rewritten so that the element is the length of a uint8 input (its contents never
read: `Shape` gives the length back; the elements that do not vary are constants, the whole cast back to the
input's type and shape), and the session feeds a zero-stride array of that length (`carry`). Every integer that
follows the element is then fitted and evaluated at run time like any dim's. An element that equals one of the
model's dims in every feed met (a Reshape's batch) is that dim: its carrier's axis is named by it.

A spec is a tuple of (input name, its elements): each element its fixed value (an int) or the name of the dim its
carrier's length is (a str).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

Spec = tuple[tuple[str, tuple[int | str, ...]], ...]
SUFFIX = "__length"
MAX_ELEMENTS = 8  # value inputs of at most this many elements may be carried
_INTEGER = {TensorProto.INT64, TensorProto.INT32, TensorProto.INT16, TensorProto.INT8, TensorProto.UINT64,
            TensorProto.UINT32, TensorProto.UINT16, TensorProto.UINT8}
_ZERO = np.zeros(1, np.uint8)


def carrier(name: str, index: int, size: int) -> str:
    """The input that carries element `index` of value input `name` (of `size` elements) as its length."""
    return name + SUFFIX if size == 1 else f"{name}{SUFFIX}{index}"


def carriable(dtype: np.dtype, dims: list[Any] | None) -> bool:
    """An input of this declared type and shape can be carried: integers, a static shape of a few elements."""
    return dtype.kind in "iu" and dims is not None and len(dims) <= 1 and all(
        isinstance(d, int) and 1 <= d <= MAX_ELEMENTS for d in dims)


def inputs_of(spec: Spec) -> dict[str, str]:
    """Each carrier input of `spec` -> the dim its length is."""
    return {carrier(name, j, len(elements)): e for name, elements in spec for j, e in enumerate(elements)
            if isinstance(e, str)}


def carry(feeds: Mapping[str, Any], spec: Spec) -> dict[str, Any] | None:
    """The feeds with each carried input replaced by its carriers (zero-stride uint8 arrays of its elements'
    lengths); None where an element is negative, or a fixed one has another value (another program's)."""
    out = dict(feeds)
    for name, elements in spec:
        x = out.pop(name, None)
        if x is None:
            return None
        a = np.asarray(x)
        if a.size != len(elements) or a.dtype.kind not in "iu":
            return None
        flat = a.reshape(-1).tolist()
        for j, (e, v) in enumerate(zip(elements, flat, strict=True)):
            if isinstance(e, str):
                if v < 0:
                    return None
                out[carrier(name, j, len(elements))] = np.broadcast_to(_ZERO, (v,))
            elif v != e:
                return None
    return out


def carried_model(model: onnx.ModelProto, spec: Spec) -> onnx.ModelProto:
    """A copy of `model` whose inputs in `spec` are made of their carriers' lengths and fixed elements."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    nodes = []
    for name, elements in spec:
        k = next(i for i, v in enumerate(graph.input) if v.name == name)
        t = graph.input[k].type.tensor_type
        elem, dims = t.elem_type, [d.dim_value for d in t.shape.dim]
        if elem not in _INTEGER or len(dims) > 1:
            raise ValueError(f"input {name!r} is not an integer of a few elements")
        del graph.input[k]
        parts = []
        for j, e in enumerate(elements):
            part = f"{name}{SUFFIX}/{j}"
            if isinstance(e, str):
                length = carrier(name, j, len(elements))
                graph.input.insert(k, helper.make_tensor_value_info(length, TensorProto.UINT8, [e]))
                k += 1
                nodes.append(helper.make_node("Shape", [length], [part], name=f"{part}/Shape"))
            else:
                graph.initializer.append(numpy_helper.from_array(np.array([e], np.int64), part))
            parts.append(part)
        joined = f"{name}{SUFFIX}/joined"
        nodes.append(helper.make_node("Concat", parts, [joined], axis=0, name=f"{joined}/Concat"))
        shape = f"{name}{SUFFIX}/shape"
        graph.initializer.append(numpy_helper.from_array(np.array(dims, np.int64), shape))
        shaped = name if elem == TensorProto.INT64 else f"{name}{SUFFIX}/value"
        nodes.append(helper.make_node("Reshape", [joined, shape], [shaped], name=f"{shaped}/Reshape"))
        if elem != TensorProto.INT64:
            nodes.append(helper.make_node("Cast", [shaped], [name], to=elem, name=f"{name}{SUFFIX}/Cast"))
    for node in reversed(nodes):
        graph.node.insert(0, node)
    return out


__all__ = ["MAX_ELEMENTS", "SUFFIX", "Spec", "carriable", "carried_model", "carrier", "carry", "inputs_of"]
