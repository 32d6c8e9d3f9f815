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

    def rebased(self, words: np.ndarray, block: int) -> Plan:
        """This plan for another set of dims of a shared list (runtime/slots.py): the fields inside the list's
        struct block (at address `block`) take their offsets from that set's structs (`words`, int64); the others
        keep theirs (launches every set shares)."""
        end = block + words.nbytes
        fields = [[(f, int(words[(a - block) // 8]) - place if block <= (a := ctypes.addressof(f)) < end else d)
                   for f, d in found] for found, place in zip(self.fields, self.places, strict=True)]
        return Plan(self.names, self.places, fields, self.inplace)


def plan(per_step: Sequence[Any], batched: Sequence[Any], key: Any,
         internal: Mapping[str, np.ndarray], names: Sequence[str], readers: Mapping[str, Sequence[int]]
         ) -> Plan | None:
    """The plan of launch list `batched` (the program's per-step launches `per_step`, merged) at thread key `key`
    for the array-fed inputs `names` (their buffers in `internal`, the steps reading each in `readers`); None when
    no call of the list points into an input's buffer. Only a reading step's launch has a view of an input, so
    only those are looked at (a few calls a list, once per list and key). A plan whose inputs are all copied still
    sets the pointers back at each run (another list's run may have left them at its feeds)."""
    in_batch = {id(x) for item in batched if item.__class__ is strided.Batch for x in item.launches}
    if not in_batch or native.library() is None:
        return None  # no batch: every launch runs through NumPy, on the program's buffers
    ew = native.function("ctxrt_ew")
    places, inplace, fields = [], [], []
    for name in names:
        v = internal[name]
        lo, n = (v.ctypes.data, v.nbytes) if v.size else (0, 0)
        ok, found = bool(n), []
        for k in readers.get(name, ()):
            launch = per_step[k]
            pairs = natives(launch, key) if id(launch) in in_batch else None
            if not pairs or any(f != ew for f, _ in pairs):
                ok = False  # read by NumPy, by another kernel, or by a call run alone
                continue
            for _, addr in pairs:
                y = ctypes.c_void_p.from_address(addr + _Y).value or 0
                if n and lo <= y < lo + n:
                    ok = False  # written: an input's buffer is the program's own
                for off in _READ:
                    p = ctypes.c_void_p.from_address(addr + off).value or 0
                    if n and lo <= p < lo + n:
                        found.append((ctypes.c_void_p.from_address(addr + off), p - lo))
        places.append(lo)
        inplace.append(ok)
        fields.append(found)
    if not any(fields):
        return None
    return Plan(list(names), places, fields, inplace)
