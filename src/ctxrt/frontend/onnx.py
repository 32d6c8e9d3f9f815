"""The ONNX frontend, the only module that imports onnx.

load -> bind static input shapes -> (shape inference, constant folding) until nothing folds ->
canonical attributes -> IR graph with a static shape and dtype on every value.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from ctxrt.errors import ModelError, ShapeError, UnsupportedOpError
from ctxrt.format.codec import MAX_TENSOR_BYTES
from ctxrt.ir.canonical import INFER_AS_IDENTITY, OUTPUTS_PRESENT, PARAM_INPUTS, SLOTTED_OUTPUTS
from ctxrt.ir.graph import Graph, Node, Value

# Ops that never need a kernel when their inputs are known at compile time (they always fold here).
FOLD_ONLY = {"Shape", "Size", "Constant", "ConstantOfShape", "Range", "NonZero", "Identity", "Dropout"}
# Initializers at most this many elements go to shape inference as data (for Reshape targets etc.);
# larger ones go as typed inputs so inference does not serialize the weights.
_DATA_PROP_MAX = 64

# Ops whose outputs after the first are optional extras (safe to drop when nobody reads them).
_OPTIONAL_OUTPUTS = {"Dropout", "MaxPool", "BatchNormalization", "LayerNormalization", "LSTM", "GRU", "RNN"}

Shapes = Mapping[str, Iterable[int]]


def load_model(model: str | os.PathLike | bytes | onnx.ModelProto) -> onnx.ModelProto:
    if isinstance(model, onnx.ModelProto):
        return model
    try:
        if isinstance(model, bytes):
            return onnx.load_from_string(model)
        return onnx.load(os.fspath(model))
    except FileNotFoundError as e:
        raise ModelError(f"no such model file: {model}") from e
    except Exception as e:  # protobuf raises DecodeError, onnx raises ValueError/OSError
        raise ModelError(f"cannot read ONNX model {model}: {e}") from e


def declared_io(model: str | os.PathLike | bytes | onnx.ModelProto
                ) -> tuple[list[tuple[str, np.dtype, list[int | str]]], list[tuple[str, np.dtype, list[int | str]]]]:
    """The model's inputs (initializers excluded) and outputs as declared: (name, dtype, dims), a dim being
    an int or its symbolic name ("?" when unnamed). Reads no weights."""
    m = load_model(model)
    inits = {i.name for i in m.graph.initializer}

    def one(vi: onnx.ValueInfoProto) -> tuple[str, np.dtype, list[int | str]]:
        tt = vi.type.tensor_type
        dims: list[int | str] = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?")
                                 for d in tt.shape.dim]
        return vi.name, _np_dtype(tt.elem_type, f"{vi.name!r}"), dims

    return [one(v) for v in m.graph.input if v.name not in inits], [one(v) for v in m.graph.output]


def _check_size(what: str, dt: np.dtype, shape: Iterable[int]) -> None:
    nbytes = dt.itemsize
    for d in shape:
        nbytes *= int(d)  # Python ints: no overflow
    if nbytes > MAX_TENSOR_BYTES:
        raise ShapeError(f"{what} would take {nbytes / 2**40:.4g} TiB ({dt}), over ctxrt's limit of "
                         f"{MAX_TENSOR_BYTES // 2**40} TiB per tensor")


def _np_dtype(elem_type: int, where: str) -> np.dtype:
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))
    except Exception as e:
        raise UnsupportedOpError(f"{where}: unsupported tensor element type {elem_type}") from e


def _attr_value(a: onnx.AttributeProto) -> Any:
    v = helper.get_attribute_value(a)
    if isinstance(v, bytes):
        return v.decode()
    if isinstance(v, onnx.TensorProto):
        return numpy_helper.to_array(v)
    if isinstance(v, list):
        return [x.decode() if isinstance(x, bytes) else x for x in v]
    if isinstance(v, onnx.GraphProto):
        raise UnsupportedOpError(f"attribute {a.name!r}: subgraphs (If/Loop/Scan) are not supported")
    return v


class _Folder:
    """Mutable state of the frontend loop: remaining nodes, known constants, inferred types."""

    def __init__(self, model: onnx.ModelProto, shapes: Shapes | None) -> None:
        self.model = model
        g = model.graph
        self.opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
        if not self.opset:
            raise ModelError("model imports no default-domain opset")
        self.consts: dict[str, np.ndarray] = {}
        for init in g.initializer:
            try:
                self.consts[init.name] = numpy_helper.to_array(init)
            except Exception as e:
                raise ModelError(f"initializer {init.name!r} cannot be read: {e}") from e
        # Old IR versions list initializers among the inputs: like onnxruntime, they are constants.
        self.inputs = [i for i in g.input if i.name not in self.consts]
        self.outputs = [o.name for o in g.output]
        self.nodes = list(g.node)
        self.types: dict[str, tuple[np.dtype, tuple[int, ...] | None]] = {}
        self.input_shapes = self._bind_inputs(shapes or {})

    def _bind_inputs(self, shapes: Shapes) -> dict[str, tuple[int, ...]]:
        names = [i.name for i in self.inputs]
        unknown = set(shapes) - set(names)
        if unknown:
            raise ShapeError(f"--shape names unknown inputs {sorted(unknown)}; the model's inputs are {names}")
        bound = {}
        for vi in self.inputs:
            tt = vi.type.tensor_type
            if not vi.type.HasField("tensor_type"):
                raise UnsupportedOpError(f"input {vi.name!r} is not a tensor")
            dims = list(tt.shape.dim)
            if vi.name in shapes:
                shape = tuple(int(d) for d in shapes[vi.name])
                if tt.HasField("shape") and len(shape) != len(dims):
                    raise ShapeError(f"input {vi.name!r} has rank {len(dims)}, --shape gives {shape}")
                for axis, (d, s) in enumerate(zip(dims, shape, strict=False)):
                    if d.HasField("dim_value") and d.dim_value != s:
                        raise ShapeError(f"input {vi.name!r} axis {axis} is fixed at {d.dim_value}, "
                                         f"--shape gives {s}")
                if any(s <= 0 for s in shape):
                    raise ShapeError(f"input {vi.name!r}: dims must be positive, got {shape}")
                _check_size(f"input {vi.name!r} at --shape {'x'.join(map(str, shape))}",
                            _np_dtype(tt.elem_type, f"input {vi.name!r}"), shape)
            else:
                if not tt.HasField("shape"):
                    raise ShapeError(f"input {vi.name!r} has no shape; pass --shape {vi.name}=...")
                shape = []
                for axis, d in enumerate(dims):
                    if d.HasField("dim_value") and d.dim_value > 0:
                        shape.append(d.dim_value)
                    elif axis == 0:
                        shape.append(1)  # batch
                    else:
                        label = d.dim_param or "?"
                        raise ShapeError(f"input {vi.name!r} axis {axis} is dynamic ({label}); pass "
                                         f"--shape {vi.name}=" + "x".join(["N"] * len(dims)))
                shape = tuple(shape)
            bound[vi.name] = shape
            self.types[vi.name] = (_np_dtype(tt.elem_type, f"input {vi.name!r}"), shape)
        return bound

    def skeleton(self) -> onnx.ModelProto:
        """A weight-free copy of the current graph for shape inference."""
        inputs = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(self.types[n][0]),
                                                self.input_shapes[n]) for n in self.input_shapes]
        inits = []
        for name, arr in self.consts.items():
            if arr.size <= _DATA_PROP_MAX:
                inits.append(numpy_helper.from_array(arr, name))
            else:
                inputs.append(helper.make_tensor_value_info(
                    name, helper.np_dtype_to_tensor_dtype(arr.dtype), arr.shape))
        outputs = [helper.make_tensor_value_info(o, onnx.TensorProto.UNDEFINED, None) for o in self.outputs]
        nodes = []
        for n in self.nodes:  # ops onnx cannot type: typed as copies of their inputs
            pairs = INFER_AS_IDENTITY.get(n.op_type)
            nodes += [helper.make_node("Identity", [n.input[j]], [n.output[k]]) for k, j in pairs.items()
                      if k < len(n.output) and n.output[k]] if pairs else [n]
        graph = helper.make_graph(nodes, "skeleton", inputs, outputs, initializer=inits)
        m = helper.make_model(graph, opset_imports=list(self.model.opset_import),
                              ir_version=max(self.model.ir_version, 4))
        return m

    def infer(self) -> None:
        try:
            inferred = onnx.shape_inference.infer_shapes(self.skeleton(), data_prop=True)
        except Exception as e:
            raise ShapeError(f"shape inference failed: {e}") from e
        g = inferred.graph
        for vi in list(g.value_info) + list(g.output):
            tt = vi.type.tensor_type
            if not vi.type.HasField("tensor_type") or not tt.elem_type:
                continue
            shape = None
            if tt.HasField("shape") and all(d.HasField("dim_value") for d in tt.shape.dim):
                shape = tuple(d.dim_value for d in tt.shape.dim)
            dt = _np_dtype(tt.elem_type, f"value {vi.name!r}")
            if shape is not None:
                _check_size(f"value {vi.name!r} at these input shapes", dt, shape)
            self.types[vi.name] = (dt, shape)

    def shape_of(self, name: str) -> tuple[int, ...] | None:
        if name in self.consts:
            return tuple(self.consts[name].shape)
        t = self.types.get(name)
        return t[1] if t else None

    def fold_once(self) -> bool:
        kept, folded = [], False
        for node in self.nodes:
            values = self._evaluate(node)
            if values is None:
                kept.append(node)
                continue
            for name, v in zip(node.output, values, strict=False):
                if name:
                    self.consts[name] = np.asarray(v)
            folded = True
        self.nodes = kept
        return folded

    def _evaluate(self, node: onnx.NodeProto) -> list[np.ndarray] | None:
        op = node.op_type
        if node.domain not in ("", "ai.onnx"):
            return None
        attrs = {a.name: a for a in node.attribute}
        if op == "Constant":
            (a,) = node.attribute
            return [np.asarray(_attr_value(a))]
        if op in ("Shape", "Size"):
            shape = self.shape_of(node.input[0])
            if shape is None:
                return None
            if op == "Size":
                return [np.array(int(np.prod(shape)), np.int64)]
            start = attrs["start"].i if "start" in attrs else 0
            end = attrs["end"].i if "end" in attrs else len(shape)
            return [np.array(shape[slice(start, end)], np.int64)]
        if not all(not n or n in self.consts for n in node.input):
            return None
        if op == "ConstantOfShape":
            fill = numpy_helper.to_array(attrs["value"].t) if "value" in attrs else np.zeros(1, np.float32)
            return [np.full(self.consts[node.input[0]].astype(np.int64), fill.reshape(-1)[0], fill.dtype)]
        if op in ("Identity", "Dropout"):
            return [self.consts[node.input[0]]] + ([] if len(node.output) < 2 else
                                                   [np.ones(self.consts[node.input[0]].shape, bool)])
        if op == "GatherElements":  # onnx.reference's version fails on some index shapes
            data, idx = self.consts[node.input[0]], self.consts[node.input[1]]
            axis = attrs["axis"].i if "axis" in attrs else 0
            idx = np.where(idx < 0, idx + data.shape[axis], idx)
            return [np.take_along_axis(data, idx, axis)]
        feeds = {n: self.consts[n] for n in node.input if n}
        # A one-node model: the evaluator then picks the op version of the model's opset.
        graph = helper.make_graph(
            [node], "fold",
            [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
             for n, v in feeds.items()],
            [helper.make_tensor_value_info(o, onnx.TensorProto.UNDEFINED, None) for o in node.output if o])
        model = helper.make_model(graph, opset_imports=list(self.model.opset_import),
                                  ir_version=max(self.model.ir_version, 4))
        try:
            return list(ReferenceEvaluator(model).run(None, feeds))
        except Exception as e:
            raise ModelError(f"constant folding failed at node {node.name!r} ({op}): {e}") from e


def check_supported(nodes: Iterable[onnx.NodeProto], supported: set[str], extra: set[str]) -> None:
    bad: dict[str, list[str]] = {}
    for node in nodes:
        key = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"
        if node.domain not in ("", "ai.onnx") or node.op_type not in supported | extra:
            bad.setdefault(key, []).append(node.name or "<unnamed>")
    if bad:
        listing = "; ".join(f"{op} ({', '.join(names[:5])}{', ...' if len(names) > 5 else ''})"
                            for op, names in sorted(bad.items()))
        raise UnsupportedOpError(f"unsupported operators: {listing}")


def to_ir(model: str | os.PathLike | bytes | onnx.ModelProto, supported: set[str],
          shapes: Shapes | None = None, name: str = "main") -> Graph:
    """Load an ONNX model as an IR graph with static shapes, constants folded."""
    proto = load_model(model)
    if proto.graph.node and all(n.op_type == "EPContext" for n in proto.graph.node):
        label = os.fspath(model) if isinstance(model, str | os.PathLike) else "this model"
        raise ModelError(f"{label} is an EPContext model (already compiled): run or inspect it, not compile")
    check_supported(proto.graph.node, supported, FOLD_ONLY)
    st = _Folder(proto, shapes)
    st.infer()
    while st.fold_once():
        st.infer()
    check_supported(st.nodes, supported - FOLD_ONLY | {"Identity", "Dropout"}, set())
    return _build_graph(st, name)


def _build_graph(st: _Folder, name: str) -> Graph:
    values: dict[str, Value] = {}
    for n, arr in st.consts.items():
        values[n] = Value(n, arr.dtype, tuple(arr.shape), np.require(arr, requirements="C"))  # keeps 0-d
    for n, shape in st.input_shapes.items():
        values[n] = Value(n, st.types[n][0], shape)
    read = set(st.outputs) | {n for node in st.nodes for n in node.input}
    nodes = []
    for i, np_node in enumerate(st.nodes):
        # Optional outputs nobody reads (Dropout's mask, MaxPool's indices, ...) are dropped; every other
        # output stays (a Split must still know all of its parts).
        optional = np_node.op_type in _OPTIONAL_OUTPUTS
        outputs = [o if o in read or k == 0 or not optional else "" for k, o in enumerate(np_node.output)]
        node = Node(np_node.op_type, np_node.name or f"{np_node.op_type}_{i}", list(np_node.input),
                    outputs, {a.name: _attr_value(a) for a in np_node.attribute})
        _canonicalize(node, st.consts)
        for out in node.outputs:
            if not out:
                continue
            dtype, shape = st.types.get(out, (None, None))
            if dtype is None or shape is None:
                raise ShapeError(f"cannot infer a static shape for {out!r}, output of {node.name!r} "
                                 f"({node.op}); check the --shape values")
            values[out] = Value(out, dtype, shape)
        nodes.append(node)
    for out in st.outputs:
        if out not in values:
            raise ShapeError(f"graph output {out!r} is never produced")
    graph = Graph(name, nodes, values, list(st.input_shapes), list(st.outputs), st.opset)
    graph.prune_values()
    return graph


def _canonicalize(node: Node, consts: dict[str, np.ndarray]) -> None:
    """Move constant parameter inputs into attributes (one form per op for the kernels); record which optional
    outputs exist where a kernel cannot tell from the ones it is given."""
    if node.op in SLOTTED_OUTPUTS:
        node.attrs[OUTPUTS_PRESENT] = [int(bool(o)) for o in node.outputs]
    params = PARAM_INPUTS.get(node.op, {})
    for pos, key in params.items():
        if pos < len(node.inputs) and node.inputs[pos]:
            src = node.inputs[pos]
            if src not in consts:
                raise UnsupportedOpError(f"{node.op} node {node.name!r}: input {key!r} ({src!r}) must be "
                                         "known at compile time")
            value = consts[src]
            node.attrs[key] = value.tolist() if value.ndim else value.item()
            node.inputs[pos] = ""
    while node.inputs and not node.inputs[-1]:
        node.inputs.pop()
