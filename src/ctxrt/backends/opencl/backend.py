"""`OpenCLBackend`: the Backend protocol on one OpenCL device (one context, one in-order queue).

Memory: every buffer is a cl.Buffer; tensors are (buffer, byte offset). Where the device shares memory with
the host (host_unified_memory: PoCL, integrated and phone GPUs) buffers are host-visible and mapped once, so
host access (copies of raw IO, CPU partitions) touches the same memory without a transfer; elsewhere (a
discrete GPU) the host reaches device memory only through explicit copies, which the runtime counts.
`CTXRT_OPENCL_ZERO_COPY=0` takes the copy path on any device (to test it where there is no discrete GPU).

Launches only enqueue; `run` finishes the queue once at the end. Nodes without an OpenCL kernel run on the
cpu backend (`fallback`), in CPU partitions the runtime synchronises at their boundaries only.
"""

from __future__ import annotations

import functools
import os
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np

import ctxrt
from ctxrt.backends.base import Backend
from ctxrt.backends.cpu.backend import small_ufunc_buffers
from ctxrt.backends.kernel import KernelFactory
from ctxrt.backends.opencl.device import normalise, open_device
from ctxrt.backends.opencl.memory import ClBuffer, ClTensor
from ctxrt.backends.opencl.program import ProgramStore
from ctxrt.errors import CtxrtError, RegistrationError, ShapeError

ZERO_COPY_ENV = "CTXRT_OPENCL_ZERO_COPY"


