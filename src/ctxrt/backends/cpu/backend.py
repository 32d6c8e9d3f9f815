"""The NumPy backend: buffers are aligned uint8 arrays, tensors are views at offsets into them."""

from __future__ import annotations

import platform
from collections.abc import Callable

import numpy as np

import ctxrt
from ctxrt.backends.cpu.registry import KERNELS
from ctxrt.errors import RegistrationError

_UFUNC_BUFSIZE = 1024


class CpuBuffer:
    """An aligned host allocation. `array` is the uint8 view of exactly `nbytes` bytes."""

    def __init__(self, nbytes: int, alignment: int = 64) -> None:
        if nbytes < 0 or alignment <= 0 or alignment & (alignment - 1):
            raise RegistrationError(f"bad allocation: {nbytes} bytes aligned to {alignment}")
        raw = np.empty(nbytes + alignment, np.uint8)
        start = -raw.ctypes.data % alignment
        self.array: np.ndarray | None = raw[start:start + nbytes]
        self.nbytes = nbytes
        self.alignment = alignment
        self.address = int(self.array.ctypes.data)
        self.holders = 0  # registered memory handles and weights / spill-fill registrations using it

    def release(self) -> None:
        """Free the memory. Refused while memory handles are registered on it (deregister them first)."""
        if self.holders:
            raise RegistrationError(f"cannot free a shared buffer that is still registered ({self.holders} memory "
                                    "handle(s) or context buffer registrations); deregister them first")
        self.array = None

    def __repr__(self) -> str:
        state = "released" if self.array is None else f"0x{self.address:x}"
        return f"CpuBuffer({self.nbytes} bytes, {state})"

    @property
    def released(self) -> bool:
        return self.array is None


class CpuBackend:
    name = "cpu"
    alignment = 64
    kernels = KERNELS

    def alloc_shared(self, nbytes: int, alignment: int = 64) -> CpuBuffer:
        return CpuBuffer(int(nbytes), int(alignment))

    def alloc_device(self, nbytes: int) -> CpuBuffer:
        return CpuBuffer(int(nbytes), self.alignment)

    def view(self, buf: CpuBuffer, offset: int, shape: tuple[int, ...], dtype: np.dtype | str) -> np.ndarray:
        if buf.array is None:
            raise RegistrationError("buffer was released")
        dt = np.dtype(dtype)
        n = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        if offset < 0 or offset + n > buf.nbytes:
            raise RegistrationError(f"view of {n} bytes at offset {offset} is outside a buffer of "
                                    f"{buf.nbytes} bytes")
        return buf.array[offset:offset + n].view(dt).reshape(shape)

    def copy_in(self, dst: np.ndarray, src: np.ndarray) -> None:
        np.copyto(dst, src, casting="no")

    def copy_out(self, dst: np.ndarray, src: np.ndarray) -> None:
        np.copyto(dst, src, casting="no")

    def run(self, launches: list[Callable[[], None]]) -> None:
        """Replay recorded launches. NumPy's ufunc iterator buffers strided and broadcast operands in
        chunks of `bufsize` elements, allocating those buffers each call: 1024 keeps them at a few KiB
        (the default 8192 costs up to 64 KiB a call) at no measurable speed cost."""
        old = np.setbufsize(_UFUNC_BUFSIZE)
        try:
            for launch in launches:
                launch()
        finally:
            np.setbufsize(old)

    def device_id(self) -> dict[str, str]:
        return {"backend": "cpu", "device": platform.machine(), "driver": f"numpy {np.__version__}",
                "ctxrt": ctxrt.__version__}
