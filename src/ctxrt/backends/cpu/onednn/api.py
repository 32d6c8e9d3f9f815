"""The part of oneDNN 3.x's C API ctxrt uses, through ctypes: memory descriptors, primitive descriptors and
primitives, memory objects over caller-owned memory, user-managed scratchpads.

The library comes from PyPI's `onednn-cpu-gomp` wheel (a dependency of ctxrt on Linux x86-64), which installs
`libdnnl.so.3` into the environment's `lib/`. Enum values are those of oneDNN 3.2's headers (`dnnl_types.h`);
format tags are looked up by name through `dnnl_fmt_tag2str`, so a binary records names, not numbers.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import ctypes.util
import os
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ctxrt.backends.cpu import native
from ctxrt.backends.kernel import ARRAY_FREE
from ctxrt.errors import CtxrtError, UnsupportedOpError

# dnnl_types.h (oneDNN 3.2)
F32, S32, S8, U8 = 3, 4, 5, 6
TAG_ANY = 1
FORWARD_INFERENCE = 96
CONVOLUTION_DIRECT, DECONVOLUTION_DIRECT = 1, 0xA
ELTWISE_RELU, ELTWISE_GELU_TANH, ELTWISE_SWISH, ELTWISE_GELU_ERF = 32, 43, 44, 49
ELTWISE_HARDSIGMOID, ELTWISE_HARDSWISH = 40, 52  # dnnl_alg_kind_t, oneDNN 3.x
ELTWISE_TANH, ELTWISE_ELU, ELTWISE_LOGISTIC, ELTWISE_CLIP = 33, 34, 41, 46
POOLING_MAX, POOLING_AVG_INCLUDE, POOLING_AVG_EXCLUDE = 511, 767, 1023
LRN_ACROSS_CHANNELS = 2815
SOFTMAX_ACCURATE = 0x30000
BINARY_ADD = 131056
SCRATCHPAD_USER = 1
ENGINE_CPU = 1
STREAM_DEFAULT = 1
USE_GLOBAL_STATS, USE_SCALE, USE_SHIFT = 1, 2, 4
ARG_SRC, ARG_SRC_1, ARG_DST, ARG_WEIGHTS, ARG_BIAS = 1, 2, 17, 33, 41
ARG_FROM, ARG_TO = ARG_SRC, ARG_DST
ARG_MEAN, ARG_VARIANCE, ARG_SCALE, ARG_SHIFT, ARG_SCRATCHPAD = 49, 50, 51, 52, 80
ARG_POST_OP_BASE = 32768
ARG_ATTR_SCALES, ARG_ATTR_ZERO_POINTS = 4096, 8192  # | ARG_SRC / ARG_WEIGHTS / ARG_DST: int8 runtime parameters
Q_IMPL_INFO, Q_WEIGHTS_MD, Q_WORKSPACE_MD, Q_SCRATCHPAD_MD = 8, 131, 135, 136
# a memory descriptor's queries (dnnl_memory_desc_query): its outer strides, format kind and inner blocks
Q_STRIDES, Q_FORMAT_KIND, Q_INNER_NBLKS, Q_INNER_BLKS, Q_INNER_IDXS = 14, 262, 263, 264, 265
FORMAT_BLOCKED = 2  # dnnl_blocked
MAX_NDIMS = 12
_STATUS = {1: "out of memory", 2: "invalid arguments", 3: "unimplemented", 4: "last implementation reached",
           5: "runtime error", 6: "not required", 7: "invalid graph", 8: "invalid graph op",
           9: "invalid shape", 10: "invalid data type"}

Dims = ctypes.c_int64 * MAX_NDIMS


class ExecArg(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_int), ("memory", ctypes.c_void_p)]


class OneDnnError(CtxrtError):
    """A oneDNN call failed (status code in the message)."""


def post_op_arg(index: int, arg: int) -> int:
    """DNNL_ARG_ATTR_MULTIPLE_POST_OP(index) | arg: an argument of the post-op at `index`."""
    return ARG_POST_OP_BASE * (index + 1) | arg


# -- the library ---------------------------------------------------------------------------------------------
_LOCK = threading.Lock()
_MAKING = threading.Lock()  # around making a primitive on its first launch (Primitive.made)
_STATE: dict[str, Any] = {}


def _candidates() -> list[str]:
    """Where the library may be: $CTXRT_ONEDNN_LIBRARY, the environment's lib/ (where the wheel puts it), the
    system's loader path."""
    paths = [os.environ.get("CTXRT_ONEDNN_LIBRARY", "")]
    for prefix in dict.fromkeys((sys.prefix, sys.exec_prefix, sys.base_prefix)):
        paths += [str(Path(prefix) / "lib" / name) for name in ("libdnnl.so.3", "libdnnl.so", "libdnnl.3.dylib")]
    paths.append(ctypes.util.find_library("dnnl") or "")
    return [p for p in paths if p]


