"""The target server under load and under attack: profile requests per second from 32 clients, and how long a
valid client waits for its first answer while 500 hostile connections are open (each dripping a byte of the
handshake now and then, as a slowloris attack does).

    .venv/bin/python bench/bench_server.py [--clients 32] [--requests 20] [--hostile 500] [--json]

The server runs as `python -m ctxrt.cli serve` in a child process, so the same script measures any ctxrt
checkout: `PYTHONPATH=OLD/src .venv/bin/python bench/bench_server.py` gives the "before" row.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import select
import socket
import statistics
import subprocess
import sys
import threading
import time
from typing import Any

import numpy as np

from ctxrt.backends import get_backend
from ctxrt.backends.kernel import NodeSpec, TensorSpec
from ctxrt.errors import ServerError
from ctxrt.tuning import protocol as p
from ctxrt.tuning.client import Client

TOKEN = "bench-token"


def _serve() -> tuple[subprocess.Popen, tuple[str, int]]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "ctxrt.cli", "serve", "--port", str(port), "--token", TOKEN],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    ready, _, _ = select.select([proc.stdout], [], [], 120)
    if not ready:
        raise SystemExit("ctxrt serve did not start")
    proc.stdout.readline()  # type: ignore[union-attr]
    return proc, ("127.0.0.1", port)


def _profile_request() -> dict[str, Any]:
    f32 = np.dtype(np.float32)
    spec = NodeSpec("MatMul", "mm", {}, [TensorSpec((64, 64), f32), TensorSpec((64, 64), f32)],
                    [TensorSpec((64, 64), f32)])
    kernel = get_backend("opencl").kernels["MatMul"](spec)
    return {"spec": p.spec_to_wire(spec), "kernel": type(kernel).__name__,
            "source_hash": kernel.programs[0].source_hash, "default": kernel.params, "candidates": [],
            "settings": {"min_runs": 1, "max_runs": 3, "min_total_s": 0}}


def throughput(address: tuple[str, int], clients: int, requests: int) -> float:
    """Profile requests answered per second, `clients` connections each sending `requests` in a row."""
    params = _profile_request()
    Client(address, TOKEN).call("profile", **params)  # the program built once, outside the timing
    errors: list[str] = []

    def one() -> None:
        try:
            c = Client(address, TOKEN)
            for _ in range(requests):
                c.call("profile", **params)
            c.close()
        except Exception as e:
            errors.append(f"{type(e).__name__}: {e}")

    threads = [threading.Thread(target=one) for _ in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    if errors:
        raise SystemExit(f"{len(errors)} clients failed: {errors[0]}")
    return clients * requests / elapsed


def under_attack(address: tuple[str, int], hostile: int, give_up: float) -> dict[str, Any]:
    """Open `hostile` connections that drip handshake bytes, then time valid clients (3 tries, median)."""
    conns: list[socket.socket] = []
    stop = threading.Event()

    def drip() -> None:
        k = 0
        while not stop.is_set():
            for s in list(conns):
                with contextlib.suppress(OSError):
                    s.send(p.MAGIC[k % 4:k % 4 + 1])
            k += 1
            stop.wait(1.0)

    for _ in range(hostile):
        try:
            conns.append(socket.create_connection(address, timeout=10))
        except OSError:
            break
    dripper = threading.Thread(target=drip, daemon=True)
    dripper.start()
    time.sleep(1.0)
    waits, outcome = [], "served"
    try:
        for _ in range(3):
            start = time.perf_counter()
            while True:
                try:
                    c = Client(address, TOKEN, timeout=give_up)
                    c.call("device_info")
                    c.close()
                    waits.append(time.perf_counter() - start)
                    break
                except ServerError as e:
                    if time.perf_counter() - start > give_up:
                        outcome = f"not served within {give_up:g} s ({e.code})"
                        break
                    time.sleep(0.2)
            if outcome != "served":
                break
    finally:
        stop.set()
        for s in conns:
            s.close()
    return {"hostile_open": len(conns), "outcome": outcome,
            "wait_s": round(statistics.median(waits), 4) if waits else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--requests", type=int, default=20)
    ap.add_argument("--hostile", type=int, default=500)
    ap.add_argument("--give-up", type=float, default=40.0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    proc, address = _serve()
    try:
        rate = throughput(address, args.clients, args.requests)
        attack = under_attack(address, args.hostile, args.give_up)
    finally:
        proc.terminate()
        proc.wait(30)
    result = {"profiles_per_s": round(rate, 1), "clients": args.clients, **attack,
              "device": get_backend("opencl").info.name, "cpu": platform.processor() or platform.machine(),
              "ctxrt_src": os.path.dirname(os.path.dirname(sys.modules["ctxrt"].__file__ or ""))}
    if args.json:
        print(json.dumps(result))
        return
    print(f"    {' '.join(sys.argv)}")
    print(f"profiles/s with {args.clients} clients: {result['profiles_per_s']}")
    print(f"valid client with {attack['hostile_open']} hostile connections open: {attack['outcome']}"
          + (f", median wait {attack['wait_s']} s" if attack["wait_s"] is not None else ""))
    print(f"device: {result['device']}; ctxrt from {result['ctxrt_src']}")


if __name__ == "__main__":
    main()
