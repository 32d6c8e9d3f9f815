"""What a performance cache file may hold, checked field by field before any entry is used (the house discipline
of format/codec.py and format/schema.py: every type checked, every size bounded, problems named with the path
of the field).

    {"format": "ctxrt-performance-cache", "version": 1, "device": {str: str},
     "entries": {signature key: {"signature": {...}, "label": str, "default": params, "default_time_s": time,
                                 "best": params, "best_time_s": time, "tried": [[params, time, error], ...],
                                 "complete": bool, "note": str}}}

params: a map of at most MAX_PARAMS names (str of at most 64 characters) to a bool, an int within 2**62, a finite
float or a str of at most 64 characters; time: null or seconds, finite, in [0, MAX_TIME_S]; error: null or a str.
The writer truncates its strings to these limits and runs the same checks before it saves an entry, so it never
writes what the reader refuses.
"""

from __future__ import annotations

import json
import math
import reprlib
from collections.abc import Mapping
from typing import Any

from ctxrt.format.codec import MAX_DEPTH, MAX_INT
from ctxrt.format.tuning import MAX_PARAMS
from ctxrt.tuning.readfile import BadFile

FORMAT = "ctxrt-performance-cache"
VERSION = 1
MAX_FILE_BYTES = 64 << 20  # a cache file is read whole: a larger one is refused before parsing
MAX_ENTRIES = 1 << 16
MAX_KEY = 128  # characters of a signature key (ctxrt writes 32 hex digits)
MAX_TRIED = 1 << 16  # candidates of one entry (the largest spaces have a few thousand)
MAX_TEXT = 1000  # characters of a label, a note, a candidate's error, a device field
MAX_DEVICE_FIELDS = 64
MAX_SIGNATURE_TEXT = 1 << 20  # characters of one string inside a signature (it holds kernel sources' names)
MAX_TIME_S = 86400.0  # a kernel that ran longer than a day is no measurement
DOC_KEYS = frozenset({"format", "version", "device", "entries"})
ENTRY_KEYS = ("signature", "label", "default", "default_time_s", "best", "best_time_s", "tried", "complete", "note")

_SHORT = reprlib.Repr()  # bounded: safe on hostile values in messages
_SHORT.maxlevel, _SHORT.maxstring, _SHORT.maxother, _SHORT.maxlist, _SHORT.maxdict = 2, 40, 40, 4, 3


def short(v: Any) -> str:
    try:
        return _SHORT.repr(v)
    except ValueError:  # an int over Python's digit limit
        return f"<{type(v).__name__}>"


class _Bad(Exception):
    """One field's problem: `where: what`."""


def _fail(where: str, expected: str, got: Any) -> _Bad:
    return _Bad(f"{where}: expected {expected}, got {type(got).__name__} {short(got)}")


