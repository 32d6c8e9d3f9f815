"""The tuning record a context binary carries in META (`tuning`, docs/format.md; format/schema.py checks it),
and the report made from it (`ctxrt tune-report`, `ctxrt inspect --tuning`).

    {"tuning_mode": true, "device": {vendor, device, driver, tier, ...},
     "kernels_profiled": 3, "kernels_from_cache": 9,
     "kernels": [{graph, signature, label, op, kernel, nodes, params, default_params, default_time_us,
                  best_time_us, tried, failed, source ("profiled" | "cache"), complete, note}, ...]}
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from ctxrt.errors import CtxrtError
from ctxrt.format.atomic import atomic_write


def context_record(graphs: Sequence[Any], device: Mapping[str, str]) -> dict[str, Any]:
    """META's tuning record for compiled graphs ({} when nothing was tuned)."""
    kernels = [dict(e) for g in graphs for e in getattr(g, "tuning", [])]
    if not kernels:
        return {}
    return {"tuning_mode": True, "device": dict(device),
            "kernels_profiled": sum(1 for e in kernels if e["source"] == "profiled"),
            "kernels_from_cache": sum(1 for e in kernels if e["source"] == "cache"), "kernels": kernels}


def _speedup(e: Mapping[str, Any]) -> float | None:
    d, b = e.get("default_time_us"), e.get("best_time_us")
    return d / b if d and b else None


def report(meta: Mapping[str, Any]) -> dict[str, Any]:
    """Per kernel: default and tuned time and the speed-up, plus totals weighted by how many nodes run each."""
    record = meta.get("tuning") or {}
    rows = []
    for e in record.get("kernels", []):
        changed = {k: v for k, v in e["params"].items() if e["default_params"].get(k) != v}
        rows.append({"graph": e["graph"], "kernel": e["label"], "op": e["op"], "nodes": len(e["nodes"]),
                     "default_us": e["default_time_us"], "tuned_us": e["best_time_us"], "speedup": _speedup(e),
                     "changed": changed, "tried": e["tried"], "failed": e["failed"], "source": e["source"],
                     "note": e["note"]})
    timed = [r for r in rows if r["speedup"]]
    total_default = sum(r["default_us"] * r["nodes"] for r in timed)
    total_tuned = sum(r["tuned_us"] * r["nodes"] for r in timed)
    device = record.get("device", {})
    return {"tuned": bool(rows), "device": device.get("device", ""), "tier": device.get("tier", ""),
            "kernels_profiled": record.get("kernels_profiled", 0),
            "kernels_from_cache": record.get("kernels_from_cache", 0), "kernels": rows,
            "total_default_us": total_default, "total_tuned_us": total_tuned,
            "total_speedup": total_default / total_tuned if total_tuned else None}


def report_lines(rep: Mapping[str, Any]) -> list[str]:
    if not rep["tuned"]:
        return ["tuning: none (compile with --config tuning.json and \"tuning_mode\": true to tune)"]
    lines = [f"tuning: {len(rep['kernels'])} kernels on {rep['device']} ({rep['tier']}): "
             f"{rep['kernels_profiled']} profiled, {rep['kernels_from_cache']} from the performance cache",
             f"  {'kernel':<52}{'nodes':>6}{'default us':>12}{'tuned us':>12}{'speed-up':>10}  parameters"]
    for r in rep["kernels"]:
        speed = f"{r['speedup']:>9.2f}x" if r["speedup"] else f"{'-':>10}"
        what = ", ".join(f"{k}={v}" for k, v in r["changed"].items()) or "default"
        if r["note"]:
            what += f" ({r['note']})"
        lines.append(f"  {r['kernel'][:51]:<52}{r['nodes']:>6}{_cell(r['default_us'])}{_cell(r['tuned_us'])}{speed}  "
                     f"{what}")
    if rep["total_speedup"]:
        lines.append(f"  {'all kernels (time x nodes)':<52}{'':>6}{rep['total_default_us']:>12.1f}"
                     f"{rep['total_tuned_us']:>12.1f}{rep['total_speedup']:>9.2f}x")
    return lines


def _cell(v: float | None) -> str:
    return f"{v:>12.1f}" if v is not None else f"{'-':>12}"


def plot_report(rep: Mapping[str, Any], path: str | os.PathLike[str]) -> None:
    """A bar chart of default vs tuned time per kernel (matplotlib, the `plot` extra), written atomically."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise CtxrtError("--plot needs matplotlib: pip install 'ctxrt[plot]'") from None
    rows = [r for r in rep["kernels"] if r["speedup"]]
    fig, ax = plt.subplots(figsize=(10, 0.35 * max(len(rows), 4) + 1.5))
    ys = range(len(rows))
    ax.barh([y + 0.2 for y in ys], [r["default_us"] for r in rows], height=0.4, label="default")
    ax.barh([y - 0.2 for y in ys], [r["tuned_us"] for r in rows], height=0.4, label="tuned")
    ax.set_yticks(list(ys), [f"{r['kernel'][:48]} ({r['speedup']:.2f}x)" for r in rows], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("kernel time (us, minimum of the profiled runs)")
    ax.set_title(f"tuning on {rep['device']}")
    ax.legend()
    fig.tight_layout()
    try:
        with atomic_write(path) as f:
            fig.savefig(f, dpi=100, format="png")
    finally:
        plt.close(fig)
