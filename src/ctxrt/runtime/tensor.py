"""Device tensors and the session's tensor cache (docs/architecture.md).

A `Tensor` is a tensor in a SharedBuffer of its session's backend. It is passed to graphs as a memory
handle (one per context, registered on first use and kept), so binding it costs no copy. The session
makes tensors for NumPy feeds and outputs through a `TensorCache`: after a run they go back to the cache
and are reused when shape and dtype match, preferably by the same input or output as before, so the
graph sees the same handle and replays its recording (pinning). They are destroyed when the session
closes or when the cache's byte cap evicts the least recently used.
"""

from __future__ import annotations

import math
import weakref
from collections import Counter, OrderedDict
from typing import TYPE_CHECKING, Any

import numpy as np

from ctxrt.errors import LifecycleError, RegistrationError, ShapeError

if TYPE_CHECKING:
    from ctxrt.runtime.context import Context
    from ctxrt.runtime.memhandle import MemHandle
    from ctxrt.runtime.session import InferenceSession


class Tensor:
    """A device-resident tensor of one session (a buffer of the session's backend). `numpy()` returns a copy,
    `write(array)` copies into it; `view` is the backend's tensor; `array` is a zero-copy host view whose
    contents change when a run writes the tensor, where the backend has one (cpu, OpenCL on memory shared
    with the host), else None."""

    __slots__ = ("_session", "shape", "dtype", "nbytes", "buffer", "view", "array", "_handles", "destroyed",
                 "cached", "strides", "owner", "windows", "__weakref__")

    def __init__(self, session: InferenceSession, shape: tuple[int, ...], dtype: np.dtype) -> None:
        session._check_open()
        self._session: Any = session
        self.shape = shape
        self.dtype = dtype
        self.nbytes = math.prod(shape) * dtype.itemsize
        be = session.backend
        self.buffer = be.alloc_shared(max(self.nbytes, 1), be.alignment)
        self.view = be.view(self.buffer, 0, shape, dtype)
        self.array: np.ndarray | None = be.host_view(self.view)
        self._handles: dict[int, MemHandle] = {}
        self.destroyed = False
        self.cached = False  # made by the session's cache (not by the user)
        self.strides: tuple[int, ...] | None = None  # a window's byte strides (None: C-contiguous)
        self.owner: Tensor | None = None  # the tensor a window is of (it owns the buffer)
        self.windows: list[Tensor] = []  # this tensor's windows not destroyed yet

    @property
    def session(self) -> InferenceSession:
        """The session whose backend holds this tensor (a tensor of its cache refers to it weakly: the session is
        freed when its user drops it, not at the next garbage collection)."""
        s = self._session
        if s.__class__ is weakref.ReferenceType:
            s = s()
            if s is None:
                raise LifecycleError("tensor was destroyed: its session was dropped")
        return s

    @session.setter
    def session(self, value: InferenceSession) -> None:
        self._session = value

    @classmethod
    def empty(cls, shape: Any, dtype: Any, session: InferenceSession) -> Tensor:
        try:
            shape, dt = tuple(int(d) for d in shape), np.dtype(dtype)
        except (TypeError, ValueError):
            raise ShapeError(f"Tensor.empty needs a shape of ints and a dtype, got {shape!r}, {dtype!r}") from None
        if any(d < 0 for d in shape):
            raise ShapeError(f"Tensor.empty: negative dimension in {list(shape)}")
        t = cls(session, shape, dt)
        session._user_tensors.add(t)
        return t

    @classmethod
    def from_numpy(cls, array: np.ndarray, session: InferenceSession) -> Tensor:
        array = np.asarray(array)
        t = cls.empty(array.shape, array.dtype, session)
        t.write(array)
        return t

    def window(self, axis: int, length: int) -> Tensor:
        """The leading `length` entries of this tensor along `axis`, in place: a tensor of this one's memory with
        its strides (CPU). A KV cache of the context's length bound as a decoder's past (its first P rows) and its
        present (P + S rows) lets the range program's Concat append only the new rows (docs/generate.md)."""
        self._check()
        if self.owner is not None:
            raise ShapeError("Tensor.window: take windows of the whole tensor, not of a window")
        if isinstance(axis, bool) or not isinstance(axis, int) or not -len(self.shape) <= axis < len(self.shape):
            raise ShapeError(f"Tensor.window: axis {axis!r} is not an axis of shape {list(self.shape)}")
        axis %= len(self.shape)
        if isinstance(length, bool) or not isinstance(length, int) or not 0 <= length <= self.shape[axis]:
            raise ShapeError(f"Tensor.window: length {length!r} is outside 0..{self.shape[axis]} (axis {axis} of "
                             f"{list(self.shape)})")
        if self.array is None:
            raise RegistrationError(f"Tensor.window: the {self.session.backend.name} backend has no host views")
        w = object.__new__(Tensor)
        w.session, w.dtype, w.buffer, w.owner = self.session, self.dtype, self.buffer, self
        w.shape = self.shape[:axis] + (length,) + self.shape[axis + 1:]
        w.nbytes = math.prod(w.shape) * self.dtype.itemsize
        w.view = w.array = self.array[(slice(None),) * axis + (slice(0, length),)]
        w.strides = tuple(int(s) for s in self.array.strides)
        w._handles, w.destroyed, w.cached, w.windows = {}, False, False, []
        self.windows.append(w)
        return w

    def numpy(self) -> np.ndarray:
        self._check()
        out = np.empty(self.shape, self.dtype)
        self.session.backend.copy_out(out, self.view)
        return out

    def write(self, value: Any) -> None:
        """Copy a host array (or another tensor's `view`) of this shape and dtype into the tensor."""
        self.session.backend.copy_in(self.view, value)

    def handle(self, ctx: Context) -> MemHandle:
        """This tensor's memory handle in `ctx` (registered once, then reused: what keeps a graph pinned)."""
        h = self._handles.get(id(ctx))
        if h is None or not h.registered:
            self._check()
            self.drop_stale_handles()
            h = self._handles[id(ctx)] = ctx.mem_register(self.buffer, 0, self.shape, self.dtype, self.strides)
        return h

    def drop_stale_handles(self) -> None:
        """Let go of handles deregistered since (those of freed contexts, e.g. a freed shape variant's): a handle
        refers to its context, so keeping one would keep what the freed context still refers to."""
        for key in [k for k, old in self._handles.items() if not old.registered]:
            del self._handles[key]

    def _check(self) -> None:
        if self.destroyed:
            raise LifecycleError("tensor was destroyed (destroy() was called, its session closed, or the cache "
                                 "evicted it)")

    def destroy(self) -> None:
        """Deregister the tensor's handles and free its buffer."""
        if self.destroyed:
            return
        for w in list(self.windows):
            w.destroy()
        if self.owner is not None:
            self.owner.windows.remove(self)
        for h in self._handles.values():
            if h.registered:
                h.context.mem_deregister(h)
        self._handles.clear()
        if self.owner is None:  # a window's buffer is its owner's
            self.buffer.release()
        self.view = self.array = None
        self.destroyed = True

    def __repr__(self) -> str:
        state = ", destroyed" if self.destroyed else ""
        return f"Tensor({self.dtype}{list(self.shape)}{state})"


