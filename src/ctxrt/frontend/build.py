"""From a settled Folder to the IR: input binding, If/Loop bodies as IR subgraphs, the final checks.

Control nodes in the IR read the outer values their bodies use as explicit inputs (`captures`), so every
pass sees those reads; their bodies are IR graphs (attributes `then_branch`/`else_branch`, `body`) whose
inputs are the formal ones (Loop: iteration, condition, carried values) then the captured values.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ctxrt.errors import ModelError, ShapeError, UnsupportedOpError
from ctxrt.frontend import control, values
from ctxrt.frontend.checks import check_supported, op_key
from ctxrt.ir import memo
from ctxrt.ir.canonical import OUTPUTS_PRESENT, PARAM_INPUTS, RUNTIME_PARAMS, SHAPE_INPUTS, SLOTTED_OUTPUTS
from ctxrt.ir.dynamic import PASS_THROUGH
from ctxrt.ir.graph import Graph, Node, Value

if TYPE_CHECKING:
    from ctxrt.frontend.onnx import Folder, Shapes, Type

# Ops whose outputs after the first are optional extras (safe to drop when nobody reads them).
_OPTIONAL_OUTPUTS = {"Dropout", "MaxPool", "BatchNormalization", "LayerNormalization", "LSTM", "GRU", "RNN",
                     "DynamicQuantizeLSTM", "SimplifiedLayerNormalization", "com.microsoft.SkipLayerNormalization",
                     "com.microsoft.SkipSimplifiedLayerNormalization"}
_I64, _BOOL = np.dtype(np.int64), np.dtype(bool)


def bind_inputs(proto: onnx.ModelProto, shapes: Shapes, given: Mapping[str, Any], notes: list[str]
                ) -> tuple[dict[str, Type], dict[str, np.ndarray]]:
    """Types of the model's inputs with every dim bound (--shape; --value for rank 0-1; else 1, noted), and
    the values given for value inputs as arrays of those types."""
    from ctxrt.frontend.onnx import check_size, np_dtype

    g = proto.graph
    inits = {i.name for i in g.initializer}
    vis = [i for i in g.input if i.name not in inits]  # old IR versions list initializers as inputs
    names = [vi.name for vi in vis]
    for flag, given_names in (("--shape", shapes), ("--value", given)):
        unknown = set(given_names) - set(names)
        if unknown:
            raise ShapeError(f"{flag} names unknown inputs {sorted(unknown)}; the model's inputs are {names}")
    types, baked, bound = {}, {}, []
    for vi in vis:
        if not vi.type.HasField("tensor_type"):
            raise UnsupportedOpError(f"input {vi.name!r} is not a tensor")
        tt = vi.type.tensor_type
        dt = np_dtype(tt.elem_type, f"input {vi.name!r}")
        dims = list(tt.shape.dim)
        if vi.name in shapes:
            shape = tuple(int(d) for d in shapes[vi.name])
            if tt.HasField("shape") and len(shape) != len(dims):
                raise ShapeError(f"input {vi.name!r} has rank {len(dims)}, --shape gives {shape}")
            for axis, (d, s) in enumerate(zip(dims, shape, strict=False)):
                if d.HasField("dim_value") and d.dim_value >= 0 and d.dim_value != s:
                    raise ShapeError(f"input {vi.name!r} axis {axis} is fixed at {d.dim_value}, --shape gives {s}")
            if any(s < 0 for s in shape):  # 0 is allowed: an empty past key/value cache
                raise ShapeError(f"input {vi.name!r}: dims must be >= 0, got {shape}")
            check_size(f"input {vi.name!r} at --shape {'x'.join(map(str, shape))}", dt, shape)
        elif not tt.HasField("shape"):
            if vi.name not in given:
                raise ShapeError(f"input {vi.name!r} has no shape; pass --shape {vi.name}=...")
            shape = values.as_value(vi.name, given[vi.name], dt, None).shape  # a value of unknown rank: 1-D
        elif vi.name in given and len(dims) <= 1 and not all(d.HasField("dim_value") and d.dim_value >= 0
                                                             for d in dims):
            shape = () if not dims else values.as_value(vi.name, given[vi.name], dt, None).shape
        else:
            shape = []
            for axis, d in enumerate(dims):
                if d.HasField("dim_value") and d.dim_value >= 0:  # 0 is a size; -1 (some exporters): dynamic
                    shape.append(d.dim_value)
                else:
                    shape.append(1)
                    bound.append(f"input {vi.name!r} axis {axis} ({d.dim_param or '?'})")
            shape = tuple(shape)
        types[vi.name] = (dt, shape)
        if vi.name in given:
            baked[vi.name] = values.as_value(vi.name, given[vi.name], dt, shape)
    if bound:
        notes.append("dynamic dims bound to 1: " + ", ".join(bound) + " (--shape NAME=DIMS binds them)")
    return types, baked


# -- If / Loop bodies -------------------------------------------------------------------------------

def lower_control(st: Folder, node: onnx.NodeProto) -> bool:
    """Lower the node's bodies once the values it reads have static shapes; False while they do not."""
    label = f"{node.op_type} node {node.name or node.output[0]!r}{st._in()}"
    reads = [n for n in node.input if n] + [n for sub in control.subgraphs(node) for n in control.free_vars(sub)]
    for n in reads:
        if n in st.bounded:
            raise UnsupportedOpError(f"{label} reads {n!r}, whose size is known only at run time")
        if n not in st.consts and st.types.get(n, (None, None))[1] is None:
            return False
    (_lower_if if node.op_type == "If" else _lower_loop)(st, node, label)
    return True


