"""Tuning mode on this machine's OpenCL device: what tuning buys and what the performance cache saves.

1. kernels: the GEMM shapes of BERT (6 layers, hidden 384, seq 128: projections, feed-forward, attention) and
   of ResNet-50 (its FC layer), element-wise classes of both, and the conv classes of ResNet-50, SqueezeNet,
   ShuffleNet and DenseNet-121 (bench/cnn_classes.py: the implicit-GEMM conv, the direct depthwise kernel);
   each tuned from a cold start: default and tuned time (device time from OpenCL profiling events, minimum of
   the runs, as the tuner measures), the speed-up and the candidates tried;
2. models: BERT and ResNet-50 compiled for opencl untuned and tuned, their latency measured interleaved
   (rounds alternate which runs first; the median of round medians), and the ratio;
3. compile time: the tuned compile from a cold cache (invalidated) and from the warm cache it left, against
   the untuned compile (goal: warm <= 5 % of cold). Programs already built in this process are reused by every
   compile (the backend's program store), and PoCL keeps its own binary cache on disk unless --no-pocl-cache:
   "cold" is then cold for ctxrt's performance cache only.

Each part prints a Markdown table, the command line and the machine. Timings on a shared machine are noisy:
compare ratios within one run.

    python bench/bench_tuning.py [--parts kernels,models,compile] [--models bert,resnet50]
                                 [--budget-candidates 16] [--budget-seconds S] [--repeat 10] [--rounds 4]
                                 [--no-pocl-cache] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "models"))
sys.path.insert(0, str(ROOT / "bench"))
import zoo  # noqa: E402

F32 = np.dtype(np.float32)


# -- kernel classes --------------------------------------------------------------------------------------
def _matmul(name: str, a: tuple[int, ...], b: tuple[int, ...], trans_b: bool = False) -> Any:
    from ctxrt.backends.kernel import NodeSpec, TensorSpec

    n = b[-2] if trans_b else b[-1]
    out = (*a[:-1], n) if len(b) == 2 else (*np.broadcast_shapes(a[:-2], b[:-2]), a[-2], n)
    return NodeSpec("MatMul", name, {"transB": 1} if trans_b else {}, [TensorSpec(a, F32), TensorSpec(b, F32)],
                    [TensorSpec(tuple(out), F32)])


def _eltwise(op: str, shapes: list[tuple[int, ...]]) -> Any:
    from ctxrt.backends.kernel import NodeSpec, TensorSpec

    out = tuple(np.broadcast_shapes(*shapes))
    return NodeSpec(op, op.lower(), {}, [TensorSpec(s, F32) for s in shapes], [TensorSpec(out, F32)])


def _node(op: str, attrs: dict[str, Any], ins: list[tuple[tuple[int, ...], Any]],
          outs: list[tuple[tuple[int, ...], Any]]) -> Any:
    from ctxrt.backends.kernel import NodeSpec, TensorSpec

    return NodeSpec(op, op.lower(), attrs, [TensorSpec(s, np.dtype(d)) for s, d in ins],
                    [TensorSpec(s, np.dtype(d)) for s, d in outs], opset=17)


def kernel_classes() -> list[tuple[str, Any]]:
    """(label, node spec): B of the projections stored [N, K] as the compiler stores constant MatMul weights."""
    return [
        ("BERT Q/K/V/out projection 128x384 @ 384x384", _matmul("proj", (128, 384), (384, 384), True)),
        ("BERT FFN up 128x384 @ 384x1536", _matmul("ffn_up", (128, 384), (1536, 384), True)),
        ("BERT FFN down 128x1536 @ 1536x384", _matmul("ffn_down", (128, 1536), (384, 1536), True)),
        ("BERT attention scores 12x128x32 @ 12x32x128", _matmul("scores", (1, 12, 128, 32), (1, 12, 32, 128))),
        ("BERT attention context 12x128x128 @ 12x128x32", _matmul("context", (1, 12, 128, 128), (1, 12, 128, 32))),
        ("ResNet-50 FC 1x2048 @ 2048x1000", _matmul("fc", (1, 2048), (1000, 2048), True)),
        ("BERT bias Add 128x384 + 384", _eltwise("Add", [(1, 128, 384), (384,)])),
        ("BERT Gelu 128x1536", _eltwise("Gelu", [(1, 128, 1536)])),
        ("ResNet-50 Relu 256x56x56", _eltwise("Relu", [(1, 256, 56, 56)])),
        ("BERT attention Softmax 12x128x128", _node("Softmax", {"axis": -1}, [((1, 12, 128, 128), F32)],
                                                     [((1, 12, 128, 128), F32)])),
        ("BERT LayerNorm 128x384", _node("LayerNormalization", {"axis": -1}, [((1, 128, 384), F32), ((384,), F32),
                                                                              ((384,), F32)], [((1, 128, 384), F32)])),
        ("BERT heads Transpose 128x12x32 -> 12x128x32", _node("Transpose", {"perm": [0, 2, 1, 3]},
                                                               [((1, 128, 12, 32), F32)], [((1, 12, 128, 32), F32)])),
        ("BERT K^T Transpose 12x128x32 -> 12x32x128", _node("Transpose", {"perm": [0, 2, 1]}, [((12, 128, 32), F32)],
                                                             [((12, 32, 128), F32)])),
        ("BERT embedding Gather 30522x384 [128]", _node("Gather", {"axis": 0}, [((30522, 384), F32),
                                                                              ((1, 128), np.int64)],
                                                        [((1, 128, 384), F32)])),
        ("ResNet-50 ReduceMean 2048x7x7 (global average)", _node("ReduceMean", {"axes": [2, 3], "keepdims": 1},
                                                                 [((1, 2048, 7, 7), F32)], [((1, 2048, 1, 1), F32)])),
    ]


def _row(label: str, entry: dict[str, Any], seconds: float) -> dict[str, Any]:
    d, b = entry["default_time_us"], entry["best_time_us"]
    changed = {k: v for k, v in entry["params"].items() if entry["default_params"][k] != v}
    print(f"  {label}: {d} -> {b} us ({entry['tried']} tried)", file=sys.stderr, flush=True)
    return {"kernel": label, "default_us": d, "tuned_us": b, "speedup": d / b if d and b else None,
            "tried": entry["tried"], "failed": entry["failed"], "converged": entry["complete"],
            "tuning_s": seconds, "params": changed, "note": entry["note"]}


def bench_kernels(args: argparse.Namespace) -> list[dict[str, Any]]:
    from cnn_classes import CLASSES, class_model

    from ctxrt.backends import get_backend, select_kernel
    from ctxrt.compiler import compile_model
    from ctxrt.tuning import LocalDevice, Tuner, TuningConfig

    be = get_backend("opencl")

    def tuner() -> Tuner:
        return Tuner(TuningConfig(tuning_mode=True, tuning_budget_candidates=args.budget_candidates,
                                  tuning_budget_seconds=args.budget_seconds), LocalDevice(be))

    rows = []
    for label, spec in kernel_classes():
        kernel, where = select_kernel(be, spec)
        assert where == "opencl", label
        start = time.perf_counter()
        _, (entry,) = tuner().tune("bench", {0: kernel}, {0: spec.name})
        rows.append(_row(label, entry, time.perf_counter() - start))
    for index, (label, op, *_) in enumerate(CLASSES):
        if op != "Conv":
            continue
        # the class's model compiled with a tuner: its one kernel (the conv, epilogue fused) is tuned as it would
        # be in a model, weights prepacked
        start = time.perf_counter()
        compiled, _ = compile_model(class_model(index)[0], None, be, "bench", tuner=tuner())
        (entry,) = compiled.tuning
        rows.append(_row(label, entry, time.perf_counter() - start))
    return rows


# -- models ------------------------------------------------------------------------------------------------
def model(name: str) -> tuple[Path, dict[str, np.ndarray]]:
    if name == "bert":
        path = zoo.bert_model(layers=6, hidden=384, heads=12, intermediate=1536, seq=128, vocab=30522,
                              exporter="dynamo")
        return path, zoo.bert_feeds(128, batch=1, vocab=30522, pad=0)
    if name == "resnet50":
        return zoo.light_model("resnet50"), zoo.light_feeds("resnet50")
    raise SystemExit(f"unknown model {name!r}: expected bert or resnet50")


def _compile(path: Path, feeds: dict[str, np.ndarray], **tuning: Any) -> tuple[Any, float]:
    import ctxrt

    start = time.perf_counter()
    ctx = ctxrt.compile(path, shapes={k: v.shape for k, v in feeds.items()}, backend="opencl", **tuning)
    return ctx, time.perf_counter() - start


def _tuning(args: argparse.Namespace, cache: Path, invalidate: bool = False) -> dict[str, Any]:
    return {"tuning_mode": True, "performance_cache_dir": str(cache), "invalidate_performance_cache": invalidate,
            "tuning_budget_candidates": args.budget_candidates, "tuning_budget_seconds": args.budget_seconds}


def bench_models(args: argparse.Namespace, cache: Path) -> list[dict[str, Any]]:
    rows = []
    for name in args.models:
        path, feeds = model(name)
        plain, _ = _compile(path, feeds)
        tuned, _ = _compile(path, feeds, **_tuning(args, cache))
        runs = {"untuned": plain.graph(), "tuned": tuned.graph()}
        outs = {k: g.run(feeds) for k, g in runs.items()}
        err = max(float(np.max(np.abs(outs["tuned"][k] - v))) for k, v in outs["untuned"].items())
        medians: dict[str, list[float]] = {k: [] for k in runs}
        order = list(runs)
        for r in range(args.rounds):
            for k in order if r % 2 == 0 else order[::-1]:
                times = []
                for _ in range(args.repeat):
                    start = time.perf_counter()
                    runs[k].run(feeds)
                    times.append((time.perf_counter() - start) * 1e3)
                medians[k].append(statistics.median(times))
        u, t = statistics.median(medians["untuned"]), statistics.median(medians["tuned"])
        record = tuned.info.get("tuning", {}) if getattr(tuned, "info", None) else {}
        rows.append({"model": name, "untuned_ms": u, "tuned_ms": t, "speedup": u / t, "max_abs_diff": err,
                     "tuned_kernels": len(record.get("kernels", [])) or None})
        plain.free()
        tuned.free()
    return rows


def bench_compile(args: argparse.Namespace, cache: Path) -> list[dict[str, Any]]:
    rows = []
    for name in args.models:
        path, feeds = model(name)
        _compile(path, feeds)  # programs built once (PoCL keeps its own binary cache), as in any later compile
        _, untuned = _compile(path, feeds)
        _, cold = _compile(path, feeds, **_tuning(args, cache, invalidate=True))
        _, warm = _compile(path, feeds, **_tuning(args, cache))
        rows.append({"model": name, "untuned_s": untuned, "cold_s": cold, "warm_s": warm,
                     "warm_over_cold": warm / cold, "warm_overhead_s": warm - untuned})
    return rows


# -- output ------------------------------------------------------------------------------------------------
def _table(rows: list[dict[str, Any]], cols: list[tuple[str, str, str]]) -> str:
    head = "| " + " | ".join(c[1] for c in cols) + " |\n|" + "---|" * len(cols) + "\n"
    body = ""
    for r in rows:
        cells = []
        for key, _, fmt in cols:
            v = r[key]
            cells.append("-" if v is None else format(v, fmt) if fmt else str(v))
        body += "| " + " | ".join(cells) + " |\n"
    return head + body


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--parts", default="kernels,models,compile")
    ap.add_argument("--models", default="bert,resnet50")
    ap.add_argument("--budget-candidates", type=int, default=16, help="per kernel (default 16)")
    ap.add_argument("--budget-seconds", type=float, default=None, help="per kernel (default: none)")
    ap.add_argument("--repeat", type=int, default=10, help="runs per round (model latency)")
    ap.add_argument("--rounds", type=int, default=4, help="interleaved rounds (model latency)")
    ap.add_argument("--no-pocl-cache", action="store_true",
                    help="turn off PoCL's own binary cache (POCL_KERNEL_CACHE=0): cold tuning then pays every "
                         "program build, as on a machine that never built ctxrt's kernels")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.no_pocl_cache:
        os.environ["POCL_KERNEL_CACHE"] = "0"  # read when PoCL starts: before the first OpenCL call
    args.models = [m for m in args.models.split(",") if m]
    parts = set(args.parts.split(","))
    from ctxrt.backends import get_backend

    be = get_backend("opencl")
    out: dict[str, Any] = {"command": shlex.join([Path(sys.executable).name, *sys.argv]),
                           "machine": f"{platform.machine()}, {platform.processor() or '?'}; OpenCL device "
                                      f"{be.info.name} ({be.info.vendor}, driver {be.info.driver}), "
                                      f"{be.info.compute_units} compute units"}
    with tempfile.TemporaryDirectory(prefix="ctxrt-perf-") as tmp:
        cache = Path(tmp)
        if "kernels" in parts:
            out["kernels"] = bench_kernels(args)
        if "compile" in parts:
            out["compile"] = bench_compile(args, cache)
        if "models" in parts:
            out["models"] = bench_models(args, cache)
    if args.json:
        print(json.dumps(out))
        return
    print(f"    {out['command']}\n")
    if "kernels" in out:
        print(_table(out["kernels"], [("kernel", "kernel class", ""), ("default_us", "default us", ".1f"),
                                      ("tuned_us", "tuned us", ".1f"), ("speedup", "speed-up", ".2f"),
                                      ("tried", "tried", "d"), ("converged", "converged", ""),
                                      ("tuning_s", "tuning s", ".1f"), ("params", "tuned parameters", "")]))
    if "models" in out:
        print(_table(out["models"], [("model", "model (opencl)", ""), ("untuned_ms", "untuned ms", ".2f"),
                                     ("tuned_ms", "tuned ms", ".2f"), ("speedup", "speed-up", ".3f"),
                                     ("max_abs_diff", "max abs diff", ".2g")]))
    if "compile" in out:
        print(_table(out["compile"], [("model", "model", ""), ("untuned_s", "untuned compile s", ".2f"),
                                      ("cold_s", "cold tuning s", ".1f"), ("warm_s", "warm cache s", ".2f"),
                                      ("warm_over_cold", "warm / cold", ".3f")]))
    print(f"machine: {out['machine']}")


if __name__ == "__main__":
    main()
