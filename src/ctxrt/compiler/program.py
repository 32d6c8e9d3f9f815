"""A compiled graph as plain data: steps with tensors bound to places (arena offsets, IO, constants).

Everything here is serializable (strings, ints, lists, dicts); the runtime turns it into kernel
launches once, at load time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from ctxrt.planner.arena import Allocation as Interval  # one arena allocation over time

# Where a tensor lives: the arena (spill-fill buffer), a graph input or output buffer, or the weights.
ARENA, INPUT, OUTPUT, CONST = "arena", "input", "output", "const"


@dataclass(frozen=True)
class Ref:
    space: str
    key: str  # IO / constant name; the root tensor's name for the arena (for diagnostics)
    offset: int  # bytes, within the arena or the IO buffer (aliases of IO buffers start at 0)
    shape: tuple[int, ...]
    dtype: str

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * np.dtype(self.dtype).itemsize


@dataclass
class Step:
    op: str
    name: str
    attrs: dict[str, Any]
    inputs: list[Ref | None]
    outputs: list[Ref]
    scratch: list[Ref]
    algorithm: str = "default"
    backend: str = ""  # the backend that runs it: the context's, or its fallback (a CPU partition)
    params: dict[str, Any] = field(default_factory=dict)  # tuned kernel parameters (tuning mode); {}: defaults


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]
    dtype: str
    mem_type: str = "raw"

    @cached_property
    def nbytes(self) -> int:
        return math.prod(self.shape) * np.dtype(self.dtype).itemsize

    def with_shape(self, shape: tuple[int, ...]) -> TensorInfo:
        """This tensor at another shape (a range program's IO at new dims): made without the frozen dataclass's
        per-field checks, ~0.3 us instead of ~1.2 (a decoder's token makes one per IO tensor)."""
        t = object.__new__(TensorInfo)
        t.__dict__.update(name=self.name, shape=shape, dtype=self.dtype, mem_type=self.mem_type)
        return t


@dataclass
class Body:
    """A control-flow step's subgraph (an If branch, a Loop body), compiled: its steps run over its own arena,
    which lies at the start of the step's scratch. Its inputs are the formal ones (Loop: iteration, condition,
    carried values) then the outer values it reads, by name: its refs point into its arena, at its inputs
    and outputs by name, or (const) at the step's captured weights by name (the step's `captures`)."""

    inputs: list[TensorInfo]
    outputs: list[TensorInfo]
    steps: list[Step]
    arena_size: int
    alignment: int


@dataclass
class CompiledGraph:
    name: str
    opset: int
    inputs: list[TensorInfo]
    outputs: list[TensorInfo]
    steps: list[Step]
    spillfill_size: int
    lower_bound: int
    alignment: int
    strategy: str
    intervals: list[Interval] = field(default_factory=list)
    const_names: list[str] = field(default_factory=list)
    # Inputs compiled for one value (docs/shapes-and-control-flow.md): running with another value is an error.
    value_inputs: dict[str, np.ndarray] = field(default_factory=dict)
    # Outputs whose size along one axis is an upper bound: name -> (axis, ref of the int64 real size).
    extents: dict[str, tuple[int, Ref]] = field(default_factory=dict)
    programs: list[Any] = field(default_factory=list)  # device programs its kernels need (not in PROGRAMS)
    tuning: list[dict[str, Any]] = field(default_factory=list)  # tuning mode's record (META, not PROGRAMS)
    # A range program's dims and how its shapes follow them (compiler/ranges.py); None: fixed shapes.
    ranges: Any = None
    # Value inputs it takes as the lengths of inputs, ranged (frontend/carriers.py Record): runs convert them.
    carriers: tuple[Any, ...] = ()

    @property
    def io_bytes(self) -> int:
        return sum(t.nbytes for t in self.inputs + self.outputs)

    def partitions(self) -> list[dict[str, Any]]:
        """Runs of consecutive steps on one backend, in order: `{backend, steps, ops}` (ops: count by type)."""
        out: list[dict[str, Any]] = []
        for s in self.steps:
            if not out or out[-1]["backend"] != s.backend:
                out.append({"backend": s.backend, "steps": 0, "ops": {}})
            out[-1]["steps"] += 1
            out[-1]["ops"][s.op] = out[-1]["ops"].get(s.op, 0) + 1
        return out
