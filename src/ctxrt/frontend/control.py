"""Control flow at the ONNX level: subgraph scopes, renaming, and the rewrites done before lowering.

- an If whose condition is known at compile time is replaced by the nodes of the branch it takes;
- a Scan becomes a Loop over its sequence axis (Gather per iteration, the stacked outputs moved into place);
- a Loop whose trip count is known and whose condition cannot stop it early is unrolled when small.

Every instantiation of a subgraph renames the values it defines, so names stay unique in the whole model
(an unrolled body appears once per iteration).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ctxrt.errors import ModelError, UnsupportedOpError

CONTROL_OPS = {"If", "Loop", "Scan"}
# An unrolled Loop adds trip count x body nodes to the graph: beyond this many it runs as a Loop kernel.
UNROLL_MAX_NODES = 2048


def subgraphs(node: onnx.NodeProto) -> Iterator[onnx.GraphProto]:
    for a in node.attribute:
        if a.type == onnx.AttributeProto.GRAPH:
            yield a.g
        elif a.type == onnx.AttributeProto.GRAPHS:
            yield from a.graphs


def all_nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    """Every node of the graph and of its subgraphs, recursively."""
    for node in graph.node:
        yield node
        for sub in subgraphs(node):
            yield from all_nodes(sub)


def all_names(graph: onnx.GraphProto) -> set[str]:
    names = {v.name for v in list(graph.input) + list(graph.output)} | {i.name for i in graph.initializer}
    for node in all_nodes(graph):
        names.update(node.input)
        names.update(node.output)
    return names


def defined(graph: onnx.GraphProto) -> set[str]:
    """Values this graph level defines (its inputs, initializers and node outputs; not its subgraphs')."""
    names = {v.name for v in graph.input} | {i.name for i in graph.initializer}
    names.update(o for node in graph.node for o in node.output if o)
    return names


def free_vars(graph: onnx.GraphProto) -> list[str]:
    """Names a subgraph reads from enclosing scopes, in order of first use (nested subgraphs included)."""
    own, seen, out = defined(graph), set(), []

    def use(name: str) -> None:
        if name and name not in own and name not in seen:
            seen.add(name)
            out.append(name)

    for node in graph.node:
        for name in node.input:
            use(name)
        for sub in subgraphs(node):
            for name in free_vars(sub):
                use(name)
    for o in graph.output:
        use(o.name)
    return out


def renamed(nodes: Iterable[onnx.NodeProto], mapping: dict[str, str]) -> list[onnx.NodeProto]:
    """Copies of the nodes with every mapped name replaced, in their subgraphs too."""
    out = []
    for node in nodes:
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        _rename_node(copy, mapping)
        out.append(copy)
    return out


def _rename_node(node: onnx.NodeProto, mapping: dict[str, str]) -> None:
    for k, name in enumerate(node.input):
        node.input[k] = mapping.get(name, name)
    for k, name in enumerate(node.output):
        node.output[k] = mapping.get(name, name)
    for sub in subgraphs(node):
        for inner in sub.node:
            _rename_node(inner, mapping)
        for o in sub.output:
            o.name = mapping.get(o.name, o.name)


class Namer:
    """Fresh value names that no part of the model uses."""

    def __init__(self, taken: set[str]) -> None:
        self.taken = taken

    def __call__(self, base: str) -> str:
        name, k = base, 0
        while name in self.taken:
            k += 1
            name = f"{base}~{k}"
        self.taken.add(name)
        return name


def instantiate(graph: onnx.GraphProto, fresh: Namer, label: str, bind: dict[str, str]
                ) -> tuple[list[onnx.NodeProto], dict[str, np.ndarray], dict[str, str]]:
    """The subgraph's nodes with its formal inputs bound to `bind` and its other values renamed: (nodes,
    initializers by new name, the renaming)."""
    if len(graph.sparse_initializer):
        raise UnsupportedOpError(f"{label}: sparse initializers in subgraphs are not supported")
    mapping = dict(bind)
    for name in sorted(defined(graph) - set(bind)):
        mapping[name] = fresh(f"{label}/{name}")
    try:
        inits = {mapping[i.name]: numpy_helper.to_array(i) for i in graph.initializer}
    except Exception as e:
        raise ModelError(f"{label}: an initializer cannot be read: {e}") from e
    return renamed(graph.node, mapping), inits, mapping


def outputs_of(graph: onnx.GraphProto, mapping: dict[str, str]) -> list[str]:
    return [mapping.get(o.name, o.name) for o in graph.output]


def attr(node: onnx.NodeProto, name: str, default: object = None) -> object:
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def inline_if(node: onnx.NodeProto, cond: np.ndarray, fresh: Namer
              ) -> tuple[list[onnx.NodeProto], dict[str, np.ndarray]]:
    """The nodes of the branch a known condition takes, writing the If's outputs."""
    if cond.size != 1:
        raise ModelError(f"If node {node.name!r}: the condition has {cond.size} elements, not 1")
    branch = attr(node, "then_branch" if bool(cond.reshape(-1)[0]) else "else_branch")
    nodes, inits, mapping = instantiate(branch, fresh, node.name or node.output[0], {})
    outs = outputs_of(branch, mapping)
    nodes += [helper.make_node("Identity", [src], [dst]) for src, dst in zip(outs, node.output, strict=True) if dst]
    return nodes, inits


def always_true(body: onnx.GraphProto, consts: dict[str, np.ndarray]) -> bool:
    """The body's condition output is its condition input passed through, or a constant true."""
    cond_in, cond_out = body.input[1].name, body.output[0].name
    made = {o: n for n in body.node for o in n.output}
    while cond_out in made and made[cond_out].op_type == "Identity":
        cond_out = made[cond_out].input[0]
    if cond_out == cond_in:
        return True
    inits = {i.name: numpy_helper.to_array(i) for i in body.initializer}
    node = made.get(cond_out)
    if node is not None and node.op_type == "Constant" and len(node.attribute) == 1:
        value = helper.get_attribute_value(node.attribute[0])
        inits[cond_out] = numpy_helper.to_array(value) if isinstance(value, onnx.TensorProto) else np.array(value)
    value = inits.get(cond_out, consts.get(cond_out))
    return value is not None and value.size == 1 and bool(value.reshape(-1)[0])


def unroll_loop(node: onnx.NodeProto, trips: int, fresh: Namer, opset: int
                ) -> tuple[list[onnx.NodeProto], dict[str, np.ndarray]]:
    """`trips` copies of the body, each reading the previous one's carried values; scan outputs stacked."""
    body = attr(node, "body")
    formal = [v.name for v in body.input]
    n_state = len(node.input) - 2
    label = node.name or node.output[0]
    consts: dict[str, np.ndarray] = {}
    true = fresh(f"{label}/true")
    consts[true] = np.array(True)
    carried, scans, nodes = list(node.input[2:]), [], []
    for i in range(trips):
        it = fresh(f"{label}/iter{i}")
        consts[it] = np.array(i, np.int64)
        bind = dict(zip(formal, [it, true, *carried], strict=True))
        new, inits, mapping = instantiate(body, fresh, f"{label}#{i}", bind)
        outs = outputs_of(body, mapping)
        nodes += new
        consts.update(inits)
        carried = outs[1:1 + n_state]
        scans.append(outs[1 + n_state:])
    nodes += [helper.make_node("Identity", [src], [dst]) for src, dst in zip(carried, node.output, strict=False) if dst]
    axes = fresh(f"{label}/axes0")
    consts[axes] = np.array([0], np.int64)
    for j, dst in enumerate(node.output[n_state:]):
        if not dst:
            continue
        parts = []
        for i in range(trips):
            part = fresh(f"{label}#{i}/scan{j}")
            nodes.append(_unsqueeze0(scans[i][j], part, axes, opset))
            parts.append(part)
        nodes.append(helper.make_node("Concat", parts, [dst], axis=0))
    return nodes, consts


def _unsqueeze0(src: str, dst: str, axes: str, opset: int) -> onnx.NodeProto:
    if opset >= 13:
        return helper.make_node("Unsqueeze", [src, axes], [dst])
    return helper.make_node("Unsqueeze", [src], [dst], axes=[0])


def scan_to_loop(node: onnx.NodeProto, shape_of: Callable[[str], tuple[int, ...] | None], fresh: Namer,
                 opset: int, consts: dict[str, np.ndarray] | None = None
                 ) -> tuple[list[onnx.NodeProto], dict[str, np.ndarray]] | None:
    """A Scan as a Loop over its sequence axis (opset 8: one Loop per batch row), or None while its inputs'
    shapes are unknown."""
    label = node.name or node.output[0]
    body = attr(node, "body")
    n_scan = int(attr(node, "num_scan_inputs"))
    if opset < 9:
        return _scan8(node, label, body, n_scan, shape_of, fresh, opset, consts or {})
    n_state = len(node.input) - n_scan
    n_out = len(body.output) - n_state
    shapes = [shape_of(n) for n in node.input[n_state:]]
    if any(s is None for s in shapes):
        return None
    in_axes = [a % len(s) for a, s in zip(attr(node, "scan_input_axes", [0] * n_scan), shapes, strict=True)]
    return _scan_loop(label, body, list(node.input), shapes, in_axes, list(attr(node, "scan_input_directions",
                      [0] * n_scan)), list(attr(node, "scan_output_axes", [0] * n_out)),
                      list(attr(node, "scan_output_directions", [0] * n_out)), list(node.output), fresh, opset)


def _scan8(node: onnx.NodeProto, label: str, body: onnx.GraphProto, n_scan: int,
           shape_of: Callable[[str], tuple[int, ...] | None], fresh: Namer, opset: int,
           known: dict[str, np.ndarray]) -> tuple[list[onnx.NodeProto], dict[str, np.ndarray]] | None:
    """Scan-8: every input and output has a leading batch axis (scan inputs [batch, sequence, ...]) and
    `sequence_lens` may shorten rows. Each batch row becomes a Scan-9-like Loop over its slice; the rows'
    results are stacked. Rows of other lengths than the scan inputs' are refused."""
    lens, inputs = node.input[0], list(node.input[1:])
    n_state = len(inputs) - n_scan
    shapes = [shape_of(n) for n in inputs]
    if any(s is None for s in shapes):
        return None
    if any(len(s) < 1 for s in shapes) or any(len(s) < 2 for s in shapes[n_state:]):
        raise ModelError(f"Scan node {label!r}: opset 8 inputs need a batch axis (and scan inputs a sequence axis)")
    batches, length = {s[0] for s in shapes}, shapes[-1][1] if n_scan else 0
    if len(batches) != 1:
        raise ModelError(f"Scan node {label!r}: inputs have different batch sizes {sorted(batches)}")
    if lens:
        value = known.get(lens)
        if value is None or np.any(np.asarray(value) != length):
            given = "computed at run time" if value is None else f"{np.asarray(value).reshape(-1).tolist()[:8]}"
            raise UnsupportedOpError(f"Scan node {label!r}: sequence_lens {given}; ctxrt runs opset 8 Scans whose "
                                     f"rows all have the scan inputs' length ({length})")
    (batch,) = batches
    dirs = list(attr(node, "directions", [0] * n_scan))
    n_out = len(node.output)
    consts: dict[str, np.ndarray] = {}
    axes = fresh(f"{label}/axes0")
    consts[axes] = np.array([0], np.int64)
    nodes, rows = [], []
    for b in range(batch):
        row = fresh(f"{label}/row{b}")
        consts[row] = np.array(b, np.int64)
        sliced = [fresh(f"{label}#{b}/in{j}") for j in range(len(inputs))]
        nodes += [helper.make_node("Gather", [src, row], [dst], axis=0)
                  for src, dst in zip(inputs, sliced, strict=True)]
        outs = [fresh(f"{label}#{b}/out{j}") for j in range(n_out)]
        new, made = _scan_loop(f"{label}#{b}", body, sliced, [s[1:] for s in shapes[n_state:]], [0] * n_scan, dirs,
                               [0] * (n_out - n_state), [0] * (n_out - n_state), outs, fresh, opset)
        nodes += new
        consts.update(made)
        rows.append(outs)
    for j, dst in enumerate(node.output):
        if not dst:
            continue
        parts = [fresh(f"{label}#{b}/stacked{j}") for b in range(batch)]
        nodes += [_unsqueeze0(outs[j], part, axes, opset) for outs, part in zip(rows, parts, strict=True)]
        nodes.append(helper.make_node("Concat", parts, [dst], axis=0))
    return nodes, consts


def _scan_loop(label: str, body: onnx.GraphProto, inputs: list[str], shapes: list[tuple[int, ...]],
               in_axes: list[int], in_dirs: list[int], out_axes: list[int], out_dirs: list[int], outputs: list[str],
               fresh: Namer, opset: int) -> tuple[list[onnx.NodeProto], dict[str, np.ndarray]]:
    """A Loop over the scan inputs (the last len(shapes) of `inputs`; the others are the initial states)."""
    n_scan = len(shapes)
    n_state = len(inputs) - n_scan
    n_out = len(body.output) - n_state
    lengths = {s[a] for s, a in zip(shapes, in_axes, strict=True)}
    if len(lengths) != 1:
        raise ModelError(f"Scan node {label!r}: scan inputs have different lengths {sorted(lengths)}")
    (length,) = lengths
    consts: dict[str, np.ndarray] = {}

    def const(base: str, value: np.ndarray) -> str:
        name = fresh(f"{label}/{base}")
        consts[name] = value
        return name

    it, cond_in, cond_out = fresh(f"{label}/iter"), fresh(f"{label}/cond"), fresh(f"{label}/cond_out")
    last = const("last", np.array(length - 1, np.int64))
    steps = []
    for j, (src, axis, rev) in enumerate(zip(inputs[n_state:], in_axes, in_dirs, strict=True)):
        idx = it
        if rev:
            idx = fresh(f"{label}/rev{j}")
            steps.append(helper.make_node("Sub", [last, it], [idx]))
        steps.append(helper.make_node("Gather", [src, idx], [body.input[n_state + j].name], axis=axis))
    steps += list(body.node) + [helper.make_node("Identity", [cond_in], [cond_out])]
    loop_body = helper.make_graph(
        steps, f"{label}_loop",
        [helper.make_tensor_value_info(it, onnx.TensorProto.INT64, []),
         helper.make_tensor_value_info(cond_in, onnx.TensorProto.BOOL, []), *body.input[:n_state]],
        [helper.make_tensor_value_info(cond_out, onnx.TensorProto.BOOL, []), *body.output],
        initializer=list(body.initializer))
    stacked = [fresh(f"{label}/stacked{j}") for j in range(n_out)]
    trips = const("trips", np.array(length, np.int64))
    nodes = [helper.make_node("Loop", [trips, "", *inputs[:n_state]], [*outputs[:n_state], *stacked],
                              name=label, body=loop_body)]
    for j, (src, dst) in enumerate(zip(stacked, outputs[n_state:], strict=True)):
        if not dst:
            continue
        axis = out_axes[j]
        out_type = body.output[n_state + j].type.tensor_type
        if axis and not out_type.HasField("shape"):
            raise UnsupportedOpError(f"Scan node {label!r}: scan output {j} has axis {axis} but its body output "
                                     "declares no rank")
        rank = len(out_type.shape.dim) + 1
        axis %= rank
        if out_dirs[j]:
            flipped = fresh(f"{label}/flipped{j}")
            nodes.append(_reverse0(src, flipped, const, opset))
            src = flipped
        if axis:
            perm = [*range(1, axis + 1), 0, *range(axis + 1, rank)]
            nodes.append(helper.make_node("Transpose", [src], [dst], perm=perm))
        else:
            nodes.append(helper.make_node("Identity", [src], [dst]))
    return nodes, consts


def _reverse0(src: str, dst: str, const: Callable[[str, np.ndarray], str], opset: int) -> onnx.NodeProto:
    lo = np.iinfo(np.int64).min
    if opset < 10:
        raise UnsupportedOpError("a reversed Scan output needs opset 10 or later (Slice with steps)")
    names = [const(k, np.array([v], np.int64)) for k, v in (("starts", -1), ("ends", lo), ("axes", 0),
                                                             ("steps", -1))]
    return helper.make_node("Slice", [src, *names], [dst])
