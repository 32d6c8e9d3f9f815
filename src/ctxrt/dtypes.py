"""Element types beyond NumPy's own, as ONNX's `numpy_helper` gives them (ml_dtypes): 4-bit integers, bfloat16 and
the float8 types of the quantization ops.

In memory (arena, IO buffers, compile-time constants) every one of them takes whole bytes: an int4 tensor holds one
value per byte, as ml_dtypes stores it. Only the weights section stores 4-bit constants packed two per byte, low
nibble first (ONNX's own order); a kernel is given such a constant in that packed form (`stored`), a uint8 array of
`packed_nbytes(n)` bytes, and unpacks it per block as it runs.

Dtype strings (refs, IO tensors, the weight table of the context binary) are NumPy's (`"<f4"`, `"|i1"`) for NumPy's
own types and the ml_dtypes name (`"int4"`, `"float8_e4m3fn"`) for these, whose NumPy strings (`"<V1"`) say nothing.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

INT4 = np.dtype(ml_dtypes.int4)
UINT4 = np.dtype(ml_dtypes.uint4)
BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
FLOAT8 = tuple(np.dtype(t) for t in (ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e4m3fnuz, ml_dtypes.float8_e5m2,
                                     ml_dtypes.float8_e5m2fnuz))
EXTENDED: dict[str, np.dtype] = {d.name: d for d in (INT4, UINT4, BFLOAT16, *FLOAT8)}
FOUR_BIT = (INT4, UINT4)


def name(dtype: Any) -> str:
    """The dtype's string in programs and the context binary: NumPy's, or the ml_dtypes name."""
    dt = np.dtype(dtype)
    return dt.name if dt in EXTENDED.values() else dt.str


def from_name(text: str) -> np.dtype | None:
    """The extended dtype a name stands for, or None."""
    return EXTENDED.get(text)


_BY_TEXT: dict[str, np.dtype] = {}


def dtype_of(text: str) -> np.dtype:
    """The dtype a program's dtype string names (NumPy's string or an extended name), looked up once per string:
    a run's checks compare many IO tensors' dtypes."""
    dt = _BY_TEXT.get(text)
    if dt is None:
        dt = _BY_TEXT[text] = EXTENDED.get(text) or np.dtype(text)
    return dt


def is_4bit(dtype: Any) -> bool:
    return np.dtype(dtype) in FOUR_BIT


def is_float8(dtype: Any) -> bool:
    return np.dtype(dtype) in FLOAT8


def int_range(dtype: Any) -> tuple[int, int]:
    """(min, max) of an integer dtype, 4-bit ones included."""
    dt = np.dtype(dtype)
    if dt == INT4:
        return -8, 7
    if dt == UINT4:
        return 0, 15
    info = np.iinfo(dt)
    return int(info.min), int(info.max)


def packed_nbytes(count: int) -> int:
    return (int(count) + 1) // 2


def pack4(values: np.ndarray) -> np.ndarray:
    """A 4-bit array as ONNX stores it: two values a byte, element 2k in the low nibble of byte k (an odd count
    leaves the last high nibble 0)."""
    flat = np.ascontiguousarray(values).reshape(-1).view(np.uint8) & 0x0F  # ml_dtypes keeps the low nibble
    out = np.zeros(packed_nbytes(flat.size), np.uint8)
    out[:] = flat[0::2]
    out[:flat.size // 2] |= flat[1::2] << 4
    return out


def unpack4(packed: np.ndarray, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """The inverse of `pack4` (a new array; kernels unpack into their own buffers as they run)."""
    n = int(np.prod(shape, dtype=np.int64))
    raw = np.empty(2 * packed.size, np.uint8)
    raw[0::2] = packed & 0x0F
    raw[1::2] = packed >> 4
    return raw[:n].view(np.dtype(dtype)).reshape(shape).copy()


def as_ref(weight: Any, shape: tuple[int, ...], dtype: Any) -> Any:
    """A weight as a step reads it: reshaped to the ref's shape, or a 4-bit one's packed bytes as they are."""
    return weight if is_4bit(dtype) else weight.reshape(shape)


def stored(value: np.ndarray | None) -> np.ndarray | None:
    """A constant in the form kernels are given it: 4-bit ones packed (`pack4`), others as they are."""
    if value is None or not is_4bit(value.dtype):
        return value
    return pack4(value)
