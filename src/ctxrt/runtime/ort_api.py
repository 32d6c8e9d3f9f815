"""The onnxruntime-shaped parts of InferenceSession's API (runtime/session.py): `IOBinding` over the session's
tensors, `NodeArg`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ctxrt.errors import RegistrationError, ShapeError
from ctxrt.runtime.tensor import Tensor

if TYPE_CHECKING:
    from ctxrt.runtime.session import InferenceSession


_ONNX_TYPES = {"float32": "float", "float16": "float16", "float64": "double", "bool": "bool", "int8": "int8",
               "int16": "int16", "int32": "int32", "int64": "int64", "uint8": "uint8", "uint16": "uint16",
               "uint32": "uint32", "uint64": "uint64"}


@dataclass(frozen=True)
class NodeArg:
    """Like onnxruntime's NodeArg: `name`, `shape` (ints; a dimension bound only at run: its symbolic name, or
    None when unnamed; the whole shape None when not even the rank is known before the feeds are), `type`
    ("tensor(float)", ...)."""

    name: str
    shape: list[int | str | None] | None
    type: str


class IOBinding:
    """Like onnxruntime's IOBinding: bind inputs (Tensor: in place; ndarray: copied into a cached tensor at
    run) and outputs (Tensor: written in place; None: a session tensor, read with get_outputs()).

    Unlike onnxruntime, an output bound with None does not get a new tensor every run: the binding's next
    run writes the same session tensor again (pinning), and when the binding is deleted its tensors go back
    to the session's cache. Keep a result with `.numpy()` (a copy) or bind a Tensor of your own."""

    def __init__(self, session: InferenceSession) -> None:
        self.session = session
        self._inputs: dict[str, Tensor | np.ndarray] = {}
        self._outputs: dict[str, Tensor | None] = {}
        self._results: dict[str, Tensor] = {}
        self._lent: list[Tensor] = []  # session tensors this binding's last run used
        self._shapes: Mapping[str, tuple[int, ...]] = {}  # real shapes of outputs of data-dependent size

    def __del__(self) -> None:
        # The session returns them to its cache at its next run: a binding made per iteration (as is usual
        # with onnxruntime) does not make new tensors every run. list.append is safe wherever GC runs this.
        if self._lent:
            self.session._orphans.append(self._lent)

    def bind_input(self, name: str, value: Tensor | np.ndarray) -> None:
        decl = self.session._in_decl.get(name)
        if decl is None:
            raise ShapeError(f"no input {name!r}; inputs are {list(self.session._in_decl)}")
        if not isinstance(value, Tensor | np.ndarray):
            raise ShapeError(f"bind_input {name!r}: expects a ctxrt.Tensor or a numpy.ndarray, "
                             f"got {type(value).__name__}")
        self._check_value(name, decl[0], value, "input")  # its shape may select another compiled variant
        self._inputs[name] = value

    def bind_output(self, name: str, value: Tensor | None = None) -> None:
        decl = self.session._out_decl.get(name)
        if decl is None:
            raise ShapeError(f"no output {name!r}; outputs are {list(self.session._out_decl)}")
        if value is not None:
            if not isinstance(value, Tensor):
                raise ShapeError(f"bind_output {name!r}: expects a ctxrt.Tensor or None, got {type(value).__name__}")
            self._check_value(name, decl[0], value, "output")
        self._outputs[name] = value

    def _check_value(self, name: str, dtype: np.dtype | None, value: Tensor | np.ndarray, role: str) -> None:
        if isinstance(value, Tensor):
            if value.session is not self.session:
                raise RegistrationError(f"{role} {name!r}: the Tensor belongs to another session")
            value._check()
        if dtype is not None and value.dtype != dtype:  # None: the model does not declare it
            raise ShapeError(f"{role} {name!r} expects {dtype}, got {value.dtype}")

    def clear_binding_inputs(self) -> None:
        self._inputs.clear()

    def clear_binding_outputs(self) -> None:
        self._outputs.clear()
        self._results.clear()

    def get_outputs(self) -> list[Tensor]:
        """The output Tensors of the last run, in the order the outputs were bound."""
        return [self._results[n] for n in self._outputs if n in self._results]

    def copy_outputs_to_cpu(self) -> list[np.ndarray]:
        """Copies of the outputs, of their real shapes (an output of data-dependent size is a Tensor of its
        upper bound, its data in the leading part)."""
        return [cut(self._results[n], self._shapes.get(n)) for n in self._outputs if n in self._results]


def cut(t: Tensor, shape: tuple[int, ...] | None) -> np.ndarray:
    """A copy of the tensor, or of its leading part of the given shape."""
    if shape is None:
        return t.numpy()
    part = tuple(slice(0, d) for d in shape)
    return (t.array[part] if t.array is not None else t.numpy()[part]).copy()


def node_arg(name: str, dt: np.dtype | None, dims: list[int | str | None] | None) -> NodeArg:
    type_name = "undefined" if dt is None else _ONNX_TYPES.get(dt.name, dt.name)
    return NodeArg(name, None if dims is None else list(dims), f"tensor({type_name})")


__all__ = ["IOBinding", "NodeArg", "cut", "node_arg"]
