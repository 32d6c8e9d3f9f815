"""The target server's wire format (docs/protocol.md): a handshake, then length-prefixed MessagePack frames.

    client -> server   MAGIC (8 bytes), then frame {"protocol": 1, "token": str | None, "client": str}
    server -> client   frame {"protocol": 1, "server": str} or an error frame, then the connection closes
    then, repeatedly:
    client -> server   frame {"id": int, "method": str, "params": map}
    server -> client   frame {"id": int, "result": ...} or {"id": int | None, "error": {"code": str, "message": str}}

A frame is a 4-byte little-endian length N (1 <= N <= MAX_FRAME) followed by N bytes of MessagePack. NumPy
arrays travel as the context binary's extension types (format/codec.py). Every field is checked here, with the
limits below, before anything acts on it; a problem is a ProtocolError whose code goes back in an error frame.
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Callable
from typing import Any

import msgpack
import numpy as np

from ctxrt.backends.kernel import NodeSpec, TensorSpec
from ctxrt.errors import FormatError
from ctxrt.format import codec

MAGIC = b"CTXRTRPC"
PROTOCOL = 1
DEFAULT_PORT = 22598
MAX_FRAME = 256 << 20  # bytes of one frame: a hostile length never makes the server allocate more
MAX_HELLO = 4096  # bytes of the handshake's frame: nothing bigger is read from a client not yet authenticated
MAX_ARRAY = 8192  # elements of one msgpack array in a frame (twice the longest the protocol has: candidates)
MAX_MAP = 1024  # entries of one msgpack map in a frame
LENGTH = struct.Struct("<I")
MAX_SOURCE = 4 << 20  # characters of one OpenCL source
MAX_OPTIONS = 64 << 10
MAX_CANDIDATES = 4096  # per profile request
MAX_TENSOR = 64 << 20  # bytes of one tensor a profile or execute request may ask the device for
MAX_NODE = 512 << 20  # bytes of all of one node's inputs and outputs together
MAX_TOKEN = 1024


class ProtocolError(Exception):
    """A frame or request the server refuses; `code` is what the error frame says (docs/protocol.md)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


# -- frames --------------------------------------------------------------------------------------------
def pack(obj: Any) -> bytes:
    body = codec.encode(obj)
    if len(body) > MAX_FRAME:
        raise ProtocolError("too_large", f"a frame of {len(body)} bytes exceeds the limit of {MAX_FRAME}")
    return LENGTH.pack(len(body)) + body


def error_frame(code: str, message: str, request_id: int | None = None) -> bytes:
    return pack({"id": request_id, "error": {"code": code, "message": message[:2000]}})


def read_exact(sock: socket.socket, n: int, started: bool, deadline: float | None = None) -> bytes:
    """n bytes. A clean end of stream before the first byte of a frame is EOFError; anywhere else a
    'truncated' ProtocolError. With a `deadline` (time.monotonic()), all n bytes must arrive before it, however
    the client spaces them: TimeoutError otherwise. Socket timeouts propagate (the caller knows which applied)."""
    chunks, got = [], 0
    while got < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            sock.settimeout(left)
        chunk = sock.recv(min(n - got, 1 << 20))
        if not chunk:
            if got == 0 and not started:
                raise EOFError
            raise ProtocolError("truncated", f"the stream ended {got} bytes into a {n}-byte read")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def read_frame(sock: socket.socket, on_start: Callable[[], float | None] | None = None, max_len: int = MAX_FRAME,
               reserve: Callable[[int, float | None], Any] | None = None) -> Any:
    """One decoded frame. `on_start` runs once the frame's first byte arrived and returns the deadline of the
    whole frame (or None). A length over `max_len` is refused before its body is read. `reserve(n, deadline)`
    is called with the body's length before the body is read (the server's memory budget): it may raise."""
    head = read_exact(sock, 1, False)
    deadline = on_start() if on_start is not None else None
    (n,) = LENGTH.unpack(head + read_exact(sock, LENGTH.size - 1, True, deadline))
    if not 1 <= n <= max_len:
        raise ProtocolError("too_large", f"frame length {n} is outside 1..{max_len}")
    if reserve is not None:
        reserve(n, deadline)
    body = read_exact(sock, n, True, deadline)
    return decode(body)


