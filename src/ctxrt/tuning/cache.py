"""The performance cache: what tuning measured, one JSON file per device tier in `performance_cache_dir`.

The file is named from the device's normalised vendor, name and driver version and ctxrt's kernel version
(CLBlast normalises device names; PyOpenCL keys its cache on the driver version), so a driver update starts a
new file instead of trusting measurements made with the old one. Entries are keyed by kernel signature
(signature.py). Rules:

- every change is made under an exclusive lock (fcntl.flock on `<file>.lock`): the file is read again, the
  entry merged in, and the whole file written to a temporary file, fsynced and renamed over the old one, so
  concurrent tuners lose no entry and a crash (even kill -9) at any point leaves the old file or the new one;
- entries are saved as each kernel finishes, so a run killed half way keeps what it measured;
- the file is read like a hostile input (cache_schema.py): only a regular file (never a FIFO, a device or a
  symbolic link), opened without blocking, at most MAX_FILE_BYTES read, every field of every entry checked; a
  file that fails any of this is set aside (renamed `*.corrupt-N`) with one warning and rebuilt;
- a directory that cannot be written, or a lock file that is not a regular file, is one ConfigError when the
  cache is opened, before any profiling.

MNN rewrites its cache file in place (a crash mid-write loses it); here the file is only ever replaced whole.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import secrets
import stat
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from ctxrt.backends.opencl.device import normalise
from ctxrt.errors import ConfigError, CtxrtWarning
from ctxrt.format.atomic import pause_point
from ctxrt.tuning import cache_schema
from ctxrt.tuning.cache_schema import FORMAT, MAX_FILE_BYTES, VERSION
from ctxrt.tuning.readfile import BadFile, kind, read_regular, size_text

__all__ = ["FORMAT", "MAX_FILE_BYTES", "VERSION", "PerformanceCache", "cache_file_name"]
_LOCK_FLAGS = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
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


class PerformanceCache:
    """One device tier's file in `directory`. `get` looks an entry up, `put` saves one (merged under the lock)."""

    def __init__(self, directory: str | os.PathLike[str], device: Mapping[str, str], invalidate: bool = False) -> None:
        self.directory = Path(directory)
        self.device = {k: str(v) for k, v in device.items()}
        self.path = self.directory / cache_file_name(self.device)
        self._lock_path = self.path.with_name(self.path.name + ".lock")
        self._check_writable()
        self.entries: dict[str, dict[str, Any]] = {}
        self._told: set[str] = set()  # warnings given: each at most once per cache
        with self._locked():
            if invalidate:
                try:
                    self.path.unlink()
                except (FileNotFoundError, IsADirectoryError):  # a directory is set aside below
                    pass
                except OSError as e:
                    raise ConfigError(f"performance cache {self.path} cannot be deleted: {e.strerror or e}") from None
            self.entries = self._read(set_aside=True)

    def _check_writable(self) -> None:
        where = f"performance_cache_dir {os.fspath(self.directory)!r}"
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            # Not named like a temporary file: a writer's sweep (under the lock) must not take it away.
            probe = self.directory / f".{self.path.name}.{secrets.token_hex(6)}.probe"
            os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            probe.unlink()
        except OSError as e:
            raise ConfigError(f"{where} cannot be written: {e.strerror or e}") from None
        except ValueError as e:  # a NUL byte in the path
            raise ConfigError(f"{where} is not a usable path: {e}") from None
        os.close(self._open_lock())

    def _open_lock(self) -> int:
        """The lock file, made if missing: a regular file, never followed through a symbolic link (O_CREAT would
        create the link's target) and never waited on (a FIFO)."""
        try:
            fd = os.open(self._lock_path, _LOCK_FLAGS, 0o666)
        except OSError as e:
            what = ("is a symbolic link" if os.path.islink(self._lock_path)
                    else f"cannot be opened ({e.strerror or e})")
            raise ConfigError(f"performance cache lock file {self._lock_path} {what}: remove it") from None
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            os.close(fd)
            raise ConfigError(f"performance cache lock file {self._lock_path} is {kind(mode)}, not a regular "
                              "file: remove it")
        return fd

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        fd = self._open_lock()
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # released by the kernel if this process dies, even by kill -9
            yield
        finally:
            os.close(fd)

    def _read(self, set_aside: bool) -> dict[str, dict[str, Any]]:
        """The file's entries; {} when there is none. A bad file is set aside (under the lock) with a warning."""
        try:
            return cache_schema.parse(read_regular(self.path, MAX_FILE_BYTES))
        except FileNotFoundError:
            return {}
        except BadFile as e:
            problem = str(e)
        if set_aside:
            n = 1
            while os.path.lexists(aside := self.path.with_name(f"{self.path.name}.corrupt-{n}")):
                n += 1
            try:
                os.replace(self.path, aside)  # renames a FIFO or a link itself: nothing is opened
                done = f"set aside as {aside.name}"
            except OSError as e:
                done = f"could not be set aside ({e.strerror or e})"
            self._warn(f"performance cache {self.path} {problem}: {done}, starting a new one")
        return {}

    def _warn(self, message: str) -> None:
        if message not in self._told:
            self._told.add(message)
            warnings.warn(message, CtxrtWarning, stacklevel=5)

    def get(self, key: str) -> dict[str, Any] | None:
        """The entry for a signature key; the file is read again on a miss (another tuner may have added it)."""
        entry = self.entries.get(key)
        if entry is None:
            self.entries.update(self._read(set_aside=False))
            entry = self.entries.get(key)
        return entry

    def put(self, key: str, entry: Mapping[str, Any]) -> None:
        """Save one kernel's result now: merged with what other tuners wrote, replacing the file whole. An entry
        the reader would refuse is not saved (one warning), and neither is one that would make the file larger
        than the reader reads."""
        entry = cache_schema.for_writing(entry)
        why = cache_schema.problem(key, entry)
        if why is not None:
            self._warn(f"performance cache {self.path}: a result is not saved: {why}")
            return
        with self._locked():
            self._sweep()
            current = self._read(set_aside=True)
            old = current.get(key)
            if old is None or _better(entry, old):
                current[key] = entry
            if self._write(current):
                self.entries = current
            else:
                self.entries[key] = entry  # this compile still uses it

    def _sweep(self) -> None:
        """Temporary files of this cache are only made under the lock: any found now are a dead writer's."""
        for stale in self.directory.glob(f".{self.path.name}.*.tmp"):
            with contextlib.suppress(OSError):
                stale.unlink()

    def _write(self, entries: Mapping[str, Any]) -> bool:
        """Replace the file whole; False (with one warning) when it would be over MAX_FILE_BYTES."""
        device = {k: v[:cache_schema.MAX_TEXT] for k, v in list(self.device.items())[:cache_schema.MAX_DEVICE_FIELDS]}
        doc = {"format": FORMAT, "version": VERSION, "device": device, "entries": dict(entries)}
        data = json.dumps(doc, indent=1, sort_keys=True).encode()
        if len(data) > MAX_FILE_BYTES or len(entries) > cache_schema.MAX_ENTRIES:
            self._warn(f"performance cache {self.path} is full (the limit is {size_text(MAX_FILE_BYTES)} and "
                       f"{cache_schema.MAX_ENTRIES} entries): new results are not saved (set "
                       "invalidate_performance_cache or use another performance_cache_dir)")
            return False
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
        return True


def _fsync_dir(path: Path) -> None:
    """Make the rename itself durable (POSIX: the directory entry lives in the directory's data)."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
