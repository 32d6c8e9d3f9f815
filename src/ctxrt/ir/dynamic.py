"""Data-dependent output sizes: tensors planned at an upper bound along one axis.

An op whose output size depends on its input values (NonZero, Compress, Unique, NonMaxSuppression, a Loop
that stops on a computed condition, GroupQueryAttention's present key and value) gets one extra int64 scalar
output in the IR: the real size along the bounded axis, written by its kernel at run time. The real data fills
the leading part of that axis. Such a tensor may pass through the ops of PASS_THROUGH (which only move the axis)
and then be a graph output, whose real shape the runtime returns; any other reader would need its shape at
compile time and is refused.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ctxrt.ir.graph import Node


def _compress(node: Node) -> dict[int, int]:
    return {0: node.attrs.get("axis", 0)}  # no axis: the output is 1-D


def _unique(node: Node) -> dict[int, int]:
    return {0: node.attrs.get("axis", 0), 1: 0, 3: 0}  # Y, indices, counts; inverse_indices is static


def _loop(node: Node) -> dict[int, int]:
    if not node.attrs.get("bounded"):
        return {}
    n_state = len(node.inputs) - 2 - len(node.attrs.get("captures", []))
    return {k: 0 for k in range(n_state, len(node.outputs) - 1)}


# op -> {output position: bounded axis}; the extent is the node's last output.
BOUNDED: dict[str, Callable[[Node], dict[int, int]]] = {
    "NonZero": lambda node: {0: 1},
    "Compress": _compress,
    "Unique": _unique,
    "NonMaxSuppression": lambda node: {0: 0},
    "Loop": _loop,
    # present key and value: max(total_sequence_length, past) of past + new rows (frontend/extensions.py)
    "com.microsoft.GroupQueryAttention": lambda node: {1: 2, 2: 2},
}

# op -> where the bounded axis of input 0 (of this rank) goes in output 0.
PASS_THROUGH: dict[str, Callable[[dict[str, Any], int, int], int]] = {
    "Identity": lambda attrs, axis, rank: axis,
    "Cast": lambda attrs, axis, rank: axis,
    "Transpose": lambda attrs, axis, rank: list(attrs.get("perm") or range(rank - 1, -1, -1)).index(axis),
}


def bounded_outputs(node: Node) -> dict[int, int]:
    """{output position: axis} of the node's outputs whose size is an upper bound (empty for most ops)."""
    rule = BOUNDED.get(node.op)
    return rule(node) if rule else {}
