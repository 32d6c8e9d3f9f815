"""The weights section's layout: identical (dtype, shape, bytes) stored once, each start 64-aligned.

The writer streams it into a file; online prepare builds the same block in memory, so a context reads
its weights the same way wherever they live. A context may also read weights kept outside its file
(format version 2, `ExternalWeight`): named by the SHA-256 of their bytes, supplied by whoever loads it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from ctxrt.errors import FormatError
from ctxrt.format import codec, layout


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
    """(the array, C-contiguous; its bytes as a flat uint8 view); a FormatError for a non-numeric dtype."""
    arr = np.ascontiguousarray(value)
    if arr.dtype.kind not in codec.NUMERIC_KINDS:
        raise FormatError(f"weight {name!r}: dtype {arr.dtype} is not numeric or bool")
    return arr, arr.reshape(-1).view(np.uint8)


def plan_weights(weights: Mapping[str, np.ndarray]
                 ) -> tuple[dict[str, WeightEntry], list[tuple[int, np.ndarray]], int]:
    """(name -> entry, unique (offset, uint8 bytes) chunks in order, section size)."""
    table: dict[str, WeightEntry] = {}
    seen: dict[tuple[str, tuple[int, ...], bytes], WeightEntry] = {}
    chunks: list[tuple[int, np.ndarray]] = []
    size = 0
    for name, value in weights.items():
        arr, raw = raw_bytes(value, name)
        key = (arr.dtype.str, arr.shape, hashlib.sha256(raw).digest())
        if key not in seen:
            offset = layout.align(size, layout.WEIGHT_ALIGNMENT)
            seen[key] = WeightEntry(offset, arr.nbytes, arr.dtype.str, tuple(arr.shape))
            chunks.append((offset, raw))
            size = offset + arr.nbytes
        table[name] = seen[key]
    return table, chunks, size


def pack(weights: Mapping[str, np.ndarray]) -> tuple[dict[str, WeightEntry], np.ndarray]:
    """The weights section as one in-memory block (online prepare)."""
    table, chunks, size = plan_weights(weights)
    block = np.zeros(size, np.uint8)
    for offset, raw in chunks:
        block[offset:offset + raw.nbytes] = raw
    return table, block


def views(table: Mapping[str, WeightEntry], segments: list[np.ndarray]) -> dict[str, np.ndarray]:
    """Zero-copy arrays over the segments (uint8 arrays; read-only stays read-only)."""
    return {name: segments[e.segment][e.offset:e.offset + e.nbytes].view(np.dtype(e.dtype)).reshape(e.shape)
            for name, e in table.items()}
