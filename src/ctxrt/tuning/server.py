"""`ctxrt serve`: the target server (QNN's qnn-gpu-target-server; docs/protocol.md).

It compiles OpenCL programs, profiles kernels' candidates and executes kernels on this machine's OpenCL device
for a host that drives a compile (`TARGET_SERVER_SOCKET=host:port ctxrt compile ...`). It binds 127.0.0.1 unless
told otherwise and always requires a token (generated when none is given): TVM's RPC server has none at all.
Limits come before trust: a client that has not shown the token can make the server read a few KiB within a
short deadline, nothing more.

Each connection has a thread; every frame it sends gets an answer, a bad one an error frame (protocol.py), and
a connection is closed only when its stream cannot be trusted any more (a wrong handshake, an oversized or
truncated frame, a frame not whole within the read timeout, or idle past the idle timeout). Every request is
checked against what its kernel will do before the device sees it (guard.py); jobs that touch the device go to
one device process, one at a time, each within a time and a memory limit (worker.py).
"""

from __future__ import annotations

import contextlib
import hmac
import secrets
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import ctxrt
from ctxrt.errors import CtxrtError
from ctxrt.tuning import guard
from ctxrt.tuning import protocol as p
from ctxrt.tuning.worker import DeviceWorker

SETTINGS = {"min_runs": (int, 1, 1000), "max_runs": (int, 1, 100000), "min_total_s": ((int, float), 0, 60),
            "budget_s": ((int, float, type(None)), 0, 1e9)}


def _settings(value: Any) -> dict[str, Any]:
    m = p.get({"settings": value}, "settings", dict, "profile")
    out = {}
    for key, v in m.items():
        if key not in SETTINGS:
            raise p.ProtocolError("bad_request", f"profile settings: unknown key {key[:40]!r}")
        kind, lo, hi = SETTINGS[key]
        if not isinstance(v, kind) or isinstance(v, bool) or (v is not None and not lo <= v <= hi):
            raise p.ProtocolError("bad_request", f"profile settings {key}: expected a number in [{lo}, {hi}]")
        out[key] = v
    return out


def _kernel_args(params: dict[str, Any], method: str) -> dict[str, Any]:
    return {"spec": p.spec_from_wire(params.get("spec"), f"{method} spec"),
            "kernel": p.get(params, "kernel", str, method, 128),
            "source_hash": p.get(params, "source_hash", str, method, 128)}


def _compile(server: Server, params: dict[str, Any]) -> Any:
    args = {"name": p.get(params, "name", str, "compile", 256),
            "source": p.get(params, "source", str, "compile", p.MAX_SOURCE),
            "options": p.get(params, "options", str, "compile", p.MAX_OPTIONS)}
    guard.check_options(args["options"])
    guard.check_source(args["source"])
    return server.worker.call("compile", args)


def _profile(server: Server, params: dict[str, Any]) -> Any:
    args = _kernel_args(params, "profile")
    args["default"] = p.params_map(params.get("default"), "profile default")
    candidates = p.get(params, "candidates", list, "profile", p.MAX_CANDIDATES)
    args["candidates"] = [p.params_map(c, f"profile candidates[{i}]") for i, c in enumerate(candidates)]
    args["settings"] = _settings(params.get("settings", {}))
    return server.worker.call("profile", args)


def _execute(server: Server, params: dict[str, Any]) -> Any:
    args = _kernel_args(params, "execute")
    args["params"] = p.params_map(params.get("params"), "execute params")
    args["inputs"] = [None if a is None else p.array(a, f"execute inputs[{i}]")
                      for i, a in enumerate(p.get(params, "inputs", list, "execute", 64))]
    return server.worker.call("execute", args)


def _device_info(server: Server, params: dict[str, Any]) -> Any:
    return {**server.worker.info, "server": f"ctxrt {ctxrt.__version__}", "protocol": p.PROTOCOL,
            "job_timeout_s": server.worker.job_timeout}


# method -> handler(server, params): the whole surface a client can reach
METHODS: dict[str, Callable[[Server, dict[str, Any]], Any]] = {
    "device_info": _device_info, "compile": _compile, "profile": _profile, "execute": _execute,
}
CLOSING = ("too_large", "truncated", "busy")  # after these the stream is out of step: answer, then close
LINGER_BYTES = 1 << 20  # read and dropped at most, while closing a connection
ACCEPT_BACKOFF = (0.01, 1.0)  # seconds: first and longest wait after accept() fails (e.g. out of descriptors)
ACCEPT_POLL = 0.25  # seconds between wake-ups of a blocked accept() (pending signals run then)


class Budget:
    """Bytes of request frames the server holds at once, over all connections: a frame's body is read only once
    its bytes are reserved here (twice its length: the body and what decoding makes of it)."""

    def __init__(self, limit: int) -> None:
        self.limit, self.used = limit, 0
        self._cond = threading.Condition()

    def reserve(self, n: int, deadline: float | None) -> None:
        with self._cond:
            while self.used + n > self.limit:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0 or not self._cond.wait(left):
                    raise p.ProtocolError("busy", f"the server holds {self.used} bytes of requests, its limit is "
                                                  f"{self.limit}: a {n}-byte frame waited past its deadline")
            self.used += n

    def release(self, n: int) -> None:
        with self._cond:
            self.used -= n
            self._cond.notify_all()


