"""Reading context binaries: the metadata alone with a few plain reads, or the whole file memory-mapped.

ContextFile.open checks the header, the section table and META (with its checksum) at once; the
PROGRAMS checksum when the graphs are first decoded, and the WEIGHTS checksum once, when the weights
are first used (it reads every weight byte, so it can be skipped with verify_weights=False).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import threading
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from ctxrt.compiler.program import CompiledGraph
from ctxrt.errors import FormatError
from ctxrt.format import codec, layout, schema
from ctxrt.format import weights as wts
from ctxrt.format.weights import ExternalWeight
from ctxrt.mapped import remember

_CHECK_CHUNK = 16 << 20  # bytes of the weights section checked, then handed back, at a time
_BESIDE = 1 << 20  # a weights section from this size is checked on a thread beside the load (check_weights_beside)


def _checked(raise_error: bool = True) -> None:
    """check_weights_beside's `wait` where the check is done."""


def beside(work: Callable[[], None], then: Callable[[bool], None] = _checked) -> Callable[[bool], None]:
    """Run `work` on a thread of its own (checksums: zlib releases the GIL) and return `wait(raise_error=True)`,
    which joins it, then waits for `then` (an earlier `beside`'s wait), and raises the first error of either."""
    failed: list[BaseException] = []

    def run() -> None:
        try:
            work()
        except BaseException as e:  # handed to `wait`
            failed.append(e)
    thread = threading.Thread(target=run, name="ctxrt-weights-check", daemon=True)
    thread.start()

    def wait(raise_error: bool = True) -> None:
        thread.join()
        then(raise_error)
        if failed and raise_error:
            raise failed[0]
    return wait

Source = str | os.PathLike[str] | bytes | bytearray | memoryview


class Head(NamedTuple):
    """What read_head learns from the start of a file, and how many bytes it read to learn it."""

    metadata: dict[str, Any]
    sections: dict[int, layout.Section]
    bytes_read: int


def _parse_meta(raw: bytes | memoryview, sections: dict[int, layout.Section], version: int) -> dict[str, Any]:
    layout.check_crc(sections[layout.META], raw)
    return schema.check_meta(codec.decode(raw, "META"), sections[layout.WEIGHTS].length, version)


