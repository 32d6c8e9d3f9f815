"""MessagePack in and out of the META and PROGRAMS sections, with hard limits and typed checks.

Decoding never trusts a count: msgpack's own limits are set from the section's length, and the
decoded value is checked field by field (types, ranges, dtypes) before anything is built from it.
Every problem raises FormatError with the path of the offending field, e.g.
"META graphs[0] inputs[1] shape[2]: expected an int in [0, 281474976710656], got int -3".
"""

from __future__ import annotations

import reprlib
import warnings
from typing import Any

import msgpack
import numpy as np

from ctxrt import dtypes
from ctxrt.errors import FormatError
from ctxrt.format.layout import MAX_ALIGNMENT

EXT_NDARRAY, EXT_SCALAR, EXT_BODY = 1, 2, 3  # EXT_BODY: a control-flow body (format/schema.py)
NUMERIC_KINDS = "biufc"  # bool, int, uint, float, complex: no objects, strings, datetimes or records
MAX_RANK = 32
MAX_DIM = 1 << 48
MAX_TENSOR_BYTES = 1 << 48
MAX_INT = 1 << 62  # offsets, sizes, counts: far beyond any real file, small enough to never overflow int64
MAX_DEPTH = 32  # nesting of attribute and tuning values; msgpack itself allows ~1000, Python recursion less


# -- encoding --------------------------------------------------------------------------------------

def _default(obj: Any) -> msgpack.ExtType:
    # Only numpy values reach here: plain Python values are packed natively.
    if isinstance(obj, np.ndarray):
        arr = np.ascontiguousarray(obj)
        body = [dtypes.name(arr.dtype), list(arr.shape), arr.tobytes()]
        return msgpack.ExtType(EXT_NDARRAY, msgpack.packb(body, use_bin_type=True))
    if isinstance(obj, np.generic):
        return msgpack.ExtType(EXT_SCALAR, msgpack.packb([dtypes.name(obj.dtype), obj.tobytes()], use_bin_type=True))
    raise TypeError(f"cannot store a value of type {type(obj).__name__}")


def encode(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True, default=_default)


def check_attr(value: Any, where: str, depth: int = 0) -> None:
    """Refuse, at write time, attribute values that this format cannot store and give back."""
    if depth > MAX_DEPTH:
        raise FormatError(f"{where}: nested deeper than {MAX_DEPTH} levels")
    if value is None or isinstance(value, bool | float | str | bytes):
        return
    if isinstance(value, int):
        if not -(1 << 63) <= value < 1 << 64:
            raise FormatError(f"{where}: int {value} does not fit in 64 bits")
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            check_attr(v, f"{where}[{i}]", depth + 1)
    elif isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                raise FormatError(f"{where}: dict keys must be str, got {type(k).__name__}")
            check_attr(v, f"{where}[{k!r}]", depth + 1)
    elif isinstance(value, np.ndarray | np.generic):
        if not numeric(value.dtype):
            raise FormatError(f"{where}: numpy dtype {value.dtype} is not numeric or bool")
    else:
        raise FormatError(f"{where}: cannot store a value of type {type(value).__name__}")


# -- decoding --------------------------------------------------------------------------------------

def _no_ext(code: int, data: bytes) -> Any:
    raise FormatError(f"unexpected msgpack extension type {code}")


def decode(data: bytes | memoryview, what: str, keep_ext: bool = False) -> Any:
    """Bounded msgpack decode; extensions are refused, or kept as ExtType for `from_ext` (PROGRAMS)."""
    n = len(data)
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=True, use_list=True,
                               ext_hook=msgpack.ExtType if keep_ext else _no_ext,
                               max_str_len=n, max_bin_len=n, max_array_len=n, max_map_len=n // 2,
                               max_ext_len=n)
    except FormatError as e:  # from the extension hook
        raise FormatError(f"{what}: {e}") from None
    except Exception as e:  # msgpack raises ValueError subclasses, UnicodeDecodeError, TypeError, ...
        raise FormatError(f"{what} is not valid msgpack: {type(e).__name__}: {e}") from e


def from_ext(ext: msgpack.ExtType, where: str) -> np.ndarray | np.generic:
    """A numpy array or scalar attribute back from its extension payload, checked before use."""
    if ext.code not in (EXT_NDARRAY, EXT_SCALAR):
        raise FormatError(f"{where}: unknown msgpack extension type {ext.code}")
    size = 3 if ext.code == EXT_NDARRAY else 2
    body = as_list(decode(ext.data, f"{where} payload"), f"{where} payload", size=size)
    dt = as_dtype(body[0], f"{where} dtype")
    shape = as_shape(body[1], f"{where} shape", dt) if ext.code == EXT_NDARRAY else ()
    raw = body[-1]
    if not isinstance(raw, bytes) or len(raw) != nbytes(shape, dt):
        raise FormatError(f"{where}: {list(shape)} {dt} needs {nbytes(shape, dt)} bytes of data")
    if ext.code == EXT_SCALAR:
        return np.frombuffer(raw, dt)[0]
    return np.frombuffer(raw, dt).reshape(shape).copy()  # a copy: attrs are writable like the original