class Server:
    """A target server on `host:port` (port 0: any free port; `address` says which).

    Without a `token` one is generated (`token` says which): every client must prove it knows it. Before a
    client has, it may send MAX_HELLO bytes within `handshake_timeout` seconds, nothing more; `max_pending`
    such clients wait at once, the oldest dropped for a newcomer. `max_clients` authenticated clients are served
    at once; each frame must arrive whole within `read_timeout`; frames held at once total `memory_budget`
    bytes at most."""

    def __init__(self, host: str = "127.0.0.1", port: int = p.DEFAULT_PORT, token: str | None = None,
                 job_timeout: float = 600.0, read_timeout: float = 30.0, idle_timeout: float = 3600.0,
                 max_clients: int = 64, *, handshake_timeout: float = 10.0, max_pending: int = 256,
                 memory_budget: int = 4 * p.MAX_FRAME, job_memory: int | None = 4 << 30) -> None:
        if token is None:
            token = secrets.token_urlsafe(24)
        if not 0 < len(token.encode()) <= p.MAX_TOKEN:
            raise CtxrtError(f"--token must be 1 to {p.MAX_TOKEN} bytes")
        self.token = token
        self.read_timeout, self.idle_timeout, self.handshake_timeout = read_timeout, idle_timeout, handshake_timeout
        self._slots = threading.BoundedSemaphore(max_clients)
        self.max_pending = max_pending
        self._pending: dict[socket.socket, float] = {}  # connections in their handshake -> when they came
        self._pending_lock = threading.Lock()
        self.budget = Budget(max(memory_budget, 2 * p.MAX_FRAME))
        try:
            self.sock = socket.create_server((host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET,
                                             reuse_port=False)
        except (OSError, OverflowError) as e:
            raise CtxrtError(f"cannot listen on {host}:{port}: {getattr(e, 'strerror', None) or e}") from None
        self.address: tuple[str, int] = self.sock.getsockname()[:2]
        try:
            self.worker = DeviceWorker(job_timeout, job_memory)
        except BaseException:
            self.sock.close()
            raise
        self._closed = threading.Event()
        self.stats = {"connections": 0, "requests": 0, "errors": 0, "accept_errors": 0, "dropped_pending": 0}

    def serve_forever(self) -> None:
        """Accept connections until `close` (from another thread) or Ctrl-C. An accept() that fails (out of file
        descriptors, a connection reset before it was accepted) is logged and retried with a growing pause."""
        pause = ACCEPT_BACKOFF[0]
        # accept() wakes up every ACCEPT_POLL seconds: a signal (SIGTERM, Ctrl-C) the kernel gave to a session's
        # thread only sets Python's flag, and its handler runs in this thread once it executes Python again: a
        # blocking accept() would keep the server up until the next connection (seen: 120 s after SIGTERM).
        self.sock.settimeout(ACCEPT_POLL)
        while not self._closed.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError as e:
                if self._closed.is_set() or self.sock.fileno() < 0:
                    return  # the listening socket closed under accept(): shutting down
                self.stats["accept_errors"] += 1
                print(f"ctxrt serve: accept failed ({e.strerror or e}); retrying in {pause:g} s", file=sys.stderr,
                      flush=True)
                self._closed.wait(pause)
                pause = min(pause * 2, ACCEPT_BACKOFF[1])
                continue
            pause = ACCEPT_BACKOFF[0]
            self._admit(conn)
            threading.Thread(target=self._session, args=(conn,), daemon=True).start()

    def _admit(self, conn: socket.socket) -> None:
        """Count a new connection among those in their handshake, dropping the oldest when there are too many:
        a flood of silent connections can never keep a real client from being heard."""
        with self._pending_lock:
            if len(self._pending) >= self.max_pending:
                oldest = min(self._pending, key=self._pending.__getitem__)
                del self._pending[oldest]
                self.stats["dropped_pending"] += 1
                with contextlib.suppress(OSError):
                    oldest.shutdown(socket.SHUT_RDWR)
            self._pending[conn] = time.monotonic()

    def _authenticated(self, conn: socket.socket) -> bool:
        """Out of the handshake: False when the connection was dropped for a newer one meanwhile."""
        with self._pending_lock:
            return self._pending.pop(conn, None) is not None

    def start(self) -> Server:
        """Serve from a background thread (tests, embedding); returns self."""
        threading.Thread(target=self.serve_forever, daemon=True, name="ctxrt-serve").start()
        return self

    def close(self) -> None:
        self._closed.set()
        with contextlib.suppress(OSError):
            self.sock.close()
        self.worker.close()

    # -- one connection ---------------------------------------------------------------------------------
    def _session(self, conn: socket.socket) -> None:
        self.stats["connections"] += 1
        with conn:
            try:
                ok = self._handshake(conn)
            except (OSError, p.ProtocolError):
                ok = False
            if not self._authenticated(conn) or not ok:
                with contextlib.suppress(OSError):
                    self._linger(conn)
                return
            if not self._slots.acquire(blocking=False):
                self._send(conn, p.error_frame("busy", "too many clients are connected: try again later"))
                with contextlib.suppress(OSError):
                    self._linger(conn)
                return
            try:
                self._serve(conn)
                self._linger(conn)
            except (OSError, p.ProtocolError):  # the client left, or its stream failed after an answer was sent
                pass
            finally:
                self._slots.release()

    def _linger(self, conn: socket.socket) -> None:
        """Close gently: stop sending, then read (and drop) what the client still sends, a bounded amount within a
        bounded time. Closing with unread bytes would make the kernel reset the connection, and the client could
        lose the error frame that explains why."""
        conn.shutdown(socket.SHUT_WR)
        deadline = time.monotonic() + min(self.read_timeout, 5.0)
        dropped = 0
        with contextlib.suppress(OSError):
            while dropped < LINGER_BYTES and (left := deadline - time.monotonic()) > 0:
                conn.settimeout(left)
                chunk = conn.recv(65536)
                if not chunk:
                    break
                dropped += len(chunk)

    def _fail(self, conn: socket.socket, code: str, message: str, rid: int | None = None) -> None:
        self.stats["errors"] += 1
        self._send(conn, p.error_frame(code, message, rid))

    @staticmethod
    def _send(conn: socket.socket, data: bytes) -> None:
        with contextlib.suppress(OSError):
            conn.settimeout(30.0)
            conn.sendall(data)

    def _handshake(self, conn: socket.socket) -> bool:
        """The magic and the hello frame, MAX_HELLO bytes at most, all within the handshake deadline; then the
        token, compared in constant time. Nothing else is read from a client that has not shown the token."""
        deadline = time.monotonic() + self.handshake_timeout
        try:
            magic = p.read_exact(conn, len(p.MAGIC), True, deadline)
            if magic != p.MAGIC:
                self._fail(conn, "bad_magic", f"not a ctxrt client: expected {p.MAGIC!r} first")
                return False
            hello = p.read_frame(conn, lambda: deadline, p.MAX_HELLO)
        except EOFError:
            return False
        except TimeoutError:
            self._fail(conn, "timeout", f"no handshake within {self.handshake_timeout:g} s")
            return False
        except p.ProtocolError as e:
            self._fail(conn, e.code, f"handshake: {e}")
            return False
        version = hello.get("protocol") if isinstance(hello, dict) else None
        if version != p.PROTOCOL:
            self._fail(conn, "bad_version", f"this server speaks protocol {p.PROTOCOL}, the client {version!r}")
            return False
        given = hello.get("token")
        given_bytes = given.encode()[:p.MAX_TOKEN + 1] if isinstance(given, str) else b""
        if not hmac.compare_digest(given_bytes, self.token.encode()):
            self._fail(conn, "bad_token", "wrong or missing token")
            return False
        self._send(conn, p.pack({"protocol": p.PROTOCOL, "server": f"ctxrt {ctxrt.__version__}"}))
        return True

    def _serve(self, conn: socket.socket) -> None:
        held, started = [0], [False]

        def start() -> float:
            started[0] = True
            return time.monotonic() + self.read_timeout

        def reserve(n: int, deadline: float | None) -> None:
            self.budget.reserve(2 * n, deadline)
            held[0] = 2 * n

        while True:
            conn.settimeout(self.idle_timeout)
            started[0] = False
            try:
                try:
                    frame = p.read_frame(conn, start, p.MAX_FRAME, reserve)
                except EOFError:
                    return
                except TimeoutError:
                    if started[0]:
                        self._fail(conn, "timeout", f"a frame did not arrive whole within {self.read_timeout:g} s: "
                                                    "closing the connection")
                    else:
                        self._fail(conn, "idle", f"no request for {self.idle_timeout:g} s: closing the connection")
                    return
                except p.ProtocolError as e:
                    self._fail(conn, e.code, str(e))
                    if e.code in CLOSING:
                        return
                    continue
                self._send(conn, self._answer(frame))
            finally:
                if held[0]:
                    self.budget.release(held[0])
                    held[0] = 0

    def _answer(self, frame: Any) -> bytes:
        rid = frame.get("id") if isinstance(frame, dict) else None
        rid = rid if type(rid) is int and 0 <= rid < 1 << 63 else None  # echoed in an error frame only if sane
        try:
            rid, method, params = p.request(frame)
            handler = METHODS.get(method)
            if handler is None:
                raise p.ProtocolError("unknown_method", f"unknown method {method!r}; methods: {', '.join(METHODS)}")
            self.stats["requests"] += 1
            return p.pack({"id": rid, "result": handler(self, params)})
        except p.ProtocolError as e:
            self.stats["errors"] += 1
            return p.error_frame(e.code, str(e), rid)
        except Exception as e:  # a bug must cost one request, never the connection or the server
            self.stats["errors"] += 1
            return p.error_frame("internal", f"{type(e).__name__}: {e}", rid)
