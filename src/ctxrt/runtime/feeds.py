"""Array feeds read, and array outputs written, where they lie: a range program's runs on arrays skip copying an
input into its internal buffer, or an output out of it, when only native calls whose structs ctxrt knows touch
it (docs/shapes-and-control-flow.md, "Feeds and outputs in place").

A decoder's past keys and values (8 tensors of (1, heads, past, head size) in a GPT-2-style model) are read by one
Concat each, which copies them into the present; the present is read by attention's two products and returned.
Copying the pasts into the program's input buffers and the presents out of its output buffers moved every byte of
the KV cache three times per token (~0.4 us per past position each here). Where each step touching an IO tensor
runs as native calls inside a batch (backends/cpu/strided.py) of kinds whose pointer fields are known (csrc/
strided.c's `ctxrt_ew` and `ctxrt_bmm`), those fields' pointers into its buffer are set to the caller's array
before each run (`plan`, then `Plan.bind`), and the copy is skipped. Every run of a planned list sets them again
(to the array, or back to the buffer when the array cannot be used in place: not C-contiguous, not aligned, an
output not asked for): a call shared by several launch lists never reads a pointer another run left.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ctxrt.backends.cpu import native, strided
from ctxrt.backends.cpu.strided import natives

# per native function: (byte offsets of its struct's pointers that are written, of those that are read)
_FIELDS = {
    "ctxrt_ew": ((native.EwArgs.y.offset,), (native.EwArgs.a.offset, native.EwArgs.b.offset, native.EwArgs.c.offset)),
    "ctxrt_bmm": ((native.BmmArgs.y.offset,), (native.BmmArgs.a.offset, native.BmmArgs.b.offset)),
}


class Plan:
    """For one batched launch list at one thread key: per IO tensor (inputs first, then outputs), whether the
    caller's array may be used in place, and the struct fields pointing into its buffer (field, offset from the
    buffer's start). A shared list's plan (`on_block`) keeps the fields inside its struct block as word indices,
    written by one NumPy assignment, their offsets per set of dims (`rebased`)."""

    __slots__ = ("names", "n_in", "places", "fields", "inplace", "blk", "idx", "owner", "delta", "at", "outside")

    def __init__(self, names: list[str], n_in: int, places: list[int], fields: list[list[tuple[Any, int]]],
                 inplace: list[bool]) -> None:
        self.names, self.n_in, self.places, self.fields, self.inplace = names, n_in, places, fields, inplace
        self.blk: np.ndarray | None = None  # the block's words, and per field in it: its word, its IO tensor, offset
        self.idx = self.owner = self.delta = self.at = np.zeros(0, np.int64)
        self.outside = [(i, f) for i, f in enumerate(fields) if f]  # fields set one by one (not in a block)

    def bind(self, inputs: Mapping[str, Any], outputs: Mapping[str, Any]) -> list[bool]:
        """Point the calls at each array used in place (else back at the buffer); which IO tensors are."""
        n_in, names = self.n_in, self.names
        got = native.array_addresses([inputs[n] for n in names[:n_in]], False) + \
            native.array_addresses([outputs.get(n) for n in names[n_in:]], True)
        read = [ok and a is not None for ok, a in zip(self.inplace, got, strict=True)]
        bases = [a if ok else p for ok, a, p in zip(read, got, self.places, strict=True)]
        for i, fields in self.outside:
            base = bases[i]
            for field, delta in fields:
                field.value = base + delta
        if self.blk is not None:
            self.blk[self.idx] = np.array(bases, np.int64)[self.owner] + self.delta
        return read

    def restore(self) -> None:
        """Point every call back at the program's buffers."""
        for place, fields in zip(self.places, self.fields, strict=True):
            for field, delta in fields:
                field.value = place + delta
        if self.blk is not None:
            self.blk[self.idx] = self.at + self.delta

    def on_block(self, block: np.ndarray) -> Plan:
        """This plan with its fields inside `block` (a shared list's structs, runtime/slots.py) kept as words."""
        lo = block.ctypes.data
        idx, owner, delta, rest = [], [], [], []
        for io, found in enumerate(self.fields):
            keep = []
            for f, d in found:
                a = ctypes.addressof(f)
                if lo <= a < lo + block.nbytes:
                    idx.append((a - lo) // 8)
                    owner.append(io)
                    delta.append(d)
                else:
                    keep.append((f, d))
            rest.append(keep)
        p = Plan(self.names, self.n_in, self.places, rest, self.inplace)
        p.blk, p.idx, p.owner = block.view(np.int64), np.array(idx, np.intp), np.array(owner, np.intp)
        p.delta, p.at = np.array(delta, np.int64), np.array(self.places, np.int64)[p.owner]
        return p

    def rebased(self, words: np.ndarray) -> Plan:
        """This shared list's plan for another set of dims: the block's fields take their offsets from that set's
        structs (`words`, int64); the others keep theirs (launches every set shares)."""
        p = Plan(self.names, self.n_in, self.places, self.fields, self.inplace)
        p.blk, p.idx, p.owner, p.at = self.blk, self.idx, self.owner, self.at
        p.delta = words[self.idx] - self.at
        return p


def plan(per_step: Sequence[Any], batched: Sequence[Any], key: Any, internal: Mapping[str, np.ndarray],
         inputs: Sequence[str], outputs: Sequence[str], users: Mapping[str, Sequence[int]]) -> Plan | None:
    """The plan of launch list `batched` (the program's per-step launches `per_step`, merged) at thread key `key`
    for the array-fed `inputs` and array `outputs` (their buffers in `internal`, the steps touching each in
    `users`); None when no call of the list points into an IO buffer. Only a touching step's launch has a view of
    an IO tensor, so only those are looked at (a few calls a list, once per list and key). A plan whose tensors
    are all copied still sets the pointers back at each run (another list's run may have left them at its
    arrays). An input written by a call is the program's own (copied)."""
    in_batch = {id(x) for item in batched if item.__class__ is strided.Batch for x in item.launches}
    if not in_batch or native.library() is None:
        return None  # no batch: every launch runs through NumPy, on the program's buffers
    known = {native.function(fn): offsets for fn, offsets in _FIELDS.items()}
    names = [*inputs, *outputs]
    places, inplace, fields = [], [], []
    for i, name in enumerate(names):
        v = internal[name]
        lo, n = (v.ctypes.data, v.nbytes) if v.size else (0, 0)
        ok, found = bool(n), []
        for k in users.get(name, ()):
            launch = per_step[k]
            pairs = natives(launch, key) if id(launch) in in_batch else None
            if not pairs or any(f not in known for f, _ in pairs):
                ok = False  # touched by NumPy, by another kernel, or by a call run alone
                continue
            for f, addr in pairs:
                written, read = known[f]
                for off in written + read:
                    p = ctypes.c_void_p.from_address(addr + off).value or 0
                    if n and lo <= p < lo + n:
                        found.append((ctypes.c_void_p.from_address(addr + off), p - lo))
                        if off in written and i < len(inputs):
                            ok = False  # an input written: its buffer is the program's own
        places.append(lo)
        inplace.append(ok)
        fields.append(found)
    if not any(fields):
        return None
    return Plan(names, len(inputs), places, fields, inplace)
