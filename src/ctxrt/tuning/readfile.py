"""Reading a small file that someone else may have put in place: only a regular file, never blocking, never
more than a bound.

`open()` on a FIFO waits for a writer forever, and reading a character device (a symbolic link to /dev/zero)
never ends, so the file is opened with O_NONBLOCK (and O_NOFOLLOW unless links are wanted), checked with fstat
to be a regular file of at most `limit` bytes, and read up to `limit` + 1 bytes (a file that grows while being
read is refused too).
"""

from __future__ import annotations

import os
import stat

_CHUNK = 1 << 20


class BadFile(Exception):
    """The file is there but cannot be used; the message is a phrase that follows the file's name, e.g.
    "is a FIFO, not a regular file"."""


def kind(mode: int) -> str:
    """What a non-regular file is, in words."""
    kinds = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
             (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symbolic link"))
    for test, name in kinds:
        if test(mode):
            return name
    return "not a regular file"


def size_text(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 and not n % (1 << 20) else f"{n} bytes"


def read_regular(path: str | os.PathLike[str], limit: int, follow_symlinks: bool = False) -> bytes:
    """The bytes of the regular file `path`, at most `limit` of them. FileNotFoundError when there is nothing
    at `path`; BadFile for anything else that keeps it from being read (a symbolic link unless
    `follow_symlinks`, a FIFO, a device, a directory, a file over `limit`, an I/O error)."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow_symlinks else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise
    except OSError as e:  # ELOOP: a link with O_NOFOLLOW; ENXIO: a socket; EACCES, EIO, ...
        try:
            mode: int | None = os.lstat(path).st_mode
        except OSError:
            mode = None
        if mode is not None and stat.S_ISLNK(mode) and not follow_symlinks:
            raise BadFile("is a symbolic link (only a regular file is read)") from None
        if mode is not None and not stat.S_ISREG(mode) and not stat.S_ISLNK(mode):
            raise BadFile(f"is {kind(mode)}, not a regular file") from None
        raise BadFile(f"cannot be read ({e.strerror or e})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise BadFile(f"is {kind(st.st_mode)}, not a regular file")
        if st.st_size > limit:
            raise BadFile(f"is {size_text(st.st_size)}, over the limit of {size_text(limit)}")
        chunks, total = [], 0
        while total <= limit:
            chunk = os.read(fd, min(_CHUNK, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total > limit:
            raise BadFile(f"grew over the limit of {size_text(limit)} while being read")
        return b"".join(chunks)
    except OSError as e:
        raise BadFile(f"cannot be read ({e.strerror or e})") from None
    finally:
        os.close(fd)