def _body(st: Folder, proto: onnx.GraphProto, formal: list[Type], label: str) -> tuple[Graph, list[str]]:
    from ctxrt.frontend.onnx import Folder

    if len(proto.input) != len(formal):
        raise ModelError(f"{label}: the body has {len(proto.input)} inputs, {len(formal)} expected")
    free = control.free_vars(proto)
    captures = [n for n in free if n not in st.consts]
    nodes, inits, mapping = control.instantiate(proto, st.scope.fresh, label, {})
    outs = control.outputs_of(proto, mapping)
    graph = helper.make_graph(nodes, label, [], [helper.make_tensor_value_info(o, onnx.TensorProto.UNDEFINED, None)
                                                 for o in outs])
    inputs = {**{mapping[v.name]: t for v, t in zip(proto.input, formal, strict=True)},
              **{c: st.types[c] for c in captures}}
    sub = Folder(st.scope, graph, inputs, {**{n: st.consts[n] for n in free if n in st.consts}, **inits}, label)
    sub.keep = frozenset(mapping[n] for n in st.scope.keep if n in mapping)  # (a range program's, ranges.py)
    sub.settle(None)
    st.scope.bodies_read.append(({v: k for k, v in mapping.items()}, sub, frozenset(inits)))  # (folded: to_ir)
    return build_graph(sub, label, body=True), captures


def _types(g: Graph) -> list[tuple[np.dtype, tuple[int, ...]]]:
    return [(np.dtype(g.values[o].dtype), tuple(g.values[o].shape)) for o in g.outputs]


def _lower_if(st: Folder, node: onnx.NodeProto, label: str) -> None:
    name = node.name or node.output[0]
    bodies, captures, types = {}, [], None
    for key in ("then_branch", "else_branch"):
        body, caps = _body(st, control.attr(node, key), [], f"{name}/{key}")
        if types is not None and _types(body) != types:
            raise UnsupportedOpError(f"{label}: its branches return different types or shapes ({types} and "
                                     f"{_types(body)}); ctxrt needs one static shape per output")
        types, bodies[key] = _types(body), body
        captures += [c for c in caps if c not in captures]
    if len(types) != len(node.output):
        raise ModelError(f"{label}: its branches return {len(types)} values for {len(node.output)} outputs")
    st.bodies[node.output[0]] = {**bodies, "captures": captures, "types": types}
    for out, t in zip(node.output, types, strict=True):
        if out:
            st.fixed[out] = t


