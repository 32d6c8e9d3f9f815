"""OpenCL buffers and tensors. A tensor is (buffer, byte offset, shape, dtype); kernels receive the buffer and
the offset as two arguments, so tensors anywhere in an arena need no sub-buffer (a sub-buffer would have to
start at a multiple of MEM_BASE_ADDR_ALIGN, which arena offsets are not in general)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from ctxrt.errors import RegistrationError

if TYPE_CHECKING:
    from ctxrt.backends.opencl.backend import OpenCLBackend


class ClBuffer:
    """One cl.Buffer. Where the device shares memory with the host, the buffer is allocated host-visible
    (ALLOC_HOST_PTR) and mapped once: `array` is that mapping, a uint8 array over the same memory the kernels
    use (zero copy). Elsewhere `array` is None and the host reaches the bytes through counted copies."""

    def __init__(self, backend: OpenCLBackend, nbytes: int, alignment: int, host_visible: bool) -> None:
        cl = backend.cl
        if nbytes < 0 or alignment <= 0 or alignment & (alignment - 1):
            raise RegistrationError(f"bad allocation: {nbytes} bytes aligned to {alignment}")
        flags = cl.mem_flags.READ_WRITE | (cl.mem_flags.ALLOC_HOST_PTR if host_visible else 0)
        try:
            self.mem: Any = cl.Buffer(backend.context, flags, max(nbytes, 1))  # OpenCL has no empty buffers
        except cl.Error as e:
            raise RegistrationError(f"cannot allocate {nbytes} bytes on {backend.info.name}: {e}") from e
        self.nbytes = nbytes
        self.alignment = alignment
        self.holders = 0  # registered memory handles and weights / spill-fill registrations using it
        self.array: np.ndarray | None = None
        self.address = 0  # device memory starts at a multiple of MEM_BASE_ADDR_ALIGN
        if backend.zero_copy:
            # Mapped once for the buffer's life: host writes and kernel reads meet in the same memory, the
            # queue being finished whenever the host touches it (run end, partition boundaries).
            mapped, _ = cl.enqueue_map_buffer(backend.queue, self.mem, cl.map_flags.READ | cl.map_flags.WRITE, 0,
                                              (max(nbytes, 1),), np.uint8, is_blocking=True)
            self.array = mapped[:nbytes]
            self.address = int(mapped.ctypes.data)
        backend.stats["buffers_created"] += 1
        backend.stats["buffer_bytes"] += nbytes

    @property
    def released(self) -> bool:
        return self.mem is None

    def release(self) -> None:
        """Let the memory go. Refused while memory handles are registered on it (deregister them first). Host
        arrays still pointing into the mapping keep it alive until they are gone: never a dangling pointer."""
        if self.holders:
            raise RegistrationError(f"cannot free a shared buffer that is still registered ({self.holders} memory "
                                    "handle(s) or context buffer registrations); deregister them first")
        self.mem = self.array = None

    def __repr__(self) -> str:
        state = "released" if self.mem is None else ("mapped" if self.array is not None else "device")
        return f"ClBuffer({self.nbytes} bytes, {state})"


class ClTensor:
    """A tensor in a ClBuffer: what OpenCL kernels bind to (`mem` and `offset` become two kernel arguments)."""

    __slots__ = ("buffer", "offset", "shape", "dtype", "nbytes", "_host")

    def __init__(self, buffer: ClBuffer, offset: int, shape: tuple[int, ...], dtype: np.dtype) -> None:
        self.buffer = buffer
        self.offset = offset
        self.shape = tuple(shape)
        self.dtype = dtype
        self.nbytes = math.prod(self.shape) * dtype.itemsize
        self._host: np.ndarray | None = None

    @property
    def mem(self) -> Any:
        if self.buffer.mem is None:
            raise RegistrationError("the tensor's buffer was released")
        return self.buffer.mem

    @property
    def host(self) -> np.ndarray | None:
        """A zero-copy host array over the tensor's bytes (one object per tensor), or None."""
        if self._host is None and self.buffer.array is not None:
            raw = self.buffer.array[self.offset:self.offset + self.nbytes]
            self._host = raw.view(self.dtype).reshape(self.shape)
        return self._host

    def reshape(self, shape: tuple[int, ...] | list[int]) -> ClTensor:
        shape = tuple(int(d) for d in shape)
        if math.prod(shape) * self.dtype.itemsize != self.nbytes:
            raise ValueError(f"cannot reshape {list(self.shape)} to {list(shape)}")
        return self if shape == self.shape else ClTensor(self.buffer, self.offset, shape, self.dtype)

    def __repr__(self) -> str:
        return f"ClTensor({self.dtype}{list(self.shape)} at offset {self.offset} of {self.buffer!r})"
