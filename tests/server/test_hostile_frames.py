"""10,000 malformed or hostile frames: each is answered with an error frame (the connection closed only where
the stream cannot be trusted any more), and a valid client is served correctly afterwards."""

from __future__ import annotations

import socket
from collections import Counter
from collections.abc import Iterator
from typing import Any

import msgpack
import numpy as np
import pytest
from server_helpers import TOKEN, Raw, add_spec

from ctxrt.backends import get_backend
from ctxrt.backends.opencl.elementwise import Elementwise
from ctxrt.errors import ServerError
from ctxrt.tuning import protocol as p
from ctxrt.tuning.client import Client, RemoteDevice
from ctxrt.tuning.server import Server

PERSISTENT = 9_400  # frames on open connections
PER_CONNECTION = 600  # frames that each end their connection
SPEC = p.spec_to_wire(add_spec())


@pytest.fixture(scope="module")
def server(opencl: str) -> Iterator[Server]:
    srv = Server("127.0.0.1", 0, TOKEN, read_timeout=1.0).start()
    yield srv
    srv.close()


def _packed(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def _deep(depth: int) -> Any:
    v: Any = 1
    for _ in range(depth):
        v = [v]
    return v


def _bad_requests(rng: np.random.Generator) -> Iterator[tuple[bytes, tuple[str, ...], int | None]]:
    """(frame body, acceptable error codes, the id the answer must echo)."""
    ext = msgpack.ExtType
    fixed: list[tuple[Any, tuple[str, ...], int | None]] = [
        (1, ("bad_request",), None), ([1, 2], ("bad_request",), None), ("profile", ("bad_request",), None),
        ({}, ("bad_request",), None), ({"id": "1", "method": "device_info", "params": {}}, ("bad_request",), None),
        ({"id": -1, "method": "device_info", "params": {}}, ("bad_request",), None),
        ({"id": 2 ** 64 - 1, "method": "device_info", "params": {}}, ("bad_request",), None),
        ({"id": True, "method": "device_info", "params": {}}, ("bad_request",), None),
        ({"id": 5, "method": 7, "params": {}}, ("bad_request",), 5),
        ({"id": 6, "method": "x" * 100, "params": {}}, ("too_large",), 6),
        ({"id": 7, "method": "device_info", "params": []}, ("bad_request",), 7),
        ({"id": 8, "method": "rm -rf /", "params": {}}, ("unknown_method",), 8),
        ({"id": 9, "method": "__init__", "params": {}}, ("unknown_method",), 9),
        ({"id": 10, "method": "compile", "params": {}}, ("bad_request",), 10),
        ({"id": 11, "method": "compile", "params": {"name": "a", "source": 3, "options": ""}}, ("bad_request",), 11),
        ({"id": 12, "method": "compile", "params": {"name": "a", "source": "", "options": "x" * (p.MAX_OPTIONS + 1)}},
         ("too_large",), 12),
        ({"id": 13, "method": "profile", "params": {"spec": 3}}, ("bad_request",), 13),
        ({"id": 14, "method": "profile", "params": {"spec": {**SPEC, "inputs": [[[4, 16], "object"]]}}},
         ("bad_request",), 14),
        ({"id": 15, "method": "profile", "params": {"spec": {**SPEC, "inputs": [[[-4, 16], "<f4"]]}}},
         ("bad_request",), 15),
        ({"id": 16, "method": "profile", "params": {"spec": {**SPEC, "inputs": [[[1 << 40, 1 << 8], "<f4"]]}}},
         ("too_large", "bad_request"), 16),
        ({"id": 17, "method": "profile", "params": {"spec": SPEC, "kernel": "Elementwise", "source_hash": "x",
                                                    "default": {}, "candidates": "all"}}, ("bad_request",), 17),
        ({"id": 18, "method": "profile", "params": {"spec": SPEC, "kernel": "Elementwise", "source_hash": "x",
                                                    "default": {}, "candidates": [{}] * (p.MAX_CANDIDATES + 1)}},
         ("too_large",), 18),
        ({"id": 19, "method": "profile", "params": {"spec": SPEC, "kernel": "Elementwise", "source_hash": "x",
                                                    "default": {"VW": [1]}, "candidates": []}}, ("bad_request",), 19),
        ({"id": 20, "method": "profile", "params": {"spec": SPEC, "kernel": "Elementwise", "source_hash": "x",
                                                    "default": {}, "candidates": [],
                                                    "settings": {"min_runs": 10 ** 9}}}, ("bad_request",), 20),
        ({"id": 21, "method": "execute", "params": {"spec": SPEC, "kernel": "Elementwise", "source_hash": "x",
                                                    "params": {}, "inputs": [1, 2]}}, ("bad_request",), 21),
        ({"id": 22, "method": "execute", "params": {"spec": SPEC, "kernel": "Elementwise", "source_hash": "x",
                                                    "params": {}, "inputs": [ext(1, b"junk")]}}, ("bad_request",), 22),
        ({"id": 23, "method": "execute", "params": {"spec": SPEC, "kernel": "Elementwise", "source_hash": "x",
                                                    "params": {}, "inputs": [ext(99, b"")]}}, ("bad_request",), 23),
        ({"id": 24, "method": "profile", "params": {"spec": {**SPEC, "attrs": {"a": _deep(60)}}}},
         ("bad_request",), 24),
        ({"id": 25, "method": "profile", "params": {"spec": {**SPEC, "consts": [ext(1, b"x")]}}},
         ("bad_request",), 25),
    ]
    for k in range(PERSISTENT):
        kind = k % 4
        if kind == 0:  # random bytes: malformed msgpack (or, by chance, a value that is not a request)
            yield rng.bytes(int(rng.integers(1, 64))), ("malformed", "bad_request"), None
        elif kind == 1:
            obj, codes, rid = fixed[k // 4 % len(fixed)]
            yield _packed(obj), codes, rid
        elif kind == 2:
            yield _packed({"id": k, "method": f"method_{k}", "params": {}}), ("unknown_method",), k
        else:  # well-formed maps with wrong field types
            junk = [None, 1.5, True, [1], {"a": 1}, b"\x00", -7][k % 7]
            yield _packed({"id": k, "method": "compile", "params": {"name": junk, "source": junk, "options": junk}}), \
                ("bad_request",), k


def _connection_cases(rng: np.random.Generator, n: int) -> Iterator[tuple[str, bytes, bool, tuple[str, ...]]]:
    """(label, bytes to send, half-close after sending, acceptable error codes): each ends its connection. Cases
    that start with a good handshake get its answer first."""
    hello = p.MAGIC + p.pack({"protocol": p.PROTOCOL, "token": TOKEN})
    for k in range(n):
        kind = k % 8
        if kind == 0:
            yield "random handshake", rng.bytes(8) + rng.bytes(int(rng.integers(0, 64))), True, ("bad_magic",)
        elif kind == 1:
            yield "wrong token", p.MAGIC + p.pack({"protocol": p.PROTOCOL, "token": f"guess{k}"}), False, ("bad_token",)
        elif kind == 2:
            yield "no token", p.MAGIC + p.pack({"protocol": p.PROTOCOL}), False, ("bad_token",)
        elif kind == 3:
            yield "token of another type", p.MAGIC + p.pack({"protocol": p.PROTOCOL, "token": [TOKEN]}), False, \
                ("bad_token",)
        elif kind == 4:
            yield "wrong version", p.MAGIC + p.pack({"protocol": 99, "token": TOKEN}), False, ("bad_version",)
        elif kind == 5:
            length = [0xFFFFFFFF, p.MAX_FRAME + 1, 0][k // 8 % 3]
            yield "huge or empty length", hello + p.LENGTH.pack(length), False, ("too_large",)
        elif kind == 6:
            yield "truncated frame", hello + p.LENGTH.pack(100) + rng.bytes(int(rng.integers(0, 100))), True, \
                ("truncated",)
        else:
            yield "truncated handshake", p.MAGIC[:int(rng.integers(1, 8))] if k % 16 < 8 else hello[:-3], True, \
                ("truncated",)


def test_ten_thousand_hostile_frames_get_error_frames_then_a_valid_client_is_served(server: Server) -> None:
    rng = np.random.default_rng(11)
    address = server.address
    hello = p.MAGIC + p.pack({"protocol": p.PROTOCOL, "token": TOKEN})
    answered: Counter[str] = Counter()
    conns = [Raw(address) for _ in range(4)]
    for k, (body, codes, rid) in enumerate(_bad_requests(rng)):
        answer = conns[k % 4].ask(body)
        error = answer.get("error") if isinstance(answer, dict) else None
        assert isinstance(error, dict) and error["code"] in codes, (body[:80], answer)
        assert answer["id"] == rid, (body[:80], answer)
        answered[error["code"]] += 1
    for c in conns:
        c.close()
    for label, data, half_close, codes in _connection_cases(rng, PER_CONNECTION):
        raw = Raw(address, hello=False)
        raw.send(data)
        if half_close:
            raw.sock.shutdown(socket.SHUT_WR)  # the server reads to the end of the stream and answers
        answer = raw.frame()
        if data.startswith(hello) and len(data) > len(hello):
            assert answer.get("protocol") == p.PROTOCOL, (label, answer)
            answer = raw.frame()
        assert answer["error"]["code"] in codes, (label, answer)
        assert raw.closed(), label
        answered[answer["error"]["code"]] += 1
        raw.close()
    assert sum(answered.values()) == PERSISTENT + PER_CONNECTION == 10_000
    assert {"malformed", "bad_request", "unknown_method", "too_large", "truncated", "bad_token", "bad_magic",
            "bad_version"} <= set(answered)

    client = Client(address, TOKEN)
    assert client.call("device_info")["device_id"]["tier"] == get_backend("opencl").info.tier
    x = np.arange(64, dtype=np.float32).reshape(4, 16)
    b = np.linspace(-1, 1, 16, dtype=np.float32)
    (y,) = RemoteDevice(client).execute(Elementwise(add_spec(), get_backend("opencl")), [x, b])
    np.testing.assert_array_equal(y, x + b)
    client.close()


def test_a_stalled_client_is_answered_and_disconnected(server: Server) -> None:
    raw = Raw(server.address)
    raw.send(p.LENGTH.pack(50)[:2])  # half a length, then nothing: the read timeout (1 s here) ends it
    answer = raw.frame()
    assert answer["error"]["code"] == "timeout" and raw.closed()
    raw.close()


def test_wrong_token_through_the_client(server: Server) -> None:
    with pytest.raises(ServerError) as e:
        Client(server.address, "not the token")
    assert e.value.code == "bad_token"


def test_an_idle_connection_is_closed_and_the_client_reconnects(opencl: str) -> None:
    srv = Server("127.0.0.1", 0, TOKEN, idle_timeout=0.5).start()
    try:
        raw = Raw(srv.address)
        answer = raw.frame()  # nothing sent: the idle timeout ends the connection, with a reason
        assert answer["error"]["code"] == "idle" and raw.closed()
        raw.close()
        client = Client(srv.address, TOKEN)
        first = client.call("device_info")
        assert client.sock is not None
        client.sock.recv(1 << 16, socket.MSG_PEEK)  # blocks until the server's idle error frame arrives
        assert client.call("device_info") == first  # the dropped connection is opened again
        client.close()
    finally:
        srv.close()