def _lower_loop(st: Folder, node: onnx.NodeProto, label: str) -> None:
    name = node.name or node.output[0]
    carried_types = [(st.dtype_of(n), st.shape_of(n)) for n in node.input[2:]]
    body, captures = _body(st, control.attr(node, "body"), [(_I64, ()), (_BOOL, ()), *carried_types], f"{name}/body")
    out_types = _types(body)
    n_state, n_scan = len(carried_types), len(out_types) - 1 - len(carried_types)
    if n_scan < 0 or out_types[0][0] != _BOOL or int(np.prod(out_types[0][1])) != 1:
        raise ModelError(f"{label}: the body must return a boolean condition and {n_state} carried values")
    if out_types[1:1 + n_state] != [(np.dtype(d), s) for d, s in carried_types]:
        raise UnsupportedOpError(f"{label}: carried values change type or shape across iterations "
                                 f"({carried_types} -> {out_types[1:1 + n_state]}); ctxrt needs static shapes")
    m, cond = node.input[0], node.input[1]
    trips = int(st.consts[m].reshape(-1)[0]) if m in st.consts else None
    stops = bool(cond and cond not in st.consts) or not _passes_condition(body)
    if n_scan and trips is None:
        raise UnsupportedOpError(f"{label}: its {n_scan} scan output(s) need a trip count known at compile time; "
                                 f"{m or 'none'!r} is computed at run time")
    if not m and not stops:
        raise UnsupportedOpError(f"{label}: it has no trip count and its condition is always true: it never ends")
    bounded = bool(n_scan and stops)
    types = [(dt, (max(trips, 0), *shape) if pos >= n_state else shape)
             for pos, (dt, shape) in enumerate(out_types[1:])]
    if len(types) != len(node.output):
        raise ModelError(f"{label}: the body returns {len(types)} values for {len(node.output)} outputs")
    st.bodies[node.output[0]] = {"body": body, "captures": captures, "bounded": bounded, "types": types}
    for pos, (out, t) in enumerate(zip(node.output, types, strict=True)):
        if out:
            st.fixed[out] = t
            if pos >= n_state and bounded:
                st.made_bounded[out] = 0


def _passes_condition(body: Graph) -> bool:
    """The body's condition output is its condition input (or a constant true): only M can stop the loop."""
    made = body.producers()
    name = body.outputs[0]
    while name in made and made[name].op == "Identity":
        name = made[name].inputs[0]
    v = body.values.get(name)
    return name == body.inputs[1] or (v is not None and v.is_const and bool(v.const.reshape(-1)[0]))


# -- IR ----------------------------------------------------------------------------------------------

def build_graph(st: Folder, name: str, body: bool = False) -> Graph:
    _check_settled(st, body)
    vals: dict[str, Value] = {n: Value(n, a.dtype, tuple(a.shape), np.require(a, requirements="C"))
                              for n, a in st.consts.items()}
    vals.update({n: Value(n, dt, shape) for n, (dt, shape) in st.inputs.items()})
    read = set(st.outputs) | {n for node in st.nodes for n in node.input}
    nodes, names = [], set()
    for i, proto in enumerate(st.nodes):
        node_name = proto.name or f"{proto.op_type}_{i}"
        while node_name in names:  # unrolled bodies repeat their node names
            node_name += "~"
        names.add(node_name)
        node = _node(st, proto, node_name, read)
        _bake_shape_inputs(st, node, vals)
        for out in node.outputs:
            if out and out not in vals:
                dtype, shape = st.types.get(out, (None, None))
                if dtype is None or shape is None:
                    raise ShapeError(f"cannot infer a static shape for {out!r}, output of {node.name!r} "
                                     f"({node.op}){st._in()}; check the --shape values")
                vals[out] = Value(out, dtype, shape)
        nodes.append(node)
    outputs = list(st.outputs)
    if not body:
        _copy_constant_outputs(st, nodes, vals)
    if body:  # a body's outputs must be written by its own steps, once each
        for k, out in enumerate(outputs):
            if out in st.inputs or out in st.consts or out in outputs[:k]:
                copy = st.scope.fresh(f"{name}/out{k}")
                nodes.append(Node("Identity", f"{name}/out{k}", [out], [copy]))
                vals[copy] = Value(copy, vals[out].dtype, vals[out].shape)
                outputs[k] = copy
    for out in outputs:
        if out not in vals:
            raise ShapeError(f"graph output {out!r} is never produced{st._in()}")
    graph = Graph(name, nodes, vals, list(st.inputs), outputs, st.scope.opset, dict(st.value_inputs))
    graph.prune_values()
    return graph


