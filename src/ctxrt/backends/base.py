"""The contract between the runtime and a backend: memory, copies, views, kernels, programs, identity.

The runtime above a backend is one code path for every backend: it never asks which backend it has. What
differs (where memory lives, whether the host can see it, how kernels are launched and when they are done)
is answered here, by the backend.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

import numpy as np

from ctxrt.backends.kernel import KernelFactory


class SharedBuffer(Protocol):
    """Memory visible to host and device; tensors are addressed as (buffer, byte offset)."""

    nbytes: int
    alignment: int
    address: int  # for alignment checks: the host address, or 0 where the host cannot see the buffer
    holders: int  # registered memory handles; release() refuses while non-zero

    @property
    def released(self) -> bool: ...

    def release(self) -> None: ...


class ProgramStore(Protocol):
    """Device programs behind a backend's kernels (OpenCL): built once, stored in context binaries.

    A kernel names the programs it needs in `Kernel.programs` (opaque, hashable keys)."""

    def prepare(self, keys: Iterable[Any], stats: Counter[str]) -> None:
        """Build or load every program named (counting `programs_built_from_source`,
        `programs_loaded_from_binary` in `stats`), so that binding kernels builds nothing."""

    def export(self, keys: Iterable[Any]) -> dict[str, Any]:
        """The programs as plain data for a context binary: device binaries, sources, the device."""

    def load(self, data: Mapping[str, Any], origin: str) -> None:
        """Take the programs of a context binary (`origin` names it in warnings); used by `prepare`."""


class Backend(Protocol):
    name: str
    alignment: int  # buffer start alignment: registered buffers and arena offsets
    kernels: Mapping[str, KernelFactory]  # op type -> factory of kernels that run on this backend's device
    fallback: Backend | None  # runs the nodes `kernels` has no kernel for (None: every node needs one)
    programs: ProgramStore | None  # device programs, for backends that build them
    stats: Counter[str]  # buffers_created, buffer_bytes, ...: what the backend made, whichever context asked

    def alloc_shared(self, nbytes: int, alignment: int = 64) -> SharedBuffer:
        """A buffer the host can also reach (memory handles, registered buffers, session tensors)."""

    def alloc_device(self, nbytes: int) -> SharedBuffer:
        """A buffer for the device (arenas, internal IO buffers)."""

    def wrap_host(self, block: np.ndarray) -> SharedBuffer | None:
        """`block` (read-only host bytes, e.g. a mapped weights section) as a buffer used in place, or None
        when the device needs its own copy."""

    def view(self, buf: SharedBuffer, offset: int, shape: tuple[int, ...], dtype: np.dtype | str) -> Any:
        """The backend's tensor at `offset` in `buf`: what its kernels bind to."""

    def host_view(self, tensor: Any) -> np.ndarray | None:
        """A zero-copy host array of a tensor, or None where the host cannot see its memory."""

    def copy_in(self, dst: Any, src: Any) -> None:
        """Host array (or a tensor of this backend) -> tensor; done when it returns."""

    def copy_out(self, dst: np.ndarray, src: Any) -> None:
        """Tensor -> host array; done when it returns."""

    def run(self, launches: list[Callable[[], Any]]) -> None:
        """Run recorded launches in order; every result is in memory when it returns."""

    def sync(self) -> None:
        """Wait until every launch issued so far is done (before the host touches their memory)."""

    def device_id(self) -> dict[str, str]:
        """backend, device, driver, ctxrt version: keys for caches of built or tuned things."""

    # Optional: `threads(num_threads)` -> a context manager entered around each run that holds the host's
    # thread pools to `num_threads` (None: a default the backend chooses). Backends without host pools omit it;
    # `lower(graph, options)` -> the backend's own IR passes, run last before kernels are chosen;
    # `batch(launches)` -> the list `run` replays for these recorded launches, merged where the backend can (the
    # CPU's runs of native launches as one call each).
