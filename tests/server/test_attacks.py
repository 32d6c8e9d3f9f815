"""The target server under attack from this machine: specs that lie about their outputs, a flood before
authentication, slow connections, file reads through the compiler, a macro bomb, SIGTERM mid-job."""

from __future__ import annotations

import contextlib
import os
import secrets
import select
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from server_helpers import TOKEN, WAIT, Raw, add_spec, start_serve, stop_serve

from ctxrt.backends import get_backend
from ctxrt.backends.kernel import NodeSpec, TensorSpec
from ctxrt.backends.opencl.elementwise import Elementwise
from ctxrt.errors import ServerError, UnsupportedOpError
from ctxrt.tuning import protocol as p
from ctxrt.tuning.client import Client, RemoteDevice
from ctxrt.tuning.server import Server

F32 = np.dtype(np.float32)
I64 = np.dtype(np.int64)


@pytest.fixture(scope="module")
def server(opencl: str) -> Iterator[Server]:
    srv = Server("127.0.0.1", 0, TOKEN, handshake_timeout=2.0).start()
    yield srv
    srv.close()


def _t(*shape: int, dtype: np.dtype = F32) -> TensorSpec:
    return TensorSpec(tuple(shape), dtype)


def _execute(client: Client, spec: NodeSpec, inputs: list[np.ndarray]) -> Any:
    """An execute request for `spec` as an attacker would send it: the kernel class and source hash are those
    the server would pick (found with a local backend), the outputs whatever the attacker declares."""
    try:
        kernel = get_backend("opencl").kernels[spec.op](spec)
        name, source_hash, params = type(kernel).__name__, kernel.programs[0].source_hash, kernel.params
    except UnsupportedOpError:  # the host's kernel refuses the lie: the server is asked all the same
        name, source_hash, params = "StridedCopy", "0" * 64, {}
    try:
        return client.call("execute", spec=p.spec_to_wire(spec), kernel=name, source_hash=source_hash,
                           params=params, inputs=inputs)
    except ServerError as e:
        return e


def _rng_inputs(spec: NodeSpec) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.integers(0, 2, t.shape).astype(t.dtype) if t.dtype.kind == "i" else
            rng.standard_normal(t.shape).astype(t.dtype) for t in spec.inputs]


def test_an_output_declared_larger_than_computed_returns_an_error_and_no_foreign_bytes(server: Server) -> None:
    spec = NodeSpec("Add", "leak", {}, [_t(16), _t(1)], [_t(1 << 22)])
    client = Client(server.address, TOKEN)
    reply = _execute(client, spec, [np.ones(16, F32), np.ones(1, F32)])
    assert isinstance(reply, ServerError) and reply.code == "bad_request", reply
    assert "Add node 'leak'" in str(reply) and "[4194304]" in str(reply) and "[16]" in str(reply)
    client.close()


LYING_SPECS = [  # outputs declared smaller than the op computes: the kernel would write past its buffer
    NodeSpec("Softmax", "sm", {"axis": -1}, [_t(256, 256)], [_t(1, 1)], opset=13),
    NodeSpec("MatMul", "mm", {}, [_t(64, 64), _t(64, 64)], [_t(1, 1)]),
    NodeSpec("Concat", "cat", {"axis": 0}, [_t(128, 64), _t(128, 64)], [_t(2, 64)]),
    NodeSpec("Gather", "gather", {"axis": 0}, [_t(512, 64), _t(256, dtype=I64)], [_t(1, 64)]),
    NodeSpec("ReduceSum", "sum", {"axes": [1], "keepdims": 1}, [_t(256, 256)], [_t(1, 1)], opset=13),
    NodeSpec("LayerNormalization", "ln", {"axis": -1, "epsilon": 1e-5}, [_t(256, 256), _t(256), _t(256)],
             [_t(1, 1)]),
    NodeSpec("Transpose", "tr", {"perm": [1, 0]}, [_t(256, 128)], [_t(8, 8)]),
    NodeSpec("Slice", "sl", {"starts": [0], "ends": [256], "axes": [0], "steps": [1]}, [_t(256, 64)], [_t(1, 64)]),
    NodeSpec("Conv", "conv", {"kernel": "opencl_conv", "weight_shape": [64, 64, 3, 3], "pads": [1, 1, 1, 1]},
             [_t(1, 64, 32, 32), _t(16)], [_t(1, 64, 32, 32)]),  # prepacked weights smaller than they claim
    NodeSpec("MatMul", "mm_res", {"residual": 1}, [_t(64, 64), _t(64, 64), _t(2, 2)], [_t(64, 64)]),
]