def _bake_shape_inputs(st: Folder, node: Node, vals: dict[str, Value]) -> None:
    """A value input read where it decides a shape (NonMaxSuppression's max_output_boxes_per_class) is read as
    the constant it was compiled for (each run checks the input still holds that value)."""
    for pos in SHAPE_INPUTS.get(node.op, ()):
        src = node.inputs[pos] if pos < len(node.inputs) else ""
        if src in st.value_inputs:
            baked = st.scope.fresh(f"{src}/compiled")
            vals[baked] = Value(baked, vals[src].dtype, vals[src].shape, st.value_inputs[src])
            node.inputs[pos] = baked


def _copy_constant_outputs(st: Folder, nodes: list[Node], vals: dict[str, Value]) -> None:
    """A graph output that folded to a constant (a Shape, a Range of value inputs) is written by a copy of that
    constant, stored under another name (its readers read that)."""
    for out in dict.fromkeys(st.outputs):
        if out not in st.consts or out in st.inputs:
            continue
        src = st.scope.fresh(f"{out}/constant")
        vals[src] = Value(src, vals[out].dtype, vals[out].shape, vals[out].const)
        vals[out] = Value(out, vals[out].dtype, vals[out].shape)
        for node in nodes:
            node.inputs = [src if n == out else n for n in node.inputs]
        nodes.append(Node("Identity", f"{out}/copy", [src], [out]))


def _node(st: Folder, proto: onnx.NodeProto, name: str, read: set[str]) -> Node:
    op = op_key(proto)
    if op in ("If", "Loop"):
        return _control_node(st, proto, name)
    outputs = list(proto.output)
    if op in values.UPPER_BOUNDS:  # every output present (kernels index them), then the extent
        bound = values.upper_bound(proto, st.shape_of, st.consts, st.scope.shared_kv)
        dt0 = st.dtype_of(proto.input[0])
        outputs = [proto.output[k] if k < len(proto.output) and proto.output[k] else st.scope.fresh(f"{name}/out{k}")
                   for k in range(len(bound))]
        for k, o in enumerate(outputs):
            st.types[o] = (bound[k][0] or dt0, bound[k][1])
        outputs.append(_extent(st, name))
    elif op in _OPTIONAL_OUTPUTS:  # unread optional outputs are dropped (a Split still keeps all its parts)
        outputs = [o if o in read or k == 0 else "" for k, o in enumerate(outputs)]
    node = Node(op, name, list(proto.input), outputs, _attrs(proto, name))
    if op == "Compress" and "axis" in node.attrs:
        node.attrs["axis"] %= len(st.shape_of(proto.input[0]))
    if op == "Unique" and "axis" in node.attrs:
        node.attrs["axis"] %= len(st.shape_of(proto.input[0]))
    _canonicalize(node, st.consts)
    return node


def _extent(st: Folder, name: str) -> str:
    extent = st.scope.fresh(f"{name}/extent")
    st.types[extent] = (_I64, ())
    return extent


def _control_node(st: Folder, proto: onnx.NodeProto, name: str) -> Node:
    lowered = st.bodies[proto.output[0]]
    outputs = [o or st.scope.fresh(f"{name}/out{k}") for k, o in enumerate(proto.output)]
    for o, t in zip(outputs, lowered["types"], strict=True):
        st.types[o] = t
    attrs = {key: lowered[key] for key in ("then_branch", "else_branch", "body", "bounded") if key in lowered}
    attrs["captures"] = list(lowered["captures"])
    if lowered.get("bounded"):
        outputs.append(_extent(st, name))
    return Node(proto.op_type, name, [*proto.input, *lowered["captures"]], outputs, attrs)


def _attrs(proto: onnx.NodeProto, name: str) -> dict[str, Any]:
    """A node's attributes as Python values: read once per node proto in a range compile (ir/memo.py), where
    every probe builds the same nodes; each node gets its own dict and lists."""
    made = memo.memo("attrs", proto, name, lambda: {a.name: _attr_value(a, name) for a in proto.attribute})
    return {k: list(v) if isinstance(v, list) else v for k, v in made.items()}