def parse(raw: bytes) -> dict[str, dict[str, Any]]:
    """The entries of a cache file's bytes (already bounded by MAX_FILE_BYTES); BadFile naming the first
    problem otherwise (one bad entry makes the whole file suspect: ctxrt never writes one)."""
    try:
        doc = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise BadFile(f"is not UTF-8 text ({e.reason} at byte {e.start})") from None
    except RecursionError:
        raise BadFile("is not a ctxrt performance cache (JSON nested too deeply)") from None
    except ValueError as e:  # JSONDecodeError, and integers over Python's digit limit
        raise BadFile(f"is not valid JSON ({' '.join(str(e).split())[:200]})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise BadFile("is not a ctxrt performance cache")
    if doc.get("version") != VERSION:
        raise BadFile(f"has version {short(doc.get('version'))}, this ctxrt writes {VERSION}")
    unknown = sorted(short(k) for k in set(doc) - DOC_KEYS)
    if unknown:
        raise BadFile(f"has unknown keys {', '.join(unknown[:4])}")
    try:
        if "device" in doc:
            _device(doc["device"])
        entries = doc.get("entries")
        if not isinstance(entries, dict):
            raise _fail("entries", "an object", entries)
        if len(entries) > MAX_ENTRIES:
            raise _Bad(f"entries: {len(entries)} of them, more than {MAX_ENTRIES}")
        for key, entry in entries.items():
            check_entry(key, entry)
    except _Bad as e:
        raise BadFile(f"is malformed ({e})") from None
    return entries


def problem(key: Any, entry: Any) -> str | None:
    """Why `entry` (under `key`) cannot be stored or used; None when it can."""
    try:
        check_entry(key, entry)
    except _Bad as e:
        return str(e)
    return None


def check_entry(key: Any, entry: Any) -> None:
    if not isinstance(key, str) or not 0 < len(key) <= MAX_KEY:
        raise _fail("entries key", f"a str of 1 to {MAX_KEY} characters", key)
    where = f"entries[{short(key)}]"
    if not isinstance(entry, dict):
        raise _fail(where, "an object", entry)
    missing = [k for k in ENTRY_KEYS if k not in entry]
    if missing:
        raise _Bad(f"{where}: missing keys {missing}")
    if len(entry) != len(ENTRY_KEYS):
        unknown = sorted(short(k) for k in set(entry) - set(ENTRY_KEYS))
        raise _Bad(f"{where}: unknown keys {', '.join(unknown[:4])}")
    _signature(entry["signature"], f"{where} signature")
    for k in ("label", "note"):
        _text(entry[k], f"{where} {k}")
    for k in ("default", "best"):
        _params(entry[k], f"{where} {k}")
    for k in ("default_time_s", "best_time_s"):
        _time(entry[k], f"{where} {k}")
    if not isinstance(entry["complete"], bool):
        raise _fail(f"{where} complete", "true or false", entry["complete"])
    tried = entry["tried"]
    if not isinstance(tried, list) or len(tried) > MAX_TRIED:
        raise _fail(f"{where} tried", f"a list of at most {MAX_TRIED} candidates", tried)
    for i, t in enumerate(tried):
        w = f"{where} tried[{i}]"
        if not isinstance(t, list) or len(t) != 3:
            raise _fail(w, "[params, time_s, error]", t)
        _params(t[0], f"{w} params")
        _time(t[1], f"{w} time_s")
        if t[2] is not None:
            _text(t[2], f"{w} error")


def for_writing(entry: Mapping[str, Any]) -> dict[str, Any]:
    """The entry as the writer saves it: its free texts (label, note, errors) cut to MAX_TEXT characters."""
    out = dict(entry)
    for k in ("label", "note"):
        if isinstance(out.get(k), str):
            out[k] = out[k][:MAX_TEXT]
    if isinstance(out.get("tried"), list):
        out["tried"] = [[t[0], t[1], t[2][:MAX_TEXT]] if isinstance(t, list | tuple) and len(t) == 3
                        and isinstance(t[2], str) else t for t in out["tried"]]
    return out


def _text(v: Any, where: str) -> None:
    if not isinstance(v, str) or len(v) > MAX_TEXT:
        raise _fail(where, f"a str of at most {MAX_TEXT} characters", v)


def _time(v: Any, where: str) -> None:
    if v is None:
        return
    if not isinstance(v, int | float) or isinstance(v, bool) or not 0 <= v <= MAX_TIME_S:  # NaN fails too
        raise _fail(where, f"null or a time in seconds in [0, {MAX_TIME_S:g}]", v)


def _params(v: Any, where: str) -> None:
    if not isinstance(v, dict) or len(v) > MAX_PARAMS:
        raise _fail(where, f"an object of at most {MAX_PARAMS} parameters", v)
    for name, value in v.items():
        if not isinstance(name, str) or not 0 < len(name) <= 64:
            raise _fail(f"{where} name", "a str of 1 to 64 characters", name)
        ok = (isinstance(value, bool) or (isinstance(value, int) and -MAX_INT <= value <= MAX_INT)
              or (isinstance(value, float) and math.isfinite(value)) or (isinstance(value, str) and len(value) <= 64))
        if not ok:
            raise _fail(f"{where}[{short(name)}]", "a bool, an int, a finite float or a str of at most 64 characters",
                        value)


def _device(v: Any) -> None:
    if not isinstance(v, dict) or len(v) > MAX_DEVICE_FIELDS:
        raise _fail("device", f"an object of at most {MAX_DEVICE_FIELDS} fields", v)
    for k, x in v.items():
        _text(x, f"device[{short(k)}]")


def _signature(v: Any, where: str) -> None:
    """What was hashed (informative only): an object, nested at most MAX_DEPTH levels, its strings bounded."""
    if not isinstance(v, dict):
        raise _fail(where, "an object", v)
    stack: list[tuple[Any, int]] = [(v, 0)]
    while stack:  # no recursion: the depth is what is being checked
        x, depth = stack.pop()
        if isinstance(x, str):
            if len(x) > MAX_SIGNATURE_TEXT:
                raise _Bad(f"{where}: a string of {len(x)} characters, more than {MAX_SIGNATURE_TEXT}")
            continue
        if not isinstance(x, dict | list):
            continue
        if depth >= MAX_DEPTH:
            raise _Bad(f"{where}: nested deeper than {MAX_DEPTH} levels")
        if isinstance(x, dict):
            stack.extend((k, depth + 1) for k in x)
        stack.extend((y, depth + 1) for y in (x.values() if isinstance(x, dict) else x))