def _prototype(lib: ctypes.CDLL) -> None:
    vp, i, f, i64, sz = ctypes.c_void_p, ctypes.c_int, ctypes.c_float, ctypes.c_int64, ctypes.c_size_t
    pp = ctypes.POINTER(ctypes.c_void_p)
    sig = {
        "dnnl_engine_create": [pp, i, sz], "dnnl_stream_create": [pp, vp, ctypes.c_uint],
        "dnnl_memory_desc_create_with_tag": [pp, i, Dims, i, i], "dnnl_memory_desc_destroy": [vp],
        "dnnl_memory_desc_create_with_strides": [pp, i, Dims, i, Dims],
        "dnnl_memory_desc_clone": [pp, vp], "dnnl_memory_create": [pp, vp, vp, vp], "dnnl_memory_destroy": [vp],
        "dnnl_primitive_attr_create": [pp], "dnnl_primitive_attr_destroy": [vp],
        "dnnl_primitive_attr_set_scratchpad_mode": [vp, i], "dnnl_primitive_attr_set_post_ops": [vp, vp],
        "dnnl_primitive_attr_set_scales_mask": [vp, i, i], "dnnl_primitive_attr_set_zero_points_mask": [vp, i, i],
        "dnnl_post_ops_create": [pp], "dnnl_post_ops_destroy": [vp],
        "dnnl_post_ops_append_eltwise": [vp, i, f, f], "dnnl_post_ops_append_binary": [vp, i, vp],
        "dnnl_convolution_forward_primitive_desc_create": [pp, vp, i, i, vp, vp, vp, vp, Dims, Dims, Dims, Dims, vp],
        "dnnl_deconvolution_forward_primitive_desc_create": [pp, vp, i, i, vp, vp, vp, vp, Dims, Dims, Dims, Dims,
                                                             vp],
        "dnnl_pooling_forward_primitive_desc_create": [pp, vp, i, i, vp, vp, Dims, Dims, Dims, Dims, Dims, vp],
        "dnnl_lrn_forward_primitive_desc_create": [pp, vp, i, i, vp, vp, i64, f, f, f, vp],
        "dnnl_batch_normalization_forward_primitive_desc_create": [pp, vp, i, vp, vp, f, ctypes.c_uint, vp],
        "dnnl_layer_normalization_forward_primitive_desc_create": [pp, vp, i, vp, vp, vp, f, ctypes.c_uint, vp],
        "dnnl_eltwise_forward_primitive_desc_create": [pp, vp, i, i, vp, vp, f, f, vp],
        "dnnl_reorder_primitive_desc_create": [pp, vp, vp, vp, vp, vp],
        "dnnl_matmul_primitive_desc_create": [pp, vp, vp, vp, vp, vp, vp],
        "dnnl_softmax_forward_primitive_desc_create": [pp, vp, i, i, vp, vp, i, vp],
        "dnnl_primitive_desc_query": [vp, i, i, vp], "dnnl_primitive_desc_destroy": [vp],
        "dnnl_primitive_create": [pp, vp], "dnnl_primitive_destroy": [vp],
        "dnnl_primitive_execute": [vp, vp, i, ctypes.POINTER(ExecArg)],
    }
    for name, args in sig.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, ctypes.c_int
    lib.dnnl_primitive_desc_query_md.argtypes, lib.dnnl_primitive_desc_query_md.restype = [vp, i, i], vp
    lib.dnnl_memory_desc_get_size.argtypes, lib.dnnl_memory_desc_get_size.restype = [vp], ctypes.c_size_t
    lib.dnnl_memory_desc_equal.argtypes, lib.dnnl_memory_desc_equal.restype = [vp, vp], ctypes.c_int
    lib.dnnl_fmt_tag2str.argtypes, lib.dnnl_fmt_tag2str.restype = [i], ctypes.c_char_p


