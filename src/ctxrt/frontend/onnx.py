"""The ONNX frontend: onnx is imported here and in the helpers of this package only.

load -> onnx.checker -> bind input shapes and value inputs -> repeat (shape inference, constant folding,
control-flow rewrites, value inputs from feeds, upper bounds and subgraph bodies) until nothing changes ->
IR graph with a static shape and dtype on every value (frontend/build.py).
"""

from __future__ import annotations

import hashlib
import math
import os
import warnings
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from ctxrt.errors import CtxrtWarning, ModelError, ShapeError, UnsupportedOpError, ValueInputError
from ctxrt.format.codec import MAX_TENSOR_BYTES
from ctxrt.frontend import contrib, control, extensions, values
from ctxrt.frontend.checks import check_model, check_supported, op_key
from ctxrt.frontend.external import load_in_place, tensor_array
from ctxrt.frontend.fold import FoldError, fold
from ctxrt.frontend.order import sorted_model
from ctxrt.frontend.pools import DECIDED, POOLS, ceil_pool_shape, conv_transpose_shape
from ctxrt.ir.canonical import INFER_AS_IDENTITY
from ctxrt.ir.dynamic import PASS_THROUGH
from ctxrt.ir.graph import Graph
from ctxrt.ir.memo import memo

# Ops that never need a kernel when their inputs are known at compile time (they always fold here).
FOLD_ONLY = {"Shape", "Size", "Constant", "ConstantOfShape", "Range", "Identity", "Dropout"}
# Initializers at most this many elements go to shape inference as data (for Reshape targets etc.);
# larger ones go as typed inputs so inference does not serialize the weights.
_DATA_PROP_MAX = 64

Shapes = Mapping[str, Iterable[int]]
Type = tuple[np.dtype, tuple[int, ...] | None]


def load_model(model: str | os.PathLike | bytes | onnx.ModelProto) -> onnx.ModelProto:
    if isinstance(model, onnx.ModelProto):
        return model
    try:
        if isinstance(model, bytes):
            return onnx.load_from_string(model)
        return load_in_place(model)
    except ModelError:
        raise
    except FileNotFoundError as e:
        raise ModelError(f"no such model file: {model}") from e
    except Exception as e:  # protobuf raises DecodeError, onnx raises ValueError/OSError
        raise ModelError(f"cannot read ONNX model {model}: {e}") from e


def check_size(what: str, dt: np.dtype, shape: Iterable[int]) -> None:
    nbytes = dt.itemsize
    for d in shape:
        nbytes *= int(d)  # Python ints: no overflow
    if nbytes > MAX_TENSOR_BYTES:
        raise ShapeError(f"{what} would take {nbytes / 2**40:.4g} TiB ({dt}), over ctxrt's limit of "
                         f"{MAX_TENSOR_BYTES // 2**40} TiB per tensor")


def np_dtype(elem_type: int, where: str) -> np.dtype:
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))
    except Exception as e:
        raise UnsupportedOpError(f"{where}: unsupported tensor element type {elem_type}") from e


