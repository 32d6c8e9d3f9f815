"""The contract between the runtime and a backend: memory, copies, views, kernels, identity."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

import numpy as np

from ctxrt.backends.kernel import KernelFactory


class SharedBuffer(Protocol):
    """Memory visible to host and device; tensors are addressed as (buffer, byte offset)."""

    nbytes: int
    alignment: int
    address: int
    holders: int  # registered memory handles; release() refuses while non-zero

    def release(self) -> None: ...


class Backend(Protocol):
    name: str
    alignment: int
    kernels: Mapping[str, KernelFactory]

    def alloc_shared(self, nbytes: int, alignment: int = 64) -> SharedBuffer: ...

    def alloc_device(self, nbytes: int) -> SharedBuffer: ...

    def view(self, buf: SharedBuffer, offset: int, shape: tuple[int, ...], dtype: np.dtype | str) -> Any: ...

    def copy_in(self, dst: Any, src: np.ndarray) -> None: ...

    def copy_out(self, dst: np.ndarray, src: Any) -> None: ...

    def run(self, launches: list[Callable[[], None]]) -> None: ...

    def device_id(self) -> dict[str, str]: ...

    # Optional: `threads(num_threads)` -> a context manager entered around each run that holds the host's
    # thread pools to `num_threads` (None: a default the backend chooses). Backends without host pools omit it.
