"""META's tuning record and a tuned step's parameters, as the reader and the writer check them (docs/format.md;
tuning/record.py writes the record)."""

from __future__ import annotations

from typing import Any

from ctxrt.errors import FormatError
from ctxrt.format.codec import as_int, as_map, as_str, field

TUNING_KEYS = {"tuning_mode": (bool,), "device": (dict,), "kernels_profiled": (int,), "kernels_from_cache": (int,),
               "kernels": (list,)}
# One tuned kernel's entry: key -> the types its value may have.
TUNED_KERNEL_KEYS: dict[str, tuple[type, ...]] = {
    "graph": (str,), "signature": (str,), "label": (str,), "op": (str,), "kernel": (str,), "nodes": (list,),
    "params": (dict,), "default_params": (dict,), "default_time_us": (int, float, type(None)),
    "best_time_us": (int, float, type(None)), "tried": (int,), "failed": (int,), "source": (str,),
    "complete": (bool,), "note": (str,),
}
TUNED_SOURCES = ("profiled", "cache")
MAX_PARAMS = 64  # tunable parameters of one kernel


def check_tuning(value: dict[str, Any], where: str = "META tuning") -> None:
    """The tuning record: {} (not tuned), or every key of TUNING_KEYS with each kernel's entry complete, times
    finite and >= 0, parameters flat maps of plain values, and counters that add up."""
    if not value:
        return
    _typed(value, TUNING_KEYS, where)
    for k, v in as_map(value["device"], f"{where} device").items():
        as_str(v, f"{where} device[{k!r}]")
    kernels = value["kernels"]
    for i, entry in enumerate(kernels):
        w = f"{where} kernels[{i}]"
        e = _typed(as_map(entry, w), TUNED_KERNEL_KEYS, w)
        for j, node in enumerate(e["nodes"]):
            as_str(node, f"{w} nodes[{j}]")
        params(e["params"], f"{w} params")
        params(e["default_params"], f"{w} default_params")
        for key in ("default_time_us", "best_time_us"):
            if e[key] is not None and not 0 <= e[key] < float("inf"):
                raise FormatError(f"{w} {key}: expected a time >= 0, got {e[key]!r}")
        for key in ("tried", "failed"):
            as_int(e[key], f"{w} {key}")
        if e["source"] not in TUNED_SOURCES:
            raise FormatError(f"{w} source: {e['source']!r} is not one of {TUNED_SOURCES}")
    counted = as_int(value["kernels_profiled"], f"{where} kernels_profiled") + as_int(
        value["kernels_from_cache"], f"{where} kernels_from_cache")
    if counted != len(kernels):
        raise FormatError(f"{where}: kernels_profiled + kernels_from_cache = {counted}, but {len(kernels)} kernels "
                          "are listed")


def _typed(m: dict[str, Any], keys: dict[str, tuple[type, ...]], where: str) -> dict[str, Any]:
    unknown = sorted(set(m) - set(keys))
    if unknown:
        raise FormatError(f"{where}: unknown keys {unknown[:4]}")
    for key, types in keys.items():
        v = field(m, key, where)
        if not isinstance(v, types) or (isinstance(v, bool) and bool not in types):
            raise FormatError(f"{where} {key}: expected {' or '.join(t.__name__ for t in types)}, got "
                              f"{type(v).__name__}")
    return m


def params(value: Any, where: str) -> dict[str, Any]:
    """Tuned kernel parameters: at most MAX_PARAMS names, each an int, float, bool or short str."""
    p = as_map(value, where)
    if len(p) > MAX_PARAMS:
        raise FormatError(f"{where}: {len(p)} parameters, more than {MAX_PARAMS}")
    for k, v in p.items():
        if len(k) > 64 or not isinstance(v, int | float | str) or (isinstance(v, str) and len(v) > 64):
            raise FormatError(f"{where}[{k[:64]!r}]: expected an int, float, bool or short str")
    return p