class Scope:
    """What a model's graph and all its subgraphs share: opsets, fresh names, notes for the user."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self.model = model
        self.opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
        if not self.opset:
            raise ModelError("model imports no default-domain opset")
        self.fresh = control.Namer(set(memo("all_names", model, None, lambda: control.all_names(model.graph))))
        self.notes: list[str] = []
        self.supported: set[str] = set()  # op types the backend has kernels for
        self.shared_kv: frozenset[str] = frozenset()  # past inputs one buffer with their presents (to_ir)
        self.keep: frozenset[str] = frozenset()  # values never folded, by their model names (bodies' too: to_ir)
        # per body read (If branch, Loop body): (its values' model names by their names here, its Folder)
        self.bodies_read: list[tuple[dict[str, str], Folder, frozenset[str]]] = []  # (and its initializers)

    def make_model(self, graph: onnx.GraphProto, min_opset: int = 0) -> onnx.ModelProto:
        opsets = [helper.make_opsetid(o.domain, max(o.version, min_opset)) if o.domain in ("", "ai.onnx") else o
                  for o in self.model.opset_import]
        return helper.make_model(graph, opset_imports=opsets, ir_version=max(self.model.ir_version, 4))


class Folder:
    """One graph (the model's, or a subgraph body) on its way to static shapes: its remaining nodes, known
    constants, types, and what was decided about it (value inputs, upper bounds, compiled bodies)."""

    def __init__(self, scope: Scope, graph: onnx.GraphProto, inputs: dict[str, Type], consts: dict[str, np.ndarray],
                 label: str = "") -> None:
        self.scope, self.label, self.graph = scope, label, graph
        self.consts = dict(consts)
        for init in graph.initializer:
            try:
                self.consts[init.name] = memo("initializer", init, None,
                                              lambda init=init: tensor_array(init))
            except Exception as e:
                raise ModelError(f"initializer {init.name!r} cannot be read: {e}") from e
        self.inputs = dict(inputs)  # graph inputs (value inputs too: they are also constants here)
        self.types: dict[str, Type] = dict(inputs)
        self.nodes = list(graph.node)
        self.outputs = [o.name for o in graph.output]
        self.fixed: dict[str, Type] = {}  # types decided here (bodies' outputs, upper bounds): given to inference
        self.bounded: dict[str, int] = {}  # value -> axis whose size is an upper bound
        self.made_bounded: dict[str, int] = {}  # the same, for outputs of data-dependent ops only
        self.bodies: dict[str, Any] = {}  # control node's first output -> its lowered bodies
        self.value_inputs: dict[str, np.ndarray] = {}
        # Values never folded into constants: they depend on a dynamic dim of a range program (compiler/ranges.py),
        # so the nodes making them run as kernels.
        self.keep: frozenset[str] = frozenset()
        self.chains: set[str] = set()  # values folded from constants alone, before any shape was known
        self._protos: dict[str, tuple[np.ndarray, onnx.TensorProto]] = {}  # skeleton's small constants (`_proto`)

    # -- the loop ------------------------------------------------------------------------------------
    def settle(self, feeds: Mapping[str, Any] | None) -> None:
        self._inline_known_ifs(feeds)
        self._fold_constant_chains()
        known = False  # every remaining node's outputs typed with a static shape: folding changes no other type
        first = True
        while True:
            if first:
                self._first_infer()
                first = False
            elif not known and not self._infer_untyped():
                self.infer()
            if self.fold_once():
                known = self._all_typed()
                continue
            known = False
            if self.rewrite_control() or self.take_values(feeds) or self.annotate():
                continue
            return

    def _inline_known_ifs(self, feeds: Mapping[str, Any] | None) -> None:
        """Before the first inference: each If whose condition follows from constants alone (and, in a compile for
        a run's feeds, from the value inputs those give) inlined, its other branch dropped. Inference would first
        type both branches, and again after each fold until the condition is known: silero VAD's whole model is
        two Ifs on its sample rate, ~45 of a probe's ~120 ms of reading (the graph the loop settles is the same:
        what the loop would fold and inline later, here folded and inlined first)."""
        if feeds is not None and any(n.op_type == "If" for n in self.nodes):
            self._take_conditions(feeds)
        while any(n.op_type == "If" for n in self.nodes):
            folded, inlined = self._fold_constant_chains(), False
            kept: list[onnx.NodeProto] = []
            for node in self.nodes:
                if node.op_type == "If" and node.input[0] in self.consts:
                    nodes, inits = control.inline_if(node, self.consts[node.input[0]], self.scope.fresh)
                    kept += nodes
                    self.consts.update(inits)
                    inlined = True
                else:
                    kept.append(node)
            self.nodes = kept
            if not (folded or inlined):
                return

    def _take_conditions(self, feeds: Mapping[str, Any]) -> None:
        """The value inputs this level's If conditions are computed from (followed back through this level's nodes,
        not into bodies: `take_values` at the end of the loop takes the others), baked in from the feeds."""
        producer = {o: n for n in self.nodes for o in n.output if o}
        stack = [n.input[0] for n in self.nodes if n.op_type == "If" and n.input and n.input[0]]
        seen: set[str] = set()
        while stack:
            name = stack.pop()
            if name in seen or name in self.consts:
                continue
            seen.add(name)
            if name in producer:
                stack += [i for i in producer[name].input if i]
            elif name in self.inputs and name in feeds and values.small_value(*self.inputs[name]) and \
                    self.inputs[name][0].kind != "f":  # (a float input deciding a branch is data, as in take_values)
                dt, shape = self.inputs[name]
                self.consts[name] = self.value_inputs[name] = values.as_value(name, feeds[name], dt, shape)

    def _fold_constant_chains(self) -> bool:
        """Before the first inference: the nodes that compute from constants alone (Constant nodes, a weight's Cast
        or Transpose, ...) folded, so that inference does not type them (paddle2onnx writes a Constant node per
        attribute-like value: PP-OCR's recognizer's first inference 860 -> 425 nodes, ~40 -> ~5 ms). Within a range
        compile (ir/memo.py) each result is made once for every probe, the same array: what `_first_infer`'s memo
        compares by identity stays the same between probes."""
        changed = False
        while True:
            kept: list[onnx.NodeProto] = []
            for node in self.nodes:
                if self._unfoldable(node) or not all(not n or n in self.consts for n in node.input):
                    kept.append(node)
                    continue
                ins = [self.consts[n] if n else None for n in node.input]

                def folded(node: onnx.NodeProto = node, ins: list[Any] = ins) -> tuple[list[Any], Any]:
                    out = self._evaluate(node)  # (the inputs held with it: their ids are not reused meanwhile)
                    return ins, None if out is None else [np.asarray(v) for v in out]
                out = memo("constant_chain", node, tuple(map(id, ins)), folded)[1]
                if out is None:
                    kept.append(node)
                    continue
                for name, v in zip(node.output, out, strict=False):
                    if name:
                        self.consts[name] = v
                        self.chains.add(name)
            if len(kept) == len(self.nodes):
                return changed
            self.nodes, changed = kept, True

    def _first_infer(self) -> None:
        """The inference before anything is folded: within a range compile (ir/memo.py), made once per graph, input
        types, constants and decided types, whatever values a round keeps unfolded (a probe's frontend read again
        after the first read found values that follow the dims: the decoder's two, ~3.5 ms each)."""
        key = (tuple((n, str(t[0]), t[1]) for n, t in self.inputs.items()),
               tuple((n, a.dtype.str, a.shape, a.tobytes() if a.size <= _DATA_PROP_MAX else id(a))
                     for n, a in self.consts.items()),
               tuple((n, str(t[0]), t[1]) for n, t in self.fixed.items()))

        def inferred() -> tuple[dict[str, Type], list[str]]:
            taken = self.scope.fresh.taken
            before = set(taken)
            self.infer()
            return dict(self.types), [n for n in taken if n not in before]
        types, names = memo("first_inference", self.graph, key, inferred)
        self.types = dict(types)
        self.scope.fresh.taken.update(names)  # the fresh names it made (a pool's decided shape): taken again

    def _untyped(self, node: onnx.NodeProto) -> bool:
        """Whether an output of the node has no type with a static shape yet (none inferred, none decided)."""
        return any(o and (o not in self.fixed and self.types.get(o, (None, None))[1] is None or o in self.bounded)
                   for o in node.output)

    def _all_typed(self) -> bool:
        """Whether every output of the nodes left has a type with a static shape (then inference, run again after
        a fold, would find the same: a range compile's probes skip one of their two inferences)."""
        return not any(self._untyped(node) for node in self.nodes)

    def _infer_untyped(self) -> bool:
        """After a fold, the inference of the nodes still untyped and of the nodes they read from (the others'
        types stand: folding gave constants, which type no other node differently), where those are at most half
        the graph, without control flow or a pool typed by a decided shape, and read only constants or values of a
        static type. The nodes read from are followed back through untyped values and small int64 or int32 ones
        (shapes, whose values inference propagates), not through the rest: a typed activation is an input of a
        static type (values of other types propagate nothing to a shape; PP-OCR's recognizer: a read 40 -> 28 ms).
        False: a whole inference is needed. (A range compile's probe: ~3.5 of its ~12 ms a read.)"""
        untyped = [n for n in self.nodes if self._untyped(n)]
        producer = {o: n for n in self.nodes for o in n.output if o}

        def followed(name: str) -> bool:  # a value whose producer inference needs as well
            dt, shape = self.fixed.get(name) or self.types.get(name, (None, None))
            return dt is None or shape is None or name in self.bounded or \
                dt in (np.int64, np.int32) and math.prod(shape) <= _DATA_PROP_MAX
        seen: dict[int, onnx.NodeProto] = {}
        stack = list(untyped)
        while stack:
            n = stack.pop()
            if id(n) not in seen:
                seen[id(n)] = n
                stack += [producer[i] for i in n.input if i in producer and followed(i)]
        if not untyped or 2 * len(seen) > len(self.nodes) or any(
                n.op_type in control.CONTROL_OPS or op_key(n) in DECIDED or any(a.type in (
                    onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in n.attribute)
                for n in seen.values()):
            return False
        sub = [n for n in self.nodes if id(n) in seen]
        made = {o for n in sub for o in n.output if o}
        inputs, inits = [], []
        for name in dict.fromkeys(i for n in sub for i in n.input if i and i not in made):
            arr = self.consts.get(name)
            if arr is not None and arr.size <= _DATA_PROP_MAX:
                inits.append(self._proto(name, arr))
                continue
            dt, shape = (arr.dtype, arr.shape) if arr is not None else \
                self.fixed.get(name) or self.types.get(name, (None, None))
            if dt is None or shape is None or name in self.bounded:
                return False
            inputs.append(helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(dt), shape))
        outputs = [helper.make_tensor_value_info(o, onnx.TensorProto.UNDEFINED, None)
                   for n in untyped for o in n.output if o]
        known = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(dt), shape)
                 for n, (dt, shape) in self.fixed.items() if n in made]
        model = self.scope.make_model(helper.make_graph(self._inferable(sub), "untyped", inputs, outputs,
                                                        initializer=inits, value_info=known))
        try:
            inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
        except Exception:
            return False  # (the whole inference says what is wrong)
        self._read_types(inferred.graph)
        return True

    def _inferable(self, nodes: list[onnx.NodeProto]) -> list[onnx.NodeProto]:
        """The nodes as onnx types them: ops it cannot type as copies of their inputs, or by stand-ins."""
        out: list[onnx.NodeProto] = []
        for n in nodes:
            stand_in = extensions.stand_in(n, self.scope.opset)
            if stand_in is not None:
                out += stand_in
                continue
            pairs = INFER_AS_IDENTITY.get(n.op_type)
            out += [helper.make_node("Identity", [n.input[j]], [n.output[k]]) for k, j in pairs.items()
                    if k < len(n.output) and n.output[k]] if pairs else [n]
        return out

    def _proto(self, name: str, arr: np.ndarray) -> onnx.TensorProto:
        """A small constant as an initializer of the graphs given to inference (made once per array)."""
        got = self._protos.get(name)
        if got is None or got[0] is not arr:
            got = self._protos[name] = (arr, numpy_helper.from_array(arr, name))
        return got[1]

    def skeleton(self) -> onnx.ModelProto:
        """A weight-free copy of the current graph for shape inference."""
        inputs = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(t[0]), t[1])
                  for n, t in self.inputs.items() if n not in self.consts]
        inits = []
        used = set(self.outputs)  # (the constants no node reads any more, folded away, are left out)
        for n in self.nodes:
            used.update(n.input)
            for sub in control.subgraphs(n):
                used.update(control.free_vars(sub))
        for name, arr in self.consts.items():
            if name not in used:
                continue
            if arr.size <= _DATA_PROP_MAX:
                inits.append(self._proto(name, arr))
            else:
                inputs.append(helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(arr.dtype),
                                                            arr.shape))
        outputs = [helper.make_tensor_value_info(o, onnx.TensorProto.UNDEFINED, None) for o in self.outputs]
        known = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(dt), shape)
                 for n, (dt, shape) in self.fixed.items() if n not in self.outputs]
        nodes = []
        for n in self.nodes:  # ops onnx cannot type: typed as copies of their inputs, or by stand-ins
            if op_key(n) in DECIDED and n.output[0] in self.fixed:  # typed by the shape decided for it
                for o in filter(None, n.output):
                    shape = self.scope.fresh(f"{o}/shape")
                    inits.append(numpy_helper.from_array(np.array(self.fixed[o][1], np.int64), shape))
                    value = helper.make_tensor("v", helper.np_dtype_to_tensor_dtype(self.fixed[o][0]), [1], [0])
                    nodes.append(helper.make_node("ConstantOfShape", [shape], [o], value=value))
                continue
            nodes += self._inferable([n])
        return self.scope.make_model(helper.make_graph(nodes, "skeleton", inputs, outputs, initializer=inits,
                                                       value_info=known))

    def infer(self) -> None:
        try:
            inferred = onnx.shape_inference.infer_shapes(self.skeleton(), data_prop=True)
        except Exception as e:
            raise ShapeError(f"shape inference failed{self._in()}: {e}") from e
        self._read_types(inferred.graph)

    def _read_types(self, g: onnx.GraphProto) -> None:
        """The types inference found (an inferred graph's value_info and outputs) into `types`."""
        dtypes_of: dict[int, np.dtype] = {}  # (this loop reads every value of the model, at every probe)
        for vi in [*g.value_info, *g.output]:
            if not vi.type.HasField("tensor_type"):
                continue
            tt = vi.type.tensor_type
            et = tt.elem_type
            if not et:
                continue
            shape = None
            if tt.HasField("shape"):
                dims = tt.shape.dim
                if all(d.HasField("dim_value") for d in dims):
                    shape = tuple([d.dim_value for d in dims])
            dt = dtypes_of.get(et)
            if dt is None:
                dt = dtypes_of[et] = np_dtype(et, f"value {vi.name!r}")
            if shape is not None and min(shape, default=0) < 0:  # onnx infers e.g. a window past its input
                node = next((n for n in self.nodes if vi.name in n.output), None)
                by = "" if node is None else f" made by node {node.name!r} ({node.op_type})" if node.name else \
                    f" made by a {node.op_type} node"
                raise ShapeError(f"value {vi.name!r}{by} would have the negative shape {list(shape)}{self._in()} "
                                 "(a kernel larger than its padded input?)")
            if shape is not None and math.prod(shape) * dt.itemsize > MAX_TENSOR_BYTES:
                check_size(f"value {vi.name!r} at these input shapes", dt, shape)
            self.types[vi.name] = (dt, shape)
        self.types.update(self.fixed)

    def _in(self) -> str:
        return f" in {self.label}" if self.label else ""

    def dtype_of(self, name: str) -> np.dtype | None:
        return self.consts[name].dtype if name in self.consts else self.types.get(name, (None, None))[0]

    def shape_of(self, name: str) -> tuple[int, ...] | None:
        if name in self.consts:
            return tuple(self.consts[name].shape)
        if name in self.bounded:
            return None  # known only at run time
        t = self.types.get(name)
        return t[1] if t else None

    def _unfoldable(self, node: onnx.NodeProto) -> bool:
        """Control flow (rewritten or run, not folded), and a value kept unfolded (`keep`)."""
        return node.op_type in control.CONTROL_OPS or bool(self.keep) and not self.keep.isdisjoint(node.output)

    def fold_once(self) -> bool:
        kept, folded = [], False
        for node in self.nodes:
            out = None if self._unfoldable(node) else self._evaluate(node)
            if out is None:
                kept.append(node)
                continue
            for name, v in zip(node.output, out, strict=False):
                if name:
                    self.consts[name] = np.asarray(v)
            folded = True
        self.nodes = kept
        return folded

    def _evaluate(self, node: onnx.NodeProto) -> list[np.ndarray] | None:
        op = node.op_type
        if node.domain not in ("", "ai.onnx") or op in extensions.STAND_INS:
            return None  # onnx.reference cannot run it
        attrs = {a.name: a for a in node.attribute}
        if op == "Constant":
            (a,) = node.attribute
            v = helper.get_attribute_value(a)
            return [numpy_helper.to_array(v) if isinstance(v, onnx.TensorProto) else np.asarray(v)]
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
        if op == "DequantizeLinear" and contrib.widens(node, self.consts):
            return None  # quantized weights stay integers: dequantized as the model runs
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
        ins = [self.consts[n] if n else None for n in node.input]
        try:
            got = fold(op, {k: helper.get_attribute_value(a) for k, a in attrs.items()}, ins, self.scope.opset)
        except FoldError as e:
            raise ModelError(f"constant folding failed at node {node.name!r} ({op}){self._in()}: {e}") from e
        if got is not None:
            return got
        feeds = {n: self.consts[n] for n in node.input if n}
        # A one-node model: the evaluator then picks the op version of the model's opset.
        graph = helper.make_graph(
            [node], "fold",
            [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
             for n, v in feeds.items()],
            [helper.make_tensor_value_info(o, onnx.TensorProto.UNDEFINED, None) for o in node.output if o])
        # onnx.reference implements QuantizeLinear / DequantizeLinear from opset 19 only: the 10 and 13 forms
        # compute the same (19 added float8 types), so they fold as 19.
        min_opset = 19 if op in ("QuantizeLinear", "DequantizeLinear") else 0
        try:
            return list(ReferenceEvaluator(self.scope.make_model(graph, min_opset)).run(None, feeds))
        except Exception as e:
            raise ModelError(f"constant folding failed at node {node.name!r} ({op}){self._in()}: {e}") from e

    def rewrite_control(self) -> bool:
        """Inline Ifs whose condition is known, turn Scans into Loops, unroll small Loops of known length."""
        kept, changed = [], False
        fresh, opset = self.scope.fresh, self.scope.opset
        for node in self.nodes:
            new = None
            if node.op_type == "If" and node.input[0] in self.consts:
                new = control.inline_if(node, self.consts[node.input[0]], fresh)
            elif node.op_type == "Scan":
                new = control.scan_to_loop(node, self.shape_of, fresh, opset, self.consts)
            elif node.op_type == "Loop":
                trips = self._unrollable(node)
                new = None if trips is None else control.unroll_loop(node, trips, fresh, opset)
            if new is None:
                kept.append(node)
                continue
            kept += new[0]
            self.consts.update(new[1])
            changed = True
        self.nodes = kept
        return changed

    def _unrollable(self, node: onnx.NodeProto) -> int | None:
        m, cond = node.input[0], node.input[1]
        if not m or m not in self.consts or (cond and cond not in self.consts):
            return None
        if cond and not bool(self.consts[cond].reshape(-1)[0]):
            return None
        trips, body = int(self.consts[m].reshape(-1)[0]), control.attr(node, "body")
        if trips < 1 or trips * (len(body.node) + 2) > control.UNROLL_MAX_NODES:
            return None
        return trips if control.always_true(body, self.consts) else None

    def take_values(self, feeds: Mapping[str, Any] | None) -> bool:
        """Bake in the graph inputs that decide shapes or branches, from the feeds; name the ones missing.

        Without feeds (None), an input deciding only a branch or a trip count may stay one: control flow
        decides at run time. With feeds (a session compiling for a run), every value input is baked in."""
        # (the same nodes at every probe of a range compile, once settled: traced once, ir/memo.py; the list kept
        # with what it gave, so that no id in the key is reused)
        nodes = list(self.nodes)
        _, (shape, branch), direct = memo("traced", self.graph, tuple(map(id, nodes)), lambda: (
            nodes, values.trace(nodes), values.read_at_shape_positions(nodes)))
        free = [n for n in self.inputs if n not in self.consts and values.small_value(*self.inputs[n])]
        ints = {n for n in free if self.inputs[n][0].kind != "f"}
        # a float as a shape parameter only (Resize's scales, a Range limit): float tensors are data
        params = {n for n in free if n in direct or int(np.prod(self.inputs[n][1], dtype=np.int64)) == 1}
        wanted = {n: shape[n] for n in free if n in shape and (n in ints or n in params)}
        wanted.update({n: branch[n] for n in ints if n in branch and n not in wanted})
        taken = [n for n in wanted if feeds and n in feeds]
        for n in taken:
            dt, s = self.inputs[n]
            self.consts[n] = self.value_inputs[n] = values.as_value(n, feeds[n], dt, s)
        missing = {n: why for n, why in wanted.items() if (n in shape or feeds is not None) and n not in taken}
        if missing and not taken and not self.label:
            raise ValueInputError(
                "; ".join(f"input {n!r} {'is needed at compile time' if n in shape else 'decides a branch'} ({why}): "
                          "give its value "
                          f"(--value {n}=... to compile, or in run --inputs)" for n, why in missing.items()),
                list(missing))
        return bool(taken)

    def annotate(self) -> bool:
        """Decide what inference cannot: upper bounds of data-dependent outputs, the bodies of If and Loop
        nodes whose inputs have static shapes (and with them the nodes' output types)."""
        from ctxrt.frontend.build import lower_control

        changed = False
        for node in self.nodes:
            key = node.output[0]
            if key in self.bodies or any(o in self.made_bounded for o in node.output):
                continue
            if contrib.accepted(node):
                changed |= self._type_contrib(node)
            elif node.op_type in ("If", "Loop"):
                changed |= lower_control(self, node)
            elif op_key(node) == "ConvTranspose" and key not in self.fixed:
                shape = conv_transpose_shape(node, self.shape_of(node.input[0]),
                                             self.shape_of(node.input[1]) if len(node.input) > 1 else None)
                if shape is not None and self.types.get(key, (None, None))[1] != shape:
                    self.fixed[key] = (self.dtype_of(node.input[0]), shape)
                    changed = True
            elif op_key(node) in POOLS and key not in self.fixed:
                shape = self.shape_of(node.input[0])
                pooled = None if shape is None else ceil_pool_shape(node, shape)
                for pos, out in enumerate(node.output if pooled else ()):
                    if out:  # MaxPool's Indices: int64
                        self.fixed[out] = (np.dtype(np.int64) if pos else self.dtype_of(node.input[0]), pooled)
                        changed = True
            elif op_key(node) in values.UPPER_BOUNDS and not any(o in self.fixed for o in node.output if o):
                bound = values.upper_bound(node, self.shape_of, self.consts, self.scope.shared_kv)
                if bound is None:
                    continue
                dt0 = self.dtype_of(node.input[0])
                for pos, (dt, shape) in bound.items():
                    if pos < len(node.output) and node.output[pos]:
                        self.fixed[node.output[pos]] = (dt or dt0, shape)
                for pos, axis in _bounded_axes(node).items():
                    if pos < len(node.output) and node.output[pos]:
                        self.made_bounded[node.output[pos]] = axis
                changed = True
        self._propagate_bounded()
        return changed

    def _type_contrib(self, node: onnx.NodeProto) -> bool:
        """Output types of a com.microsoft node, which onnx cannot infer (frontend/contrib.py)."""
        if all(o in self.fixed for o in node.output if o):
            return False
        types = contrib.output_types(node, lambda n: (self.dtype_of(n), self.shape_of(n)))
        self.fixed.update({out: t for out, t in zip(node.output, types or [], strict=False) if out})
        return types is not None

    def _propagate_bounded(self) -> None:
        self.bounded = dict(self.made_bounded)
        for node in self.nodes:
            src = node.input[0] if node.input else ""
            if node.op_type in PASS_THROUGH and src in self.bounded:
                attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
                rank = len(self.fixed.get(src, self.types.get(src, (None, ())))[1] or ())
                self.bounded[node.output[0]] = PASS_THROUGH[node.op_type](attrs, self.bounded[src], rank)


