"""The compile configuration of tuning mode, with QNN's names (reference/002, DESIGN.md §9).

    {"tuning_mode": true, "performance_cache_dir": "perf", "invalidate_performance_cache": false}

The same keys are keyword arguments of `ctxrt.compile` and `ctxrt.compiler.compile_graphs`. Every problem
(unknown key, wrong type, a cache directory or the invalidate flag without `tuning_mode`) is collected into one
ConfigError, so a user fixes the file in one go.
"""

from __future__ import annotations

import difflib
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ctxrt.errors import ConfigError


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
                problems.append(f"{key} {why}, got {json.dumps(value, default=repr)[:60]} "
                                f"({type(value).__name__})")
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
        with open(path, "rb") as f:  # OSError (missing, a directory, unreadable) names the path itself
            raw = f.read(1 << 20)
        try:
            values = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError as e:
            raise ConfigError(f"{label}: not UTF-8 text ({e.reason} at byte {e.start})") from None
        except json.JSONDecodeError as e:
            raise ConfigError(f"{label}: not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
        return cls.parse(values, label)


def _boolean(v: Any) -> str | None:
    return None if isinstance(v, bool) else "must be true or false"


def _directory(v: Any) -> str | None:
    if v is None or (isinstance(v, str | os.PathLike) and os.fspath(v) not in ("", b"")):
        return None
    return "must be a directory path (a non-empty string)"


def _seconds(v: Any) -> str | None:
    ok = v is None or (isinstance(v, int | float) and not isinstance(v, bool) and 0 < v < float("inf"))
    return None if ok else "must be a number of seconds > 0"


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
