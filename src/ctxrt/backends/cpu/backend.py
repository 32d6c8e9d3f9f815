"""The NumPy backend: buffers are aligned uint8 arrays, tensors are views at offsets into them."""

from __future__ import annotations

import contextlib
import os
import platform
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

import ctxrt
from ctxrt.backends.cpu.registry import KERNELS
from ctxrt.errors import RegistrationError

_UFUNC_BUFSIZE = 1024


@contextlib.contextmanager
def small_ufunc_buffers() -> Iterator[None]:
    """NumPy's ufunc iterator buffers strided and broadcast operands in chunks of `bufsize` elements, allocating
    those buffers each call: 1024 keeps them at a few KiB (the default 8192 costs up to 64 KiB a call) at no
    measurable speed cost. Every run of NumPy kernels (here, and CPU partitions of other backends) uses it."""
    old = np.setbufsize(_UFUNC_BUFSIZE)
    try:
        yield
    finally:
        np.setbufsize(old)


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

    @classmethod
    def wrap(cls, block: np.ndarray) -> CpuBuffer:
        """Host bytes (e.g. a mapped weights section) as a buffer, in place: nothing is copied."""
        buf = cls.__new__(cls)
        buf.array, buf.nbytes, buf.alignment = block, int(block.nbytes), 64
        buf.address, buf.holders = int(block.ctypes.data), 0
        return buf


class CpuBackend:
    name = "cpu"
    alignment = 64
    kernels = KERNELS
    fallback = None  # every op ctxrt supports has a NumPy kernel
    programs = None  # nothing is built: NumPy kernels are Python

    def __init__(self) -> None:
        self.stats: Counter[str] = Counter()  # buffers made (a steady loop makes none)

    def alloc_shared(self, nbytes: int, alignment: int = 64) -> CpuBuffer:
        buf = CpuBuffer(int(nbytes), int(alignment))
        self.stats["buffers_created"] += 1
        self.stats["buffer_bytes"] += buf.nbytes
        return buf

    def alloc_device(self, nbytes: int) -> CpuBuffer:
        return self.alloc_shared(nbytes, self.alignment)

    def wrap_host(self, block: np.ndarray) -> CpuBuffer:
        return CpuBuffer.wrap(block)

    def view(self, buf: CpuBuffer, offset: int, shape: tuple[int, ...], dtype: np.dtype | str) -> np.ndarray:
        if not isinstance(buf, CpuBuffer):
            raise RegistrationError(f"the cpu backend needs its own buffers (alloc_shared), got {type(buf).__name__}")
        if buf.array is None:
            raise RegistrationError("buffer was released")
        dt = np.dtype(dtype)
        n = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        if offset < 0 or offset + n > buf.nbytes:
            raise RegistrationError(f"view of {n} bytes at offset {offset} is outside a buffer of "
                                    f"{buf.nbytes} bytes")
        return buf.array[offset:offset + n].view(dt).reshape(shape)

    def host_view(self, tensor: np.ndarray) -> np.ndarray:
        return tensor

    def copy_in(self, dst: np.ndarray, src: np.ndarray) -> None:
        np.copyto(dst, src, casting="no")

    def copy_out(self, dst: np.ndarray, src: np.ndarray) -> None:
        np.copyto(dst, src, casting="no")

    def run(self, launches: list[Callable[[], None]]) -> None:
        """Replay recorded launches."""
        with small_ufunc_buffers():
            for launch in launches:
                launch()

    def sync(self) -> None:
        """NumPy kernels are done when their launch returns."""

    def device_id(self) -> dict[str, str]:
        return {"backend": "cpu", "device": platform.machine(), "driver": f"numpy {np.__version__}",
                "ctxrt": ctxrt.__version__}

    @staticmethod
    def describe() -> dict[str, Any]:
        """This backend as `ctxrt devices` lists it."""
        return {"backend": "cpu", "index": None, "name": platform.processor() or platform.machine(),
                "vendor": "", "driver": f"numpy {np.__version__}", "compute_units": os.cpu_count() or 1,
                "global_memory": _physical_memory(), "unified_memory": True}


def _physical_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not POSIX
        return 0
