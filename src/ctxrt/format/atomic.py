"""Outputs appear whole or not at all, and errors name the user's path, never a temporary one.

One file is written under a hidden temporary name in its own folder and renamed over the target at the
end (`atomic_write`). Several files that belong together (a split model's parts and their EPContext model,
a context binary and its wrapper) are written into a hidden staging directory and moved into the target
folder together at the end (`StagedFiles`). An error or Ctrl-C before that point removes the temporary
files and leaves the target as it was.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

PAUSE_ENV = "CTXRT_TEST_PAUSE"


def _hidden(folder: str | os.PathLike, name: str) -> Path:
    return Path(folder) / f".{name}.{secrets.token_hex(6)}.tmp"


def user_error(e: OSError, path: str | os.PathLike) -> OSError:
    """The same error (errno and text) about the path the user gave."""
    return OSError(e.errno, e.strerror or str(e), os.fspath(path))


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike) -> Iterator[BinaryIO]:
    """A binary file object whose bytes land at `path` only if the block completes."""
    target = Path(os.path.abspath(path))
    tmp = _hidden(target.parent, target.name)
    try:
        # 0o666 lets the umask decide the final mode, as for any file the user creates.
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
    except OSError as e:
        raise user_error(e, path) from e
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException as e:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(e, OSError) and e.filename in (None, os.fspath(tmp), os.fspath(target)):
            raise user_error(e, path) from e  # a write (no file name), the rename, or the temporary file
        raise


class StagedFiles:
    """Files written into a hidden staging directory, then moved into `folder` all at once by `commit`.

    `folder` may not exist yet: it is then made by renaming the staging directory. Otherwise the staging
    directory is made inside it (the same file system, so the final moves are renames) and each file
    replaces its namesake; the rest of the folder is left alone. `path(name)` is where to write a file;
    `shown(name)` is its final path as the user wrote it, for messages."""

    def __init__(self, folder: str | os.PathLike, label: str | None = None) -> None:
        self.user_folder = Path(folder)
        self.folder = Path(os.path.abspath(folder))
        self.fresh = not self.folder.exists()
        parent = self.folder.parent if self.fresh else self.folder
        self.stage = _hidden(parent, label or self.folder.name)
        try:
            self.stage.mkdir()
        except OSError as e:
            raise user_error(e, folder) from e
        self.names: list[str] = []
        self.committed = False

    def path(self, name: str) -> Path:
        self.names.append(name)
        return self.stage / name

    def shown(self, name: str) -> Path:
        return self.user_folder / name

    def commit(self) -> list[Path]:
        """Move every staged file into place; returns their final paths as the user wrote them."""
        for name in self.names:
            if (self.folder / name).is_dir():
                raise IsADirectoryError(21, "Is a directory", os.fspath(self.shown(name)))
        pause_point("commit")
        with _interrupts_held():  # past this point the command completes: a Ctrl-C now comes too late
            if self.fresh:
                os.rename(self.stage, self.folder)
            else:
                for name in self.names:
                    os.replace(self.stage / name, self.folder / name)
                self.stage.rmdir()
            self.committed = True
        return [self.shown(n) for n in self.names]

    def discard(self) -> None:
        if not self.committed:
            shutil.rmtree(self.stage, ignore_errors=True)

    def __enter__(self) -> StagedFiles:
        return self

    def __exit__(self, kind: type[BaseException] | None, e: BaseException | None, tb: object) -> None:
        self.discard()
        if isinstance(e, OSError) and e.filename and Path(e.filename).parent == self.stage:
            raise user_error(e, self.shown(Path(e.filename).name)) from e


@contextlib.contextmanager
def _interrupts_held() -> Iterator[None]:
    """SIGINT is ignored while the block runs, so the renames all happen (main thread only: signal handlers
    live there). The block is a few renames long."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(signal.SIGINT, lambda *_: None)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


def pause_point(point: str) -> None:
    """Test hook: with CTXRT_TEST_PAUSE=POINT:FIFO, on reaching POINT the first time, write POINT to the FIFO
    (if a test is reading it) and wait up to a minute for the test's signal. A test can so interrupt a
    write at a known point without guessing with sleeps."""
    wanted, _, fifo = os.environ.get(PAUSE_ENV, "").partition(":")
    if wanted != point or not fifo or point in _paused:
        return
    _paused.add(point)
    try:
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)  # no reader: no test waiting, carry on
    except OSError:
        return
    with os.fdopen(fd, "w") as f:
        f.write(point + "\n")
    time.sleep(60)


_paused: set[str] = set()
