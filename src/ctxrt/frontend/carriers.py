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

import re
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


# A program's value inputs given as lengths, as a context binary records them (docs/format.md "value_ranges"):
# (input name, its dtype, its shape, its elements: a fixed value or the name of its dim).
Record = tuple[tuple[str, str, tuple[int, ...], tuple[int | str, ...]], ...]
_ELEMENT = re.compile(r"(.+)\[(\d+)\]")


def value_ranges(model: Any, dims: Mapping[str, Any], values: Mapping[str, Any] | None
                 ) -> tuple[Any, Record]:
    """`dims` keys that name an integer value input deciding shapes only (NAME, or NAME[J] for its element J):
    (the model with those inputs carried, their records); (model, ()) where none does. The elements not ranged
    are taken from `values`. A compile with ranges for a value input (`ctxrt compile --dim limit=1:64`)."""
    from ctxrt.compiler.ranges import parse_range
    from ctxrt.errors import CtxrtError
    from ctxrt.frontend.onnx import load_model
    from ctxrt.frontend.values import trace

    keys = {}
    for key in dims:
        m = _ELEMENT.fullmatch(key)
        keys[key] = (m.group(1), int(m.group(2))) if m else (key, None)
    loaded = load_model(model)
    graph = loaded.graph
    inits = {t.name for t in graph.initializer}
    declared = {i.name: i for i in graph.input if i.name not in inits}
    named = {d.dim_param for i in declared.values() for d in i.type.tensor_type.shape.dim}  # (a dim's name: a dim)
    wanted = {key: nj for key, nj in keys.items() if nj[0] in declared and key not in named}
    if not wanted:
        return model, ()
    shape_only, branch = trace(graph.node)
    spec, records = [], []
    for name in dict.fromkeys(n for n, _ in wanted.values()):
        t = declared[name].type.tensor_type
        decl = [d.dim_value if d.HasField("dim_value") else d.dim_param or None for d in t.shape.dim] \
            if t.HasField("shape") else None
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(t.elem_type)) if t.elem_type else np.dtype(object)
        if not carriable(dtype, decl) or name not in shape_only or name in branch:
            raise CtxrtError(f"dim {name!r}: input {name!r} is no integer input of at most {MAX_ELEMENTS} elements "
                             "(a static shape) whose value decides shapes and no branch: it cannot be ranged")
        size = int(np.prod(decl, dtype=np.int64)) if decl else 1
        if size > 1 and any(nj == (name, None) for nj in wanted.values()):
            raise CtxrtError(f"dim {name!r}: input {name!r} has {size} elements: range each as {name}[J]")
        given = values.get(name) if values else None
        fixed = None if given is None else np.asarray(given).reshape(-1)
        elements: list[int | str] = []
        for j in range(size):
            key = next((k for k, nj in wanted.items() if nj[0] == name and nj[1] in ((j,) if size > 1 else (j, None))),
                       None)
            if key is not None:
                parse_range(dims[key], key)  # (0 <= MIN <= MAX: lengths)
                elements.append(key)
            elif fixed is None or fixed.size != size:
                raise CtxrtError(f"dim {name!r}: element {j} of input {name!r} is not ranged: give the input's "
                                 f"value for it (--value {name}=... with {size} elements)")
            else:
                elements.append(int(fixed[j]))
        if any(n == name and j is not None and j >= size for n, j in wanted.values()):
            raise CtxrtError(f"dim {name!r}: input {name!r} has {size} elements")
        spec.append((name, tuple(elements)))
        records.append((name, dtype.str, tuple(decl or ()), tuple(elements)))
    return carried_model(loaded, tuple(spec)), tuple(records)


__all__ = ["MAX_ELEMENTS", "SUFFIX", "Record", "Spec", "carriable", "carried_model", "carrier", "carry", "inputs_of",
           "value_ranges"]
