"""The target server serving real work: 32 clients at once, a job past its time limit, a compile driven from
this host through TARGET_SERVER_SOCKET that behaves as a local one, and `ctxrt serve` itself."""

from __future__ import annotations

import json
import os
import select
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from server_helpers import TOKEN, WAIT, add_spec, free_port, start_serve, stop_serve
from tuning_helpers import mlp_model

import ctxrt
from ctxrt.backends import get_backend
from ctxrt.backends.opencl.backend import OpenCLBackend
from ctxrt.backends.opencl.elementwise import Elementwise
from ctxrt.cli import main
from ctxrt.errors import ServerError
from ctxrt.format import read_metadata
from ctxrt.tuning.client import Client, RemoteDevice
from ctxrt.tuning.server import Server


@pytest.fixture(scope="module")
def server(opencl: str) -> Iterator[Server]:
    srv = Server("127.0.0.1", 0, TOKEN).start()
    yield srv
    srv.close()


def test_32_concurrent_clients_all_get_correct_answers(server: Server) -> None:
    kernel = Elementwise(add_spec(), get_backend("opencl"))
    tier = get_backend("opencl").info.tier
    failures: list[str] = []

    def one(k: int) -> None:
        try:
            client = Client(server.address, TOKEN)
            try:
                assert client.call("device_info")["device_id"]["tier"] == tier
                rng = np.random.default_rng(k)
                x, b = rng.standard_normal((4, 16)).astype(np.float32), rng.standard_normal(16).astype(np.float32)
                (y,) = RemoteDevice(client).execute(kernel, [x, b])
                np.testing.assert_array_equal(y, x + b)
            finally:
                client.close()
        except Exception as e:  # reported by the main thread
            failures.append(f"client {k}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=one, args=(k,)) for k in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
    assert not any(t.is_alive() for t in threads) and not failures, failures


def test_a_job_past_its_time_limit_is_answered_and_the_device_process_restarted(
        opencl: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fifo = tmp_path / "pause.fifo"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    monkeypatch.setenv("CTXRT_TEST_PAUSE", f"server-job:{fifo}")  # the device process stops at its first job
    srv = Server("127.0.0.1", 0, TOKEN, job_timeout=5.0).start()
    try:
        client = Client(srv.address, TOKEN)
        result: list[Any] = []
        asking = threading.Thread(target=lambda: result.append(_try(client.call, "compile", name="k.cl",
                                                                    source="kernel void k() {}", options="")))
        asking.start()
        ready, _, _ = select.select([reader], [], [], WAIT)
        assert ready and os.read(reader, 100) == b"server-job\n"
        os.close(reader)  # no reader any more: the restarted process does not stop
        reader = -1
        asking.join(WAIT)
        (error,) = result
        assert isinstance(error, ServerError) and error.code == "job_timeout", error
        reply = client.call("compile", name="k.cl", source="kernel void k() {}", options="")
        assert isinstance(reply["binary"], bytes) and reply["binary"]
        assert srv.worker.restarts == 1
        client.close()
    finally:
        if reader >= 0:
            os.close(reader)
        srv.close()


def _try(fn: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return fn(*args, **kwargs)
    except ServerError as e:
        return e


def test_remote_compile_behaves_as_a_local_one(server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    model = mlp_model(tmp_path / "mlp.onnx")
    for where in ("local", "remote"):
        (tmp_path / f"{where}.json").write_text(json.dumps({
            "tuning_mode": True, "performance_cache_dir": str(tmp_path / f"perf_{where}"),
            "tuning_budget_candidates": 2}))
    assert main(["compile", str(model), "-o", str(tmp_path / "local.ctx"), "--backend", "opencl", "--config",
                 str(tmp_path / "local.json"), "-q"]) == 0
    monkeypatch.setenv("TARGET_SERVER_SOCKET", f"127.0.0.1:{server.address[1]}")
    monkeypatch.setenv("CTXRT_SERVER_TOKEN", TOKEN)
    requests = server.stats["requests"]
    assert main(["compile", str(model), "-o", str(tmp_path / "remote.ctx"), "--backend", "opencl", "--config",
                 str(tmp_path / "remote.json"), "-q"]) == 0
    assert server.stats["requests"] > requests  # profiled and built there
    capsys.readouterr()
    local, remote = read_metadata(tmp_path / "local.ctx"), read_metadata(tmp_path / "remote.ctx")
    assert remote["device"] == local["device"]  # the server's device (this machine's here)
    assert remote["tuning"]["device"]["tier"] == local["tuning"]["device"]["tier"]
    assert remote["tuning"]["kernels_profiled"] == 3
    assert [e["op"] for e in remote["tuning"]["kernels"]] == [e["op"] for e in local["tuning"]["kernels"]]
    (cache,) = (tmp_path / "perf_remote").glob("*.perf.json")  # on this host, named from the server's device
    assert len(json.loads(cache.read_text())["entries"]) == 3

    x = np.random.default_rng(3).standard_normal((8, 16)).astype(np.float32)
    outs = {}
    for where in ("local", "remote"):
        fresh = OpenCLBackend(0)  # a new context: nothing built yet
        ctx = ctxrt.context_from_binary(tmp_path / f"{where}.ctx", fresh)
        outs[where] = ctx.graph("mlp").run({"x": x})["y"]
        assert ctx.stats["programs_built_from_source"] == 0 and ctx.stats["programs_loaded_from_binary"] == 3
        ctx.free()
    np.testing.assert_allclose(outs["remote"], outs["local"], rtol=1e-5, atol=1e-5)
    plain = ctxrt.compile(model, backend="cpu").graph("main").run({"x": x})["y"]
    np.testing.assert_allclose(outs["remote"], plain, rtol=1e-4, atol=1e-5)


def test_remote_compile_errors_are_one_line(server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    model = mlp_model(tmp_path / "mlp.onnx")
    monkeypatch.setenv("TARGET_SERVER_SOCKET", f"127.0.0.1:{server.address[1]}")
    monkeypatch.setenv("CTXRT_SERVER_TOKEN", "wrong")
    assert main(["compile", str(model), "-o", str(tmp_path / "r.ctx"), "--backend", "opencl"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "bad_token" in err
    monkeypatch.setenv("TARGET_SERVER_SOCKET", "nonsense")
    assert main(["compile", str(model), "-o", str(tmp_path / "r.ctx"), "--backend", "opencl"]) == 2
    assert "TARGET_SERVER_SOCKET='nonsense'" in capsys.readouterr().err
    monkeypatch.setenv("TARGET_SERVER_SOCKET", f"127.0.0.1:{free_port()}")  # a port nobody listens on
    assert main(["compile", str(model), "-o", str(tmp_path / "r.ctx"), "--backend", "opencl"]) == 2
    assert "cannot reach the target server" in capsys.readouterr().err
    assert not (tmp_path / "r.ctx").exists()


def test_ctxrt_serve_command(opencl: str) -> None:
    proc, port, line = start_serve("--token", TOKEN)
    try:
        assert f"127.0.0.1:{port}" in line and "a token is required" in line, (line, proc.poll())
        client = Client(("127.0.0.1", port), TOKEN)
        assert client.call("device_info")["protocol"] == 1
        client.close()
    finally:
        out, err = stop_serve(proc, signal.SIGINT)
    assert proc.returncode == 130 and err == "ctxrt: interrupted\n", (proc.returncode, err)