def test_specs_that_would_corrupt_the_heap_are_refused_and_the_device_process_lives(server: Server) -> None:
    client = Client(server.address, TOKEN)
    restarts = server.worker.restarts
    for spec in LYING_SPECS:
        reply = _execute(client, spec, _rng_inputs(spec))
        assert isinstance(reply, ServerError) and reply.code == "bad_request", (spec.op, reply)
        assert f"node {spec.name!r}" in str(reply)
    assert server.worker.restarts == restarts and server.worker.proc.poll() is None
    x, b = np.arange(64, dtype=F32).reshape(4, 16), np.ones(16, F32)
    (y,) = RemoteDevice(client).execute(Elementwise(add_spec(), get_backend("opencl")), [x, b])
    np.testing.assert_array_equal(y, x + b)
    client.close()


def test_profile_checks_the_spec_as_execute_does(server: Server) -> None:
    spec = LYING_SPECS[0]
    kernel = get_backend("opencl").kernels[spec.op](spec)
    client = Client(server.address, TOKEN)
    with pytest.raises(ServerError) as e:
        client.call("profile", spec=p.spec_to_wire(spec), kernel=type(kernel).__name__,
                    source_hash=kernel.programs[0].source_hash, default=kernel.params, candidates=[])
    assert e.value.code == "bad_request" and "output 0 is declared float32[1, 1]" in str(e.value)
    client.close()


def _rss(pid: int, field: str = "VmHWM") -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) << 10 for line in f if line.startswith(field + ":"))


@pytest.fixture
def serve_process(opencl: str, tmp_path: Path) -> Iterator[tuple[subprocess.Popen, tuple[str, int]]]:
    proc, port, line = start_serve("--token", TOKEN)
    try:
        assert f":{port}" in line, (line, proc.poll())
        yield proc, ("127.0.0.1", port)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=WAIT)


def test_a_32_mib_hostile_hello_costs_the_server_almost_nothing(serve_process: Any) -> None:
    proc, address = serve_process
    Client(address, TOKEN).close()
    before = _rss(proc.pid)
    body = b"\x90" * (32 << 20)  # 32 Mi empty msgpack arrays: ~73x its size once decoded
    with socket.create_connection(address, timeout=WAIT) as s:
        with contextlib.suppress(OSError):  # the server may close before all of it was sent
            s.sendall(p.MAGIC + p.LENGTH.pack(len(body)) + body)
        answer = p.read_frame(s)
    assert answer["error"]["code"] == "too_large", answer
    client = Client(address, TOKEN)
    assert client.call("device_info")["protocol"] == p.PROTOCOL
    client.close()
    assert _rss(proc.pid) - before < 64 << 20


def test_slow_connections_do_not_keep_a_valid_client_out(opencl: str) -> None:
    srv = Server("127.0.0.1", 0, TOKEN, handshake_timeout=3.0, max_pending=16, max_clients=4).start()
    slow: list[socket.socket] = []
    stop = threading.Event()

    def drip() -> None:  # a byte of the magic per connection now and then, never a whole handshake
        k = 0
        while not stop.is_set():
            for s in list(slow):
                with contextlib.suppress(OSError):
                    s.send(p.MAGIC[k % 4:k % 4 + 1])
            k += 1
            stop.wait(0.5)

    try:
        slow.extend(socket.create_connection(srv.address, timeout=WAIT) for _ in range(60))
        dripper = threading.Thread(target=drip, daemon=True)
        dripper.start()
        for _ in range(3):  # served at once each time, though 60 connections drip bytes (16 held at a time)
            client = Client(srv.address, TOKEN, timeout=3.0)
            assert client.call("device_info")["protocol"] == p.PROTOCOL
            client.close()
        assert srv.stats["dropped_pending"] >= 60 - 16
    finally:
        stop.set()
        for s in slow:
            s.close()
        srv.close()


