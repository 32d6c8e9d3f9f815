"""What a backend's kernel factories see and return: shared by every backend."""

from __future__ import annotations

import ctypes
import functools
import math
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ctxrt.errors import InvalidInputError


@dataclass(frozen=True)
class TensorSpec:
    shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * np.dtype(self.dtype).itemsize


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
    # Compile options (e.g. {"prefer": "memory"}); empty when a context is loaded: a kernel whose choice
    # depends on them records that choice in `Kernel.attrs`, which the loader passes back as attributes.
    options: dict[str, Any] = field(default_factory=dict)

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
    # A choice made at compile time that the loader must repeat (provider, tile size, layout...): the compiler
    # adds these to the node's attributes, stored in the binary.
    attrs: dict[str, Any] = {}
    # Kernel-private constants made at compile time (transformed or prepacked weights), by the index of the
    # input each replaces (None: the input is no longer read). They are stored in the weights section instead
    # of the originals, so they are memory-mapped and shared like any weight.
    constants: dict[int, np.ndarray | None] = {}
    # Bytes of constants the kernel made for itself when it was built (e.g. per-channel scale rows), counted in
    # the context's memory as kernel-private; None: found by `built_constants_bytes`.
    private_bytes: int | None = None
    programs: tuple[Any, ...] = ()
    # Its launches' work is BLAS calls (NumPy's matmul): a run whose large kernels all are gives BLAS the
    # threads, not only OpenMP (runtime/work.py, `blas_run`).
    blas: bool = False

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
    n = math.prod(shape) * dt.itemsize
    return buf[:n].view(dt).reshape(shape)


# Types whose objects hold no arrays (scalars, strings, ctypes' pointers; backends add their own handles: oneDNN's
# memory objects, descriptors and primitives): `held_constants_bytes` does not search them (a decoder's load walked
# ~4,000 objects twice, ~1.5 ms each, half of them oneDNN's argument objects).
ARRAY_FREE: set[type] = {str, bytes, int, float, bool, complex, type(None), ctypes.c_void_p, ctypes.c_int64,
                         ctypes.c_int32, ctypes.c_int, ctypes.c_size_t, ctypes.c_float, ctypes.c_double,
                         ctypes.c_char_p}


ARRAY_FREE.update({TensorSpec, types.ModuleType})  # a shape and a dtype; a module (its globals are no kernel's)


def check_indices(spec: NodeSpec, idx: np.ndarray, n: Any) -> None:
    """Indices into an axis of n entries must lie in [-n, n - 1] (`n` an array: per element of each index tuple,
    the last axis of `idx`), as onnxruntime refuses others: an InvalidInputError naming the node and the index,
    raised before the kernel writes anything. One index or a few are read as Python ints (a token's embedding
    row: ~0.3 us, not two NumPy reductions)."""
    if not isinstance(n, np.ndarray):
        n = int(n)  # (a shape's entry: a NumPy integer where a shape came through NumPy)
        size = idx.size
        if size == 1:
            lo = hi = idx.item()
        elif size <= 16:
            if not size:
                return
            vals = idx.ravel().tolist()
            lo, hi = min(vals), max(vals)
        else:
            lo, hi = int(idx.min()), int(idx.max())
        if -n <= lo and hi < n:
            return
        bad, where = (lo if lo < -n else hi), f"[{-n}, {n - 1}] (the axis has {n} entries)"
    else:
        if not idx.size:
            return
        dims = n.astype(np.int64, copy=False)
        t = idx.reshape(-1, dims.size)
        lo, hi = t.min(axis=0), t.max(axis=0)  # (per element of a tuple: k values, not a mask of every index)
        out = (lo < -dims) | (hi >= dims)
        if not out.any():
            return
        col = int(np.argmax(out))
        bad = int(lo[col] if lo[col] < -dims[col] else hi[col])
        where = f"[{-dims[col]}, {dims[col] - 1}] (element {col} of an index tuple)"
    raise InvalidInputError(f"{spec.op} node {spec.name!r}: index {bad} is outside {where}")


def constant_indices_error(spec: NodeSpec, idx: np.ndarray, n: int | np.ndarray) -> Exception | None:
    """`check_indices`' error for constant indices, made once when the kernel is built (raised when it runs, as
    onnxruntime's: a model compiled with its dims bound to 1 may hold such a node that no run reaches)."""
    try:
        check_indices(spec, idx, n)
    except InvalidInputError as e:
        return e
    return None


def held_constants_bytes(objects: list[Any], shared: set[int] = frozenset()) -> int:
    """Bytes of the arrays that kernels and their launches hold (in attributes, in their functions' closures, in
    lists, tuples and dicts of them), counted once per allocation: constants they made for themselves. Not
    counted: read-only arrays (weights, constants shared by every kernel of the process) and views of
    allocations whose id is in `shared` (the context's buffers: arena, IO, weights). A kernel that sets
    `private_bytes` is taken at its word and not searched."""
    seen: set[int] = set()
    owners: dict[int, int] = {}
    declared = 0
    leaves = ARRAY_FREE

    def visit(obj: Any, depth: int) -> None:
        if type(obj) in leaves or id(obj) in seen or depth > 6:  # (type(): no attribute lookup on the object)
            return
        seen.add(id(obj))
        if isinstance(obj, np.ndarray):
            root = obj
            while isinstance(root.base, np.ndarray):
                root = root.base
            if root.base is None and root.flags.writeable and id(root) not in shared:
                owners[id(root)] = root.nbytes
        elif isinstance(obj, (list, tuple)):
            for item in obj:
                visit(item, depth + 1)
        elif isinstance(obj, dict):
            for item in obj.values():
                visit(item, depth + 1)
        elif isinstance(obj, functools.partial):
            visit([obj.func, obj.args, obj.keywords], depth + 1)
        elif callable(obj) and hasattr(obj, "__closure__"):
            for cell in obj.__closure__ or ():
                visit(cell.cell_contents, depth + 1)
        elif hasattr(obj, "__dict__") and not isinstance(obj, type):
            for item in vars(obj).values():
                visit(item, depth + 1)

    for obj in objects:
        if isinstance(obj, Kernel) and obj.private_bytes is not None:
            declared += obj.private_bytes
            seen.add(id(obj))
        else:
            visit(obj, 0)
    return declared + sum(owners.values())


def leads(past: Any, present: Any, axis: int) -> bool:
    """Whether array `past` is the leading rows of array `present` along `axis`, in place: the same first
    address and strides, the same shape but a shorter or equal axis."""
    return past.strides == present.strides and past.ndim == present.ndim and \
        past.__array_interface__["data"][0] == present.__array_interface__["data"][0] and \
        all(a == b or i == axis and a <= b for i, (a, b) in enumerate(zip(past.shape, present.shape, strict=True)))