def _load() -> ctypes.CDLL | None:
    from ctxrt.backends.cpu import threads

    threads.openmp_waits()  # before libgomp is loaded with libdnnl: short spins, then sleep
    for path in _candidates():
        try:
            lib = ctypes.CDLL(path)
            _prototype(lib)
        except (OSError, AttributeError):
            continue
        threads.refresh()  # libgomp's pool is there now: held to the context's thread count too
        return lib
    return None


def library() -> ctypes.CDLL | None:
    """The loaded libdnnl, or None where it is not installed."""
    if "lib" not in _STATE:
        with _LOCK:
            if "lib" not in _STATE:
                _STATE["lib"] = _load()
    return _STATE["lib"]


def available() -> bool:
    return library() is not None


class _Version(ctypes.Structure):
    _fields_ = [("major", ctypes.c_int), ("minor", ctypes.c_int), ("patch", ctypes.c_int), ("hash", ctypes.c_char_p),
                ("cpu_runtime", ctypes.c_uint), ("gpu_runtime", ctypes.c_uint)]


# dnnl_cpu_isa_t values (oneDNN 3.x) -> name
_ISA = {0x1: "sse41", 0x3: "avx", 0x7: "avx2", 0xF: "avx2_vnni", 0x1F: "avx2_vnni_2", 0x27: "avx512_core",
        0x67: "avx512_core_vnni", 0xE7: "avx512_core_bf16", 0x1E7: "avx512_core_fp16", 0x3E7: "avx512_core_amx",
        0x7E7: "avx512_core_amx_fp16"}


def describe() -> str | None:
    """'oneDNN 3.2.0 (avx2)': the library and the instruction set its kernels use here; None without oneDNN."""
    lib = library()
    if lib is None:
        return None
    lib.dnnl_version.restype = ctypes.POINTER(_Version)
    lib.dnnl_get_effective_cpu_isa.restype = ctypes.c_int
    v = lib.dnnl_version().contents
    isa = lib.dnnl_get_effective_cpu_isa()
    return f"oneDNN {v.major}.{v.minor}.{v.patch} ({_ISA.get(isa, hex(isa))})"


def _isa() -> int:
    """oneDNN's effective CPU ISA (its dnnl_cpu_isa_t bits), 0 where it is not installed."""
    lib = library()
    if lib is None:
        return 0
    lib.dnnl_get_effective_cpu_isa.restype = ctypes.c_int
    return int(lib.dnnl_get_effective_cpu_isa())


def has_avx512() -> bool:
    """Whether oneDNN's kernels here run AVX-512 (avx512_core or later: the ISA's 0x20 bit)."""
    return bool(_isa() & 0x20)


def has_vnni() -> bool:
    """Whether oneDNN's int8 kernels here have VNNI (exact int32 sums of u8 x s8 products); without it they sum
    pairs of products in saturating int16 (exact while |weights| <= 64, onnxruntime's reduce_range)."""
    isa = _isa()
    return isa in (0xF, 0x1F) or bool(isa & 0x40)


def require(what: str) -> ctypes.CDLL:
    lib = library()
    if lib is None:
        raise UnsupportedOpError(f"{what} was compiled to run on oneDNN, which is not installed here: pip install "
                                 "onednn-cpu-gomp (Linux x86-64), or compile the model again where it is absent")
    return lib


def check(status: int, what: str) -> None:
    if status:
        error = UnsupportedOpError if status == 3 else OneDnnError
        raise error(f"oneDNN {what}: {_STATUS.get(status, f'status {status}')}")


