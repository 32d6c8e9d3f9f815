"""The tuning parts of `ctxrt` (docs/tuning.md): `compile --config`, the target server `serve`, `tune-report`,
and `TARGET_SERVER_SOCKET`, which makes `compile --backend opencl` build and tune on a server's device."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import sys
from typing import Any

from ctxrt.cli_args import (
    UsageError,
    checked_number,
    naming,
    non_negative_int,
    not_an_input,
    output_file,
    readable_file,
)


def port_number(text: str) -> int:
    return checked_number(text, int, lambda v: 1 <= v <= 65535, "a TCP port 1..65535")


def seconds(text: str) -> float:
    return checked_number(text, float, lambda v: 0 < v < 1e9, "a number of seconds > 0")


def load_config(path: str | None) -> dict[str, Any]:
    """--config FILE: the tuning keyword arguments of the compile ({} without the option)."""
    if path is None:
        return {}
    from ctxrt.tuning.config import TuningConfig

    readable_file("--config", path)
    return dataclasses.asdict(TuningConfig.load(path, f"--config {path}"))


def compile_backend(name: str, config: str | None, tuning: dict[str, Any]) -> Any:
    """The backend a compile builds for: with $TARGET_SERVER_SOCKET, `opencl` is the target server's device."""
    from ctxrt.backends import get_backend
    from ctxrt.tuning.client import SOCKET_ENV, remote_backend

    address = os.environ.get(SOCKET_ENV)
    kind, _, index = name.partition(":")
    if tuning.get("tuning_mode") and kind != "opencl":
        raise UsageError(f"--config {config}: tuning_mode tunes OpenCL kernels; backend {name!r} has none (add "
                         "--backend opencl)")
    if not address or kind != "opencl":
        return get_backend(name)
    if index:
        raise UsageError(f"--backend {name} names a device of this machine; with {SOCKET_ENV} set the compile is "
                         "for the target server's device: use --backend opencl")
    return remote_backend(address)


# -- serve -----------------------------------------------------------------------------------------
class _Terminated(Exception):
    """SIGTERM (how systemd and docker stop a service), raised in the main thread."""


def _on_sigterm(signum: int, frame: Any) -> None:
    raise _Terminated


def cmd_serve(args: argparse.Namespace) -> int:
    from ctxrt.tuning.client import TOKEN_ENV
    from ctxrt.tuning.server import Server

    token = args.token if args.token is not None else os.environ.get(TOKEN_ENV) or None
    if token is not None and not token.strip():
        raise UsageError("--token must not be empty")
    server = Server(args.host, args.port, token, job_timeout=args.job_timeout, job_memory=args.job_memory << 20)
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        device = server.worker.info["device_id"]
        host, port = server.address
        print(f"ctxrt target server on {host}:{port} for {device['device']} (driver {device['driver']}); "
              "a token is required; Ctrl-C stops it", flush=True)
        if token is None:
            print(f"token: {server.token}  (clients: {TOKEN_ENV}={server.token})", flush=True)
        server.serve_forever()
    except _Terminated:
        print("ctxrt serve: stopped (SIGTERM)", file=sys.stderr, flush=True)
    finally:
        server.close()
        signal.signal(signal.SIGTERM, previous)
    return 0


# -- tune-report -----------------------------------------------------------------------------------
def tuning_reports(path: str) -> list[tuple[str, dict[str, Any]]]:
    """(label, report) of each context binary `path` names (itself, or an EPContext model's binaries)."""
    from ctxrt.cli_inspect import _binaries
    from ctxrt.format import read_metadata
    from ctxrt.tuning.record import report

    with naming(path):
        return [(label, report(read_metadata(source))) for label, source in _binaries(path)]


def cmd_tune_report(args: argparse.Namespace) -> int:
    from ctxrt.tuning.record import plot_report, report_lines

    if args.plot:
        not_an_input(f"--plot {args.plot}", output_file("--plot", args.plot, ".png"), [args.file])
    reports = tuning_reports(args.file)
    if args.plot:
        tuned = [r for _, r in reports if r["tuned"]]
        if not tuned:
            raise UsageError(f"{args.file} was not tuned: nothing to plot (compile it with --config and "
                             "\"tuning_mode\": true)")
        plot_report(tuned[0], args.plot)
    if args.json:
        print(json.dumps(reports[0][1] if len(reports) == 1 else {"contexts": [r for _, r in reports]}))
        return 0
    for label, rep in reports:
        if len(reports) > 1:
            print(f"{args.file} [{label}]")
        print("\n".join(report_lines(rep)))
    if args.plot:
        print(f"wrote {args.plot}")
    return 0


def add_commands(sub: Any) -> None:
    """`serve` and `tune-report` in the command's parser."""
    from ctxrt.tuning.protocol import DEFAULT_PORT

    s = sub.add_parser("serve", help="target server: compile, profile and execute kernels on this machine's OpenCL "
                                     "device for a host compiling with TARGET_SERVER_SOCKET=host:port")
    s.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1: this machine only; anyone who can connect can "
                        "run kernels here, so set --token when you open it wider)")
    s.add_argument("--port", type=port_number, default=DEFAULT_PORT, help=f"TCP port (default {DEFAULT_PORT})")
    s.add_argument("--token", help="the secret every client must send (clients read $CTXRT_SERVER_TOKEN; "
                                   "default: $CTXRT_SERVER_TOKEN, else a new random token, printed at start)")
    s.add_argument("--job-timeout", type=seconds, default=600.0, metavar="S",
                   help="time limit of one device job in seconds (default 600); an overrun is answered with a "
                        "timeout error and the device process restarted")
    s.add_argument("--job-memory", type=non_negative_int, default=4096, metavar="MIB",
                   help="memory a device job may use beyond what opening the device took, in MiB (default 4096; 0: "
                        "no limit); past it the job fails and the device process restarts")
    s.set_defaults(func=cmd_serve)
    t = sub.add_parser("tune-report", help="per tuned kernel of a context binary: default and tuned time, speed-up")
    t.add_argument("file", metavar="FILE.ctx|FILE_ctx.onnx")
    t.add_argument("--plot", metavar="FILE.png", help="draw default vs tuned time per kernel (needs matplotlib)")
    t.add_argument("--json", action="store_true", help="print one JSON object")
    t.set_defaults(func=cmd_tune_report)