class TensorCache:
    """Free tensors by (shape, dtype), least recently used first; tensors lent to a run are held too.

    `acquire(shape, dtype, prefer)` returns `prefer` when it is free (the same tensor as last run), else
    the most recently released free tensor of that shape and dtype (a hit), else a new one (a miss).
    `release(t)` puts it back; then, above the byte cap, free tensors are destroyed from the least recently
    used. `keep_only(shapes)` (when the session frees a shape variant) destroys the free tensors of any other
    (shape, dtype), and those lent now when they come back."""

    def __init__(self, session: InferenceSession, cap_bytes: int | None = None, enabled: bool = True) -> None:
        if cap_bytes is not None and cap_bytes < 0:
            raise RegistrationError(f"tensor cache byte cap must be >= 0, got {cap_bytes}")
        self._session = weakref.ref(session)  # (its session holds it: no cycle)
        self.cap_bytes = cap_bytes
        self.enabled = enabled
        self._free: OrderedDict[int, Tensor] = OrderedDict()  # id -> tensor, oldest first
        self._lent: dict[int, Tensor] = {}
        self._keep: set[tuple[tuple[int, ...], str]] | None = None  # (shape, dtype) worth keeping; None: all
        self.stats: Counter[str] = Counter()

    @property
    def session(self) -> InferenceSession:
        return self._session()

    @property
    def bytes_held(self) -> int:
        return sum(t.nbytes for t in self._free.values()) + sum(t.nbytes for t in self._lent.values())

    def acquire(self, shape: tuple[int, ...], dtype: np.dtype, prefer: Tensor | None = None) -> Tensor:
        if prefer is not None and id(prefer) in self._free and prefer.shape == shape and prefer.dtype == dtype:
            t = self._free.pop(id(prefer))
        else:
            t = None
            for key, cand in reversed(self._free.items()):  # the most recently released: still warm in cache
                if cand.shape == shape and cand.dtype == dtype:
                    t = self._free.pop(key)
                    break
        if t is not None:
            self.stats["hits"] += 1
        else:
            self.stats["misses"] += 1
            t = Tensor(self.session, shape, dtype)
            t.cached = True
            t._session = self._session  # (weakly)
            self.stats["created"] += 1
            self.stats["created_bytes"] += t.nbytes
        self._lent[id(t)] = t
        return t

    def release(self, t: Tensor) -> None:
        self._lent.pop(id(t), None)
        if not self.enabled or (self._keep is not None and (t.shape, t.dtype.str) not in self._keep):
            self._destroy(t)
            return
        self._free[id(t)] = t  # most recently used last
        if self.cap_bytes is not None:
            held = self.bytes_held
            while held > self.cap_bytes and self._free:
                _, old = self._free.popitem(last=False)
                held -= old.nbytes
                self._destroy(old)
                self.stats["evicted"] += 1

    def keep_only(self, keys: set[tuple[tuple[int, ...], str]]) -> None:
        """Shape variants were freed: destroy the free tensors whose (shape, dtype) no variant left has (and the
        lent ones when they are released), and drop every kept tensor's handles of freed contexts."""
        self._keep = keys
        for key, t in list(self._free.items()):
            if (t.shape, t.dtype.str) not in keys:
                del self._free[key]
                self._destroy(t)
                self.stats["pruned"] += 1
        for t in (*self._free.values(), *self._lent.values()):
            t.drop_stale_handles()

    def stale_handles(self) -> int:
        """Handles of freed contexts that tensors of this cache still hold (0 after `keep_only`)."""
        return sum(not h.registered for t in (*self._free.values(), *self._lent.values())
                   for h in t._handles.values())

    def _destroy(self, t: Tensor) -> None:
        t.destroy()
        self.stats["destroyed"] += 1

    def clear(self) -> None:
        for t in list(self._free.values()) + list(self._lent.values()):
            self._destroy(t)
        self._free.clear()
        self._lent.clear()

    def counters(self) -> dict[str, int]:
        return {"tensor_cache_hits": self.stats["hits"], "tensor_cache_misses": self.stats["misses"],
                "tensors_created": self.stats["created"], "tensors_destroyed": self.stats["destroyed"],
                "tensors_evicted": self.stats["evicted"], "tensors_pruned": self.stats["pruned"],
                "tensor_cache_bytes_held": self.bytes_held, "tensor_cache_stale_handles": self.stale_handles()}
