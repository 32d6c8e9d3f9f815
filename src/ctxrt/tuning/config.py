"""The compile configuration of tuning mode, with QNN's names (docs/tuning.md).

    {"tuning_mode": true, "performance_cache_dir": "perf", "invalidate_performance_cache": false}

The same keys are keyword arguments of `ctxrt.compile` and `ctxrt.compiler.compile_graphs`. Every problem
(unknown key, wrong type, a cache directory or the invalidate flag without `tuning_mode`) is collected into one
ConfigError, so a user fixes the file in one go.
"""

from __future__ import annotations

import difflib
import json
import os
import reprlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ctxrt.errors import ConfigError
from ctxrt.tuning.readfile import BadFile, read_regular

MAX_CONFIG_BYTES = 1 << 20
MAX_PATH = 4096  # characters of performance_cache_dir (Linux's PATH_MAX)
MAX_SECONDS = 1e9
_SHORT = reprlib.Repr()  # bounded: a hostile value (huge, deeply nested) is shown in a few characters
_SHORT.maxlevel, _SHORT.maxstring, _SHORT.maxother, _SHORT.maxlist, _SHORT.maxdict = 2, 60, 60, 4, 3


@dataclass(frozen=True)
class TuningConfig:
    """What `tuning_mode` does. Budgets are per kernel; None: the search runs until it converges."""

    tuning_mode: bool = False
    performance_cache_dir: str | None = None
    invalidate_performance_cache: bool = False
    tuning_budget_seconds: float | None = None
    tuning_budget_candidates: int | None = None

    @classmethod
    def parse(cls, values: Mapping[str, Any], origin: str = "compile config") -> TuningConfig:
        """Check `values` (a decoded JSON object or keyword arguments) and build the config."""
        if not isinstance(values, Mapping):
            raise ConfigError(f"{origin}: expected a JSON object such as {{\"tuning_mode\": true}}, got "
                              f"{type(values).__name__}")
        problems, out = [], {}
        for key, value in values.items():
            check = _CHECKS.get(key) if isinstance(key, str) else None
            if check is None:
                problems.append(_unknown(key))
                continue
            why = check(value)
            if why:
                problems.append(f"{key} {why}, got {_shown(value)} ({type(value).__name__})")
            else:
                out[key] = value
        if not out.get("tuning_mode"):
            for key in ("performance_cache_dir", "invalidate_performance_cache", "tuning_budget_seconds",
                        "tuning_budget_candidates"):
                if out.get(key) not in (None, False):
                    problems.append(f"{key} needs \"tuning_mode\": true (tuning settings without tuning mode are "
                                    "an error, as in QNN)")
        if problems:
            raise ConfigError(f"{origin}: {'; '.join(problems)}")
        if out.get("performance_cache_dir") is not None:
            out["performance_cache_dir"] = os.fspath(out["performance_cache_dir"])
        if out.get("tuning_budget_seconds") is not None:
            out["tuning_budget_seconds"] = float(out["tuning_budget_seconds"])
        return cls(**out)

    @classmethod
    def load(cls, path: str | os.PathLike[str], label: str | None = None) -> TuningConfig:
        """The config in a JSON file; `label` names it in errors (e.g. "--config tuning.json")."""
        label = label or os.fspath(path)
        try:  # a regular file only (a FIFO would block), at most MAX_CONFIG_BYTES; missing: FileNotFoundError
            raw = read_regular(path, MAX_CONFIG_BYTES, follow_symlinks=True)
        except BadFile as e:
            raise ConfigError(f"{label} {e}") from None
        try:
            values = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError as e:
            raise ConfigError(f"{label}: not UTF-8 text ({e.reason} at byte {e.start})") from None
        except json.JSONDecodeError as e:
            raise ConfigError(f"{label}: not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
        except RecursionError:
            raise ConfigError(f"{label}: not a tuning config (JSON nested too deeply)") from None
        except ValueError as e:  # an integer over Python's digit limit
            raise ConfigError(f"{label}: not valid JSON: {' '.join(str(e).split())[:120]}") from None
        return cls.parse(values, label)


def _shown(v: Any) -> str:
    try:
        return _SHORT.repr(v)
    except ValueError:  # an int over Python's digit limit
        return f"<{type(v).__name__}>"


def _boolean(v: Any) -> str | None:
    return None if isinstance(v, bool) else "must be true or false"


def _directory(v: Any) -> str | None:
    if v is None:
        return None
    path = os.fspath(v) if isinstance(v, str | os.PathLike) else None
    if not isinstance(path, str) or not path:
        return "must be a directory path (a non-empty string)"
    if "\0" in path:
        return "must be a directory path without NUL characters"
    if len(path) > MAX_PATH:
        return f"must be a directory path of at most {MAX_PATH} characters"
    return None


def _seconds(v: Any) -> str | None:
    ok = v is None or (isinstance(v, int | float) and not isinstance(v, bool) and 0 < v <= MAX_SECONDS)
    return None if ok else f"must be a number of seconds > 0 (at most {MAX_SECONDS:g})"


def _count(v: Any) -> str | None:
    ok = v is None or (isinstance(v, int) and not isinstance(v, bool) and v >= 1)
    return None if ok else "must be a whole number >= 1"


_CHECKS: dict[str, Callable[[Any], str | None]] = {
    "tuning_mode": _boolean, "performance_cache_dir": _directory, "invalidate_performance_cache": _boolean,
    "tuning_budget_seconds": _seconds, "tuning_budget_candidates": _count,
}
KEYS = tuple(_CHECKS)


def _unknown(key: Any) -> str:
    close = difflib.get_close_matches(str(key), KEYS, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else f" (known keys: {', '.join(KEYS)})"
    return f"unknown key {str(key)[:60]!r}{hint}"
