"""Byte layout of a context binary: the fixed header and the section table (docs/format.md).

Everything here is arithmetic on at most a few hundred bytes: the header and the table are checked
against the file's real size before any section is touched, so a hostile file cannot make the reader
seek, read or allocate past what is there.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

from ctxrt.errors import FormatError

MAGIC = b"CTXRTBIN"
FORMAT_VERSION = 1  # a self-contained context: what `ctxrt compile` writes
EXTERNAL_VERSION = 2  # version 1 plus weights kept outside the file (META external_weights): compile caches
SUPPORTED_VERSIONS = (1, 2)

# magic, version, header size, section count, table entry size, table offset, file size, flags,
# 16 reserved bytes, crc32 of (header with this field excluded) + section table.
HEADER = struct.Struct("<8sIIIIQQI16sI")
ENTRY = struct.Struct("<IIQQII")  # kind, alignment, offset, length, crc32, flags
HEADER_CRC_AT = HEADER.size - 4
PREFIX = struct.Struct("<8sI")  # magic + version: enough to refuse a file before trusting its layout

META, PROGRAMS, WEIGHTS, KERNELS = 1, 2, 3, 4
KIND_NAMES = {META: "META", PROGRAMS: "PROGRAMS", WEIGHTS: "WEIGHTS", KERNELS: "KERNELS"}
REQUIRED_KINDS = (META, PROGRAMS, WEIGHTS)

MAX_SECTIONS = 16
MAX_ALIGNMENT = 1 << 20
PAGE = 4096  # the weights section starts on a page so it can be mapped and used in place
WEIGHT_ALIGNMENT = 64  # each weight inside the weights section
SECTION_ALIGNMENT = {META: 8, PROGRAMS: 8, WEIGHTS: PAGE, KERNELS: PAGE}
MAX_MSGPACK_SECTION = 1 << 31  # META / PROGRAMS: far above any real model, and msgpack's own limit


@dataclass(frozen=True)
class Section:
    kind: int
    alignment: int
    offset: int
    length: int
    crc: int

    @property
    def label(self) -> str:
        return f"section {self.kind} ({KIND_NAMES[self.kind]})"

    @property
    def end(self) -> int:
        return self.offset + self.length


@dataclass(frozen=True)
class Header:
    version: int
    section_count: int
    table_offset: int
    file_size: int

    @property
    def table_end(self) -> int:
        return self.table_offset + self.section_count * ENTRY.size


def crc32(data: bytes | memoryview, start: int = 0) -> int:
    return zlib.crc32(data, start) & 0xFFFFFFFF


def is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def align(n: int, alignment: int) -> int:
    return -(-n // alignment) * alignment


# -- writing ---------------------------------------------------------------------------------------

def pack_head(sections: list[Section], file_size: int, version: int = FORMAT_VERSION) -> bytes:
    """Header + section table, with the header checksum filled in."""
    table = b"".join(ENTRY.pack(s.kind, s.alignment, s.offset, s.length, s.crc, 0) for s in sections)
    header = HEADER.pack(MAGIC, version, HEADER.size, len(sections), ENTRY.size, HEADER.size,
                         file_size, 0, bytes(16), 0)
    crc = crc32(table, crc32(header[:HEADER_CRC_AT]))
    return header[:HEADER_CRC_AT] + struct.pack("<I", crc) + table


# -- reading ---------------------------------------------------------------------------------------

def parse_header(data: bytes, actual_size: int) -> Header:
    """Check the fixed header (`data` is the file's first bytes, up to HEADER.size of them)."""
    if len(data) < PREFIX.size:
        raise FormatError(f"not a ctxrt context binary: the file is {actual_size} bytes, "
                          f"too short for a {HEADER.size}-byte header")
    magic, version = PREFIX.unpack_from(data)
    if magic != MAGIC:
        raise FormatError(f"not a ctxrt context binary: magic {magic!r}, expected {MAGIC!r}")
    if version not in SUPPORTED_VERSIONS:
        supported = ", ".join(map(str, SUPPORTED_VERSIONS))
        raise FormatError(f"format version {version} is not supported by this ctxrt (supports {supported})")
    if len(data) < HEADER.size:
        raise FormatError(f"truncated context binary: the file is {actual_size} bytes, "
                          f"shorter than its {HEADER.size}-byte header")
    (_, _, header_size, count, entry_size, table_offset, file_size, flags, reserved,
     _) = HEADER.unpack_from(data)
    if header_size != HEADER.size:
        raise FormatError(f"header size {header_size} is not {HEADER.size} (format version {version})")
    if entry_size != ENTRY.size:
        raise FormatError(f"section table entry size {entry_size} is not {ENTRY.size} (format version {version})")
    if flags != 0 or reserved != bytes(16):
        raise FormatError(f"header flags {flags:#x} / reserved bytes are not zero: unknown features")
    if file_size != actual_size:
        raise FormatError(f"the header records a file size of {file_size} bytes but the file has "
                          f"{actual_size}: truncated or extended")
    if not 1 <= count <= MAX_SECTIONS:
        raise FormatError(f"section count {count} is outside 1..{MAX_SECTIONS}")
    header = Header(version, count, table_offset, file_size)
    if table_offset < HEADER.size or table_offset % 8:
        raise FormatError(f"section table offset {table_offset} points into the {HEADER.size}-byte header "
                          "or is not 8-aligned")
    if header.table_end > file_size:
        raise FormatError(f"section table extends past the end of the file: offset {table_offset} + "
                          f"{count} entries x {ENTRY.size} bytes > {file_size}")
    return header


def parse_table(header_bytes: bytes, table: bytes, header: Header) -> dict[int, Section]:
    """Check the section table (`table` holds exactly its bytes) and the header checksum."""
    sections: dict[int, Section] = {}
    for i in range(header.section_count):
        kind, alignment, offset, length, crc, flags = ENTRY.unpack_from(table, i * ENTRY.size)
        what = f"section table entry {i}"
        if kind not in KIND_NAMES:
            raise FormatError(f"{what}: unknown section kind {kind} (known: {sorted(KIND_NAMES)})")
        if kind in sections:
            raise FormatError(f"{what}: a second {KIND_NAMES[kind]} section")
        s = Section(kind, alignment, offset, length, crc)
        if flags != 0:
            raise FormatError(f"{s.label}: flags {flags:#x} are not zero: unknown features")
        if not is_power_of_two(alignment) or alignment > MAX_ALIGNMENT:
            raise FormatError(f"{s.label}: alignment {alignment} is not a power of two up to {MAX_ALIGNMENT}")
        if alignment % SECTION_ALIGNMENT[kind]:
            raise FormatError(f"{s.label}: alignment {alignment} is below the required "
                              f"{SECTION_ALIGNMENT[kind]}")
        if offset % alignment:
            raise FormatError(f"{s.label}: offset {offset} is not aligned to {alignment}")
        if offset < header.table_end:
            raise FormatError(f"{s.label}: offset {offset} points into the header or section table "
                              f"(which end at {header.table_end})")
        if s.end > header.file_size:
            raise FormatError(f"{s.label} extends past the end of the file: offset {offset} + length "
                              f"{length} > {header.file_size}")
        if kind in (META, PROGRAMS, KERNELS) and length > MAX_MSGPACK_SECTION:
            raise FormatError(f"{s.label}: length {length} exceeds {MAX_MSGPACK_SECTION}")
        sections[kind] = s
    for kind in REQUIRED_KINDS:
        if kind not in sections:
            raise FormatError(f"the section table has no {KIND_NAMES[kind]} section")
    ordered = sorted(sections.values(), key=lambda s: (s.offset, s.end))
    for a, b in zip(ordered, ordered[1:], strict=False):
        if b.offset < a.end:
            raise FormatError(f"{a.label} [{a.offset}, {a.end}) and {b.label} [{b.offset}, {b.end}) overlap")
    expected = crc32(table, crc32(header_bytes[:HEADER_CRC_AT]))
    (stored,) = struct.unpack_from("<I", header_bytes, HEADER_CRC_AT)
    if stored != expected:
        raise FormatError(f"header checksum mismatch (stored {stored:#010x}, computed {expected:#010x}): "
                          "the header or section table is corrupt")
    return sections


def check_crc(section: Section, data: bytes | memoryview) -> None:
    check_crc_value(section, crc32(data))


def check_crc_value(section: Section, got: int) -> None:
    """The section's stored checksum against one computed over its bytes (FormatError where they differ)."""
    if got != section.crc:
        raise FormatError(f"{section.label}: checksum mismatch (stored {section.crc:#010x}, computed "
                          f"{got:#010x}): the section is corrupt")