class OpenCLBackend:
    """One OpenCL device. `get_backend("opencl:N")` shares one instance per device; make your own (e.g. with
    `zero_copy=False` or `profiling=True`) for a separate context and queue."""

    name = "opencl"

    def __init__(self, index: int = 0, zero_copy: bool | None = None, profiling: bool = False) -> None:
        import pyopencl as cl

        from ctxrt.backends import get_backend
        from ctxrt.backends.opencl.registry import KERNELS

        self.cl = cl
        self.device, self.info = open_device(index)
        self.context = cl.Context([self.device])
        props = cl.command_queue_properties.PROFILING_ENABLE if profiling else 0
        self.queue = cl.CommandQueue(self.context, self.device, properties=props)
        env = os.environ.get(ZERO_COPY_ENV, "")
        if zero_copy and not self.info.unified_memory:
            # a buffer mapped for the host is a copy of the device's on such a device (a discrete GPU): kernels
            # and the host would each see their own bytes (the outputs of CPU partitions read back as zeros)
            raise CtxrtError(f"zero_copy=True needs a device whose memory is shared with the host; "
                             f"{self.info.name} has its own memory: use zero_copy=False (copies, the default there)")
        self.zero_copy = self.info.unified_memory and env != "0" if zero_copy is None else bool(zero_copy)
        # Arena offsets and registered buffers' starts are multiples of this: 16-float vector loads stay aligned.
        # Kernels take (buffer, offset) arguments, so no tensor needs to be a sub-buffer: MEM_BASE_ADDR_ALIGN
        # (512 bytes on some GPUs) would waste arena space if every tensor had to start on it.
        self.alignment = 64
        self.stats: Counter[str] = Counter()  # buffers made, programs built outside any context
        self.programs = ProgramStore(self)
        self.fallback: Backend | None = get_backend("cpu")
        self.kernels: dict[str, KernelFactory] = {op: functools.partial(f, backend=self) for op, f in KERNELS.items()}

    def __repr__(self) -> str:
        mode = "zero-copy" if self.zero_copy else "copies"
        return f"OpenCLBackend({self.info.index}: {self.info.name}, {mode})"

    def lower(self, graph: Any, options: Any) -> Any:
        """The OpenCL backend's own passes, last before kernels are chosen: QDQ units fused into integer ops (as on
        the CPU), half precision computed in float32 (half weights stay half: the kernels read them with
        vload_half), then MatMuls' bias, residual and Relu/Gelu folded into the GEMM's epilogue."""
        from ctxrt.backends.opencl.gemm import fold_epilogues
        from ctxrt.ir.passes.fuse_gelu import FuseGelu
        from ctxrt.ir.passes.half import ComputeHalfInFloat
        from ctxrt.ir.passes.qdq import FuseQDQUnits

        graph = FuseQDQUnits()(graph).graph  # DequantizeLinear -> op -> QuantizeLinear as integer kernels
        half = ComputeHalfInFloat()(graph)  # float16/bfloat16 computed in float32, half weights read as stored
        graph = half.graph
        if half.modified:  # a float16 model's GELU, which the generic pass did not see through its Casts
            graph = FuseGelu()(graph).graph
        return fold_epilogues(graph, self)

    # -- memory --------------------------------------------------------------------------------------
    def alloc_shared(self, nbytes: int, alignment: int = 64) -> ClBuffer:
        return ClBuffer(self, int(nbytes), int(alignment), host_visible=True)

    def alloc_device(self, nbytes: int) -> ClBuffer:
        return ClBuffer(self, int(nbytes), self.alignment, host_visible=self.zero_copy)

    def wrap_host(self, block: np.ndarray) -> None:
        return None  # weights get one device buffer, uploaded once at finalize

    def view(self, buf: ClBuffer, offset: int, shape: tuple[int, ...], dtype: np.dtype | str) -> ClTensor:
        if not isinstance(buf, ClBuffer):
            raise RegistrationError(f"the opencl backend needs its own buffers (alloc_shared), got "
                                    f"{type(buf).__name__}")
        if buf.released:
            raise RegistrationError("buffer was released")
        t = ClTensor(buf, int(offset), tuple(int(d) for d in shape), np.dtype(dtype))
        if offset < 0 or offset + t.nbytes > buf.nbytes:
            raise RegistrationError(f"view of {t.nbytes} bytes at offset {offset} is outside a buffer of "
                                    f"{buf.nbytes} bytes")
        return t

    def host_view(self, tensor: ClTensor) -> np.ndarray | None:
        return tensor.host

    # -- copies (blocking: done when they return; the queue is idle around them) ---------------------
    def copy_in(self, dst: ClTensor, src: Any) -> None:
        if isinstance(src, ClTensor):
            _check_same(dst, src.shape, src.dtype)
            if dst.host is not None and src.host is not None:
                np.copyto(dst.host, src.host)
            elif src.nbytes:
                self.cl.enqueue_copy(self.queue, dst.mem, src.mem, byte_count=src.nbytes, src_offset=src.offset,
                                     dst_offset=dst.offset).wait()
            return
        src = np.asarray(src)
        _check_same(dst, src.shape, src.dtype)
        if dst.host is not None:
            np.copyto(dst.host, src, casting="no")
        elif dst.nbytes:
            self.cl.enqueue_copy(self.queue, dst.mem, np.ascontiguousarray(src), dst_offset=dst.offset,
                                 is_blocking=True)

    def copy_out(self, dst: np.ndarray, src: ClTensor) -> None:
        _check_same(src, dst.shape, dst.dtype)
        if src.host is not None:
            np.copyto(dst, src.host, casting="no")
        elif src.nbytes:
            out = dst if dst.flags.c_contiguous and dst.flags.writeable else np.empty(dst.shape, dst.dtype)
            self.cl.enqueue_copy(self.queue, out, src.mem, src_offset=src.offset, is_blocking=True)
            if out is not dst:
                np.copyto(dst, out)

    # -- running -------------------------------------------------------------------------------------
    def run(self, launches: list[Callable[[], Any]]) -> None:
        """Enqueue every launch (CPU partition steps synchronise before they touch memory), then one finish."""
        with small_ufunc_buffers():
            for launch in launches:
                launch()
        self.queue.finish()

    def sync(self) -> None:
        self.queue.finish()

    def threads(self, num_threads: int | None) -> Any:
        """Around each run: the host's pools (BLAS, OpenMP: CPU partitions) held as the cpu backend holds them;
        PoCL's own worker threads are its own."""
        return self.fallback.threads(num_threads)

    def device_id(self) -> dict[str, str]:
        info = self.info
        return {"backend": "opencl", "vendor": normalise(info.vendor), "device": info.name,
                "driver": info.driver, "tier": info.tier, "ctxrt": ctxrt.__version__}


def _check_same(t: ClTensor, shape: tuple[int, ...], dtype: Any) -> None:
    if tuple(shape) != t.shape or np.dtype(dtype) != t.dtype:
        raise ShapeError(f"copy between {t.dtype}{list(t.shape)} and {np.dtype(dtype)}{list(shape)}")
