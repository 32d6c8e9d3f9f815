"""Weights as one aligned block of bytes plus a table: the layout of the context binary's weights section.

A context reads its weights as views into this block wherever it lives: the memory-mapped file, the
block built at online prepare, or a buffer the user registered.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

WEIGHT_ALIGNMENT = 64


@dataclass(frozen=True)
class WeightEntry:
    offset: int
    nbytes: int
    dtype: str
    shape: tuple[int, ...]


def pack(weights: Mapping[str, np.ndarray], alignment: int = WEIGHT_ALIGNMENT
         ) -> tuple[dict[str, WeightEntry], np.ndarray]:
    """Lay the arrays out in one block; identical contents (dtype, shape, bytes) are stored once."""
    table: dict[str, WeightEntry] = {}
    seen: dict[tuple[str, tuple[int, ...], bytes], WeightEntry] = {}
    chunks: list[tuple[int, np.ndarray]] = []
    size = 0
    for name, arr in weights.items():
        arr = np.ascontiguousarray(arr)
        key = (arr.dtype.str, arr.shape, hashlib.sha256(arr.view(np.uint8).reshape(-1)).digest())
        if key not in seen:
            size = -(-size // alignment) * alignment
            seen[key] = WeightEntry(size, arr.nbytes, arr.dtype.str, tuple(arr.shape))
            chunks.append((size, arr))
            size += arr.nbytes
        table[name] = seen[key]
    block = np.zeros(size, np.uint8)
    for offset, arr in chunks:
        block[offset:offset + arr.nbytes] = arr.view(np.uint8).reshape(-1)
    return table, block


def views(table: Mapping[str, WeightEntry], block: np.ndarray) -> dict[str, np.ndarray]:
    """Zero-copy arrays over `block` (a uint8 array; read-only stays read-only)."""
    out = {}
    for name, e in table.items():
        dt = np.dtype(e.dtype)
        out[name] = block[e.offset:e.offset + e.nbytes].view(dt).reshape(e.shape)
    return out
