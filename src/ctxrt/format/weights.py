"""The weights section's layout: identical (dtype, shape, bytes) stored once, each start 64-aligned; 4-bit
weights packed two a byte (ctxrt.dtypes), and viewed so: a kernel unpacks them as it runs.

The writer streams it into a file; online prepare builds the same block in memory, so a context reads
its weights the same way wherever they live. A context may also read weights kept outside its file
(format version 2, `ExternalWeight`): named by the SHA-256 of their bytes, supplied by whoever loads it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ctxrt import dtypes
from ctxrt.errors import FormatError
from ctxrt.format import codec, layout
from ctxrt.mapped import region


@dataclass(frozen=True)
class WeightEntry:
    """Where one weight's bytes are: `offset` in segment `segment` of its context's weights (segment 0: the
    weights section or the packed block; others: weights shared with other contexts, see runtime/weightstore)."""

    offset: int
    nbytes: int
    dtype: str
    shape: tuple[int, ...]
    segment: int = 0


@dataclass(frozen=True)
class ExternalWeight:
    """A weight kept outside the context binary: `key` is the SHA-256 (hex) of its bytes, `crc` their CRC-32
    (checked when the bytes are supplied)."""

    key: str
    nbytes: int
    dtype: str
    shape: tuple[int, ...]
    crc: int

    def as_list(self) -> list[object]:
        """The META external_weights entry (docs/format.md)."""
        return [self.key, self.nbytes, self.dtype, list(self.shape), self.crc]


def content_key(raw: np.ndarray | memoryview | bytes) -> str:
    """The SHA-256 (hex) of a weight's bytes: what identifies it across contexts and compiles."""
    return hashlib.sha256(raw).hexdigest()


def raw_bytes(value: np.ndarray, name: str) -> tuple[np.ndarray, np.ndarray]:
    """(the array, C-contiguous; its stored bytes as a flat uint8 array: 4-bit values packed two a byte); a
    FormatError for a non-numeric dtype."""
    arr = np.ascontiguousarray(value)
    if not codec.numeric(arr.dtype):
        raise FormatError(f"weight {name!r}: dtype {arr.dtype} is not numeric or bool")
    return arr, dtypes.stored(arr).reshape(-1).view(np.uint8)


def plan_weights(weights: Mapping[str, np.ndarray]
                 ) -> tuple[dict[str, WeightEntry], list[tuple[int, np.ndarray]], int]:
    """(name -> entry, unique (offset, uint8 bytes) chunks in order, section size)."""
    table: dict[str, WeightEntry] = {}
    seen: dict[tuple[str, tuple[int, ...], bytes], WeightEntry] = {}
    chunks: list[tuple[int, np.ndarray]] = []
    size = 0
    for name, value in weights.items():
        arr, raw = raw_bytes(value, name)
        key = (dtypes.name(arr.dtype), arr.shape, hashlib.sha256(raw).digest())
        if key not in seen:
            offset = layout.align(size, layout.WEIGHT_ALIGNMENT)
            seen[key] = WeightEntry(offset, raw.nbytes, key[0], tuple(arr.shape))
            chunks.append((offset, raw))
            size = offset + raw.nbytes
        table[name] = seen[key]
    return table, chunks, size


def pack(weights: Mapping[str, np.ndarray]) -> tuple[dict[str, WeightEntry], list[np.ndarray]]:
    """The weights of online prepare: (name -> entry, segments). Segment 0 is one in-memory block of the weights
    made in memory; each weight that is a view of a mapped file (a model's external data, ctxrt.mapped) is a
    segment of its own, used in place: no copy of it is made."""
    table: dict[str, WeightEntry] = {}
    segments: list[np.ndarray] = []
    mapped: dict[tuple[str, int, str, tuple[int, ...]], WeightEntry] = {}
    rest: dict[str, np.ndarray] = {}
    for name, value in weights.items():
        where = region(value) if isinstance(value, np.ndarray) else None
        if where is None or dtypes.is_4bit(value.dtype):
            rest[name] = value
            continue
        key = (*where, dtypes.name(value.dtype), tuple(value.shape))
        if key not in mapped:
            segments.append(value.reshape(-1).view(np.uint8))
            mapped[key] = WeightEntry(0, value.nbytes, key[2], key[3], len(segments))
        table[name] = mapped[key]
    packed, chunks, size = plan_weights(rest)
    block = np.zeros(size, np.uint8)
    for offset, raw in chunks:
        block[offset:offset + raw.nbytes] = raw
    table.update(packed)
    return table, [block, *segments]


def views(table: Mapping[str, WeightEntry], segments: list[np.ndarray]) -> dict[str, np.ndarray]:
    """Zero-copy arrays over the segments (uint8 arrays; read-only stays read-only); 4-bit weights as their packed
    bytes."""
    return {name: view(segments[e.segment][e.offset:e.offset + e.nbytes], np.dtype(e.dtype), e.shape)
            for name, e in table.items()}


def stored_form(e: WeightEntry) -> tuple[tuple[int, ...], np.dtype]:
    """(shape, dtype) of a weight's stored bytes: its own, or (nbytes,) uint8 for a packed 4-bit weight."""
    return ((e.nbytes,), np.dtype(np.uint8)) if dtypes.is_4bit(e.dtype) else (e.shape, np.dtype(e.dtype))


def view(raw: np.ndarray, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    """A weight's stored bytes as kernels read them: the typed array, or for a 4-bit type the packed bytes."""
    return raw if dtypes.is_4bit(dtype) else raw.view(dtype).reshape(shape)


def bytes_by_type(entries: Iterable[tuple[Any, int, str]]) -> dict[str, int]:
    """Bytes of weights by storage type ("float32", "int8", ...; a 4-bit weight is stored packed in uint8), each
    distinct place (its `where` key: an offset, or (segment, offset)) counted once: entries (where, nbytes, dtype)."""
    seen: dict[Any, tuple[int, str]] = {}
    for where, nbytes, dtype in entries:
        seen.setdefault(where, (int(nbytes), _type_name(dtype)))
    out: dict[str, int] = {}
    for nbytes, name in seen.values():
        out[name] = out.get(name, 0) + nbytes
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def _type_name(dtype: str) -> str:
    try:
        return np.dtype(dtype).name
    except TypeError:  # ctxrt's own names (4-bit types: ctxrt.dtypes)
        return str(dtype)
