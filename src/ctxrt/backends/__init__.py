"""Backends by name, and the one kernel choice that the compiler and the runtime share.

    get_backend("cpu")          NumPy
    get_backend("opencl")       the OpenCL device named by $CTXRT_OPENCL_DEVICE (an index), else device 0
    get_backend("opencl:N")     OpenCL device N of `list_devices()`

A backend's `kernels` run on its device; a node they do not cover (or decline, with UnsupportedOpError)
runs on `backend.fallback` (OpenCL falls back to cpu, as onnxruntime falls back to its CPU provider).
Nothing above this package tests which backend it has.
"""

from __future__ import annotations

import os
import threading
import warnings
from collections.abc import Callable, Mapping
from typing import Any

from ctxrt.backends.base import Backend
from ctxrt.backends.kernel import Kernel, NodeSpec
from ctxrt.errors import CtxrtError, CtxrtWarning, UnsupportedOpError

DEVICE_ENV = "CTXRT_OPENCL_DEVICE"

_lock = threading.RLock()  # an opencl backend gets its cpu fallback while being made
_instances: dict[str, Backend] = {}


def _cpu(arg: str) -> Backend:
    from ctxrt.backends.cpu.backend import CpuBackend

    if arg:
        raise CtxrtError(f"backend 'cpu' takes no device, got 'cpu:{arg}'")
    return CpuBackend()


def _opencl(arg: str) -> Backend:
    from ctxrt.backends.opencl.backend import OpenCLBackend

    index = arg or os.environ.get(DEVICE_ENV, "0")
    if not index.isdigit():
        where = f"'opencl:{arg}'" if arg else f"${DEVICE_ENV}={index!r}"
        raise CtxrtError(f"{where}: an OpenCL device is named by its index in `ctxrt devices`, e.g. opencl:0")
    return OpenCLBackend(int(index))


# Backend name (before any ':N') -> constructor given what follows the colon.
FACTORIES: dict[str, Callable[[str], Backend]] = {"cpu": _cpu, "opencl": _opencl}


def get_backend(name: str | Backend = "cpu") -> Backend:
    """The backend called `name` (one instance per name and device, shared by every context that names it,
    so buffers of one can be used by another), or `name` itself when it is already a backend."""
    if not isinstance(name, str):
        return name
    kind, _, arg = name.partition(":")
    factory = FACTORIES.get(kind)
    if factory is None:
        raise CtxrtError(f"unknown backend {name!r}; available: {', '.join(FACTORIES)} (opencl:N for device N)")
    key = name if arg or kind != "opencl" else f"opencl:{os.environ.get(DEVICE_ENV, '0')}"
    with _lock:
        backend = _instances.get(key)
        if backend is None:
            backend = _instances[key] = factory(arg)
    return backend


def list_devices() -> list[dict[str, Any]]:
    """Every backend and device this machine has: the cpu backend, then each OpenCL device (index, name,
    vendor, driver, compute units, memory). No OpenCL platform (or no pyopencl) lists none."""
    from ctxrt.backends.cpu.backend import CpuBackend
    from ctxrt.backends.opencl.device import opencl_devices

    return [CpuBackend.describe(), *opencl_devices()]


def select_kernel(backend: Backend, spec: NodeSpec, placement: str | None = None,
                  params: Mapping[str, Any] | None = None) -> tuple[Kernel, str]:
    """(kernel, name of the backend that runs it) for one node: the first of `backend`, its fallback, ... that
    has a kernel for it; or, when `placement` is given (a compiled step's), that backend's kernel. `params` are
    tuned parameters (a compiled step's, tuning mode): the kernel is rebuilt with them."""
    chain: list[Backend] = []
    be: Backend | None = backend
    while be is not None:
        chain.append(be)
        be = be.fallback
    if placement is not None:
        chain = [b for b in chain if b.name == placement]
        if not chain:
            raise UnsupportedOpError(f"{spec.op} node {spec.name!r} was compiled to run on {placement!r}, which "
                                     f"backend {backend.name!r} cannot run; compile the model again")
    error: UnsupportedOpError | None = None
    for be in chain:
        factory = be.kernels.get(spec.op)
        if factory is None:
            continue
        try:
            return _tuned(factory(spec), params), be.name
        except UnsupportedOpError as e:
            error = e  # this backend declines these attributes or dtypes: the next one may not
        except CtxrtError:
            raise
        except Exception as e:
            shapes = [s.shape if s else None for s in spec.inputs]
            raise UnsupportedOpError(f"{spec.op} node {spec.name!r} with inputs {shapes}: {e}") from e
    raise error or UnsupportedOpError(f"unsupported operators: {spec.op} ({spec.name})")


def _tuned(kernel: Kernel, params: Mapping[str, Any] | None) -> Kernel:
    """`kernel` rebuilt with tuned parameters (the OpenCL kernel contract: `type(k)(spec, backend, params)`).
    Parameters this device refuses (a context tuned for another device) leave the defaults, with a warning."""
    if not params or dict(params) == getattr(kernel, "params", None):
        return kernel
    spec = getattr(kernel, "spec", None)
    why = f"{type(kernel).__name__} takes no tuned parameters"
    if getattr(kernel, "space", None) is not None:
        try:
            return type(kernel)(spec, kernel.backend, params)  # type: ignore[call-arg, attr-defined]
        except UnsupportedOpError as e:
            why = str(e)
    warnings.warn(f"tuned parameters {dict(params)} do not fit here ({why}): running the defaults", CtxrtWarning,
                  stacklevel=3)
    return kernel


def supported_ops(backend: Backend) -> set[str]:
    """Op types some backend of the fallback chain has a kernel for."""
    ops: set[str] = set()
    be: Backend | None = backend
    while be is not None:
        ops |= set(be.kernels)
        be = be.fallback
    return ops


__all__ = ["Backend", "DEVICE_ENV", "get_backend", "list_devices", "select_kernel", "supported_ops"]