def test_slow_handshakes_end_at_the_handshake_deadline(opencl: str) -> None:
    srv = Server("127.0.0.1", 0, TOKEN, handshake_timeout=1.0).start()
    try:
        raw = Raw(srv.address, hello=False)
        raw.send(p.MAGIC[:3])
        answer = raw.frame()  # however the bytes are spaced, the whole handshake has 1 s
        assert answer["error"]["code"] == "timeout" and raw.closed()
    finally:
        srv.close()


INCLUDES = ['#include "{path}"', '%:include "{path}"', '#inc\\\nlude "{path}"', '# /* */ include "{path}"',
            '??=include "{path}"', '#include_next "{path}"', '#embed "{path}"', '#if __has_include("{path}")\n#endif']


def test_no_compile_request_returns_a_file_of_the_server(server: Server, tmp_path: Path) -> None:
    secret = secrets.token_hex(16)
    path = tmp_path / "secret.h"
    path.write_text(f"{secret}\n")
    raw = Raw(server.address)
    requests = [(form.format(path=path) + "\nkernel void k() {}\n", "") for form in INCLUDES]
    requests += [("kernel void k() { X; }", f"-include {path}"), ("kernel void k() {}", f"-I{tmp_path}"),
                 ("kernel void k() {}", f"-DX=1 -Xclang -include -Xclang {path}")]
    for k, (source, options) in enumerate(requests):
        answer = raw.ask(p.codec.encode({"id": k, "method": "compile",
                                         "params": {"name": "k.cl", "source": source, "options": options}}))
        assert "error" in answer and answer["error"]["code"] == "bad_request", (source, options, answer)
        assert secret not in str(answer)
    assert server.worker.restarts == 0
    raw.close()


def test_a_macro_bomb_is_stopped_by_the_memory_limit(opencl: str) -> None:
    levels = "\n".join(f"#define L{i + 1} L{i} L{i} L{i} L{i} L{i} L{i} L{i} L{i}" for i in range(12))
    source = f"#define L0 (1+1)\n{levels}\nkernel void k(global int* x) {{ x[0] = L12; }}\n"
    srv = Server("127.0.0.1", 0, TOKEN, job_timeout=120.0, job_memory=512 << 20).start()
    try:
        client = Client(srv.address, TOKEN)
        with pytest.raises(ServerError) as e:
            client.call("compile", name="bomb.cl", source=source, options="")
        assert e.value.code in ("job_memory", "device_error", "build_failed"), e.value
        reply = client.call("compile", name="k.cl", source="kernel void k() {}", options="")
        assert reply["binary"]
        client.close()
    finally:
        srv.close()


def _children(pid: int) -> list[int]:
    out = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            out += [int(c) for c in f.read().split()]
    return out


def _gone(pid: int) -> bool:
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split(") ")[-1].startswith("Z"):
                    return True  # exited, not yet reaped by its (dead) parent's reaper
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL])
def test_stopping_the_server_mid_job_leaves_no_device_process(opencl: str, tmp_path: Path, how: int) -> None:
    fifo = tmp_path / "pause.fifo"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    proc, port, line = start_serve("--token", TOKEN, env={**os.environ, "CTXRT_TEST_PAUSE": f"server-job:{fifo}"})
    try:
        assert f":{port}" in line, (line, proc.poll())
        (worker,) = _children(proc.pid)
        client = Client(("127.0.0.1", port), TOKEN)
        asking = threading.Thread(target=lambda: _swallow(client.call, "compile", name="k.cl",
                                                          source="kernel void k() {}", options=""), daemon=True)
        asking.start()
        ready, _, _ = select.select([reader], [], [], WAIT)
        assert ready and os.read(reader, 100) == b"server-job\n"  # the device process is inside a job
        _, err = stop_serve(proc, how)
        if how == signal.SIGTERM:
            assert proc.returncode == 0 and "stopped (SIGTERM)" in err and "Traceback" not in err, err
        assert _gone(worker), f"device process {worker} still runs after the server got signal {how}"
    finally:
        os.close(reader)
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=WAIT)