# -- typed access to decoded values -------------------------------------------------------------------

_SHORT = reprlib.Repr()  # bounded depth and length: safe on hostile, deeply nested values
_SHORT.maxlevel, _SHORT.maxstring, _SHORT.maxother, _SHORT.maxlist, _SHORT.maxdict = 3, 40, 40, 6, 4


def _fail(where: str, expected: str, got: Any) -> FormatError:
    return FormatError(f"{where}: expected {expected}, got {type(got).__name__} {_SHORT.repr(got)}")


def as_int(v: Any, where: str, lo: int = 0, hi: int = MAX_INT) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
        raise _fail(where, f"an int in [{lo}, {hi}]", v)
    return v


def as_pow2(v: Any, where: str) -> int:
    n = as_int(v, where, 1, MAX_ALIGNMENT)
    if n & (n - 1):
        raise _fail(where, "a power of two", v)
    return n


def as_str(v: Any, where: str) -> str:
    if not isinstance(v, str):
        raise _fail(where, "a str", v)
    return v


def as_list(v: Any, where: str, size: int | None = None) -> list[Any]:
    if not isinstance(v, list) or (size is not None and len(v) != size):
        raise _fail(where, "a list" if size is None else f"a list of {size}", v)
    return v


def as_map(v: Any, where: str) -> dict[str, Any]:
    if not isinstance(v, dict) or not all(isinstance(k, str) for k in v):
        raise _fail(where, "a map with str keys", v)
    return v


def field(m: dict[str, Any], key: str, where: str) -> Any:
    if key not in m:
        raise FormatError(f"{where}: missing key {key!r}")
    return m[key]


def numeric(dt: np.dtype) -> bool:
    """NumPy's bool and number dtypes, and the extended ones of ctxrt.dtypes (int4, float8, ...)."""
    return (dt.kind in NUMERIC_KINDS and dt.fields is None and dt.subdtype is None) or dt in dtypes.EXTENDED.values()


_DTYPES: dict[str, np.dtype] = {}  # dtype strings met and accepted (a file names a few, each on every ref)


def as_dtype(v: Any, where: str) -> np.dtype:
    hit = _DTYPES.get(v) if v.__class__ is str else None
    if hit is not None:
        return hit
    dt = _as_dtype(v, where)
    if len(_DTYPES) < 256:
        _DTYPES[v] = dt
    return dt


def _as_dtype(v: Any, where: str) -> np.dtype:
    s = as_str(v, where)
    extended = dtypes.from_name(s)
    if extended is not None:
        return extended
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dt = np.dtype(s) if len(s) <= 16 else None
    except Exception:
        dt = None
    if dt is None or dt.kind not in NUMERIC_KINDS or dt.fields is not None or dt.subdtype is not None:
        raise _fail(where, "a numeric or bool numpy dtype string (or an extended dtype's name)", v)
    return dt


def as_shape(v: Any, where: str, dt: np.dtype) -> tuple[int, ...]:
    dims = as_list(v, where)
    if len(dims) > MAX_RANK:
        raise FormatError(f"{where}: rank {len(dims)} exceeds {MAX_RANK}")
    shape = tuple(dims)
    if not all(d.__class__ is int and 0 <= d <= MAX_DIM for d in shape):  # (the message names the first misfit)
        shape = tuple(as_int(d, f"{where}[{i}]", 0, MAX_DIM) for i, d in enumerate(dims))
    if nbytes(shape, dt) > MAX_TENSOR_BYTES:
        raise FormatError(f"{where}: {list(shape)} of {dt} is {nbytes(shape, dt)} bytes, "
                          f"over the limit of {MAX_TENSOR_BYTES}")
    return shape


def check_depth(v: Any, where: str, depth: int = 0) -> None:
    """Refuse decoded values nested deeper than MAX_DEPTH, before anything recurses into them."""
    if depth > MAX_DEPTH:
        raise FormatError(f"{where}: nested deeper than {MAX_DEPTH} levels")
    for x in v.values() if isinstance(v, dict) else v if isinstance(v, list) else ():
        check_depth(x, where, depth + 1)


def nbytes(shape: tuple[int, ...], dt: np.dtype) -> int:
    n = dt.itemsize
    for d in shape:  # Python ints: no silent int64 overflow on hostile shapes
        n *= d
    return n


def stored_nbytes(shape: tuple[int, ...], dt: np.dtype) -> int:
    """Bytes of a weight in the weights section: 4-bit types packed two a byte, others as in memory."""
    return dtypes.packed_nbytes(nbytes(shape, dt)) if dtypes.is_4bit(dt) else nbytes(shape, dt)
