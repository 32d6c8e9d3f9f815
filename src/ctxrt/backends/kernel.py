"""What a backend's kernel factories see and return: shared by every backend."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class TensorSpec:
    shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


@dataclass
class NodeSpec:
    """One node as a kernel factory sees it: static shapes and dtypes, attributes, known constants.

    `inputs[i]` is None for a missing optional input. `consts[i]` is the input's value when it is a
    compile-time constant (weights), else None. Attributes are plain Python values (ints, floats,
    strings, lists); the frontend has already moved constant "parameter" inputs into attributes
    (e.g. Slice starts/ends/axes/steps, Squeeze/Unsqueeze/ReduceMean axes, Split sizes).
    """

    op: str
    name: str
    attrs: dict[str, Any]
    inputs: list[TensorSpec | None]
    outputs: list[TensorSpec]
    consts: list[np.ndarray | None] = field(default_factory=list)
    opset: int = 17

    def attr(self, key: str, default: Any = None) -> Any:
        return self.attrs.get(key, default)


Launch = Callable[[], None]


class Kernel:
    """A kernel chosen for one node at fixed shapes.

    `scratch` lists the byte sizes of the scratch buffers it needs while it runs; the planner places
    them in the arena. `bind` receives the backend's tensors (inputs, outputs, scratch as uint8 tensors)
    and returns a zero-argument launch that computes outputs from inputs without allocating memory.
    `programs` names the device programs the launch needs (keys of the backend's ProgramStore): they are
    built or loaded once, before any kernel is bound, and stored in context binaries.
    """

    scratch: tuple[int, ...] = ()
    algorithm: str = "default"
    programs: tuple[Any, ...] = ()

    def bind(self, ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        raise NotImplementedError


KernelFactory = Callable[[NodeSpec], Kernel]


class FnKernel(Kernel):
    """A kernel whose launch is `fn(ins, outs, scratch)` with no per-shape state."""

    def __init__(self, fn: Callable[[list[Any], list[Any], list[Any]], None],
                 scratch: tuple[int, ...] = (), algorithm: str = "default") -> None:
        self.fn = fn
        self.scratch = scratch
        self.algorithm = algorithm

    def bind(self, ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        fn = self.fn
        return lambda: fn(ins, outs, scratch)


def scratch_view(buf: np.ndarray, shape: tuple[int, ...], dtype: np.dtype | type) -> np.ndarray:
    """A typed view of the first bytes of a uint8 scratch buffer."""
    dt = np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
    return buf[:n].view(dt).reshape(shape)