def _swallow(fn: Any, *args: Any, **kwargs: Any) -> None:
    with contextlib.suppress(ServerError):
        fn(*args, **kwargs)


def test_serve_without_a_token_makes_one_and_requires_it(opencl: str) -> None:
    proc, port, line = start_serve(env={k: v for k, v in os.environ.items() if k != "CTXRT_SERVER_TOKEN"})
    try:
        assert "a token is required" in line, (line, proc.poll())
        line = proc.stdout.readline()  # type: ignore[union-attr]
        assert line.startswith("token: "), line
        token = line.split()[1]
        with pytest.raises(ServerError) as e:
            Client(("127.0.0.1", port), None)
        assert e.value.code == "bad_token"
        client = Client(("127.0.0.1", port), token)
        assert client.call("device_info")["protocol"] == p.PROTOCOL
        client.close()
    finally:
        stop_serve(proc, signal.SIGTERM)
    assert proc.returncode == 0


def test_accept_errors_are_logged_and_retried(opencl: str, capsys: pytest.CaptureFixture[str]) -> None:
    srv = Server("127.0.0.1", 0, TOKEN)
    real = srv.sock
    failures = [3]

    class Flaky:
        def accept(self) -> Any:
            if failures[0]:
                failures[0] -= 1
                raise OSError(24, "Too many open files")
            return real.accept()

        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

    srv.sock = Flaky()  # type: ignore[assignment]
    srv.start()
    try:
        client = Client(srv.address, TOKEN)
        assert client.call("device_info")["protocol"] == p.PROTOCOL
        client.close()
        assert srv.stats["accept_errors"] == 3
        assert "accept failed (Too many open files); retrying" in capsys.readouterr().err
    finally:
        srv.close()


def test_the_compiler_cache_is_emptied_past_its_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ctxrt.tuning import worker

    monkeypatch.setattr(worker, "CACHE_LIMIT", 1000)
    (tmp_path / "kcache" / "ab").mkdir(parents=True)
    (tmp_path / "kcache" / "ab" / "program.bc").write_bytes(b"x" * 600)
    worker._trim_cache(str(tmp_path))
    assert (tmp_path / "kcache" / "ab" / "program.bc").exists()  # under the limit: kept
    (tmp_path / "kcache" / "cd.bc").write_bytes(b"x" * 600)
    worker._trim_cache(str(tmp_path))
    assert list(tmp_path.iterdir()) == []


def test_a_signal_taken_by_another_thread_stops_accept(opencl: str) -> None:
    """The kernel may give SIGTERM (or SIGINT) to any thread, e.g. a session's blocked in recv(): Python only flags
    it, and its handler runs in the main thread once that runs Python again. serve_forever's accept() wakes up
    every ACCEPT_POLL seconds, so the handler runs within that, not at the next connection (the `ctxrt serve`
    that stayed up 120 s after SIGTERM in parallel test runs)."""
    from ctxrt.tuning.server import ACCEPT_POLL

    class Stop(Exception):
        pass

    def handler(signum: int, frame: Any) -> None:
        raise Stop

    srv = Server("127.0.0.1", 0, TOKEN)
    previous = signal.signal(signal.SIGUSR1, handler)
    watchdog = threading.Timer(10.0, srv.close)  # without the fix: accept() never returns; this ends the test
    sent = []

    def other_thread() -> None:
        time.sleep(0.3)  # the main thread is in accept() by now
        sent.append(time.monotonic())
        signal.pthread_kill(threading.get_ident(), signal.SIGUSR1)  # to this thread, not the main one

    try:
        watchdog.start()
        threading.Thread(target=other_thread, daemon=True).start()
        with pytest.raises(Stop):
            srv.serve_forever()
        assert time.monotonic() - sent[0] < ACCEPT_POLL + 1.0
    finally:
        watchdog.cancel()
        signal.signal(signal.SIGUSR1, previous)
        srv.close()
