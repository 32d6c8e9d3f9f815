"""The NumPy backend: buffers are aligned uint8 arrays, tensors are views at offsets into them."""

from __future__ import annotations

import contextlib
import math
import os
import platform
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

import ctxrt
from ctxrt.backends.cpu import onednn, strided
from ctxrt.backends.cpu.onednn import api as onednn_api
from ctxrt.backends.cpu.registry import KERNELS
from ctxrt.backends.cpu.threads import ThreadScope
from ctxrt.backends.kernel import NodeSpec, TensorSpec
from ctxrt.errors import CtxrtError, RegistrationError
from ctxrt.ir import memo
from ctxrt.ir.graph import Graph as IRGraph
from ctxrt.ir.graph import Node
from ctxrt.ir.layouts import Layout

_UFUNC_BUFSIZE = 1024


def _quiet() -> tuple[Any, Any] | None:
    """(NumPy's context variable of ufunc settings, the settings of a run), where NumPy 2 has them."""
    try:
        from numpy._core import _ufunc_config as config

        return config._extobj_contextvar, config._make_extobj(all="ignore", bufsize=_UFUNC_BUFSIZE)
    except (ImportError, AttributeError, TypeError):  # another NumPy: setbufsize and seterr, each time
        return None


_QUIET = _quiet()


@contextlib.contextmanager
def small_ufunc_buffers() -> Iterator[None]:
    """NumPy's ufunc iterator buffers strided and broadcast operands in chunks of `bufsize` elements, allocating
    those buffers each call: 1024 keeps them at a few KiB (the default 8192 costs up to 64 KiB a call) at no
    measurable speed cost. Every run of NumPy kernels (here, and CPU partitions of other backends) uses it.
    Floating-point warnings are off meanwhile: a kernel's inf or NaN is its output (a fully masked attention row
    is NaN in onnxruntime too), not a warning to the user."""
    if _QUIET is not None:  # both settings in one swap of NumPy's context variable: 0.4 us, not 10
        token = _QUIET[0].set(_QUIET[1])
        try:
            yield
        finally:
            _QUIET[0].reset(token)
        return
    old, errors = np.setbufsize(_UFUNC_BUFSIZE), np.seterr(all="ignore")
    try:
        yield
    finally:
        np.setbufsize(old)
        np.seterr(**errors)


class CpuBuffer:
    """An aligned host allocation. `array` is the uint8 view of exactly `nbytes` bytes."""

    def __init__(self, nbytes: int, alignment: int = 64) -> None:
        if nbytes < 0 or alignment <= 0 or alignment & (alignment - 1):
            raise RegistrationError(f"bad allocation: {nbytes} bytes aligned to {alignment}")
        raw = np.empty(nbytes + alignment, np.uint8)
        start = -raw.ctypes.data % alignment
        self.array: np.ndarray | None = raw[start:start + nbytes]
        self.nbytes = nbytes
        self.allocated = raw.nbytes  # with the alignment slack
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
        buf.array, buf.nbytes, buf.allocated, buf.alignment = block, int(block.nbytes), int(block.nbytes), 64
        buf.address, buf.holders = int(block.ctypes.data), 0
        return buf


_DECIDED = object()  # the memo's source object of oneDNN's answers in a range compile (`_decided`)


def _decided(g: IRGraph, node: Node, how: Any, ask: Callable[[], bool]) -> bool:
    """Whether oneDNN runs `node` (as `how` says: layouts, or "laid"): in a range compile, asked at its first probe
    (the upper bound) and taken as such at the others, per node, its attributes and its inputs' dtypes, ranks and
    constness (ir/memo.py; ~0.5 ms of primitive descriptors a probe for a 4-layer decoder's 66 questions). A probe
    whose shapes oneDNN would refuse then fails building that kernel or compiles another one: the probes differ,
    and the range compile fails as it did when the answers differed (a RangeError)."""
    ins = tuple((np.dtype(v.dtype).str, len(v.shape), v.is_const) if v is not None else None
                for v in (g.values.get(n) if n else None for n in node.inputs))
    key = (node.name, node.op, how, repr(sorted(node.attrs.items(), key=lambda kv: kv[0])), ins)
    return memo.memo("onednn_supports", _DECIDED, key, ask)


