"""The OpenCL kernel contract (docs/opencl.md): a kernel is a `.cl` file, a `ClKernel` subclass that says
which program it needs and how to launch it, and a tunable `Space` declared as data.

    class Foo(ClKernel):
        source = "foo.cl"                           # kernels/foo.cl, shipped as package data
        space = Space(params={"WGS": (64, 128, 256), "VW": (1, 2, 4)},
                      defaults={"cpu": {"WGS": 64, "VW": 4}, "gpu": {"WGS": 256, "VW": 1}},
                      work_group=lambda p: p["WGS"])
        def __init__(self, spec, backend, params=None):
            super().__init__(spec, backend, params)     # resolves and checks the parameters
            ...                                          # decline what it cannot do: UnsupportedOpError
        def defines(self):                          # the -D build options: dtypes and parameters
            return {"T": "float", **self.params}
        def bind(self, ins, outs, scratch):         # ClTensors in; a launch that only enqueues
            k = self.kernel("foo", ins[0].mem, np.uint64(ins[0].offset), ...)
            return self.launch(k, (n,), (self.params["WGS"],))

Registered in registry.py as `{op: factory(spec, backend)}`. A tuner needs nothing kernel-specific: it
expands `space.candidates(problem, device)` (pruned by the constraints, the work-group limit and local
memory), builds `type(kernel)(spec, backend, params)` for each, and times its launch, which returns the
OpenCL event (profiling info when the backend's queue profiles).
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
from collections.abc import Callable, Container, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from ctxrt import dtypes
from ctxrt.backends.kernel import Kernel, Launch, NodeSpec
from ctxrt.backends.opencl.device import DeviceInfo
from ctxrt.backends.opencl.program import ProgramKey
from ctxrt.errors import UnsupportedOpError

if TYPE_CHECKING:
    from ctxrt.backends.opencl.backend import OpenCLBackend

Params = Mapping[str, Any]
# A constraint sees a configuration and the problem (sizes the kernel instance declares) and says if it is valid.
Constraint = Callable[[Params, Mapping[str, int]], bool]


@dataclass(frozen=True)
class Space:
    """A kernel's tunable parameters as data (CLBlast style): candidates per name, the constraints that prune
    them before anything runs, and defaults per device type and kernel variant ("cpu:nt", else "cpu", else
    "default": the first key present wins, as CLBlast's database falls back level by level). `work_group` gives a
    configuration's local size, `local_memory` its bytes of local memory for a problem."""

    params: Mapping[str, tuple[Any, ...]]
    defaults: Mapping[str, Params]
    constraints: tuple[Constraint, ...] = ()
    work_group: Callable[[Params], tuple[int, ...]] = field(default=lambda p: (1,))
    local_memory: Callable[[Params, Mapping[str, int]], int] = field(default=lambda p, problem: 0)

    def default(self, device: DeviceInfo, variant: str = "", problem: Mapping[str, int] | None = None
                ) -> dict[str, Any]:
        """The first default of the chain present (valid for `problem` on `device` where one is given: a default
        for the device type that this problem or device refuses falls back to the next level, not to the CPU)."""
        found = [self.defaults[k] for k in (f"{device.type}:{variant}", device.type, "default") if k in self.defaults]
        if not found:
            raise KeyError("a Space needs a 'default' entry")
        valid = [p for p in found if problem is None or self.why_invalid(p, problem, device) is None]
        return dict((valid or found)[0])

    def why_invalid(self, p: Params, problem: Mapping[str, int], device: DeviceInfo) -> str | None:
        """None when `p` can run on `device` for `problem`, else the reason."""
        unknown = set(p) ^ set(self.params)
        if unknown:
            return f"parameters {sorted(unknown)} do not match the space's {sorted(self.params)}"
        for name, value in p.items():
            if value not in self.params[name]:
                return f"{name}={value!r} is not one of {self.params[name]}"
        wg = self.work_group(p)
        if int(np.prod(wg)) > device.max_work_group_size or any(
                n > m for n, m in zip(wg, device.max_work_item_sizes, strict=False)):
            return f"work-group {wg} exceeds the device's {device.max_work_group_size} work-items"
        local = self.local_memory(p, problem)
        if local > device.local_memory:
            return f"{local} bytes of local memory exceed the device's {device.local_memory}"
        for c in self.constraints:
            if not c(p, problem):
                return f"a constraint of the space refuses {dict(p)}"
        return None

    def candidates(self, problem: Mapping[str, int], device: DeviceInfo) -> Iterator[dict[str, Any]]:
        """Every valid configuration, in declaration order."""
        names = list(self.params)
        for values in itertools.product(*(self.params[n] for n in names)):
            p = dict(zip(names, values, strict=True))
            if self.why_invalid(p, problem, device) is None:
                yield p

    def digest(self) -> str:
        """Hash of the candidates (not the constraints' code): part of a tuned kernel's signature."""
        return hashlib.sha256(json.dumps({k: list(v) for k, v in self.params.items()}, sort_keys=True,
                                         default=str).encode()).hexdigest()[:16]


# numpy dtype -> OpenCL C type
CL_TYPES = {"float32": "float", "float64": "double", "int8": "char", "uint8": "uchar", "int16": "short",
            "uint16": "ushort", "int32": "int", "uint32": "uint", "int64": "long", "uint64": "ulong",
            "bool": "uchar"}
# Half-precision constants a node reads (ir/passes/half.py lists them in its `widen` attribute): no kernel computes
# in half (that needs cl_khr_fp16); a kernel that reads such inputs as stored, as float (vload_half, halfload.clh's
# WTYPE), names them in `half_inputs`; any other node with a `widen` attribute is declined (runs on the CPU, which
# widens them). Bytes of half are never read as float.
WIDEN = "widen"  # as ir/passes/half.py writes it
HALF_TYPES = {np.dtype(np.float16): 1, dtypes.BFLOAT16: 2}  # halfload.clh's WTYPE of each half dtype


def weight_type(spec: NodeSpec, index: int, t: str) -> int:
    """How a kernel computing in OpenCL type `t` reads input `index` (halfload.clh's WTYPE): 0 as `t`, 1 float16,
    2 bfloat16 (a half constant the node lists in `widen`, read as float)."""
    if index not in (spec.attr(WIDEN) or ()):
        return 0
    dt = np.dtype(spec.inputs[index].dtype)
    if dt not in HALF_TYPES or t != "float":
        raise UnsupportedOpError(f"{spec.op} node {spec.name!r}: no OpenCL kernel for {dt} input {index} with "
                                 f"{t} arithmetic")
    return HALF_TYPES[dt]


class ClKernel(Kernel):
    """An OpenCL kernel for one node at fixed shapes with resolved tunable parameters."""

    source: ClassVar[str]
    space: ClassVar[Space]
    half_inputs: ClassVar[Container[int]] = ()  # inputs it reads as half where the node's `widen` lists them

    @property
    def algorithm(self) -> str:  # type: ignore[override]
        """What `inspect --kernels` names: the device kernel's class (a step in a CPU partition names the CPU's)."""
        return f"opencl:{type(self).__name__}"

    def __init__(self, spec: NodeSpec, backend: OpenCLBackend, params: Params | None = None) -> None:
        self.spec = spec
        self.backend = backend
        halves = [i for i in spec.attr(WIDEN) or () if i not in self.half_inputs]
        if halves:
            raise UnsupportedOpError(f"{spec.op} node {spec.name!r}: OpenCL {type(self).__name__} does not read "
                                     f"the half-precision constant inputs {halves}")
        self.params: dict[str, Any] = (self.space.default(backend.info, self.variant(), self.problem())
                                       if params is None else dict(params))
        why = self.space.why_invalid(self.params, self.problem(), backend.info)
        if why is not None:
            raise UnsupportedOpError(f"{spec.op} node {spec.name!r}: OpenCL {type(self).__name__}: {why}")

    def problem(self) -> dict[str, int]:
        """The sizes constraints are checked against (e.g. M, N, K)."""
        return {}

    def variant(self) -> str:
        """Which defaults of the space fit this problem (e.g. "nt" for a GEMM with B stored [N, K])."""
        return ""

    def defines(self) -> dict[str, Any]:
        """Build options as macros; together with the source they name the program."""
        return dict(self.params)

    @property
    def divides(self) -> bool:
        """Whether its float divisions must round as NumPy's (quantized kernels' scales): then its program is
        built with DIVIDE where the device takes it."""
        return False

    @property
    def programs(self) -> tuple[ProgramKey, ...]:  # type: ignore[override]
        key = ProgramKey.make(self.source, self.defines())
        if self.divides and _correct_divide(self.backend):
            key = ProgramKey(key.name, key.source_hash, f"{key.options} {DIVIDE}")
        return (key,)

    def cl_type(self, dtype: np.dtype) -> str:
        """The OpenCL type of a dtype this device can compute in; declines (falls back) otherwise."""
        name = np.dtype(dtype).name
        if name not in CL_TYPES or (name == "float64" and not self.backend.info.fp64):
            raise UnsupportedOpError(f"{self.spec.op} node {self.spec.name!r}: no OpenCL kernel for {name} on "
                                     f"{self.backend.info.name}")
        return CL_TYPES[name]

    def kernel(self, name: str, *args: Any) -> Any:
        """A kernel object of this kernel's program with its arguments set once (one per launch)."""
        (key,) = self.programs
        k = self.backend.cl.Kernel(self.backend.programs.get(key), name)
        k.set_args(*args)
        return k

    def launch(self, k: Any, global_size: tuple[int, ...], local_size: tuple[int, ...]) -> Launch:
        """A launch that enqueues `k` and returns its event. The global size is rounded up to whole work-groups
        (kernels bound-check their indices)."""
        gsize = tuple(-(-g // w) * w for g, w in zip(global_size, local_size, strict=True))
        if not all(gsize):  # nothing to compute (a zero-size part); OpenCL < 2.1 refuses an empty range
            return lambda: None
        enqueue, queue = self.backend.cl.enqueue_nd_range_kernel, self.backend.queue
        return lambda: enqueue(queue, k, gsize, local_size)


# Float division rounded as NumPy's (OpenCL's own may be 2.5 ulp off). Dividing through double in the kernel is not
# enough alone: a compiler may fold (float)((double)x / (double)y) back into a float division (exact for floats),
# which NVIDIA's OpenCL then rounds approximately (DynamicQuantizeMatMul's scale an ulp off on an H100 and an H200).
DIVIDE = "-cl-fp32-correctly-rounded-divide-sqrt"


def _correct_divide(backend: Any) -> bool:
    try:
        return _divides_correctly(backend.device, backend.cl.device_fp_config.CORRECTLY_ROUNDED_DIVIDE_SQRT)
    except AttributeError:  # (no such query: plain division)
        return False


@functools.cache
def _divides_correctly(device: Any, flag: int) -> bool:
    """Whether the device takes DIVIDE (CL_FP_CORRECTLY_ROUNDED_DIVIDE_SQRT in its single_fp_config)."""
    return bool(device.single_fp_config & flag)
