"""The host side of the target server: a client, and the backend a compile uses to build and tune for the
server's device (`TARGET_SERVER_SOCKET=host:port ctxrt compile --backend opencl ...`).

`RemoteBackend` looks like the opencl backend to the compiler: the same kernel table, constructed against the
server's device description (so defaults and constraints are the server device's), a program store whose
binaries the server builds, and the server's device identity, which the context binary records; the binary then
loads on the server's machine without building anything. It cannot run a context itself.
"""

from __future__ import annotations

import functools
import os
import socket
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

import ctxrt
from ctxrt.backends.opencl.device import DeviceInfo
from ctxrt.backends.opencl.kernel import ClKernel
from ctxrt.backends.opencl.program import ProgramKey, source
from ctxrt.errors import ConfigError, CtxrtError, ServerError
from ctxrt.tuning import protocol as p
from ctxrt.tuning.profiler import Settings, Trial

SOCKET_ENV = "TARGET_SERVER_SOCKET"
TOKEN_ENV = "CTXRT_SERVER_TOKEN"
CONNECT_TIMEOUT = 30.0


def parse_address(text: str, where: str = SOCKET_ENV) -> tuple[str, int]:
    """`host:port` or `[v6 address]:port`."""
    host, sep, port = text.strip().rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"{where}={text!r}: expected <host>:<port>, e.g. 127.0.0.1:{p.DEFAULT_PORT}")
    return host, int(port)


class Client:
    """One connection to a target server; `call(method, **params)` returns the result or raises ServerError."""

    def __init__(self, address: str | tuple[str, int], token: str | None = None, timeout: float | None = None) -> None:
        self.address = parse_address(address) if isinstance(address, str) else address
        self.label = f"{self.address[0]}:{self.address[1]}"
        self.token = token
        self.timeout = timeout
        self._next = 0
        self.sock: socket.socket | None = None
        self._connect()

    def _connect(self) -> None:
        try:
            sock = socket.create_connection(self.address, timeout=CONNECT_TIMEOUT)
        except OSError as e:
            raise ServerError(f"cannot reach the target server at {self.label}: {e.strerror or e} (is `ctxrt serve` "
                              "running there?)", "unreachable") from None
        try:
            sock.settimeout(CONNECT_TIMEOUT)
            sock.sendall(p.MAGIC + p.pack({"protocol": p.PROTOCOL, "token": self.token,
                                           "client": f"ctxrt {ctxrt.__version__}"}))
            self._check(self._read(sock))
            sock.settimeout(self.timeout)
        except BaseException:
            sock.close()
            raise
        self.sock = sock

    def _read(self, sock: socket.socket) -> Any:
        try:
            return p.read_frame(sock)
        except EOFError:
            raise ServerError(f"the target server at {self.label} closed the connection", "closed") from None
        except TimeoutError:
            raise ServerError(f"the target server at {self.label} did not answer in time", "timeout") from None
        except p.ProtocolError as e:
            raise ServerError(f"the target server at {self.label} sent a bad frame: {e}", "bad_reply") from None
        except OSError as e:
            raise ServerError(f"lost the target server at {self.label}: {e.strerror or e}", "closed") from None

    def _check(self, frame: Any) -> Any:
        if not isinstance(frame, dict):
            raise ServerError(f"the target server at {self.label} sent a {type(frame).__name__}", "bad_reply")
        err = frame.get("error")
        if isinstance(err, dict):
            code, message = str(err.get("code", "error"))[:40], str(err.get("message", ""))[:2000]
            raise ServerError(f"target server {self.label}: {code}: {message}", code)
        return frame

    def call(self, method: str, **params: Any) -> Any:
        """One request; a connection the server closed (e.g. after an idle timeout) is opened again once."""
        for attempt in (0, 1):
            if self.sock is None:
                self._connect()
            self._next += 1
            try:
                frame = p.pack({"id": self._next, "method": method, "params": params})
            except p.ProtocolError as e:
                raise ServerError(f"{method} request for {self.label}: {e}", e.code) from None
            try:
                self.sock.sendall(frame)  # type: ignore[union-attr]
                reply = self._check(self._read(self.sock))  # type: ignore[arg-type]
            except ServerError as e:
                if e.code not in ("closed", "idle") or attempt:  # the server may drop an idle connection
                    raise
                self.close()
                continue
            except OSError:
                self.close()
                if attempt:
                    raise ServerError(f"lost the target server at {self.label}", "closed") from None
                continue
            if reply.get("id") != self._next or "result" not in reply:
                raise ServerError(f"the target server at {self.label} answered another request", "bad_reply")
            return reply["result"]
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