def _gemm_layout(x: Any) -> tuple[bytes, int] | None:
    """How dnnl_sgemm reads a 2-D float32 view: rows of unit stride ("N"), or the transpose of such rows ("T": a
    view through a Transpose, attention's keys), and its leading dimension; None for other strides."""
    r, c = x.shape
    s0 = x.strides[0] if r > 1 else 4 * c  # (an axis of one element: any stride)
    s1 = x.strides[1] if c > 1 else 4
    if s1 == 4 and s0 % 4 == 0 and s0 >= 4 * c:
        return b"N", max(s0 // 4, c, 1)
    s0 = x.strides[0] if r > 1 else 4
    s1 = x.strides[1] if c > 1 else 4 * r
    if s0 == 4 and s1 % 4 == 0 and s1 >= 4 * r:
        return b"T", max(s1 // 4, r, 1)
    return None


def sgemm(a: Any, b: Any, out: Any) -> Callable[[], None] | None:
    """A call that computes `out = a @ b` (2-D float32 arrays, `a` and `b` rows of unit stride or the transpose of
    such rows, `out` rows of unit stride; their addresses fixed) with oneDNN's GEMM on OpenMP's threads, the pool a
    context with oneDNN kernels gives the cores (threads.py: BLAS has one there); None without oneDNN or for other
    arrays."""
    lib = library()
    arrays = (a, b, out)
    if lib is None or any(str(x.dtype) != "float32" or x.ndim != 2 for x in arrays) or not out.flags.writeable:
        return None
    (m, k), n = a.shape, b.shape[1]
    if b.shape[0] != k or out.shape != (m, n) or 0 in (m, n, k):
        return None
    la, lb, ly = _gemm_layout(a), _gemm_layout(b), _gemm_layout(out)
    if la is None or lb is None or ly is None or ly[0] != b"N":
        return None
    fn = _STATE.get("sgemm")
    if fn is None:
        fn = lib.dnnl_sgemm
        fn.argtypes = [ctypes.c_char, ctypes.c_char, *[ctypes.c_int64] * 3, ctypes.c_float, ctypes.c_void_p,
                       ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_void_p, ctypes.c_int64]
        fn.restype = ctypes.c_int
        _STATE["sgemm"] = fn
    args = (la[0], lb[0], m, n, k, 1.0, a.ctypes.data, la[1], b.ctypes.data, lb[1], 0.0, out.ctypes.data, ly[1])

    def call() -> None:
        status = fn(*args)
        if status:
            check(status, "sgemm")
    call.arrays = arrays  # type: ignore[attr-defined]  (kept alive with the call)
    return call


def _engine_stream() -> tuple[ctypes.c_void_p, ctypes.c_void_p]:
    if "engine" not in _STATE:
        with _LOCK:
            if "engine" not in _STATE:
                lib = require("a kernel")
                engine, stream = ctypes.c_void_p(), ctypes.c_void_p()
                check(lib.dnnl_engine_create(ctypes.byref(engine), ENGINE_CPU, 0), "engine")
                check(lib.dnnl_stream_create(ctypes.byref(stream), engine, STREAM_DEFAULT), "stream")
                _STATE["stream"] = stream
                _STATE["engine"] = engine
    return _STATE["engine"], _STATE["stream"]


def engine() -> ctypes.c_void_p:
    return _engine_stream()[0]


def stream() -> ctypes.c_void_p:
    return _engine_stream()[1]


# -- format tags by name -----------------------------------------------------------------------------------
def tags() -> dict[str, int]:
    """Format tag name (e.g. "aBcd16b") -> enum value of the loaded library."""
    if "tags" not in _STATE:
        lib = require("a kernel")
        names: dict[str, int] = {}
        for value in range(1, 4096):
            raw = lib.dnnl_fmt_tag2str(value)
            name = raw.decode() if raw else ""
            if not name or name.startswith(("unknown", "undef")) or name in ("any", "format_tag_last"):
                continue
            names.setdefault(name, value)
        _STATE["tags"] = names
    return _STATE["tags"]


def tags_of_rank(n: int) -> list[tuple[str, int]]:
    """The format tags (name, value) over exactly the first `n` dims' letters, in the library's order."""
    per = _STATE.setdefault("tags_by_rank", {})
    if n not in per:
        letters = set("abcdefghijkl"[:n])
        per[n] = [(name, v) for name, v in tags().items() if {c.lower() for c in name if c.isalpha()} == letters]
    return per[n]


def tag(name: str) -> int:
    try:
        return tags()[name]
    except KeyError:
        raise UnsupportedOpError(f"oneDNN here has no memory format {name!r}: the context was compiled with "
                                 "another oneDNN version; compile it again") from None


# -- objects -----------------------------------------------------------------------------------------------
_DESCS_MAX = 2048  # descriptors made by Desc.make kept for reuse (a few hundred bytes of oneDNN's each)


class Desc:
    """An owned memory descriptor (or a borrowed one, owned by a primitive descriptor)."""

    def __init__(self, handle: ctypes.c_void_p | int, owned: bool = True, keep: Any = None) -> None:
        self.handle = ctypes.c_void_p(handle) if isinstance(handle, int) else handle
        self.owned, self._keep = owned, keep

    @classmethod
    def make(cls, dims: Sequence[int], fmt: int | str, dtype: int = F32) -> Desc:
        """The descriptor of these dims in this format tag: one object per (dims, tag, type), shared (descriptors
        are never changed once made; a compile asks for the same few hundred ~1,000 times, ~4 us each)."""
        key = (tuple(int(d) for d in dims), fmt, dtype)
        desc = _DESCS.get(key)
        if desc is None:
            lib = library()
            md = ctypes.c_void_p()
            value = tag(fmt) if isinstance(fmt, str) else fmt
            check(lib.dnnl_memory_desc_create_with_tag(ctypes.byref(md), len(dims), Dims(*dims), dtype, value),
                  f"memory descriptor {list(dims)} {fmt}")
            if len(_DESCS) >= _DESCS_MAX:
                _DESCS.clear()
            desc = _DESCS[key] = cls(md)
        return desc

    @classmethod
    def strided(cls, dims: Sequence[int], strides: Sequence[int]) -> Desc:
        """A float32 descriptor with explicit strides (in elements)."""
        md = ctypes.c_void_p()
        check(library().dnnl_memory_desc_create_with_strides(ctypes.byref(md), len(dims), Dims(*dims), F32,
                                                             Dims(*strides)), f"memory descriptor {list(dims)}")
        return cls(md)

    @property
    def nbytes(self) -> int:
        return int(library().dnnl_memory_desc_get_size(self.handle)) if self.handle else 0

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Desc) and bool(library().dnnl_memory_desc_equal(self.handle, other.handle))

    __hash__ = None  # type: ignore[assignment]

    def tag_name(self, dims: Sequence[int]) -> str | None:
        """The name of the format tag that describes this descriptor (dims as given), or None: the name its
        blocking spells (`_spelled`) where that tag gives this descriptor, else the first tag of its rank that
        does (the ~760 tags were tried one descriptor each: 60% of MobileNetV3's compile)."""
        for name in self._spelled(len(dims)):
            if Desc.make(dims, name) == self:
                return name
        for name, value in tags_of_rank(len(dims)):
            try:
                if Desc.make(dims, value) == self:
                    return name
            except CtxrtError:
                continue
        return None

    def _spelled(self, n: int) -> list[str]:
        """The format tag names of this blocked descriptor's layout, by oneDNN's naming: the dims from the outermost
        (largest stride; dims of one element tie, in either order of their letters) as letters, upper case where
        also blocked inside, then the inner blocks ("aBcd16b"); those that are tags (none where not blocked)."""
        lib = library()
        kind, nblks = ctypes.c_int(0), ctypes.c_int(0)
        strides, blks, idxs = (ctypes.POINTER(ctypes.c_int64)() for _ in range(3))
        if lib.dnnl_memory_desc_query(self.handle, Q_FORMAT_KIND, ctypes.byref(kind)) or kind.value != FORMAT_BLOCKED \
                or lib.dnnl_memory_desc_query(self.handle, Q_STRIDES, ctypes.byref(strides)) \
                or lib.dnnl_memory_desc_query(self.handle, Q_INNER_NBLKS, ctypes.byref(nblks)) \
                or not 0 < n <= 12 or not 0 <= nblks.value <= 12:
            return []
        if nblks.value and (lib.dnnl_memory_desc_query(self.handle, Q_INNER_BLKS, ctypes.byref(blks))
                            or lib.dnnl_memory_desc_query(self.handle, Q_INNER_IDXS, ctypes.byref(idxs))):
            return []
        inner = [(int(blks[k]), int(idxs[k])) for k in range(nblks.value)]
        if any(not 0 <= i < n for _, i in inner):
            return []
        blocked = {i for _, i in inner}
        names = []
        for tie in (1, -1):
            order = sorted(range(n), key=lambda i: (-int(strides[i]), tie * i))
            name = "".join(chr(65 + i) if i in blocked else chr(97 + i) for i in order) + \
                "".join(f"{b}{chr(97 + i)}" for b, i in inner)
            if name in tags() and name not in names:
                names.append(name)
        return names

    def __del__(self) -> None:
        if self.owned and self.handle and _STATE is not None and _STATE.get("lib") is not None:
            _STATE["lib"].dnnl_memory_desc_destroy(self.handle)
            self.handle = None


class Memory:
    """A memory object over memory the caller owns (an arena view, a weight): no copy, no allocation."""

    def __init__(self, desc: Desc, address: int) -> None:
        lib = library()
        self.handle = ctypes.c_void_p()
        self.desc = desc
        check(lib.dnnl_memory_create(ctypes.byref(self.handle), desc.handle, engine(), ctypes.c_void_p(address)),
              "memory object")

    def __del__(self) -> None:
        if self.handle and _STATE.get("lib") is not None:
            _STATE["lib"].dnnl_memory_destroy(self.handle)
            self.handle = None


class Attr:
    """Primitive attributes: a user-managed scratchpad (planned in the arena), post-ops (a binary add of a tensor
    shaped like the output, then an element-wise op, ELTWISE_*), and for int8 primitives the masks of the scales and
    zero points (argument -> mask) passed at run time as ARG_ATTR_SCALES / ARG_ATTR_ZERO_POINTS | argument."""

    def __init__(self, eltwise: int | None = None, add: Desc | None = None, scales: dict[int, int] | None = None,
                 zero_points: dict[int, int] | None = None, alpha: float = 0.0, beta: float = 0.0) -> None:
        lib = library()
        self.handle, ops = ctypes.c_void_p(), ctypes.c_void_p()
        check(lib.dnnl_primitive_attr_create(ctypes.byref(self.handle)), "attributes")
        check(lib.dnnl_primitive_attr_set_scratchpad_mode(self.handle, SCRATCHPAD_USER), "scratchpad mode")
        for arg, mask in (scales or {}).items():  # int8: scales and zero points given at run time, per argument
            check(lib.dnnl_primitive_attr_set_scales_mask(self.handle, arg, mask), "scales mask")
        for arg, mask in (zero_points or {}).items():
            check(lib.dnnl_primitive_attr_set_zero_points_mask(self.handle, arg, mask), "zero points mask")
        self.binary_index: int | None = None
        if eltwise is not None or add is not None:
            check(lib.dnnl_post_ops_create(ctypes.byref(ops)), "post-ops")
            try:
                if add is not None:  # y = op + residual, then the activation: the order of the fused epilogue
                    check(lib.dnnl_post_ops_append_binary(ops, BINARY_ADD, add.handle), "binary add post-op")
                    self.binary_index = 0
                if eltwise is not None:
                    check(lib.dnnl_post_ops_append_eltwise(ops, eltwise, alpha, beta), "eltwise post-op")
                check(lib.dnnl_primitive_attr_set_post_ops(self.handle, ops), "set post-ops")
            finally:
                lib.dnnl_post_ops_destroy(ops)

    def __del__(self) -> None:
        if self.handle and _STATE.get("lib") is not None:
            _STATE["lib"].dnnl_primitive_attr_destroy(self.handle)
            self.handle = None


class Primitive:
    """A primitive descriptor and the primitive made from it, when its first launch is made: a descriptor the
    layout pass only asks about, or a range compile's probe program only compares, never makes its primitive
    (oneDNN's JIT: 13% of a ViT's range compile). `scope()`: entered around making it (the OpenMP threads the
    descriptor was made for)."""

    def __init__(self, pd: ctypes.c_void_p, what: str,
                 scope: Callable[[], contextlib.AbstractContextManager[None]] | None = None) -> None:
        self.pd, self.what, self._scope = pd, what, scope
        self.handle = ctypes.c_void_p()

    def made(self) -> ctypes.c_void_p:
        """The primitive (made now where it was not)."""
        if not self.handle:
            with _MAKING, self._scope() if self._scope is not None else contextlib.nullcontext():
                if not self.handle:
                    check(library().dnnl_primitive_create(ctypes.byref(self.handle), self.pd),
                          f"{self.what} primitive")
        return self.handle

    def md(self, query: int, index: int = 0) -> Desc:
        """A memory descriptor the primitive uses (owned by it: valid while it lives)."""
        return Desc(library().dnnl_primitive_desc_query_md(self.pd, query, index) or 0, owned=False, keep=self)

    @property
    def scratchpad_bytes(self) -> int:
        return self.md(Q_SCRATCHPAD_MD).nbytes

    @property
    def impl(self) -> str:
        out = ctypes.c_char_p()
        check(library().dnnl_primitive_desc_query(self.pd, Q_IMPL_INFO, 0, ctypes.byref(out)), "impl info")
        return (out.value or b"").decode()

    def launch(self, args: Sequence[tuple[int, Memory]]):
        """A zero-argument launch running the primitive on these memory objects (kept alive by the launch)."""
        lib, strm = library(), stream()
        packed = (ExecArg * len(args))(*[ExecArg(a, m.handle) for a, m in args])
        execute, handle, n, keep = lib.dnnl_primitive_execute, self.made(), len(args), (self, args)

        def run() -> None:
            status = execute(handle, strm, n, packed)
            if status:
                check(status, f"{keep[0].what} execution")
        if native.library() is not None:  # a native launch: a batch calls dnnl_primitive_execute directly
            trampoline = native.DnnlArgs(execute=ctypes.cast(execute, ctypes.c_void_p).value, primitive=handle.value,
                                         stream=strm.value, nargs=n, args=ctypes.addressof(packed))
            run.native = [(native.function("ctxrt_dnnl"), ctypes.addressof(trampoline))]  # type: ignore[attr-defined]
            run.trampoline = trampoline  # type: ignore[attr-defined]  (kept alive with the launch)
        return run

    def __del__(self) -> None:
        lib = _STATE.get("lib")
        if lib is not None:
            if self.handle:
                lib.dnnl_primitive_destroy(self.handle)
            if self.pd:
                lib.dnnl_primitive_desc_destroy(self.pd)
        self.handle = self.pd = None


def create(fn: str, what: str, *args: Any,
           scope: Callable[[], contextlib.AbstractContextManager[None]] | None = None) -> Primitive:
    """A primitive descriptor made with `dnnl_<fn>_primitive_desc_create(&pd, engine, *args)` (the primitive
    itself when a launch is made, inside `scope()`). An unsupported combination raises UnsupportedOpError."""
    lib = library()
    pd = ctypes.c_void_p()
    check(getattr(lib, f"dnnl_{fn}_primitive_desc_create")(ctypes.byref(pd), engine(), *args), what)
    return Primitive(pd, what, scope)


def reorder(src: Desc, dst: Desc, scope: Callable[[], contextlib.AbstractContextManager[None]] | None = None
            ) -> Primitive:
    lib = library()
    pd = ctypes.c_void_p()
    attr = Attr()
    check(lib.dnnl_reorder_primitive_desc_create(ctypes.byref(pd), src.handle, engine(), dst.handle, engine(),
                                                 attr.handle), "reorder")
    return Primitive(pd, "reorder", scope)


_DESCS: dict[tuple[Any, ...], Desc] = {}
atexit.register(_DESCS.clear)  # destroyed while oneDNN's library is still loaded
ARRAY_FREE.update({Desc, Memory, Attr, Primitive})  # handles only: not searched for a kernel's own arrays