class CpuBackend:
    """NumPy kernels, and oneDNN's for convolution chains where it is installed (a dependency on Linux x86-64).

    `onednn`: None uses it when installed, False never, True requires it. `layout`: the layout the compiler
    gives oneDNN's chains ("nhwc", "nChw8c" or "nChw16c"); channels-last measured fastest with oneDNN 3.2 on
    AVX2 and AVX-512 and fits any channel count (ShuffleNet's groups of 34 channels fit no block)."""

    name = "cpu"
    alignment = 64
    kernels = KERNELS
    fallback = None  # every op ctxrt supports has a NumPy kernel
    programs = None  # nothing is built: NumPy kernels are Python

    def __init__(self, onednn: bool | None = None, layout: str = "nhwc") -> None:
        from ctxrt.ir.layouts import LAYOUTS, PLAIN

        self.stats: Counter[str] = Counter()  # buffers made (a steady loop makes none)

        if layout not in LAYOUTS or LAYOUTS[layout] is PLAIN:
            raise CtxrtError(f"layout must be one of {[k for k, v in LAYOUTS.items() if v is not PLAIN]}, "
                             f"got {layout!r}")
        if onednn and not onednn_api.available():
            raise CtxrtError("oneDNN was asked for but is not installed: pip install onednn-cpu-gomp (Linux x86-64)")
        self.onednn = onednn_api.available() if onednn is None else bool(onednn)
        self.layout = LAYOUTS[layout]

    def lower(self, graph: IRGraph, options: Mapping[str, Any]) -> IRGraph:
        """The CPU's own passes, last before kernels are chosen: QDQ units fused into integer ops, half precision
        computed in float32, channel shuffles fused, then (with oneDNN) layouts assigned and MatMuls' bias,
        residual and activation folded into oneDNN's epilogue."""
        from ctxrt.ir.layouts import PLAIN
        from ctxrt.ir.passes.fuse_epilogue import FuseConvActivation, FuseMatMulEpilogue
        from ctxrt.ir.passes.fuse_gelu import FuseGelu
        from ctxrt.ir.passes.half import ComputeHalfInFloat
        from ctxrt.ir.passes.layout import AssignLayouts
        from ctxrt.ir.passes.qdq import FuseQDQUnits
        from ctxrt.ir.passes.shuffle import FuseChannelShuffle

        graph = FuseQDQUnits()(graph).graph  # DequantizeLinear -> op -> QuantizeLinear as integer kernels
        half = ComputeHalfInFloat()(graph)  # no half-precision arithmetic here: float32 inside
        graph = half.graph
        if half.modified:  # a float16 model's GELU, which the generic pass did not see through its Casts
            graph = FuseGelu()(graph).graph
        graph = FuseChannelShuffle()(graph).graph
        if not self.onednn:
            return graph
        for node in graph.nodes:
            if node.op == "ChannelShuffle" and graph.values[node.inputs[0]].dtype == np.float32:
                node.attrs = {**node.attrs, "kernel": onednn.NAME}  # one strided reorder
        probe = {**options, "probe": True}

        def supports(g: IRGraph, node: Node, src: Layout, dst: Layout) -> bool:
            return _decided(g, node, (src.name, dst.name), lambda: onednn.supports(_spec(g, node, src, dst, probe)))

        graph = AssignLayouts(self.layout, onednn.NAME, set(onednn.LAYOUT_OPS), set(onednn.PLAIN_OPS),
                              supports)(graph).graph
        graph = FuseConvActivation(onednn.NAME, lambda g, node: _decided(
            g, node, "laid", lambda: onednn.supports(_laid_spec(g, node, probe))))(graph).graph
        return FuseMatMulEpilogue(onednn.NAME, lambda g, node: supports(g, node, PLAIN, PLAIN),
                                  {"Relu", "Gelu", "Swish"})(graph).graph

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
        n = math.prod(shape) * dt.itemsize
        if offset < 0 or offset + n > buf.nbytes:
            raise RegistrationError(f"view of {n} bytes at offset {offset} is outside a buffer of "
                                    f"{buf.nbytes} bytes")
        return buf.array[offset:offset + n].view(dt).reshape(shape)

    def strided_view(self, buf: CpuBuffer, offset: int, shape: tuple[int, ...], dtype: np.dtype | str,
                     strides: tuple[int, ...]) -> np.ndarray:
        """A window of a larger tensor in `buf` (mem_register checked that it lies inside)."""
        if not isinstance(buf, CpuBuffer) or buf.array is None:
            raise RegistrationError("strided view: not a live cpu buffer")
        return np.ndarray(shape, np.dtype(dtype), buf.array, offset, strides)

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

    @staticmethod
    def batch(launches: list[Callable[[], None]], cache: dict[Any, Any] | None = None) -> list[Callable[[], None]]:
        """What `run` replays: each run of native launches as one call (backends/cpu/strided.py); `cache`, a dict
        the caller keeps, serves runs of launches batched before."""
        return strided.batch(launches, cache)

    def sync(self) -> None:
        """NumPy kernels are done when their launch returns."""

    def threads(self, num_threads: int | None) -> ThreadScope:
        """What a context enters around each run: BLAS and OpenMP held to `num_threads` (None: the idle cores)."""
        return ThreadScope(num_threads)

    def device_id(self) -> dict[str, str]:
        return {"backend": "cpu", "device": platform.machine(), "driver": f"numpy {np.__version__}",
                "ctxrt": ctxrt.__version__}

    @staticmethod
    def describe() -> dict[str, Any]:
        """This backend as `ctxrt devices` lists it; `provider` says whose kernels run its convs, pools and GEMMs,
        and whether ctxrt's native kernels (docs/cpu.md, "Native kernels") are built."""
        from ctxrt.backends.cpu import native
        from ctxrt.backends.cpu.onednn import api

        lib = native.library()
        extra = f"; native kernels {lib.ctxrt_isa().decode()}" if lib is not None else \
            "; native kernels off or not built (NumPy's run in their place)"
        return {"backend": "cpu", "index": None, "name": platform.processor() or platform.machine(),
                "vendor": "", "driver": f"numpy {np.__version__}", "compute_units": os.cpu_count() or 1,
                "global_memory": _physical_memory(), "unified_memory": True,
                "provider": (api.describe() or "numpy (oneDNN is not installed: pip install onednn-cpu-gomp)") + extra}


