"""A context: weights, one spill-fill arena shared by its graphs, the graphs, and their counters.

Lifecycle (docs/architecture.md): create (optionally deferred) -> register weights / spill-fill buffers ->
finalize -> execute graphs -> free.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ctxrt.backends import Backend
from ctxrt.backends.kernel import held_constants_bytes
from ctxrt.compiler.program import CONST, CompiledGraph
from ctxrt.errors import LifecycleError, RegistrationError
from ctxrt.format import weights as wts
from ctxrt.format.weights import bytes_by_type
from ctxrt.mapped import region
from ctxrt.runtime.graph import Graph, io_buffer_layout
from ctxrt.runtime.memhandle import MemHandle, check_descriptor, handle_key

if TYPE_CHECKING:
    from ctxrt.runtime.weightstore import WeightStore


def _root(a: np.ndarray) -> Any:
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


# What each shared buffer is registered as, across all contexts: buffer -> {(role, context id)}.
_ROLES: weakref.WeakKeyDictionary[Any, set[tuple[str, int]]] = weakref.WeakKeyDictionary()


def buffer_roles(buf: Any) -> set[tuple[str, int]]:
    return _ROLES.setdefault(buf, set())


class Context:
    """Owns weights, kernels and graphs. Its graphs share one spill-fill buffer and never run at once."""

    def __init__(self, graphs: list[CompiledGraph], weight_table: Mapping[str, wts.WeightEntry],
                 weight_block: np.ndarray | Sequence[np.ndarray], backend: Backend, *, defer_graph_init: bool = False,
                 info: Mapping[str, Any] | None = None, keepalive: Any = None,
                 num_threads: int | None = None, store: WeightStore | None = None,
                 segment_keys: Sequence[str | None] | None = None) -> None:
        self.backend = backend
        self.info = dict(info or {})
        self._table = dict(weight_table)
        # The weights' segments: the mapped file's weights section or the packed block (one), or contents a
        # session's WeightStore shares between contexts (each entry names its segment); `segment_keys` names
        # the store's (None: this context's own), released to the store when the context is freed.
        self._segments = [weight_block] if isinstance(weight_block, np.ndarray) else list(weight_block)
        self._store = store
        self._keys = list(segment_keys) if segment_keys is not None else [None] * len(self._segments)
        self._starts = []  # each segment's offset in a registered weights buffer
        size = 0
        for seg in self._segments:
            size = -(-size // 64) * 64
            self._starts.append(size)
            size += int(seg.nbytes)
        self._weights_size = size
        self._keepalive = keepalive  # e.g. the open ContextFile whose mmap backs the weights
        self.weights: dict[str, Any] = {}  # the backend's tensors: what device kernels read
        self.host_weights: dict[str, np.ndarray] = {}  # host arrays: for kernel factories and CPU partitions
        self._graphs = {g.name: Graph(self, g) for g in graphs}
        self.lock = threading.RLock()
        self.stats: Counter[str] = Counter()
        self.finalized = False
        self.freed = False
        self._owned: list[Any] = []
        self._registered: dict[str, tuple[Any, int]] = {}  # role -> (buffer, offset)
        self.arena: tuple[Any, int] | None = None
        self._handles: dict[tuple, MemHandle] = {}
        self._io_buffers: dict[int, int] = {}  # id(buffer) -> this context's handles on it
        self.threads: Any = contextlib.nullcontext()
        self._openmp_kernels = any(str(s.algorithm).startswith("onednn") for g in graphs for s in g.steps)
        self.num_threads = num_threads
        if not defer_graph_init:
            self.finalize()

    # -- properties -------------------------------------------------------------------------------
    @property
    def properties(self) -> dict[str, int]:
        return {
            "weights_buffer_size": self._weights_size,
            "max_spillfill_buffer_size": max((g.spillfill_size for g in self._graphs.values()), default=0),
            "buffer_start_alignment": self.backend.alignment,
        }

    @property
    def num_threads(self) -> int | None:
        """Threads every host pool (BLAS, OpenMP) uses during this context's runs; None: the cores other
        processes leave idle, measured as it runs. May be changed between runs."""
        return self._num_threads

    @num_threads.setter
    def num_threads(self, value: int | None) -> None:
        make = getattr(self.backend, "threads", None)  # a backend without host thread pools has none to set
        scope = make(value) if make is not None else contextlib.nullcontext()
        if hasattr(scope, "openmp_owns"):
            scope.openmp_owns = self._openmp_kernels
        with self.lock:
            self._num_threads = getattr(scope, "num_threads", value)
            self.threads = scope

    @property
    def graph_names(self) -> list[str]:
        return list(self._graphs)

    def graph(self, name: str | None = None) -> Graph:
        """The graph called `name`; without a name, the context's first graph."""
        self._check_alive()
        if name is None:
            return next(iter(self._graphs.values()))
        try:
            return self._graphs[name]
        except KeyError:
            raise LifecycleError(f"no graph {name!r}; this context has {self.graph_names}") from None

    def _check_alive(self) -> None:
        if self.freed:
            raise LifecycleError("context was freed")

    # -- registration -------------------------------------------------------------------------------
    def register_weights_buffer(self, buf: Any, offset: int = 0) -> None:
        """Weights are copied into `buf` at finalize and used from there."""
        self._register("weights", buf, offset, self.properties["weights_buffer_size"])

    def register_spillfill_buffer(self, buf: Any, offset: int = 0) -> None:
        """Use `buf` (from `offset`) as this context's spill-fill arena instead of allocating one."""
        self._register("spillfill", buf, offset, self.properties["max_spillfill_buffer_size"])

    def _register(self, role: str, buf: Any, offset: int, need: int) -> None:
        self._check_alive()
        if self.finalized:
            raise LifecycleError(f"register the {role} buffer before finalize()")
        if role in self._registered:
            raise RegistrationError(f"a {role} buffer is already registered with this context")
        if getattr(buf, "released", False):
            raise RegistrationError(f"{role} buffer was released")
        if not isinstance(offset, int) or offset < 0:
            raise RegistrationError(f"{role} buffer offset must be a non-negative int, got {offset!r}")
        if buf.nbytes - offset < need:
            raise RegistrationError(f"{role} buffer too small: needs {need} bytes from offset {offset}, "
                                    f"buffer has {buf.nbytes}")
        align = self.backend.alignment
        if (buf.address + offset) % align:
            raise RegistrationError(f"{role} buffer start (address + offset {offset}) is not aligned to "
                                    f"buffer_start_alignment {align}")
        self.backend.view(buf, offset, (need,), np.uint8)  # a buffer of this context's backend
        roles = buffer_roles(buf)
        if any(r == "io" for r, _ in roles):
            raise RegistrationError(f"{role} buffer is also used for IO memory handles")
        if role == "weights" and any(r == "weights" and c != id(self) for r, c in roles):
            raise RegistrationError("this weights buffer is already registered with another context")
        roles.add((role, id(self)))
        buf.holders += 1
        self._registered[role] = (buf, offset)

    def deregister_buffer(self, role: str) -> None:
        """Undo register_*_buffer before finalize (after finalize the buffer is in use: an error)."""
        if self.finalized:
            raise LifecycleError(f"cannot deregister the {role} buffer after finalize(); free() the context")
        self._unregister(role)

    def _unregister(self, role: str) -> None:
        if role not in self._registered:
            raise RegistrationError(f"no {role} buffer is registered")
        buf, _ = self._registered.pop(role)
        buf.holders -= 1
        buffer_roles(buf).discard((role, id(self)))

    # -- finalize / free ----------------------------------------------------------------------------
    def _alloc(self, nbytes: int, category: str) -> Any:
        buf = self.backend.alloc_device(nbytes)
        self._owned.append(buf)
        self.stats[f"alloc_{category}_bytes"] += nbytes
        self.stats["alloc_padding_bytes"] += getattr(buf, "allocated", nbytes) - nbytes  # alignment slack
        return buf

    def _place_weights(self) -> None:
        """Weights in the registered buffer (copied), else used in place where the backend reads host memory
        (the mapped file, the store's contents), else uploaded once: only those the device's kernels read (CPU
        partitions read the host copy), the store's shared with the other contexts using them, the rest packed
        at 64-byte offsets into one buffer."""
        be, segs = self.backend, self._segments
        chunks = {(e.segment, e.offset): e.nbytes for e in self._table.values()}  # distinct weights
        where: dict[tuple[int, int], tuple[Any, int]] = {}  # (segment, offset) -> (buffer, offset in it)
        wrapped = [] if "weights" in self._registered else [be.wrap_host(seg) for seg in segs]
        if "weights" in self._registered:
            buf, off = self._registered["weights"]
            for seg, start in zip(segs, self._starts, strict=True):
                be.copy_in(be.view(buf, off + start, (int(seg.nbytes),), np.uint8), seg)
                self.stats["weights_copied_bytes"] += int(seg.nbytes)
            where = {(s, o): (buf, off + self._starts[s] + o) for s, o in chunks}
        elif all(w is not None for w in wrapped):
            where = {(s, o): (wrapped[s], o) for s, o in chunks}
        else:
            read = {r.key for g in self._graphs.values() for s in g.compiled.steps if s.backend in ("", be.name)
                    for r in s.inputs if r is not None and r.space == CONST}
            own, size = {}, 0
            for s, o in sorted({(self._table[k].segment, self._table[k].offset) for k in read}):
                if self._store is not None and self._keys[s] is not None:
                    where[(s, o)] = (self._store.device(self._keys[s]), o)  # uploaded once per store
                else:
                    own[(s, o)] = size
                    size += -(-max(chunks[(s, o)], 1) // 64) * 64
            if own or self._store is None:
                buf = self._alloc(size, "weights")
                for (s, o), dst in own.items():
                    n = chunks[(s, o)]
                    be.copy_in(be.view(buf, dst, (n,), np.uint8), segs[s][o:o + n])
                    self.stats["weights_uploaded_bytes"] += n
                    where[(s, o)] = (buf, dst)
        self.weights = {name: be.view(*where[(e.segment, e.offset)], *wts.stored_form(e))
                        for name, e in self._table.items() if (e.segment, e.offset) in where}
        self.host_weights = {}
        for name, host in wts.views(self._table, segs).items():
            t = self.weights.get(name)
            view = be.host_view(t) if t is not None else None
            self.host_weights[name] = host if view is None else view

    def finalize(self) -> None:
        """Place weights, allocate what was not registered, build kernels and record every graph."""
        self._check_alive()
        if self.finalized:
            raise LifecycleError("context is already finalized")
        be = self.backend
        self._place_weights()
        self.stats["weights_bytes"] = sum(int(seg.nbytes) for seg in self._segments)
        for kind, nbytes in self.weights_by_type().items():  # int8 weights stay int8 (docs/quantization.md)
            self.stats[f"weights_bytes_{kind}"] = nbytes
        self.stats["weights_mapped_bytes"] = sum(self.mapped_weights().values())
        self.stats["weights_prepacked_bytes"] = self._prepacked_bytes()
        if "spillfill" in self._registered:
            self.arena = self._registered["spillfill"]
        else:
            self.arena = (self._alloc(self.properties["max_spillfill_buffer_size"], "spillfill"), 0)
        for g in self._graphs.values():
            g._build_kernels(self.host_weights)
        if be.programs is not None:  # every device program built (or loaded from the binary) once, here
            be.programs.prepare(dict.fromkeys(k for g in self._graphs.values() for k in g.programs), self.stats)
        for g in self._graphs.values():
            # Internal IO buffers for tensors prepared as raw (docs/architecture.md); memhandle ones get none now.
            raw = [t for t in g.inputs + g.outputs if t.mem_type == "raw"]
            internal = {}
            if raw:
                layout = io_buffer_layout(raw, be.alignment)
                buf = self._alloc(max(off + n for _, off, n in layout), "io")
                internal = {name: be.view(buf, off, info.shape, info.dtype)
                            for (name, off, _), info in zip(layout, raw, strict=True)}
                g._io_places.update({name: (buf, off) for name, off, _ in layout})
            g._prepare(self.arena, internal, self.weights)
        self._count_kernel_bytes()
        self.finalized = True

    def _count_kernel_bytes(self) -> None:
        """Constants the kernels made for themselves when built or bound (after finalize and each recording)."""
        buffers = [b for b in self._owned] + [b for b, _ in self._registered.values()] + \
            [h.buffer for h in self._handles.values()]
        shared = {id(_root(w)) for w in self.host_weights.values()}  # the weights, whichever buffer holds them
        shared.update(id(_root(b.array)) for b in buffers if getattr(b, "array", None) is not None)
        shared.update(id(g._host.staging) for g in self._graphs.values()  # CPU partitions' staging (counted apart)
                      if g._host is not None and g._host.staging is not None)
        self.stats["alloc_kernel_bytes"] = held_constants_bytes(
            [obj for g in self._graphs.values() for obj in (*g._kernels, *g._launches) if obj is not None], shared)

    def _prepacked(self) -> dict[tuple[int, int], int]:
        """(segment, offset) -> bytes of each weight kernels made for themselves at compile time (transformed or
        prepacked weights, recorded in their node's `prepacked` attribute)."""
        blocks = {}
        for g in self._graphs.values():
            for step in g.compiled.steps:
                for i, _ in step.attrs.get("prepacked", ()):
                    ref = step.inputs[i] if i < len(step.inputs) else None
                    if ref is not None and ref.key in self._table:
                        entry = self._table[ref.key]
                        blocks[(entry.segment, entry.offset)] = entry.nbytes
        return blocks

    def _prepacked_bytes(self) -> int:
        """Bytes of the weights that kernels made for themselves at compile time, each stored block counted once."""
        return sum(self._prepacked().values())

    def held_weights(self) -> tuple[dict[int, int], dict[tuple[int, int], int]]:
        """(id of each weights segment -> its bytes, (segment id, offset) of each prepacked weight -> its bytes):
        what a session counts once for all the contexts sharing a WeightStore's contents. Empty once freed."""
        ids = [id(seg) for seg in self._segments]
        return ({i: int(seg.nbytes) for i, seg in zip(ids, self._segments, strict=True)},
                {(ids[s], o): n for (s, o), n in self._prepacked().items()})

    def mapped_weights(self) -> dict[int, int]:
        """(id of each weights segment read in place from a model's external data file -> its bytes)."""
        return {id(seg): int(seg.nbytes) for seg in self._segments if region(seg) is not None}

    def weights_by_type(self) -> dict[str, int]:
        """Bytes of this context's weights by storage type ("float32", "int8", "float16", ...), each stored weight
        counted once (also as `stats["weights_bytes_<type>"]`)."""
        return bytes_by_type(((e.segment, e.offset), e.nbytes, e.dtype) for e in self._table.values())

    def memory(self) -> dict[str, int]:
        """Bytes this context holds, by category: `weights` (the weights section, memory-mapped from the binary
        or copied into a registered buffer; `prepacked` of them are kernel-private constants made at compile
        time), `spillfill`, `io` and `kernel` (constants kernels made when they were built) it allocated."""
        s = self.stats
        return {"weights": s["weights_bytes"], "prepacked": s["weights_prepacked_bytes"],
                "spillfill": s["alloc_spillfill_bytes"], "io": s["alloc_io_bytes"], "kernel": s["alloc_kernel_bytes"],
                "padding": s["alloc_padding_bytes"]}

    # -- memory handles (docs/architecture.md) ----------------------------------------------------------
    def mem_register(self, buffer: Any, offset: int, shape: Any, dtype: Any, strides: Any = None) -> MemHandle:
        """A handle for the tensor dtype[shape] at `offset` in `buffer`, to pass to Graph.execute.
        Registering the same (buffer, offset, shape, dtype, strides) again returns the same handle. `strides`
        (bytes per axis; CPU only): a window of a larger tensor, e.g. a KV cache's leading rows, which a range
        program takes as the past and present of a Concat it appends to in place (docs/generate.md)."""
        self._check_alive()
        offset, shape, dt, st = check_descriptor(buffer, offset, shape, dtype, strides)
        key = handle_key(buffer, offset, shape, dt, st)
        with self.lock:
            cached = self._handles.get(key)
            if cached is not None and cached.buffer is buffer:
                self.stats["mem_register_cached"] += 1
                return cached
            roles = buffer_roles(buffer)
            used = sorted({r for r, _ in roles if r != "io"})
            if used:
                raise RegistrationError(f"mem_register: this buffer is registered as a {used[0]} buffer; "
                                        "IO tensors need a buffer of their own")
            if st is None:
                view = self.backend.view(buffer, offset, shape, dt)
            elif hasattr(self.backend, "strided_view"):
                view = self.backend.strided_view(buffer, offset, shape, dt, st)
            else:
                raise RegistrationError(f"mem_register: strided windows need the cpu backend, not {self.backend.name}")
            h = MemHandle(self, buffer, offset, shape, dt, view, st)
            roles.add(("io", id(self)))
            buffer.holders += 1
            self._handles[key] = h
            self._io_buffers[id(buffer)] = self._io_buffers.get(id(buffer), 0) + 1
            self.stats["mem_handles_registered"] += 1
            return h

    def mem_deregister(self, handle: MemHandle) -> None:
        """Release a handle; its buffer can be freed once no handle uses it."""
        if not isinstance(handle, MemHandle):
            raise RegistrationError(f"mem_deregister expects a MemHandle, got {type(handle).__name__}")
        if handle.context is not self:
            raise RegistrationError("mem_deregister: the memory handle belongs to another context")
        with self.lock:
            if not handle.registered:
                raise RegistrationError("mem_deregister: the memory handle was already deregistered")
            self._drop_handle(handle)

    def _drop_handle(self, h: MemHandle) -> None:
        h.registered = False
        del self._handles[h.key]
        h.buffer.holders -= 1
        left = self._io_buffers.pop(id(h.buffer)) - 1  # no scan of every handle: a generation makes many
        if left:
            self._io_buffers[id(h.buffer)] = left
        else:
            buffer_roles(h.buffer).discard(("io", id(self)))
        self.stats["mem_handles_deregistered"] += 1

    def free(self) -> None:
        """Release every buffer this context allocated and deregister the ones it was given."""
        with self.lock:
            if self.freed:
                return
            for buf in self._owned:
                buf.release()
            self._owned.clear()
            for role in list(self._registered):
                self._unregister(role)
            for h in list(self._handles.values()):
                self._drop_handle(h)
            for g in self._graphs.values():
                g._release()
            self.weights, self.host_weights, self.arena, self._keepalive = {}, {}, None, None
            self._segments, self._table = [], {}  # the weights go now, even while something refers to the context
            if self._store is not None:  # contents no other context uses are let go
                self._store.release([k for k in self._keys if k is not None])
                self._store = None
            self.finalized = False
            self.freed = True

    def __enter__(self) -> Context:
        return self

    def __exit__(self, *exc: object) -> None:
        self.free()