def _bounded_axes(node: onnx.NodeProto) -> dict[int, int]:
    from ctxrt.ir.dynamic import BOUNDED
    from ctxrt.ir.graph import Node

    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute if a.type != onnx.AttributeProto.GRAPH}
    return BOUNDED[op_key(node)](Node(op_key(node), node.name, list(node.input), list(node.output), attrs))


SMALL_MAX = 64  # constants of at most this many elements a range compile's probe keeps as they are
FINGERPRINT_MAX = 1 << 20  # folded values of more elements are not fingerprinted (weights, not masks)


def fingerprints(consts: Mapping[str, np.ndarray], skip: set[str]) -> dict[str, tuple[Any, ...]]:
    """(shape, dtype, digest) of each folded value not in `skip` (initializers, inputs) and of at most
    FINGERPRINT_MAX elements: what a range compile compares between probes (compiler/ranges.py)."""
    out = {}
    for name, a in consts.items():
        if name in skip or a.size > FINGERPRINT_MAX:
            continue
        a = np.ascontiguousarray(a)
        out[name] = (a.shape, a.dtype.str, hashlib.blake2b(a.view(np.uint8).reshape(-1) if a.dtype.kind != "O"
                                                           else repr(a.tolist()).encode(), digest_size=16).digest())
    return out


