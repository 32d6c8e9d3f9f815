"""The performance cache: what tuning measured, one JSON file per device tier in `performance_cache_dir`.

The file is named from the device's normalised vendor, name and driver version and ctxrt's kernel version
(CLBlast normalises device names; PyOpenCL keys its cache on the driver version), so a driver update starts a
new file instead of trusting measurements made with the old one. Entries are keyed by kernel signature
(signature.py). Rules:

- every change is made under an exclusive lock (fcntl.flock on `<file>.lock`): the file is read again, the
  entry merged in, and the whole file written to a temporary file, fsynced and renamed over the old one, so
  concurrent tuners lose no entry and a crash (even kill -9) at any point leaves the old file or the new one;
- entries are saved as each kernel finishes, so a run killed half way keeps what it measured;
- a file that cannot be read or parsed is set aside (renamed `*.corrupt-N`) with one warning and rebuilt;
- a directory that cannot be written is one ConfigError when the cache is opened, before any profiling.

MNN rewrites its cache file in place (a crash mid-write loses it); here the file is only ever replaced whole.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import secrets
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from ctxrt.backends.opencl.device import normalise
from ctxrt.errors import ConfigError, CtxrtWarning
from ctxrt.format.atomic import pause_point

FORMAT = "ctxrt-performance-cache"
VERSION = 1
_NAME_PART = 48  # characters kept of each normalised name part (long names get a digest instead of the rest)


def cache_file_name(device: Mapping[str, str]) -> str:
    """`<vendor>_<device>_<driver>_ctxrt-<kernel version>.perf.json`, every part normalised."""
    parts = []
    for key in ("vendor", "device", "driver"):
        text = normalise(str(device.get(key, ""))) or "unknown"
        if len(text) > _NAME_PART:
            text = text[:_NAME_PART - 9] + "-" + hashlib.sha256(text.encode()).hexdigest()[:8]
        parts.append(text)
    return "_".join(parts) + f"_ctxrt-{normalise(str(device.get('ctxrt', '0')))}.perf.json"


def _better(new: Mapping[str, Any], old: Mapping[str, Any]) -> bool:
    """Keep the entry that explored more: a converged search, else more candidates tried."""
    return (bool(new.get("complete")), len(new.get("tried", []))) >= (bool(old.get("complete")),
                                                                      len(old.get("tried", [])))


def _valid_entry(e: Any) -> bool:
    if not isinstance(e, dict) or not isinstance(e.get("tried"), list):
        return False
    return (isinstance(e.get("best"), dict) and isinstance(e.get("default"), dict)
            and all(isinstance(e.get(k), int | float | type(None)) for k in ("best_time_s", "default_time_s")))


class PerformanceCache:
    """One device tier's file in `directory`. `get` looks an entry up, `put` saves one (merged under the lock)."""

    def __init__(self, directory: str | os.PathLike[str], device: Mapping[str, str], invalidate: bool = False) -> None:
        self.directory = Path(directory)
        self.device = {k: str(v) for k, v in device.items()}
        self.path = self.directory / cache_file_name(self.device)
        self._lock_path = self.path.with_name(self.path.name + ".lock")
        self._check_writable()
        self.entries: dict[str, dict[str, Any]] = {}
        with self._locked():
            if invalidate:
                with contextlib.suppress(FileNotFoundError):
                    self.path.unlink()
            self.entries = self._read(set_aside=True)

    def _check_writable(self) -> None:
        where = f"performance_cache_dir {os.fspath(self.directory)!r}"
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            # Not named like a temporary file: a writer's sweep (under the lock) must not take it away.
            probe = self.directory / f".{self.path.name}.{secrets.token_hex(6)}.probe"
            os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            probe.unlink()
            os.close(os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o666))
        except OSError as e:
            raise ConfigError(f"{where} cannot be written: {e.strerror or e}") from None

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # released by the kernel if this process dies, even by kill -9
            yield
        finally:
            os.close(fd)

    def _read(self, set_aside: bool) -> dict[str, dict[str, Any]]:
        """The file's entries; {} when there is none. A bad file is set aside (under the lock) with a warning."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return {}
        except OSError as e:
            problem = f"cannot be read ({e.strerror or e})"
        else:
            problem, entries = self._parse(raw)
            if problem is None:
                return entries
        if set_aside:
            n = 1
            while (aside := self.path.with_name(f"{self.path.name}.corrupt-{n}")).exists():
                n += 1
            with contextlib.suppress(OSError):
                os.replace(self.path, aside)
            warnings.warn(f"performance cache {self.path} {problem}: set aside as {aside.name}, starting a new one",
                          CtxrtWarning, stacklevel=4)
        return {}

    def _parse(self, raw: bytes) -> tuple[str | None, dict[str, dict[str, Any]]]:
        try:
            doc = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            return f"is not valid JSON ({e})", {}
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            return "is not a ctxrt performance cache", {}
        if doc.get("version") != VERSION:
            return f"has version {doc.get('version')!r}, this ctxrt writes {VERSION}", {}
        entries = doc.get("entries")
        if not isinstance(entries, dict) or not all(_valid_entry(e) for e in entries.values()):
            return "has malformed entries", {}
        return None, entries

    def get(self, key: str) -> dict[str, Any] | None:
        """The entry for a signature key; the file is read again on a miss (another tuner may have added it)."""
        entry = self.entries.get(key)
        if entry is None:
            self.entries.update(self._read(set_aside=False))
            entry = self.entries.get(key)
        return entry

    def put(self, key: str, entry: Mapping[str, Any]) -> None:
        """Save one kernel's result now: merged with what other tuners wrote, replacing the file whole."""
        with self._locked():
            self._sweep()
            current = self._read(set_aside=True)
            old = current.get(key)
            if old is None or _better(entry, old):
                current[key] = dict(entry)
            self._write(current)
            self.entries = current

    def _sweep(self) -> None:
        """Temporary files of this cache are only made under the lock: any found now are a dead writer's."""
        for stale in self.directory.glob(f".{self.path.name}.*.tmp"):
            with contextlib.suppress(OSError):
                stale.unlink()

    def _write(self, entries: Mapping[str, Any]) -> None:
        doc = {"format": FORMAT, "version": VERSION, "device": self.device, "entries": dict(entries)}
        data = json.dumps(doc, indent=1, sort_keys=True).encode()
        tmp = self.directory / f".{self.path.name}.{secrets.token_hex(6)}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            with os.fdopen(fd, "wb") as f:
                f.write(data[:len(data) // 2])
                f.flush()
                pause_point("cache-write")  # test hook: a kill -9 here must leave the previous file readable
                f.write(data[len(data) // 2:])
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
            _fsync_dir(self.directory)
        except OSError as e:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise ConfigError(f"performance cache {self.path} cannot be written: {e.strerror or e}") from None


def _fsync_dir(path: Path) -> None:
    """Make the rename itself durable (POSIX: the directory entry lives in the directory's data)."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
