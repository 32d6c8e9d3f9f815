"""Tuning mode (docs/tuning.md): tunable OpenCL kernels profiled at compile time on the target
device, the winners stored in the context binary, measurements remembered in a performance cache, and a target
server (`ctxrt serve`) that compiles, profiles and executes kernels for a host that drives the compile.

    config.py     the compile config (QNN's keys), checked in one place
    signature.py  what a measurement is valid for
    profiler.py   timing candidates with OpenCL profiling events, outputs checked against the default's
    tuner.py      the search, the cache look-ups, the record
    cache.py      the performance cache file (locked, atomic, crash-safe)
    cache_schema.py  what the cache file may hold, checked field by field; readfile.py reads it safely
    record.py     the record in META and the report made from it
    protocol.py   the target server's wire format (docs/protocol.md)
    server.py     `ctxrt serve`; worker.py its device process
    client.py     the host side: a client and the backend a compile uses through it
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ctxrt.errors import ConfigError
from ctxrt.tuning.config import TuningConfig
from ctxrt.tuning.tuner import Device, LocalDevice, Tuner


def tuning_device(backend: Any) -> Device:
    """Where `backend`'s kernels are profiled: its own OpenCL device, or the target server it compiles for."""
    from ctxrt.backends.opencl.backend import OpenCLBackend
    from ctxrt.tuning.client import RemoteBackend, RemoteDevice

    if isinstance(backend, RemoteBackend):
        return RemoteDevice(backend.client)
    if isinstance(backend, OpenCLBackend):
        return LocalDevice(backend)
    raise ConfigError(f"tuning_mode tunes OpenCL kernels: backend {backend.name!r} has none to tune "
                      "(compile with --backend opencl)")


def make_tuner(backend: Any, tuning: Mapping[str, Any] | TuningConfig) -> Tuner | None:
    """A tuner for `backend` when the config turns tuning mode on, else None. The config is checked and the
    performance cache directory opened here, before any compiling or profiling."""
    config = tuning if isinstance(tuning, TuningConfig) else TuningConfig.parse(tuning, "tuning options")
    if not config.tuning_mode:
        return None
    return Tuner(config, tuning_device(backend))


__all__ = ["Device", "LocalDevice", "Tuner", "TuningConfig", "make_tuner", "tuning_device"]
