"""Runtime: backends by name, contexts, graphs."""

from __future__ import annotations

from ctxrt.errors import CtxrtError
from ctxrt.runtime.backend import Backend


def get_backend(name: str | Backend = "cpu") -> Backend:
    if not isinstance(name, str):
        return name
    if name == "cpu":
        from ctxrt.backends.cpu.backend import CpuBackend

        return CpuBackend()
    raise CtxrtError(f"unknown backend {name!r}; available: cpu")