def _physical_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not POSIX
        return 0


def _laid_spec(graph: IRGraph, node: Node, options: dict[str, Any]) -> NodeSpec:
    """A node after the layout pass as its kernel will see it: its values' shapes are the stored ones already,
    its `src_layout` and `dst_layout` attributes say how."""
    def tensor(name: str) -> TensorSpec | None:
        return TensorSpec(tuple(graph.values[name].shape), np.dtype(graph.values[name].dtype)) if name else None

    return NodeSpec(node.op, node.name, dict(node.attrs), [tensor(n) for n in node.inputs],
                    [tensor(n) for n in node.outputs if n], [graph.values[n].const if n else None for n in node.inputs],
                    graph.opset, options)


def _spec(graph: IRGraph, node: Node, src: Layout, dst: Layout, options: dict[str, Any]) -> NodeSpec:
    """The node as its kernel would see it with input 0 stored in `src` and output 0 (and a fused residual)
    in `dst`."""
    def tensor(name: str, layout: Layout | None) -> TensorSpec | None:
        if not name:
            return None
        v = graph.values[name]
        stored = layout is not None and layout.name != "nchw"  # plain: the IR shape, whatever its rank
        return TensorSpec(layout.physical(v.shape) if stored else tuple(v.shape), np.dtype(v.dtype))

    stored = {0: src, 3: dst if node.attrs.get("residual") else None}
    ins = [tensor(n, stored.get(i)) for i, n in enumerate(node.inputs)]
    outs = [tensor(n, dst if k == 0 else None) for k, n in enumerate(node.outputs) if n]
    attrs = {**node.attrs, "kernel": onednn.NAME, "src_layout": src.name, "dst_layout": dst.name}
    consts = [graph.values[n].const if n else None for n in node.inputs]
    return NodeSpec(node.op, node.name, attrs, ins, outs, consts, graph.opset, options)
