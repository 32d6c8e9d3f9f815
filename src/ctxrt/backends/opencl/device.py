"""OpenCL devices: discovery, the limits kernels are pruned by, and names normalised for caches."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ctxrt.errors import CtxrtError

INSTALL_HINT = ("install an OpenCL driver (on Debian/Ubuntu: apt-get install pocl-opencl-icd, a CPU device) "
                "and pyopencl (pip install 'ctxrt[opencl]')")


def _cl() -> Any:
    try:
        import pyopencl as cl
    except ImportError as e:
        raise CtxrtError(f"the opencl backend needs pyopencl: {INSTALL_HINT}") from e
    return cl


@dataclass(frozen=True)
class DeviceInfo:
    """What kernels and caches need to know about one device."""

    index: int
    name: str
    vendor: str
    driver: str
    version: str
    type: str  # "cpu", "gpu", "accelerator"
    compute_units: int
    global_memory: int
    local_memory: int
    max_work_group_size: int
    max_work_item_sizes: tuple[int, ...]
    unified_memory: bool  # host and device share memory: host access through mappings, no copies
    base_align: int  # MEM_BASE_ADDR_ALIGN in bytes: sub-buffers must start at multiples of it
    fp64: bool

    @property
    def tier(self) -> str:
        """normalised vendor / device name / driver: the key of anything built or tuned for this device."""
        return f"{normalise(self.vendor)}/{normalise(self.name)}/{normalise(self.driver)}"

    def describe(self) -> dict[str, Any]:
        """This device as `ctxrt devices` lists it."""
        return {"backend": f"opencl:{self.index}", "index": self.index, "name": self.name, "vendor": self.vendor,
                "driver": self.driver, "version": self.version, "type": self.type,
                "compute_units": self.compute_units, "global_memory": self.global_memory,
                "local_memory": self.local_memory, "max_work_group_size": self.max_work_group_size,
                "unified_memory": self.unified_memory}


_NOISE = re.compile(r"\((r|tm|c)\)|\b(corporation|corp|inc|incorporated|ltd|co)\b\.?", re.IGNORECASE)


def normalise(text: str) -> str:
    """Lower case, trademarks and company suffixes dropped, runs of other characters one '-' (as CLBlast
    normalises device names, so that one device reports one name across drivers and platforms)."""
    return re.sub(r"[^a-z0-9.+]+", "-", _NOISE.sub(" ", text).lower()).strip("-")


_TYPES = {"CPU": "cpu", "GPU": "gpu", "ACCELERATOR": "accelerator"}


def _info(cl: Any, index: int, dev: Any) -> DeviceInfo:
    kind = next((v for k, v in _TYPES.items() if dev.type & getattr(cl.device_type, k)), "other")
    return DeviceInfo(
        index=index, name=dev.name.strip(), vendor=dev.vendor.strip(), driver=dev.driver_version.strip(),
        version=dev.version.strip(), type=kind, compute_units=int(dev.max_compute_units),
        global_memory=int(dev.global_mem_size), local_memory=int(dev.local_mem_size),
        max_work_group_size=int(dev.max_work_group_size),
        max_work_item_sizes=tuple(int(n) for n in dev.max_work_item_sizes),
        unified_memory=bool(dev.host_unified_memory), base_align=max(1, int(dev.mem_base_addr_align) // 8),
        fp64="cl_khr_fp64" in dev.extensions.split())


def _all_devices(cl: Any) -> list[Any]:
    """Every device of every platform, in a fixed order: `opencl:N` is the N-th."""
    try:
        platforms = cl.get_platforms()
    except cl.Error:  # the ICD loader finds no platform: PLATFORM_NOT_FOUND_KHR
        return []
    devices = []
    for p in platforms:
        try:
            devices.extend(p.get_devices())
        except cl.Error:  # a platform with no device of any type
            continue
    return devices


def opencl_devices() -> list[dict[str, Any]]:
    """`describe()` of every OpenCL device; none without pyopencl or a platform."""
    try:
        cl = _cl()
    except CtxrtError:
        return []
    return [_info(cl, k, d).describe() for k, d in enumerate(_all_devices(cl))]


def open_device(index: int) -> tuple[Any, DeviceInfo]:
    """(pyopencl device, its info) for `opencl:index`; one clear error when there is no such device."""
    cl = _cl()
    devices = _all_devices(cl)
    if not devices:
        raise CtxrtError(f"no OpenCL platform or device found: {INSTALL_HINT}")
    if not 0 <= index < len(devices):
        raise CtxrtError(f"no OpenCL device {index}: this machine has {len(devices)} "
                         f"(0..{len(devices) - 1}, see `ctxrt devices`)")
    return devices[index], _info(cl, index, devices[index])
