"""OpenCL programs: `.cl` sources shipped in the package, built once per (source hash, build options) per
device context, and stored in context binaries as device binaries next to their sources.

Loading a context binary made on the same device and driver builds nothing from source; one made for
another device or driver is rebuilt from its stored sources, with one warning naming both devices.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import re
import threading
import warnings
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING, Any

from ctxrt.errors import CtxrtError, CtxrtWarning

if TYPE_CHECKING:
    from ctxrt.backends.opencl.backend import OpenCLBackend


_INCLUDE = re.compile(r'^#include "([\w.]+\.clh)"$', re.MULTILINE)


@functools.cache
def source(name: str) -> str:
    """The text of `kernels/<name>`, shipped as package data, with each `#include "x.clh"` line replaced by that
    header's text (one level: the program is built, and hashed, as one self-contained string)."""
    try:
        text = (resources.files("ctxrt.backends.opencl") / "kernels" / name).read_text(encoding="utf-8")
    except (FileNotFoundError, OSError) as e:
        raise CtxrtError(f"OpenCL kernel source {name!r} is missing from the ctxrt package") from e
    if name.endswith(".clh"):
        return text
    return _INCLUDE.sub(lambda m: source(m.group(1)), text)


@functools.cache
def source_hash(name: str) -> str:
    return hashlib.sha256(source(name).encode()).hexdigest()


@dataclass(frozen=True)
class ProgramKey:
    """One program: a `.cl` file (by name and content hash) and its build options (`-D` macros)."""

    name: str
    source_hash: str
    options: str

    @classmethod
    def make(cls, name: str, defines: Mapping[str, Any]) -> ProgramKey:
        options = " ".join(f"-D{k}={v}" for k, v in sorted(defines.items()))
        return cls(name, source_hash(name), options)

    @property
    def built_as(self) -> tuple[str, str]:
        return self.source_hash, self.options


class ProgramStore:
    """The backend's programs: built ones, and binaries or sources offered by loaded context binaries."""

    def __init__(self, backend: OpenCLBackend) -> None:
        self.backend = backend
        self._built: dict[tuple[str, str], Any] = {}
        self._binaries: dict[tuple[str, str], bytes] = {}  # from context binaries made on this device
        self._sources: dict[str, str] = {}  # source hash -> text, stored in context binaries
        self._lock = threading.Lock()

    def device_record(self) -> dict[str, str]:
        """Who a binary is for: the device's normalised tier plus its names, as KERNELS stores it."""
        info = self.backend.info
        return {"tier": info.tier, "vendor": info.vendor, "device": info.name, "driver": info.driver}

    # -- ProgramStore protocol ----------------------------------------------------------------------
    def prepare(self, keys: Iterable[ProgramKey], stats: Counter[str]) -> None:
        for key in keys:
            self._get(key, stats)

    def get(self, key: ProgramKey) -> Any:
        """The built program (built now, counted in the backend's stats, if `prepare` did not see it)."""
        program = self._built.get(key.built_as)
        return program if program is not None else self._get(key, self.backend.stats)

    def export(self, keys: Iterable[ProgramKey]) -> dict[str, Any]:
        cl = self.backend.cl
        records = []
        for key in keys:
            program = self._get(key, self.backend.stats)
            (binary,) = program.get_info(cl.program_info.BINARIES)
            records.append({"name": key.name, "source_hash": key.source_hash, "options": key.options,
                            "source": self._sources.get(key.source_hash) or source(key.name),
                            "binary": bytes(binary)})
        return {"device": self.device_record(), "programs": records}

    def load(self, data: Mapping[str, Any], origin: str) -> None:
        theirs, ours = data["device"], self.device_record()
        programs = data["programs"]
        for p in programs:
            self._sources.setdefault(p["source_hash"], p["source"])
        if theirs.get("tier") == ours["tier"]:
            for p in programs:
                self._binaries.setdefault((p["source_hash"], p["options"]), p["binary"])
        elif programs:
            warnings.warn(f"{origin}: its {len(programs)} OpenCL programs were built for {_label(theirs)}; this "
                          f"device is {_label(ours)}: rebuilding them from their stored sources",
                          CtxrtWarning, stacklevel=4)

    # -- building -----------------------------------------------------------------------------------
    def _get(self, key: ProgramKey, stats: Counter[str]) -> Any:
        with self._lock:  # one build per program, also when several threads finalize contexts at once
            program = self._built.get(key.built_as)
            if program is not None:
                stats["programs_reused"] += 1
                return program
            binary = self._binaries.get(key.built_as)
            if binary is not None:
                program = self._from_binary(key, binary)
            if program is not None:
                stats["programs_loaded_from_binary"] += 1
            else:
                program = self._from_source(key)
                stats["programs_built_from_source"] += 1
            self._built[key.built_as] = program
            return program

    def _from_binary(self, key: ProgramKey, binary: bytes) -> Any | None:
        cl, be = self.backend.cl, self.backend
        try:
            with _quiet_driver(cl):
                return cl.Program(be.context, [be.device], [binary]).build(options=key.options)
        except cl.Error as e:  # a binary this driver does not take after all: build from source instead
            warnings.warn(f"OpenCL program {key.name} ({key.options}): the stored binary was refused by "
                          f"{be.info.name} ({type(e).__name__}); rebuilding it from source", CtxrtWarning,
                          stacklevel=5)
            return None

    def _from_source(self, key: ProgramKey) -> Any:
        cl, be = self.backend.cl, self.backend
        text = self._sources.get(key.source_hash) or source(key.name)
        try:
            with _quiet_driver(cl):
                return cl.Program(be.context, text).build(options=key.options, devices=[be.device])
        except cl.Error as e:
            log = str(e).strip().splitlines()
            raise CtxrtError(f"OpenCL program {key.name} ({key.options}) does not build on {be.info.name}: "
                             f"{' | '.join(log[-6:])}") from e


@contextlib.contextmanager
def _quiet_driver(cl: Any) -> Iterator[None]:
    """A build whose log is not empty is no error: PoCL's notes on vector ABIs, for one, are nothing a user can act
    on, and a failed build raises with its log anyway."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", cl.CompilerWarning)
        yield


def _label(device: Mapping[str, str]) -> str:
    return f"{device.get('device', '?')} ({device.get('vendor', '?')}, driver {device.get('driver', '?')})"
