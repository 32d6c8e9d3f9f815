"""The target server's device process: the one place its OpenCL device is used.

Jobs (requests already checked by the server, protocol.py) arrive one at a time over a pipe, so timings are
never polluted by a second job. The server kills and restarts this process when a job overruns its time limit
or the process dies (a driver crash takes the job down, never the server): TVM's RPC server runs one child
process per session for the same reason; one long-lived process keeps built programs between requests.

The process is contained: its address space is limited (RLIMIT_AS, `job_memory` bytes beyond what opening the
device took), it dies with the server (PR_SET_PDEATHSIG), and the OpenCL compiler's on-disk cache is a directory
of the server's own (kept between runs, so a restarted server does not rebuild what it built), emptied when it
passes CACHE_LIMIT bytes.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import threading
from dataclasses import asdict
from multiprocessing.connection import Connection
from typing import Any

from ctxrt.backends.kernel import NodeSpec
from ctxrt.backends.opencl.kernel import ClKernel
from ctxrt.errors import CtxrtError, UnsupportedOpError
from ctxrt.format.atomic import pause_point
from ctxrt.tuning.guard import check_spec
from ctxrt.tuning.profiler import Settings, execute, profile
from ctxrt.tuning.protocol import ProtocolError

START_TIMEOUT = 120.0  # seconds for the device process to import ctxrt and open the device
CACHE_LIMIT = 256 << 20  # bytes of the OpenCL compiler's kernel cache (PoCL, NVIDIA) before it is emptied
PR_SET_PDEATHSIG = 1


# -- in the device process ---------------------------------------------------------------------------------
def _kernel(backend: Any, spec: NodeSpec, kernel: str, source_hash: str, params: dict[str, Any]) -> ClKernel:
    """The server's own kernel for `spec`, as the host named it: only ctxrt's kernels ever run here, and only
    for a spec whose outputs are what its op computes from its inputs (guard.check_spec)."""
    check_spec(spec)
    factory = backend.kernels.get(spec.op)
    if factory is None:
        raise ProtocolError("unsupported", f"no OpenCL kernel for {spec.op}")
    try:
        k = factory(spec)
    except UnsupportedOpError as e:
        raise ProtocolError("unsupported", str(e)) from None
    if type(k).__name__ != kernel or not isinstance(k, ClKernel):
        raise ProtocolError("unsupported", f"this server runs {type(k).__name__} for {spec.op} node {spec.name!r}, "
                                           f"the host asked for {kernel}: are both the same ctxrt version?")
    (key,) = k.programs
    if key.source_hash != source_hash:
        raise ProtocolError("unsupported", f"this server's {k.source} differs from the host's (another ctxrt "
                                           "version): tuning results would not match the host's kernels")
    if params != k.params:
        try:
            k = type(k)(spec, backend, params)
        except UnsupportedOpError as e:
            raise ProtocolError("bad_request", str(e)) from None
    return k


def _compile(backend: Any, name: str, source: str, options: str) -> dict[str, Any]:
    cl = backend.cl
    program = cl.Program(backend.context, source)
    try:
        program.build(options=options, devices=[backend.device])
    except cl.Error as e:
        raise ProtocolError("build_failed", f"{name} ({options}) does not build: {' '.join(str(e).split())}") from None
    log = program.get_build_info(backend.device, cl.program_build_info.LOG) or ""
    (binary,) = program.get_info(cl.program_info.BINARIES)
    return {"binary": bytes(binary), "log": log.strip()[-20000:]}


def _profile(backend: Any, spec: NodeSpec, kernel: str, source_hash: str, default: dict[str, Any],
             candidates: list[dict[str, Any]], settings: dict[str, Any]) -> dict[str, Any]:
    k = _kernel(backend, spec, kernel, source_hash, default)
    d, trials, spent = profile(backend, k, candidates, Settings(**settings))
    return {"default": d.as_wire(), "trials": [t.as_wire() for t in trials], "budget_spent": spent}


def _execute(backend: Any, spec: NodeSpec, kernel: str, source_hash: str, params: dict[str, Any],
             inputs: list[Any]) -> dict[str, Any]:
    k = _kernel(backend, spec, kernel, source_hash, params)
    if len(inputs) != len(spec.inputs) or any((a is None) != (t is None) or (a is not None and (
            a.shape != t.shape or a.dtype != t.dtype)) for a, t in zip(inputs, spec.inputs, strict=False)):
        raise ProtocolError("bad_request", "execute: inputs do not match the spec's shapes and dtypes")
    return {"outputs": execute(backend, k, inputs)}


JOBS = {"compile": _compile, "profile": _profile, "execute": _execute}


def describe(backend: Any) -> dict[str, Any]:
    info = asdict(backend.info)
    info["max_work_item_sizes"] = list(info["max_work_item_sizes"])
    return {"device": info, "device_id": backend.device_id(), "alignment": backend.alignment}


def _die_with(parent: int) -> None:
    """Be killed when the server process ends, however it ends (Linux; elsewhere the pipe's end stops us)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the server ended before the line above took effect
        os._exit(1)


def _limit_memory(job_memory: int) -> None:
    """Address space: what the process has now (the driver's mappings included) plus `job_memory` bytes."""
    if job_memory <= 0:
        return
    with contextlib.suppress(OSError, ValueError), open("/proc/self/status") as f:
        vm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        limit = vm + job_memory
        resource.setrlimit(resource.RLIMIT_AS, (limit if hard == resource.RLIM_INFINITY else min(limit, hard), hard))


def cache_dir() -> str:
    """The OpenCL compiler cache of `ctxrt serve`: $CTXRT_SERVE_CACHE, else ~/.cache/ctxrt/serve-opencl."""
    root = os.environ.get("CTXRT_SERVE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "ctxrt", "serve-opencl")
    os.makedirs(root, mode=0o700, exist_ok=True)
    return root


def _trim_cache(root: str | None) -> None:
    """Empty the compiler's cache directory once it holds more than CACHE_LIMIT bytes."""
    if not root:
        return
    total = 0
    for dirpath, _, files in os.walk(root):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_size
    if total > CACHE_LIMIT:
        for entry in os.listdir(root):
            path = os.path.join(root, entry)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    os.unlink(path)


def worker_main(conn: Any, parent: int, job_memory: int) -> None:
    """The device process: open the device, say so, then run jobs until the pipe closes."""
    from ctxrt.backends import get_backend

    _die_with(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C at the terminal is the server's to handle: it stops us
    try:
        backend = get_backend("opencl")
    except CtxrtError as e:
        conn.send(("fatal", str(e)))
        return
    _limit_memory(job_memory)
    conn.send(("ready", describe(backend)))
    while True:
        try:
            method, args = conn.recv()
        except (EOFError, OSError):
            return
        pause_point("server-job")  # test hook: a job that never ends, at a known point
        try:
            conn.send(("ok", JOBS[method](backend, **args)))
        except ProtocolError as e:
            conn.send(("error", e.code, str(e)))
        except MemoryError:
            conn.send(("error", "job_memory", f"{method} ran out of its memory limit ({job_memory >> 20} MiB)"))
        except Exception as e:  # the job fails, the process (and the server) go on
            conn.send(("error", "device_error", f"{type(e).__name__}: {' '.join(str(e).split())}"[:2000]))
        finally:
            if method == "compile":
                _trim_cache(os.environ.get("POCL_CACHE_DIR"))


# -- in the server -------------------------------------------------------------------------------------
class DeviceWorker:
    """The server's handle on its device process: `call` runs one job, one at a time, within a time limit.

    The process is `python -m ctxrt.tuning.worker FD`, talking over one end of a socket pair: not a fork of the
    threaded server, and not multiprocessing's spawn, which re-runs the caller's main script."""

    def __init__(self, job_timeout: float, job_memory: int | None = 4 << 30) -> None:
        self.job_timeout, self.job_memory = job_timeout, job_memory or 0
        self.cache_dir = cache_dir()
        _trim_cache(self.cache_dir)
        self._lock = threading.Lock()
        self.info: dict[str, Any] = {}
        self.restarts = 0
        self.closed = False
        self._start()

    def _start(self) -> None:
        ours, theirs = socket.socketpair()
        env = {**os.environ, "POCL_CACHE_DIR": self.cache_dir, "CUDA_CACHE_PATH": self.cache_dir,
               "CUDA_CACHE_MAXSIZE": str(CACHE_LIMIT)}
        with theirs:
            self.proc = subprocess.Popen([sys.executable, "-m", "ctxrt.tuning.worker", str(theirs.fileno()),
                                          str(os.getpid()), str(self.job_memory)],
                                         pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, env=env)
        self.conn = Connection(ours.detach())
        if not self.conn.poll(START_TIMEOUT):
            self._stop()
            raise CtxrtError(f"the device process did not start within {START_TIMEOUT:.0f} s")
        try:
            kind, payload = self.conn.recv()
        except (EOFError, OSError):
            self._stop()
            raise CtxrtError(f"the device process exited at start (exit code {self.proc.returncode})") from None
        if kind != "ready":
            self._stop()
            raise CtxrtError(payload)
        self.info = payload

    def _alive(self) -> bool:
        return self.proc.poll() is None

    def _stop(self) -> None:
        if self._alive():
            self.proc.kill()
        self.proc.wait(30)
        self.conn.close()

    def _restart(self) -> None:
        self._stop()
        self.restarts += 1
        self._start()

    def call(self, method: str, args: dict[str, Any], timeout: float | None = None) -> Any:
        limit = self.job_timeout if timeout is None else min(timeout, self.job_timeout)
        with self._lock:
            if self.closed:
                raise ProtocolError("device_error", "the server is shutting down")
            if not self._alive():
                self._restart()
            try:
                self.conn.send((method, args))
                if not self.conn.poll(limit):
                    self._restart()
                    raise ProtocolError("job_timeout", f"{method} ran past its time limit of {limit:g} s: stopped")
                reply = self.conn.recv()
            except (EOFError, OSError, BrokenPipeError):
                if self.closed:
                    raise ProtocolError("device_error", "the server is shutting down") from None
                code = self.proc.poll()
                self._restart()
                hint = (f"; it may have passed its memory limit of {self.job_memory >> 20} MiB"
                        if code is not None and code < 0 and self.job_memory else "")
                raise ProtocolError("device_error", f"the device process died during {method} (exit code {code}"
                                                    f"{hint}); it was restarted") from None
        if reply[0] == "ok":
            return reply[1]
        raise ProtocolError(reply[1], reply[2])

    def close(self) -> None:
        """Stop the device process now, also in the middle of a job (that job is answered with an error)."""
        self.closed = True
        self._stop()


if __name__ == "__main__":
    worker_main(Connection(int(sys.argv[1])), int(sys.argv[2]), int(sys.argv[3]))
