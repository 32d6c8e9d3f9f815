"""Value inputs and data-dependent sizes, at the ONNX level (docs/shapes-and-control-flow.md).

A small integer or boolean graph input (as TensorRT's shape tensors) whose value reaches a position that decides
a shape (Reshape's shape, Slice's starts, ...: the tables of ir/canonical.py) or a branch or a trip count (If's
condition, Loop's M and cond) is a *value input*: the compile specializes on its value. A float input is one where
it decides a shape as a parameter: read at the position itself (Resize's scales), or a scalar (Range's limits,
also through arithmetic); a shape computed from a float tensor is data-dependent. Inputs that decide no shape
(Clip's bounds, Pad's constant value: RUNTIME_PARAMS) are read by their kernels at run time. A shape that comes
from other data is an error; a branch from other data is decided at run time. `trace` follows values backwards
from those positions, through every op but Shape and Size (which read only a shape), and into subgraphs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np
import onnx

from ctxrt.errors import ShapeError
from ctxrt.frontend import extensions
from ctxrt.frontend.checks import op_key
from ctxrt.frontend.control import attr, free_vars, subgraphs
from ctxrt.ir.canonical import BRANCH_INPUTS, PARAM_INPUTS, RUNTIME_PARAMS, SHAPE_INPUTS

# Value inputs are integer or boolean tensors of at most this many elements.
BRANCH_VALUE_MAX = 64
_SHAPE_ONLY = {"Shape", "Size"}


def positions(node: onnx.NodeProto) -> tuple[dict[int, str], set[int]]:
    """The node's inputs that decide a shape ({position: what}) and those that decide a branch (read only: the
    same objects for every node of an op but Loop)."""
    op = node.op_type
    if op != "Loop":
        hit = _POSITIONS.get(op)
        if hit is None:
            hit = _POSITIONS[op] = _positions(node)
        return hit
    return _positions(node)


_POSITIONS: dict[str, tuple[dict[int, str], set[int]]] = {}


def _positions(node: onnx.NodeProto) -> tuple[dict[int, str], set[int]]:
    op = node.op_type
    runtime = RUNTIME_PARAMS.get(op, set())
    required = {pos: f"input {key!r}" for pos, key in PARAM_INPUTS.get(op, {}).items() if pos not in runtime}
    required.update({pos: f"input {pos}" for pos in SHAPE_INPUTS.get(op, ())})
    branch = set(BRANCH_INPUTS.get(op, ()))
    if op == "Loop":
        body = attr(node, "body")
        if len(body.output) - 1 - (len(node.input) - 2) > 0:  # scan outputs: M is their size
            required[0] = "trip count (it sizes the scan outputs)"
            branch.discard(0)
    return required, branch


def _where(node: onnx.NodeProto, what: str) -> str:
    return f"{node.op_type} node {node.name or node.output[0]!r} {what}"


def trace(nodes: Iterable[onnx.NodeProto], inner: bool = False) -> tuple[dict[str, str], dict[str, str]]:
    """(shape, branch): every name whose value reaches a shape (or branch) position, with the first such
    position it reaches, for these nodes and the subgraphs they hold (`inner`: the subgraphs' own values too,
    not only the outer values they read)."""
    shape: dict[str, str] = {}
    branch: dict[str, str] = {}
    for node in reversed(list(nodes)):
        required, br = positions(node)
        for pos, what in required.items():
            if pos < len(node.input) and node.input[pos]:
                shape.setdefault(node.input[pos], _where(node, what))
        for pos in br:
            if pos < len(node.input) and node.input[pos]:
                branch.setdefault(node.input[pos], _where(node, "condition" if pos else "trip count"))
        reads = [n for n in node.input if n]
        for sub in subgraphs(node):
            free = free_vars(sub)
            reads += free
            inner_shape, inner_branch = trace(sub.node, inner)
            for name in (*free, *((inner_shape.keys() | inner_branch.keys()) - set(free) if inner else ())):
                if name in inner_shape:
                    shape.setdefault(name, inner_shape[name])
                if name in inner_branch:
                    branch.setdefault(name, inner_branch[name])
        if node.op_type in _SHAPE_ONLY:
            continue
        for table in (shape, branch):
            why = next((table[o] for o in node.output if o in table), None)
            if why is not None:
                for name in reads:
                    table.setdefault(name, why)
    return shape, branch


def read_at_shape_positions(nodes: Iterable[onnx.NodeProto]) -> set[str]:
    """The names these nodes read at a shape-deciding position itself (not through other ops)."""
    return {node.input[pos] for node in nodes for pos in positions(node)[0]
            if pos < len(node.input) and node.input[pos]}


def small_value(dtype: np.dtype, shape: tuple[int, ...]) -> bool:
    """Whether an input of this type can be a value input: a few numbers (floats too: Resize's scales)."""
    return np.dtype(dtype).kind in "biuf" and int(np.prod(shape, dtype=np.int64)) <= BRANCH_VALUE_MAX


def as_value(name: str, value: Any, dtype: np.dtype, shape: tuple[int, ...] | None) -> np.ndarray:
    """A value given for input `name` as an array of its dtype and shape (None: its rank-0/1 shape is the
    value's own); it must convert exactly to an integer or boolean type, to the nearest for a float type (a
    decimal 0.6 is float32's 0.6)."""
    raw = np.asarray(value)
    if raw.dtype.kind not in "biuf":
        raise ShapeError(f"value for input {name!r} must be numbers or booleans, got {raw.dtype}")
    with np.errstate(all="ignore"):
        arr = raw.astype(dtype)
        exact = np.dtype(dtype).kind == "f" or np.array_equal(arr.astype(raw.dtype), raw)
    if not exact:
        raise ShapeError(f"value for input {name!r}: {raw.reshape(-1).tolist()[:8]} does not convert exactly to "
                         f"its type {np.dtype(dtype)}")
    if shape is None:
        return arr.reshape(-1)
    if arr.size != int(np.prod(shape, dtype=np.int64)):
        raise ShapeError(f"value for input {name!r} has {arr.size} elements; its shape {list(shape)} holds "
                         f"{int(np.prod(shape, dtype=np.int64))}")
    return np.require(arr.reshape(shape), requirements="C")  # (ascontiguousarray makes 0-d arrays 1-d)


# -- upper bounds of data-dependent outputs -----------------------------------------------------------

Bound = dict[int, tuple[np.dtype, tuple[int, ...]]]  # output position -> (dtype, upper-bound shape)
_I64 = np.dtype(np.int64)


def _nonzero(node: onnx.NodeProto, shape: Callable[[str], Any], const: Mapping[str, np.ndarray]) -> Bound | None:
    s = shape(node.input[0])
    return None if s is None else {0: (_I64, (len(s), int(np.prod(s, dtype=np.int64))))}


def _compress(node: onnx.NodeProto, shape: Callable[[str], Any], const: Mapping[str, np.ndarray]) -> Bound | None:
    s, c = shape(node.input[0]), shape(node.input[1])
    if s is None or c is None:
        return None
    axis = attr(node, "axis")
    if axis is None:
        return {0: (None, (min(c[0], int(np.prod(s, dtype=np.int64))),))}
    a = int(axis) % len(s)
    return {0: (None, (*s[:a], min(c[0], s[a]), *s[a + 1:]))}


def _unique(node: onnx.NodeProto, shape: Callable[[str], Any], const: Mapping[str, np.ndarray]) -> Bound | None:
    s = shape(node.input[0])
    if s is None:
        return None
    axis = attr(node, "axis")
    n = int(np.prod(s, dtype=np.int64)) if axis is None else s[int(axis) % len(s)]
    y = (n,) if axis is None else s
    return {0: (None, y), 1: (_I64, (n,)), 2: (_I64, (n,)), 3: (_I64, (n,))}


def _nms(node: onnx.NodeProto, shape: Callable[[str], Any], const: Mapping[str, np.ndarray]) -> Bound | None:
    boxes, scores = shape(node.input[0]), shape(node.input[1])
    if boxes is None or scores is None:
        return None
    limit = node.input[2] if len(node.input) > 2 else ""
    if limit and limit not in const:
        return None
    per_class = int(const[limit].reshape(-1)[0]) if limit else 0
    batch, classes, n = scores
    return {0: (_I64, (batch * classes * max(0, min(n, per_class)), 3))}


# op (frontend.checks.op_key) -> upper bounds of its outputs once its inputs' shapes (and size-deciding constants)
# are known; the dtype None means "that of input 0".
UPPER_BOUNDS: dict[str, Callable[[onnx.NodeProto, Callable[[str], Any], Mapping[str, np.ndarray]], Bound | None]] = {
    "NonZero": _nonzero, "Compress": _compress, "Unique": _unique, "NonMaxSuppression": _nms,
    extensions.GQA: extensions.gqa_bounds,
}


def upper_bound(node: onnx.NodeProto, shape: Callable[[str], Any], const: Mapping[str, np.ndarray],
                shared_kv: frozenset[str] = frozenset()) -> Bound | None:
    """UPPER_BOUNDS' rule for the node; GroupQueryAttention's also told which past inputs share their buffer with
    the present outputs (frontend.onnx.to_ir's `shared_kv`)."""
    key = op_key(node)
    if key == extensions.GQA:
        return extensions.gqa_bounds(node, shape, const, shared_kv)
    return UPPER_BOUNDS[key](node, shape, const)
