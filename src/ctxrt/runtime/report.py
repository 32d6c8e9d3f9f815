"""Memory reports of context binaries: per graph weights, spill-fill, lower bound, IO; the arena as a plot."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ctxrt.errors import CtxrtError
from ctxrt.format.atomic import atomic_write
from ctxrt.format.schema import weight_sizes


def graph_memory(source: str | os.PathLike | bytes, at: dict[str, int] | None = None) -> list[dict[str, Any]]:
    """Per graph of a context binary: bytes of the weights it reads, its spill-fill arena, the arena's
    lower bound, its IO tensors, and the arena's allocations (key, offset, size, first step, last step).
    The weights' checksum is verified, as when the binary is loaded to run. `at` (dim name -> size): for a
    range program, the arena bytes live at most and the IO bytes at those dims (the others at their bound)."""
    from ctxrt.format import ContextFile

    with ContextFile.open(source) as f:
        f.weights_block()
        sizes = weight_sizes(f.metadata)  # weights in the file and outside it (format version 2)
        out = []
        for g in f.graphs():
            out.append({
                "name": g.name,
                "weights": sum(sizes[n] for n in g.const_names),
                "spillfill": g.spillfill_size, "lower_bound": g.lower_bound, "io": g.io_bytes,
                "steps": len(g.steps),
                "intervals": [[i.key, i.offset, i.size, i.first, i.last] for i in g.intervals],
            })
            if at and g.ranges is None:
                raise CtxrtError(f"--at: graph {g.name!r} has fixed shapes (compile it with --dim for ranges)")
            if at:
                out[-1]["live_at"] = live_at(g, at)
        return out


def plot_arena(graphs: list[tuple[str, dict[str, Any]]], path: str | os.PathLike) -> Path:
    """One panel per graph: each arena allocation as a rectangle over (execution step, offset)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Rectangle
    except ImportError:
        raise CtxrtError("--plot needs matplotlib: pip install 'ctxrt[plot]'") from None
    path = Path(path)
    fig, axes = plt.subplots(len(graphs), 1, figsize=(10, 3.2 * len(graphs)), squeeze=False)
    cmap = plt.get_cmap("tab20")
    mib = 2 ** 20
    for ax, (label, g) in zip(axes[:, 0], graphs, strict=True):
        for k, (key, offset, size, first, last) in enumerate(g["intervals"]):
            scratch = "#scratch" in key
            ax.add_patch(Rectangle((first, offset / mib), last - first + 1, size / mib, linewidth=0.3,
                                   edgecolor="black", facecolor="lightgrey" if scratch else cmap(k % 20),
                                   alpha=0.85))
        ax.axhline(g["lower_bound"] / mib, color="red", linestyle="--", linewidth=1,
                   label=f"lower bound {g['lower_bound'] / mib:.2f} MiB")
        ax.axhline(g["spillfill"] / mib, color="black", linewidth=1, label=f"arena {g['spillfill'] / mib:.2f} MiB")
        ax.set_xlim(0, max([g["steps"], 1] + [last + 1 for *_, last in g["intervals"]]))
        ax.set_ylim(0, max(g["spillfill"], 1) / mib * 1.05)
        ax.set_xlabel("execution step")
        ax.set_ylabel("offset (MiB)")
        ax.set_title(f"{label}: {len(g['intervals'])} tensors and scratch buffers (grey)")
        ax.legend(loc="upper right", fontsize="small")
    fig.tight_layout()
    try:
        with atomic_write(path) as f:
            fig.savefig(f, dpi=110, format="png")
    finally:
        plt.close(fig)
    return path


def graph_kernels(source: str | os.PathLike | bytes) -> list[dict[str, Any]]:
    """Per graph of a context binary: how many nodes each (op, kernel) runs, where the layout pass put its
    reorders (step, tensor, layouts, bytes), and the bytes of weights kernels prepacked at compile time. The
    weights' checksum is verified, as when the binary is loaded to run."""
    from collections import Counter

    from ctxrt.format import ContextFile

    with ContextFile.open(source) as f:
        f.weights_block()
        table = {**f.metadata.get("external_weights", {}), **f.metadata["weights"]}  # [0]: offset or key
        out = []
        for g in f.graphs():
            counts = Counter((s.op, s.algorithm) for s in g.steps)
            prepacked = {table[s.inputs[i].key][0]: int(table[s.inputs[i].key][1]) for s in g.steps
                         for i, _ in s.attrs.get("prepacked", ()) if i < len(s.inputs) and s.inputs[i] is not None}
            out.append({
                "name": g.name,
                "kernels": [{"op": op, "algorithm": alg, "count": n} for (op, alg), n in sorted(counts.items())],
                "reorders": [{"step": k, "name": s.name, "tensor": s.inputs[0].key, "from": s.attrs.get("from"),
                              "to": s.attrs.get("to"), "bytes": s.outputs[0].nbytes}
                             for k, s in enumerate(g.steps) if s.op == "Reorder"],
                "prepacked_bytes": sum(prepacked.values()),
            })
        return out


def live_at(g: Any, at: dict[str, int]) -> dict[str, Any]:
    """A range program's arena bytes live at most, and its IO bytes, at the dims `at` (others at their upper
    bound): each arena allocation at its size there, alive over the steps the plan gives it."""
    from ctxrt.compiler.program import ARENA

    names = [d[0] for d in g.ranges.dims]
    unknown = sorted(set(at) - set(names))
    if unknown:
        raise CtxrtError(f"--at: {unknown} are not dims of this range program ({names})")
    sizes = tuple(at.get(n, hi) for n, _, hi, _ in g.ranges.natural())
    for (n, lo, hi, step), d in zip(g.ranges.natural(), sizes, strict=True):
        if not lo <= d <= hi or d % step:
            raise CtxrtError(f"--at {n}={d}: outside the range {lo}..{hi}"
                             + (f" in steps of {step}" if step > 1 else ""))
    dims = tuple(d // step for d, step in zip(sizes, g.ranges.step_of(), strict=True))
    child = g.ranges.specialize(g, dims, {})[0]
    size: dict[str, int] = {}
    for step in child.steps:
        for r in (*step.inputs, *step.outputs):
            if r is not None and r.space == ARENA:
                size[r.key] = max(size.get(r.key, 0), r.nbytes)
    events = sorted(t for i in g.intervals
                    for t in ((i.first, size.get(i.key, i.size)), (i.last + 1, -size.get(i.key, i.size))))
    live = peak = 0
    for _, delta in events:
        live += delta
        peak = max(peak, live)
    return {"dims": dict(zip(names, dims, strict=True)), "peak": peak, "io": child.io_bytes}