def _attr_value(a: onnx.AttributeProto, node: str) -> Any:
    if a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS):
        raise UnsupportedOpError(f"node {node!r}: attribute {a.name!r} holds a subgraph; ctxrt runs subgraphs "
                                 "of If, Loop and Scan only")
    v = helper.get_attribute_value(a)
    if isinstance(v, bytes):
        return v.decode()
    if isinstance(v, onnx.TensorProto):
        return numpy_helper.to_array(v)
    if isinstance(v, list):
        return [x.decode() if isinstance(x, bytes) else x for x in v]
    return v


def _canonicalize(node: Node, consts: dict[str, np.ndarray]) -> None:
    """Move constant parameter inputs into attributes (one form per op for the kernels); record which optional
    outputs exist where a kernel cannot tell from the ones it is given."""
    if node.op in SLOTTED_OUTPUTS:
        node.attrs[OUTPUTS_PRESENT] = [int(bool(o)) for o in node.outputs]
    runtime = RUNTIME_PARAMS.get(node.op, set())
    for pos, key in PARAM_INPUTS.get(node.op, {}).items():
        if pos < len(node.inputs) and node.inputs[pos]:
            if pos in runtime and node.inputs[pos] not in consts:
                continue  # read by the kernel at run time
            value = consts[node.inputs[pos]]
            node.attrs[key] = value.tolist() if value.ndim else value.item()
            node.inputs[pos] = ""
    while node.inputs and not node.inputs[-1]:
        node.inputs.pop()


def _broadcast(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...] | None:
    return _broadcast_all([a, b])


def _broadcast_all(shapes: list[tuple[int, ...]]) -> tuple[int, ...] | None:
    try:
        return tuple(np.broadcast_shapes(*(tuple(x) for x in shapes)))
    except ValueError:
        return None


# element-wise ops whose inputs broadcast together (multidirectional broadcasting, ONNX's Broadcasting.md)
_BROADCASTING = frozenset({"Add", "Sub", "Mul", "Div", "Pow", "Mod", "Max", "Min", "Sum", "Mean", "Equal", "Less",
                           "Greater", "LessOrEqual", "GreaterOrEqual", "And", "Or", "Xor", "Where", "BitShift",
                           "BitwiseAnd", "BitwiseOr", "BitwiseXor"})


def _check_einsum(st: Folder, node: onnx.NodeProto, label: str) -> None:
    """ShapeError where a letter of an Einsum's equation labels axes of different sizes (onnx's inference types
    the output by the first operand's, and a size-1 axis against another size is not broadcast here)."""
    eq = next((a.s.decode() for a in node.attribute if a.name == "equation"), "").replace(" ", "")
    sizes: dict[str, set[int]] = {}
    for term, name in zip(eq.partition("->")[0].split(","), node.input, strict=False):
        shape = st.shape_of(name) if name else None
        if shape is None or "..." in term or len(term) != len(shape):
            continue  # (a broadcast ellipsis, or a rank the kernel names)
        for c, d in zip(term, shape, strict=True):
            sizes.setdefault(c, set()).add(int(d))
    bad = {c: sorted(v) for c, v in sizes.items() if len(v) > 1}
    if bad:
        c, v = next(iter(bad.items()))
        raise ShapeError(f"{label}: equation {eq!r} labels axes of sizes {v} with {c!r}; they must be one size")


class _Label:
    """A node's name in a message, formatted when one is written (`_check_settled` checks every node)."""

    def __init__(self, node: onnx.NodeProto, where: str) -> None:
        self.node, self.where = node, where

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)

    def __str__(self) -> str:
        return f"{self.node.op_type} node {self.node.name or self.node.output[0]!r}{self.where}"