def _reply(value: Any, key: str, kind: type | tuple[type, ...], label: str) -> Any:
    try:
        return p.get(value if isinstance(value, dict) else {}, key, kind, "reply")
    except p.ProtocolError as e:
        raise ServerError(f"the target server at {label} sent a bad reply: {e}", "bad_reply") from None


class RemoteProgramStore:
    """Programs built by the server for its device: what the context binary's KERNELS section stores."""

    def __init__(self, backend: RemoteBackend) -> None:
        self.backend = backend
        self._built: dict[ProgramKey, bytes] = {}

    def device_record(self) -> dict[str, str]:
        d = self.backend.info
        return {"tier": d.tier, "vendor": d.vendor, "device": d.name, "driver": d.driver}

    def prepare(self, keys: Iterable[ProgramKey], stats: Counter[str]) -> None:
        raise CtxrtError("a context compiled through a target server runs on the server's machine: load it there")

    def _binary(self, key: ProgramKey) -> bytes:
        if key not in self._built:
            reply = self.backend.client.call("compile", name=key.name, source=source(key.name), options=key.options)
            self._built[key] = _reply(reply, "binary", bytes, self.backend.client.label)
            self.backend.stats["programs_built_remotely"] += 1
        return self._built[key]

    def export(self, keys: Iterable[ProgramKey]) -> dict[str, Any]:
        records = [{"name": k.name, "source_hash": k.source_hash, "options": k.options, "source": source(k.name),
                    "binary": self._binary(k)} for k in keys]
        return {"device": self.device_record(), "programs": records}

    def load(self, data: Mapping[str, Any], origin: str) -> None:
        raise CtxrtError("a target server's backend compiles contexts; it does not load them")


def _device_info(reply: Any, label: str) -> DeviceInfo:
    d = _reply(reply, "device", dict, label)
    try:
        fields = {k: d[k] for k in DeviceInfo.__dataclass_fields__}
        fields["max_work_item_sizes"] = tuple(int(n) for n in fields["max_work_item_sizes"])
        info = DeviceInfo(**fields)
        ints = (info.index, info.compute_units, info.global_memory, info.local_memory, info.max_work_group_size,
                info.base_align)
        if not all(isinstance(n, int) and not isinstance(n, bool) for n in ints) or not all(
                isinstance(s, str) for s in (info.name, info.vendor, info.driver, info.version, info.type)):
            raise TypeError("field types")
    except (KeyError, TypeError, ValueError) as e:
        raise ServerError(f"the target server at {label} described its device badly: {e}", "bad_reply") from None
    return info


class RemoteBackend:
    """The opencl backend of a target server's device, as a compile on this host sees it."""

    name = "opencl"

    def __init__(self, client: Client) -> None:
        from ctxrt.backends import get_backend
        from ctxrt.backends.opencl.registry import KERNELS

        self.client = client
        reply = client.call("device_info")
        self.info = _device_info(reply, client.label)
        self.alignment = _reply(reply, "alignment", int, client.label)
        if not 0 < self.alignment <= 1 << 20 or self.alignment & (self.alignment - 1):
            raise ServerError(f"the target server at {client.label} sent alignment {self.alignment}", "bad_reply")
        self._device_id = {str(k): str(v) for k, v in _reply(reply, "device_id", dict, client.label).items()}
        self.stats: Counter[str] = Counter()
        self.programs = RemoteProgramStore(self)
        self.fallback = get_backend("cpu")
        self.kernels = {op: functools.partial(f, backend=self) for op, f in KERNELS.items()}

    def __repr__(self) -> str:
        return f"RemoteBackend({self.info.name} at {self.client.label})"

    def device_id(self) -> dict[str, str]:
        return dict(self._device_id)

    def _elsewhere(self, *args: Any, **kwargs: Any) -> Any:
        raise CtxrtError(f"{self!r} compiles for the server's device; run the context binary on that machine")

    alloc_shared = alloc_device = wrap_host = view = host_view = copy_in = copy_out = run = sync = _elsewhere


