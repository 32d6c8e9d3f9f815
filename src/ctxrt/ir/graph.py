"""The intermediate representation: values with static shapes, nodes, graphs. No onnx import."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class Value:
    name: str
    dtype: np.dtype
    shape: tuple[int, ...]
    const: np.ndarray | None = None

    @property
    def nbytes(self) -> int:
        return math.prod(map(int, self.shape)) * np.dtype(self.dtype).itemsize  # (Python ints: no overflow)

    @property
    def is_const(self) -> bool:
        return self.const is not None


@dataclass
class Node:
    op: str
    name: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict[str, Any] = field(default_factory=dict)
    domain: str = ""


@dataclass
class Graph:
    """A topologically ordered list of nodes over named values. Missing optional inputs are ''."""

    name: str
    nodes: list[Node]
    values: dict[str, Value]
    inputs: list[str]
    outputs: list[str]
    opset: int = 17
    value_inputs: dict[str, np.ndarray] = field(default_factory=dict)  # inputs compiled for one value (§9b)
    # what the frontend folded into constants, by value: (shape, dtype, digest of the contents) — a range compile
    # compares two probes' to find every value that follows the dims at once (compiler/ranges.py)
    folded: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    small: dict[str, np.ndarray] = field(default_factory=dict)  # and its small numeric constants as they are

    def consumers(self) -> dict[str, list[Node]]:
        uses: dict[str, list[Node]] = {name: [] for name in self.values}
        for node in self.nodes:
            for name in node.inputs:
                if name:
                    uses[name].append(node)
        return uses

    def producers(self) -> dict[str, Node]:
        return {out: node for node in self.nodes for out in node.outputs if out}

    def const(self, name: str) -> np.ndarray | None:
        return self.values[name].const if name else None

    def prune_values(self) -> None:
        """Drop values no node, input or output refers to (e.g. folded constants)."""
        used = set(self.inputs) | set(self.outputs)
        for node in self.nodes:
            used.update(node.inputs)
            used.update(node.outputs)
        used.discard("")
        self.values = {k: v for k, v in self.values.items() if k in used}