def _check_settled(st: Folder, body: bool) -> None:
    """Everything that cannot be compiled, all at once: ops left unfolded, shape-deciding inputs computed at
    run time, readers of data-dependent sizes, control nodes whose inputs never got static shapes."""
    from ctxrt.frontend.onnx import FOLD_ONLY

    problems = []
    where = st._in()
    for node in st.nodes:
        label = _Label(node, where)
        if node.op_type in ("Scan", "If", "Loop") and node.output[0] not in st.bodies:
            raise ShapeError(f"{label}: cannot infer static shapes for the values it reads")
        required, _ = values.positions(node)
        for pos, what in required.items():
            src = node.input[pos] if pos < len(node.input) else ""
            if src and src not in st.consts:
                problems.append(f"{label}: {what} ({src!r}) is computed at run time; ctxrt needs it at compile time")
        if node.op_type == "Einsum":
            _check_einsum(st, node, str(label))
        if node.op_type == "Expand" and len(node.input) > 1 and node.input[1] in st.consts:
            # (onnx's inference lets a target that does not broadcast through)
            a, b = st.shape_of(node.input[0]), tuple(int(d) for d in st.consts[node.input[1]].reshape(-1))
            if a is not None and _broadcast(a, b) is None:
                raise ShapeError(f"{label}: its input {list(a)} does not broadcast with the shape {list(b)}")
        if node.op_type in _BROADCASTING and len(node.input) > 1 and node.output and \
                st.shape_of(node.output[0]) is None:  # (onnx's inference leaves the output untyped where the inputs
            # do not broadcast: the message was then about a shape chain further on, 'computed at run time'; a
            # trace-specialized export fed another length. Typed outputs cost no check)
            shapes = [st.shape_of(n) for n in node.input if n]
            if all(x is not None for x in shapes) and _broadcast_all(shapes) is None:
                raise ShapeError(f"{label}: its inputs' shapes {[list(x) for x in shapes]} do not broadcast (an "
                                 "export specialized to other input shapes?)")
        if node.op_type == "PRelu" and len(node.input) > 1:  # slope broadcast to X, not X to slope (onnx's spec)
            a, b = st.shape_of(node.input[0]), st.shape_of(node.input[1])
            if a is not None and b is not None and _broadcast(a, b) != tuple(a):
                raise ShapeError(f"{label}: its slope {list(b)} does not broadcast to its input {list(a)}")
        if node.op_type == "Reshape" and node.input and node.output:  # (onnx's inference does not check it)
            a, b = st.shape_of(node.input[0]), st.shape_of(node.output[0])
            if a is not None and b is not None and math.prod(a) != math.prod(b):
                raise ShapeError(f"{label}: cannot reshape {list(a)} ({math.prod(a)} elements) into {list(b)} "
                                 f"({math.prod(b)} elements)")
        if node.op_type in ("ScatterND", "ScatterElements") and len(node.input) > 2:  # (nor these)
            d, i, u = (st.shape_of(n) for n in node.input[:3])
            if d is not None and i is not None and u is not None:
                q = i[-1] if node.op_type == "ScatterND" and i else 0
                want = tuple(i[:-1]) + tuple(d[q:]) if node.op_type == "ScatterND" else tuple(i)
                if node.op_type == "ScatterElements" and len(i) != len(d):
                    raise ShapeError(f"{label}: indices of rank {len(i)} into data of rank {len(d)} (they must be "
                                     "of one rank)")
                if node.op_type == "ScatterND" and q > len(d) or tuple(u) != want:
                    raise ShapeError(f"{label}: updates of shape {list(u)} for indices {list(i)} into data "
                                     f"{list(d)} (they must be of shape {list(want)})")
        if node.op_type == "GatherElements" and len(node.input) > 1:
            d, i = st.shape_of(node.input[0]), st.shape_of(node.input[1])
            if d is not None and i is not None and len(i) != len(d):
                raise ShapeError(f"{label}: indices of rank {len(i)} into data of rank {len(d)} (they must be of "
                                 "one rank)")
        for k, src in enumerate(node.input):
            if src in st.bounded and not (k == 0 and node.op_type in PASS_THROUGH):
                problems.append(f"{label} reads {src!r}, whose size along axis {st.bounded[src]} is known only at "
                                "run time; such tensors can only be graph outputs (through Transpose, Cast, Identity)")
    for out in st.outputs:
        if body and out in st.bounded:
            problems.append(f"{st.label}: returns {out!r}, whose size is known only at run time; bodies need "
                            "static shapes")
    if problems:
        raise UnsupportedOpError("; ".join(problems))
    kept = {n.op_type for n in st.nodes if not st.keep.isdisjoint(n.output)}  # a range program's (onnx.py)
    check_supported([n for n in st.nodes if n.op_type not in ("If", "Loop")],
                    st.scope.supported - (FOLD_ONLY - kept) | {"Identity", "Dropout"}, set())
