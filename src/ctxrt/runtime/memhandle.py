"""Memory handles: a tensor at an offset inside a shared buffer, registered with one context.

The QNN `memRegister` / `Qnn_MemHandle_t` model (reference/004_*): a handle names (buffer, offset,
shape, dtype); passing it to `Graph.execute` binds the graph's IO tensor to that memory, so nothing is
copied. One buffer per handle, or many handles at offsets in one buffer (the multi-tensor shared buffer).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from ctxrt.errors import RegistrationError

if TYPE_CHECKING:
    from ctxrt.runtime.context import Context


class MemHandle:
    """Made by `Context.mem_register`; valid until `Context.mem_deregister` or the context's `free()`."""

    __slots__ = ("context", "buffer", "offset", "shape", "dtype", "nbytes", "strides", "span", "view", "registered",
                 "__weakref__")

    def __init__(self, context: Context, buffer: Any, offset: int, shape: tuple[int, ...], dtype: np.dtype,
                 view: Any, strides: tuple[int, ...] | None = None) -> None:
        self.context = context
        self.buffer = buffer
        self.offset = offset
        self.shape = shape
        self.dtype = dtype
        self.nbytes = math.prod(shape) * dtype.itemsize
        # None: C-contiguous. Else byte strides: a window of a larger tensor (the leading rows of a KV cache
        # along its sequence axis, docs/generate.md), whose bytes from `offset` span `span`
        self.strides = strides
        self.span = self.nbytes if strides is None else strided_span(shape, strides, dtype.itemsize)
        self.view = view  # the backend's tensor at (buffer, offset): what kernels read and write
        self.registered = True

    @property
    def key(self) -> tuple[int, int, tuple[int, ...], str, tuple[int, ...] | None]:
        return handle_key(self.buffer, self.offset, self.shape, self.dtype, self.strides)

    def __repr__(self) -> str:
        state = "" if self.registered else ", deregistered"
        return f"MemHandle({self.dtype}{list(self.shape)} at offset {self.offset}{state})"


def handle_key(buffer: Any, offset: int, shape: tuple[int, ...], dtype: np.dtype,
               strides: tuple[int, ...] | None = None) -> tuple[int, int, tuple, str, tuple[int, ...] | None]:
    return (id(buffer), offset, shape, dtype.str, strides)


def strided_span(shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int) -> int:
    """Bytes from a strided tensor's first element to the end of its last (0 when it is empty)."""
    if any(d == 0 for d in shape):
        return 0
    return sum((d - 1) * s for d, s in zip(shape, strides, strict=True)) + itemsize


def check_strides(strides: Any, shape: tuple[int, ...], dt: np.dtype) -> tuple[int, ...] | None:
    """A window's byte strides normalized (None where they are the C-contiguous ones): non-negative multiples of
    the item size, one per axis, no two elements at one address (each axis' stride at least the extent of the
    axes inside it, in descending order)."""
    if strides is None:
        return None
    try:
        st = tuple(int(s) for s in strides)
    except (TypeError, ValueError):
        raise RegistrationError(f"mem_register: strides must be a sequence of ints, got {strides!r}") from None
    if len(st) != len(shape) or any(s < 0 or s % dt.itemsize for s in st):
        raise RegistrationError(f"mem_register: strides {list(st)} for shape {list(shape)} must be one non-negative "
                                f"multiple of {dt.itemsize} bytes per axis")
    inner = dt.itemsize
    for d, s in sorted(zip(shape, st, strict=True), key=lambda x: x[1]):
        if d > 1 and s < inner:
            raise RegistrationError(f"mem_register: strides {list(st)} make elements of shape {list(shape)} overlap")
        inner = max(inner, s * d)
    contiguous = tuple(math.prod(shape[i + 1:]) * dt.itemsize for i in range(len(shape)))
    return None if st == contiguous else st


def check_descriptor(buffer: Any, offset: Any, shape: Any, dtype: Any, strides: Any = None
                     ) -> tuple[int, tuple[int, ...], np.dtype, tuple[int, ...] | None]:
    """Validate a registration request; return (offset, shape, dtype, strides) normalized."""
    for attr in ("nbytes", "address"):
        if not hasattr(buffer, attr):
            raise RegistrationError(f"mem_register needs a SharedBuffer from backend.alloc_shared, "
                                    f"got {type(buffer).__name__}")
    if getattr(buffer, "released", False):
        raise RegistrationError("mem_register: the shared buffer was released")
    if isinstance(offset, bool) or not isinstance(offset, (int, np.integer)) or offset < 0:
        raise RegistrationError(f"mem_register: offset must be a non-negative int, got {offset!r}")
    try:
        shape = tuple(int(d) for d in shape)
    except (TypeError, ValueError):
        raise RegistrationError(f"mem_register: shape must be a sequence of ints, got {shape!r}") from None
    if any(d < 0 for d in shape):
        raise RegistrationError(f"mem_register: negative dimension in shape {list(shape)}")
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise RegistrationError(f"mem_register: {dtype!r} is not a dtype") from None
    offset = int(offset)
    st = check_strides(strides, shape, dt)
    nbytes = math.prod(shape) * dt.itemsize if st is None else strided_span(shape, st, dt.itemsize)
    if offset + nbytes > buffer.nbytes:
        raise RegistrationError(f"mem_register: {dt}{list(shape)} ({nbytes} bytes) at offset {offset} is out of "
                                f"bounds of a {buffer.nbytes}-byte shared buffer")
    if (buffer.address + offset) % dt.itemsize:
        raise RegistrationError(f"mem_register: offset {offset} is misaligned for {dt} (the tensor's address must "
                                f"be a multiple of {dt.itemsize})")
    return offset, shape, dt, st