def to_ir(model: str | os.PathLike | bytes | onnx.ModelProto, supported: set[str],
          shapes: Shapes | None = None, name: str = "main", values: Mapping[str, Any] | None = None,
          feeds: Mapping[str, Any] | None = None, keep: frozenset[str] = frozenset(),
          shared_kv: frozenset[str] = frozenset(), fingerprint: bool = False) -> Graph:
    """Load an ONNX model as an IR graph with static shapes, constants folded (except the values in `keep`:
    a range program's values that depend on a dynamic dim).

    `shapes` binds dynamic input dimensions (an unbound one is bound to 1, with a CtxrtWarning); `values`
    bakes in input values (value inputs, docs/shapes-and-control-flow.md); value inputs missing from `values` are
    taken from `feeds` when given (a session compiling for a run's inputs: then every value input must be there).
    `shared_kv`: past inputs of GroupQueryAttention that will be bound to the same buffer as their present outputs
    (a KV cache of the context's length written in place): those presents take the past's shape. `fingerprint`:
    the graph's `folded` says what was folded (a range compile's probe, compiler/ranges.py)."""
    from ctxrt.frontend.build import bind_inputs, build_graph

    loaded = load_model(model)
    proto = memo("sorted", loaded, None, lambda: sorted_model(loaded))  # once per range compile (ir/memo.py)
    if proto.graph.node and all(n.op_type == "EPContext" for n in proto.graph.node):
        label = os.fspath(model) if isinstance(model, str | os.PathLike) else "this model"
        raise ModelError(f"{label} is an EPContext model (already compiled): run or inspect it, not compile")

    def checked() -> bool:
        # SimplifiedLayerNormalization where it runs
        check_model(proto, supported & (extensions.STAND_INS.keys() - extensions.ONNX_OPS))
        check_supported(control.all_nodes(proto.graph), supported, FOLD_ONLY | {"Scan"})
        return True
    memo("checked", proto, frozenset(supported), checked)  # the same proto at every probe: checked once
    scope = Scope(proto)
    scope.supported = set(supported)
    scope.shared_kv = frozenset(shared_kv)
    inputs, baked = bind_inputs(proto, shapes or {}, values or {}, scope.notes)
    st = Folder(scope, proto.graph, inputs, baked)
    st.value_inputs.update(baked)
    st.keep = scope.keep = frozenset(keep)
    st.settle(feeds)
    graph = build_graph(st, name)
    if fingerprint:  # a range compile's probe: what was folded, compared between probes
        # (constant chains are the same at every probe: PP-OCR's recognizer's weights, written as Constant nodes,
        # not hashed at every probe, 12 ms a read)
        consts, same = dict(st.consts), {i.name for i in proto.graph.initializer} | set(st.inputs) | st.chains
        for names, sub, inits in scope.bodies_read:  # bodies' values under their model names (as `keep` has them)
            for n, a in sub.consts.items():
                if n in names:
                    consts.setdefault(names[n], a)  # (a Loop unrolled: its first iteration's)
            same.update(names[n] for n in sub.chains | inits if n in names)
        graph.folded = fingerprints(consts, same)
        # and every small numeric constant as it is (a piecewise op's inputs, checked over the ranges)
        graph.small = {n: a for n, a in consts.items() if a.size <= SMALL_MAX and a.dtype.kind in "biuf"}
    if scope.notes:
        warnings.warn("; ".join(scope.notes), CtxrtWarning, stacklevel=2)
    return graph