def read_head(source: Source) -> Head:
    """Header, section table and META only: plain reads whose total does not depend on the weights."""
    if not isinstance(source, str | os.PathLike):
        with ContextFile.open(source, verify_weights=False) as cf:
            meta = cf.sections[layout.META]
            looked_at = layout.HEADER.size + len(cf.sections) * layout.ENTRY.size + meta.length
            return Head(cf.metadata, cf.sections, looked_at)
    with open(source, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        first = f.read(layout.HEADER.size)
        header = layout.parse_header(first, size)  # from here on, every offset is within `size`
        f.seek(header.table_offset)
        table = f.read(header.table_end - header.table_offset)
        sections = layout.parse_table(first, table, header)
        meta = sections[layout.META]
        f.seek(meta.offset)
        raw = f.read(meta.length)
        if len(raw) != meta.length:
            raise FormatError(f"{meta.label}: the file shrank while being read")
        return Head(_parse_meta(raw, sections, header.version), sections, len(first) + len(table) + len(raw))


def read_metadata(source: Source) -> dict[str, Any]:
    """The decoded META section (everything `ctxrt inspect` shows), without reading the rest."""
    return read_head(source).metadata


class ContextFile:
    """A context binary opened for reading: a read-only memory map of a path, or the given bytes."""

    def __init__(self, buf: memoryview, mm: mmap.mmap | None, verify_weights: bool) -> None:
        self._buf = buf  # the whole file, read-only, bytes-formatted
        self._mm = mm
        self._verify_weights = verify_weights
        self._graphs: list[CompiledGraph] | None = None
        self._weights: dict[str, np.ndarray] | None = None
        self._closed = False
        try:
            size = len(buf)
            first = bytes(buf[:layout.HEADER.size])
            header = layout.parse_header(first, size)
            self.sections = layout.parse_table(first, bytes(buf[header.table_offset:header.table_end]), header)
            self.metadata = _parse_meta(self._section(layout.META), self.sections, header.version)
        except BaseException:
            self.close()
            raise

    @classmethod
    def open(cls, source: Source, verify_weights: bool = True) -> ContextFile:
        """Open a path (memory-mapped read-only) or a bytes-like object (used in place)."""
        if isinstance(source, str | os.PathLike):
            with open(source, "rb") as f:
                if os.fstat(f.fileno()).st_size == 0:
                    raise FormatError(f"{os.fspath(source)}: empty file, not a ctxrt context binary")
                mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)  # stays valid after f closes
                remember(mm, np.frombuffer(mm, np.uint8, count=1).ctypes.data, len(mm), os.dup(f.fileno()))
            return cls(memoryview(mm), mm, verify_weights)
        if not isinstance(source, bytes | bytearray | memoryview):
            raise TypeError(f"ContextFile.open needs a path or bytes, got {type(source).__name__}")
        view = memoryview(source)
        if not view.c_contiguous:
            raise FormatError("the context binary buffer is not contiguous")
        return cls(view.cast("B").toreadonly(), None, verify_weights)

    def _section(self, kind: int) -> memoryview:
        if self._closed:
            raise ValueError("I/O operation on a closed ContextFile")
        s = self.sections[kind]
        return self._buf[s.offset:s.end]

    def graphs(self) -> list[CompiledGraph]:
        """The compiled graphs, decoded from PROGRAMS and checked against META (cached)."""
        if self._graphs is None:
            raw = self._section(layout.PROGRAMS)
            layout.check_crc(self.sections[layout.PROGRAMS], raw)
            self._graphs = schema.graphs_from(codec.decode(raw, "PROGRAMS", keep_ext=True), self.metadata)
        return list(self._graphs)

    def programs(self) -> dict[str, Any] | None:
        """The KERNELS section (device programs: binaries, sources, the device they were built for), decoded
        and checked; None when the file has none (a cpu context)."""
        if layout.KERNELS not in self.sections:
            return None
        raw = self._section(layout.KERNELS)
        layout.check_crc(self.sections[layout.KERNELS], raw)
        return schema.check_kernels(codec.decode(raw, "KERNELS"))

    def weights_section(self) -> tuple[memoryview, int]:
        """The raw weights section (read-only) and its offset in the file, for copying into a buffer."""
        raw = self._section(layout.WEIGHTS)
        if self._verify_weights:  # once per ContextFile (it reads every weight byte)
            self._check_weights(raw)
            self._verify_weights = False
        return raw, self.sections[layout.WEIGHTS].offset

    def check_weights_beside(self) -> Callable[[bool], None]:
        """Start the weights section's checksum (once per file) on a thread of its own, so that it runs beside the
        rest of a load (zlib's crc32 releases the GIL; a 12.5 MiB section took ~4 ms of a 22 ms load, now off its
        path on a second core); returns `wait(raise_error=True)`, which joins the thread and raises its FormatError.
        A section under `_BESIDE` bytes is checked now. The file must not be closed before `wait` returned."""
        if not self._verify_weights:
            return _checked
        raw = self._section(layout.WEIGHTS)
        self._verify_weights = False
        if raw.nbytes < _BESIDE:
            self._check_weights(raw)
            return _checked
        return beside(lambda: self._check_weights(raw))

    def _check_weights(self, raw: memoryview) -> None:
        """The weights section's checksum, in chunks each handed back once read: the check never holds the whole
        section resident (kernels fault back in what they read; a decoder's first run pays ~200 page faults for it,
        ~0.5 ms, where keeping them mapped would hold a loaded context's every weight resident before any run)."""
        section, crc = self.sections[layout.WEIGHTS], 0
        for start in range(0, raw.nbytes, _CHECK_CHUNK):
            crc = layout.crc32(raw[start:start + _CHECK_CHUNK], crc)
            self._release(section.offset + start, min(_CHECK_CHUNK, raw.nbytes - start))
        layout.check_crc_value(section, crc)

    def _release(self, offset: int, nbytes: int) -> None:
        """Out of this process's resident set, the mapped pages the checksum just read: they stay in the page
        cache, and only those kernels touch come back (an embedding's unused rows never do)."""
        advise = getattr(mmap, "MADV_DONTNEED", None)
        if self._mm is None or advise is None or not nbytes:
            return
        start = offset - offset % mmap.PAGESIZE
        with contextlib.suppress(OSError, ValueError):
            self._mm.madvise(advise, start, offset + nbytes - start)

    def weights_block(self) -> np.ndarray:
        """The weights section as a read-only uint8 array over the file's memory."""
        raw, _ = self.weights_section()
        return np.frombuffer(raw, np.uint8)

    def weights(self) -> dict[str, np.ndarray]:
        """Read-only zero-copy arrays over the weights section, one per name; shared contents share bytes."""
        if self._weights is None:
            block = self.weights_block()
            out = {}
            for name, entry in self.metadata["weights"].items():
                offset, size, dt, shape = schema.weight_entry(entry, f"META weights[{name!r}]", block.nbytes)
                out[name] = wts.view(block[offset:offset + size], dt, shape)
            self._weights = out
        return dict(self._weights)

    def external_weights(self) -> dict[str, ExternalWeight]:
        """The weights this context reads from outside the file (format version 2; {} for version 1), by name:
        whoever loads it supplies their bytes (runtime/weightstore.py)."""
        return {name: ExternalWeight(e[0], int(e[1]), str(e[2]), tuple(int(d) for d in e[3]), int(e[4]))
                for name, e in self.metadata.get("external_weights", {}).items()}

    def close(self) -> None:
        """Drop this file's views; the map closes now, or when the last array handed out is gone."""
        self._graphs = self._weights = None
        self._closed = True
        self._buf.release()
        if self._mm is not None:
            # Arrays handed out by weights() may still point into the map: it then goes when they do.
            with contextlib.suppress(BufferError):
                self._mm.close()
            self._mm = None

    def __enter__(self) -> ContextFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
