"""The weights section's layout: identical (dtype, shape, bytes) stored once, each start 64-aligned.

The writer streams it into a file; online prepare builds the same block in memory, so a context reads
its weights the same way wherever they live.
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
    offset: int
    nbytes: int
    dtype: str
    shape: tuple[int, ...]


def plan_weights(weights: Mapping[str, np.ndarray]
                 ) -> tuple[dict[str, WeightEntry], list[tuple[int, np.ndarray]], int]:
    """(name -> entry, unique (offset, uint8 bytes) chunks in order, section size)."""
    table: dict[str, WeightEntry] = {}
    seen: dict[tuple[str, tuple[int, ...], bytes], WeightEntry] = {}
    chunks: list[tuple[int, np.ndarray]] = []
    size = 0
    for name, value in weights.items():
        arr = np.ascontiguousarray(value)
        if arr.dtype.kind not in codec.NUMERIC_KINDS:
            raise FormatError(f"weight {name!r}: dtype {arr.dtype} is not numeric or bool")
        raw = arr.reshape(-1).view(np.uint8)
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


def views(table: Mapping[str, WeightEntry], block: np.ndarray) -> dict[str, np.ndarray]:
    """Zero-copy arrays over `block` (a uint8 array; read-only stays read-only)."""
    return {name: block[e.offset:e.offset + e.nbytes].view(np.dtype(e.dtype)).reshape(e.shape)
            for name, e in table.items()}
