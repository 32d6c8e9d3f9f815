"""Array feeds read where they lie: a range program's runs on arrays skip copying an input into its internal
buffer when only native element-wise calls read it (docs/shapes-and-control-flow.md, "Feeds read in place").

A decoder's past keys and values (8 tensors of (1, heads, past, head size) in a GPT-2-style model) are read by one
Concat each, which copies them into the present: copying them into the program's input buffers first moved every
byte of the KV cache twice per token, ~0.4 us per past position here. Where each step reading an input runs as
csrc/strided.c's `ctxrt_ew` calls inside a batch (backends/cpu/strided.py), those calls' pointers into the input's
buffer are set to the feed's array before each run (`plan`, then `Plan.bind`), and the copy is skipped. Every run of
a planned list sets them again (to the feed, or back to the buffer when the feed cannot be read in place: not
C-contiguous, not aligned): a call shared by several launch lists never reads a pointer another run left.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ctxrt.backends.cpu import native, strided
from ctxrt.backends.cpu.strided import natives

# byte offsets of ew_args' pointers (csrc/strided.h): y (written), then the operands a, b and c (read)
_Y = native.EwArgs.y.offset
_READ = (native.EwArgs.a.offset, native.EwArgs.b.offset, native.EwArgs.c.offset)


class Plan:
    """For one batched launch list at one thread key: per input, whether its feed may be read in place, and the
    struct fields pointing into its buffer (field, offset from the buffer's start)."""

    __slots__ = ("names", "places", "fields", "inplace")

    def __init__(self, names: list[str], places: list[int], fields: list[list[tuple[Any, int]]],
                 inplace: list[bool]) -> None:
        self.names, self.places, self.fields, self.inplace = names, places, fields, inplace

    def bind(self, inputs: Mapping[str, Any]) -> list[bool]:
        """Point the calls at each feed read in place (else back at the input's buffer); which inputs are."""
        read = []
        for name, place, fields, ok in zip(self.names, self.places, self.fields, self.inplace, strict=True):
            base = place
            if ok:
                v = inputs[name]
                flags = v.flags if v.__class__ is np.ndarray else None
                if flags is not None and flags.c_contiguous and flags.aligned and v.size:
                    base = v.ctypes.data
                else:
                    ok = False
            for field, delta in fields:
                field.value = base + delta
            read.append(ok)
        return read


def plan(per_step: Sequence[Any], batched: Sequence[Any], key: Any,
         internal: Mapping[str, np.ndarray], names: Sequence[str], readers: Mapping[str, Sequence[int]]
         ) -> Plan | None:
    """The plan of launch list `batched` (the program's per-step launches `per_step`, merged) at thread key `key`
    for the array-fed inputs `names` (their buffers in `internal`, the steps reading each in `readers`); None when
    no call of the list points into an input's buffer. A plan whose inputs are all copied still sets the pointers
    back at each run (another list's run may have left them at its feeds)."""
    if native.library() is None:
        return None
    ew = native.function("ctxrt_ew")
    batched_ew: set[int] = set()  # the ew structs a Batch of the list calls natively
    for item in batched:
        if item.__class__ is not strided.Batch:
            continue
        at = key if item.keyed else None  # (Batch.__call__'s key)
        table = item.tables.get(at) or item._table(at)
        for seg in table:
            if seg.__class__ is tuple:
                batched_ew.update(a for f, a in zip(seg[4], seg[5], strict=True) if f == ew)
    places, inplace = [], []
    for name in names:
        v = internal[name]
        places.append(v.ctypes.data if v.size else 0)
        ok = bool(v.size)
        for k in readers.get(name, ()):
            pairs = natives(per_step[k], key)
            if not pairs or any(f != ew or a not in batched_ew for f, a in pairs):
                ok = False  # read by NumPy, by another kernel, or by a call run alone
                break
        inplace.append(ok)
    fields: list[list[tuple[Any, int]]] = [[] for _ in names]
    for addr in batched_ew:
        y = ctypes.c_void_p.from_address(addr + _Y).value or 0
        for i, name in enumerate(names):
            lo, n = places[i], internal[name].nbytes
            if n and lo <= y < lo + n:
                inplace[i] = False  # written: an input's buffer is the program's own
            for off in _READ:
                p = ctypes.c_void_p.from_address(addr + off).value or 0
                if n and lo <= p < lo + n:
                    fields[i].append((ctypes.c_void_p.from_address(addr + off), p - lo))
    if not any(fields):
        return None
    return Plan(list(names), places, fields, inplace)
