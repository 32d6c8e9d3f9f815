"""Helpers of the target server tests: a raw connection that speaks the wire format by hand, and a kernel to run
remotely. Every server binds 127.0.0.1 on a port the OS picks (unused), every wait is bounded."""

from __future__ import annotations

import socket
from typing import Any

import numpy as np

from ctxrt.backends.kernel import NodeSpec, TensorSpec
from ctxrt.tuning import protocol as p

TOKEN = "s3cret-token"
WAIT = 120.0  # seconds: a bound on every wait, never a synchronisation


class Raw:
    """A TCP connection to a server, frames written and read by hand."""

    def __init__(self, address: tuple[str, int], hello: bool = True, token: str | None = TOKEN) -> None:
        self.sock = socket.create_connection(address, timeout=WAIT)
        if hello:
            self.send(p.MAGIC + p.pack({"protocol": p.PROTOCOL, "token": token}))
            answer = self.frame()
            assert answer.get("protocol") == p.PROTOCOL, answer

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def frame(self) -> Any:
        return p.read_frame(self.sock)

    def ask(self, body: bytes) -> Any:
        """Send one frame body (length-prefixed here) and read the answer."""
        self.send(p.LENGTH.pack(len(body)) + body)
        return self.frame()

    def closed(self) -> bool:
        """True when the server closed the connection (after everything it sent was read)."""
        try:
            return self.sock.recv(1) == b""
        except ConnectionResetError:
            return True

    def close(self) -> None:
        self.sock.close()


def add_spec(n: int = 16) -> NodeSpec:
    f32 = np.dtype(np.float32)
    return NodeSpec("Add", "add", {}, [TensorSpec((4, n), f32), TensorSpec((n,), f32)], [TensorSpec((4, n), f32)])


def free_port() -> int:
    """A TCP port nobody listens on now (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_serve(*args: str, env: dict[str, str] | None = None) -> tuple[Any, int, str]:
    """`python -m ctxrt.cli serve --port P ARGS...` in a child process: (process, port, its first line).

    `free_port` closes its socket before the child binds: should a test running beside this one (pytest-xdist)
    take that port in between, the child exits at once saying so, and another port is tried."""
    import os
    import select
    import subprocess
    import sys

    env = {**(os.environ if env is None else env), "PYTHONFAULTHANDLER": "1"}  # for stop_serve's SIGABRT
    for attempt in range(5):
        port = free_port()
        proc = subprocess.Popen([sys.executable, "-m", "ctxrt.cli", "serve", "--port", str(port), *args],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        ready, _, _ = select.select([proc.stdout], [], [], WAIT)
        line = proc.stdout.readline() if ready else ""  # type: ignore[union-attr]
        if line or not ready:
            return proc, port, line
        try:  # its output closed without a line: it is exiting
            proc.wait(WAIT)
        except subprocess.TimeoutExpired:
            return proc, port, line
        err = proc.stderr.read()  # type: ignore[union-attr]
        if "Address already in use" not in err or attempt == 4:
            return proc, port, line
    raise AssertionError("unreachable")


def stop_serve(proc: Any, sig: int) -> tuple[str, str]:
    """Send a `start_serve` process `sig` and wait for it to end: (its stdout, its stderr). Should it still run WAIT
    seconds later (seen twice under pytest-xdist on a busy machine, SIGTERM and SIGINT; not reproduced alone), SIGABRT
    makes it print every thread's stack (PYTHONFAULTHANDLER), and the test fails with them."""
    import signal
    import subprocess

    proc.send_signal(sig)
    try:
        return proc.communicate(timeout=WAIT)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)
        _, err = proc.communicate(timeout=WAIT)
        raise AssertionError(f"ctxrt serve still ran {WAIT:g} s after signal {sig}; its threads then:\n{err}") from None
