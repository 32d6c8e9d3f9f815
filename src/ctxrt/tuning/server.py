"""`ctxrt serve`: the target server (QNN's qnn-gpu-target-server; DESIGN.md §9, docs/protocol.md).

It compiles OpenCL programs, profiles kernels' candidates and executes kernels on this machine's OpenCL device
for a host that drives a compile (`TARGET_SERVER_SOCKET=host:port ctxrt compile ...`). It runs kernels for
whoever can reach it: it binds 127.0.0.1 unless told otherwise, and `--token` makes every client prove it
knows a secret (TVM's RPC server has no authentication at all).

Each connection has a thread; every frame it sends gets an answer, a bad one an error frame (protocol.py), and
a connection is closed only when its stream cannot be trusted any more (a wrong handshake, an oversized or
truncated frame, a client stalled mid-frame past the read timeout, or idle past the idle timeout). Jobs that
touch the device go to one device process, one at a time, each within a time limit (worker.py).
"""

from __future__ import annotations

import contextlib
import hmac
import socket
import threading
from collections.abc import Callable
from typing import Any

import ctxrt
from ctxrt.errors import CtxrtError
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
CLOSING = ("too_large", "truncated")  # after these the stream is out of step: answer, then close
LINGER_BYTES = 1 << 20  # read and dropped at most, while closing a connection


class Server:
    """A target server on `host:port` (port 0: any free port; `address` says which)."""

    def __init__(self, host: str = "127.0.0.1", port: int = p.DEFAULT_PORT, token: str | None = None,
                 job_timeout: float = 600.0, read_timeout: float = 30.0, idle_timeout: float = 3600.0,
                 max_clients: int = 64) -> None:
        if token is not None and not 0 < len(token.encode()) <= p.MAX_TOKEN:
            raise CtxrtError(f"--token must be 1 to {p.MAX_TOKEN} bytes")
        self.token = token
        self.read_timeout, self.idle_timeout = read_timeout, idle_timeout
        self._slots = threading.BoundedSemaphore(max_clients)
        try:
            self.sock = socket.create_server((host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET,
                                             reuse_port=False)
        except (OSError, OverflowError) as e:
            raise CtxrtError(f"cannot listen on {host}:{port}: {getattr(e, 'strerror', None) or e}") from None
        self.address: tuple[str, int] = self.sock.getsockname()[:2]
        try:
            self.worker = DeviceWorker(job_timeout)
        except BaseException:
            self.sock.close()
            raise
        self._closed = threading.Event()
        self.stats = {"connections": 0, "requests": 0, "errors": 0}

    def serve_forever(self) -> None:
        """Accept connections until `close` (from another thread) or Ctrl-C."""
        with contextlib.suppress(OSError):  # the listening socket closed under accept(): shutting down
            while not self._closed.is_set():
                conn, _ = self.sock.accept()
                threading.Thread(target=self._session, args=(conn,), daemon=True).start()

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
            if not self._slots.acquire(blocking=False):
                self._send(conn, p.error_frame("busy", "too many clients are connected: try again later"))
                return
            try:
                if self._handshake(conn):
                    self._serve(conn)
                self._linger(conn)
            except (OSError, p.ProtocolError):  # the client left, or its stream failed after an answer was sent
                pass
            finally:
                self._slots.release()

    def _linger(self, conn: socket.socket) -> None:
        """Close gently: stop sending, then read (and drop) what the client still sends, a bounded amount. Closing
        with unread bytes would make the kernel reset the connection, and the client could lose the error frame
        that explains why."""
        conn.shutdown(socket.SHUT_WR)
        conn.settimeout(min(self.read_timeout, 5.0))
        dropped = 0
        with contextlib.suppress(OSError):
            while dropped < LINGER_BYTES and (chunk := conn.recv(65536)):
                dropped += len(chunk)

    def _fail(self, conn: socket.socket, code: str, message: str, rid: int | None = None) -> None:
        self.stats["errors"] += 1
        self._send(conn, p.error_frame(code, message, rid))

    @staticmethod
    def _send(conn: socket.socket, data: bytes) -> None:
        with contextlib.suppress(OSError):
            conn.sendall(data)

    def _handshake(self, conn: socket.socket) -> bool:
        conn.settimeout(self.read_timeout)
        try:
            magic = p.read_exact(conn, len(p.MAGIC), True)
            if magic != p.MAGIC:
                self._fail(conn, "bad_magic", f"not a ctxrt client: expected {p.MAGIC!r} first")
                return False
            hello = p.read_frame(conn)
        except EOFError:
            return False
        except TimeoutError:
            self._fail(conn, "timeout", f"no handshake within {self.read_timeout:g} s")
            return False
        except p.ProtocolError as e:
            self._fail(conn, e.code, f"handshake: {e}")
            return False
        version = hello.get("protocol") if isinstance(hello, dict) else None
        if version != p.PROTOCOL:
            self._fail(conn, "bad_version", f"this server speaks protocol {p.PROTOCOL}, the client {version!r}")
            return False
        given = hello.get("token")
        if self.token is not None and not (isinstance(given, str) and hmac.compare_digest(
                given.encode()[:p.MAX_TOKEN + 1], self.token.encode())):
            self._fail(conn, "bad_token", "wrong or missing token")
            return False
        self._send(conn, p.pack({"protocol": p.PROTOCOL, "server": f"ctxrt {ctxrt.__version__}"}))
        return True

    def _serve(self, conn: socket.socket) -> None:
        while True:
            conn.settimeout(self.idle_timeout)
            started = False

            def start() -> None:
                nonlocal started
                started = True
                conn.settimeout(self.read_timeout)

            try:
                frame = p.read_frame(conn, start)
            except EOFError:
                return
            except TimeoutError:
                if started:
                    self._fail(conn, "timeout", f"a frame stalled for {self.read_timeout:g} s: closing the connection")
                else:
                    self._fail(conn, "idle", f"no request for {self.idle_timeout:g} s: closing the connection")
                return
            except p.ProtocolError as e:
                self._fail(conn, e.code, str(e))
                if e.code in CLOSING:
                    return
                continue
            self._send(conn, self._answer(frame))

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