def decode(body: bytes) -> Any:
    """A frame's MessagePack, with strings, arrays and maps bounded before objects are made for them (msgpack
    itself bounds nesting; fields are checked for depth where they are read)."""
    n = len(body)
    try:
        value = msgpack.unpackb(body, raw=False, strict_map_key=True, use_list=True, ext_hook=msgpack.ExtType,
                                max_str_len=min(n, 4 * MAX_SOURCE), max_bin_len=n, max_array_len=min(n, MAX_ARRAY),
                                max_map_len=min(n // 2, MAX_MAP), max_ext_len=n)
    except Exception as e:  # msgpack raises ValueError subclasses, UnicodeDecodeError, TypeError, ...
        raise ProtocolError("malformed", f"frame is not valid msgpack: {type(e).__name__}: {e}") from None
    return value


# -- typed fields ----------------------------------------------------------------------------------------
def checked(fn: Callable[..., Any], *args: Any) -> Any:
    """Run a codec check; its FormatError becomes a bad_request."""
    try:
        return fn(*args)
    except FormatError as e:
        raise ProtocolError("bad_request", str(e)) from None


def get(m: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str, limit: int | None = None) -> Any:
    if key not in m:
        raise ProtocolError("bad_request", f"{where}: missing {key!r}")
    v = m[key]
    if not isinstance(v, kind) or (isinstance(v, bool) and kind is int):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise ProtocolError("bad_request", f"{where} {key}: expected {names}, got {type(v).__name__}")
    if limit is not None and len(v) > limit:
        raise ProtocolError("too_large", f"{where} {key}: {len(v)} long, the limit is {limit}")
    return v


def request(frame: Any) -> tuple[int, str, dict[str, Any]]:
    """(id, method, params) of a request frame."""
    if not isinstance(frame, dict):
        raise ProtocolError("bad_request", f"a request is a map, got {type(frame).__name__}")
    rid = get(frame, "id", int, "request")
    if not 0 <= rid < 1 << 63:
        raise ProtocolError("bad_request", f"request id {rid} is outside 0..2^63")
    return rid, get(frame, "method", str, "request", 64), get(frame, "params", dict, "request")


def params_map(value: Any, where: str) -> dict[str, Any]:
    return checked(_params, value, where)


def _params(value: Any, where: str) -> dict[str, Any]:
    from ctxrt.format.schema import params

    return params(value, where)


def array(value: Any, where: str) -> np.ndarray:
    arr = checked(codec.from_ext, value, where) if isinstance(value, msgpack.ExtType) else None
    if not isinstance(arr, np.ndarray):
        raise ProtocolError("bad_request", f"{where}: expected an array")
    if arr.nbytes > MAX_TENSOR:
        raise ProtocolError("too_large", f"{where}: {arr.nbytes} bytes, the limit is {MAX_TENSOR}")
    return arr


# -- node specs ------------------------------------------------------------------------------------------
def spec_to_wire(spec: NodeSpec, consts_limit: int = 8 << 20) -> dict[str, Any]:
    """A node's spec as plain data; constants larger than `consts_limit` bytes are left out (the device fills
    those inputs with random values, as for any non-constant input)."""
    def t(x: TensorSpec | None) -> Any:
        return None if x is None else [list(map(int, x.shape)), np.dtype(x.dtype).str]
    consts = [c if isinstance(c, np.ndarray) and c.nbytes <= consts_limit else None for c in spec.consts or []]
    return {"op": spec.op, "name": spec.name, "attrs": spec.attrs, "inputs": [t(x) for x in spec.inputs],
            "outputs": [t(x) for x in spec.outputs], "consts": consts, "opset": int(spec.opset)}


def _tensor(value: Any, where: str) -> TensorSpec:
    shape, dtype = checked(codec.as_list, value, where, 2)
    dt = checked(codec.as_dtype, dtype, f"{where} dtype")
    dims = checked(codec.as_shape, shape, f"{where} shape", dt)
    if codec.nbytes(dims, dt) > MAX_TENSOR:
        raise ProtocolError("too_large", f"{where}: {codec.nbytes(dims, dt)} bytes, the limit is {MAX_TENSOR}")
    return TensorSpec(dims, dt)


def spec_from_wire(value: Any, where: str = "spec") -> NodeSpec:
    m = value if isinstance(value, dict) else {}
    if not isinstance(value, dict):
        raise ProtocolError("bad_request", f"{where}: expected a map")
    attrs = get(m, "attrs", dict, where)
    checked(codec.check_depth, attrs, f"{where} attrs")
    inputs = [None if x is None else _tensor(x, f"{where} inputs[{i}]")
              for i, x in enumerate(get(m, "inputs", list, where, 64))]
    outputs = [_tensor(x, f"{where} outputs[{i}]") for i, x in enumerate(get(m, "outputs", list, where, 64))]
    consts = [None if c is None else array(c, f"{where} consts[{i}]")
              for i, c in enumerate(get(m, "consts", list, where, 64))]
    total = sum(codec.nbytes(t.shape, np.dtype(t.dtype)) for t in [*inputs, *outputs] if t is not None)
    if total > MAX_NODE:
        raise ProtocolError("too_large", f"{where}: its tensors need {total} bytes, the limit is {MAX_NODE}")
    if len(consts) > len(inputs):
        raise ProtocolError("bad_request", f"{where}: {len(consts)} constants for {len(inputs)} inputs")
    for i, (c, t) in enumerate(zip(consts, inputs, strict=False)):
        if c is not None and (t is None or c.shape != t.shape or c.dtype != t.dtype):
            raise ProtocolError("bad_request", f"{where} consts[{i}] does not match inputs[{i}]")
    opset = get(m, "opset", int, where)
    return NodeSpec(get(m, "op", str, where, 64), get(m, "name", str, where, 1024),
                    {k: checked(_attr, v, f"{where} attrs[{k!r}]") for k, v in attrs.items()},
                    inputs, outputs, consts + [None] * (len(inputs) - len(consts)), opset)


def _attr(v: Any, where: str) -> Any:
    if isinstance(v, msgpack.ExtType):
        return codec.from_ext(v, where)
    if isinstance(v, list):
        return [_attr(x, f"{where}[{i}]") for i, x in enumerate(v)]
    if isinstance(v, dict):
        return {k: _attr(x, f"{where}[{k!r}]") for k, x in v.items()}
    return v