class RemoteDevice:
    """Profiling on the target server (the tuner's Device)."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self._id: dict[str, str] | None = None

    def device_id(self) -> dict[str, str]:
        if self._id is None:
            reply = self.client.call("device_info")
            self._id = {str(k): str(v) for k, v in _reply(reply, "device_id", dict, self.client.label).items()}
        return dict(self._id)

    def profile(self, kernel: ClKernel, candidates: list[dict[str, Any]], settings: Settings
                ) -> tuple[Trial, list[Trial], bool]:
        (key,) = kernel.programs
        reply = self.client.call(
            "profile", spec=p.spec_to_wire(kernel.spec), kernel=type(kernel).__name__, source_hash=key.source_hash,
            default=dict(kernel.params), candidates=candidates,
            settings={"min_runs": settings.min_runs, "max_runs": settings.max_runs,
                      "min_total_s": settings.min_total_s, "budget_s": settings.budget_s})
        label = self.client.label
        default = self._trial(_reply(reply, "default", dict, label))
        trials = [self._trial(t) for t in _reply(reply, "trials", list, label)]
        return default, trials, bool(_reply(reply, "budget_spent", bool, label))

    def _trial(self, t: Any) -> Trial:
        label = self.client.label
        params = _reply(t, "params", dict, label)
        time_s = _reply(t, "time_s", (int, float, type(None)), label)
        error = _reply(t, "error", (str, type(None)), label)
        if time_s is not None and not 0 <= time_s < float("inf"):
            raise ServerError(f"the target server at {label} sent a time of {time_s!r}", "bad_reply")
        return Trial(dict(params), time_s, error)

    def execute(self, kernel: ClKernel, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        """Run `kernel` once on the server's device (finalize kernels, e.g. a weight re-layout): its outputs."""
        (key,) = kernel.programs
        reply = self.client.call("execute", spec=p.spec_to_wire(kernel.spec, 0), kernel=type(kernel).__name__,
                                 source_hash=key.source_hash, params=dict(kernel.params), inputs=inputs)
        try:
            outs = [p.array(a, "execute output") for a in _reply(reply, "outputs", list, self.client.label)]
        except p.ProtocolError as e:
            raise ServerError(f"the target server at {self.client.label} sent a bad reply: {e}", "bad_reply") from None
        if [o.shape for o in outs] != [tuple(t.shape) for t in kernel.spec.outputs]:
            raise ServerError(f"the target server at {self.client.label} returned outputs of other shapes",
                              "bad_reply")
        return outs


def remote_backend(address: str | None = None, token: str | None = None) -> RemoteBackend:
    """The backend of the target server at `address` (default: $TARGET_SERVER_SOCKET; the token defaults to
    $CTXRT_SERVER_TOKEN)."""
    address = address or os.environ.get(SOCKET_ENV)
    if not address:
        raise ConfigError(f"no target server: set {SOCKET_ENV}=<host>:<port>")
    client = Client(address, token if token is not None else os.environ.get(TOKEN_ENV) or None)
    info = client.call("device_info")
    job = info.get("job_timeout_s") if isinstance(info, dict) else None
    if isinstance(job, int | float) and not isinstance(job, bool) and job > 0:
        client.timeout = float(job) + 60.0  # the server answers a job within its limit; allow for transfers
        client.sock.settimeout(client.timeout)  # type: ignore[union-attr]
    return RemoteBackend(client)
