"""Latency and memory of ctxrt against onnxruntime on ResNet-50 (light, random weights) and a BERT encoder.
Latency: both engines in this process on the same inputs, timed in alternating blocks of runs (each block
after one untimed run) so machine noise hits both, while onnxruntime's spinning worker threads (they spin for
a while after each run) do not steal the cores from the run that follows. Peak RSS: each engine alone in a
fresh child process (this script with --child), so neither is charged for the other's memory. Prints a
Markdown table and the command line.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import resource
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "models"))
import zoo  # noqa: E402

MiB = 2**20
Feeds = dict[str, np.ndarray]
Runner = Callable[[], Any]


def model_and_feeds(name: str) -> tuple[Path, Feeds]:
    if name == "resnet50":
        return zoo.light_model("resnet50"), zoo.light_feeds("resnet50")
    if name == "bert":  # the shape of all-MiniLM-L6-v2: 6 layers, hidden 384, 12 heads
        path = zoo.bert_model(layers=6, hidden=384, heads=12, intermediate=1536, seq=128, vocab=30522,
                              exporter="dynamo")
        return path, zoo.bert_feeds(128, batch=1, vocab=30522, pad=0)
    raise SystemExit(f"unknown model {name!r}: expected resnet50 or bert")


def open_ort(path: Path, feeds: Feeds) -> tuple[Runner, list[str]]:
    import onnxruntime as ort

    ort.set_default_logger_severity(3)  # not the warning about light models' unused initializer
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return (lambda: sess.run(None, feeds)), [o.name for o in sess.get_outputs()]


def open_ctxrt(path: Path, feeds: Feeds) -> tuple[Runner, Any]:
    import ctxrt

    ctx = ctxrt.compile(path, shapes={k: v.shape for k, v in feeds.items()})
    g = ctx.graph()
    return (lambda: g.run(feeds)), (ctx, g)


def timed(run: Runner) -> float:
    start = time.perf_counter_ns()
    run()
    return (time.perf_counter_ns() - start) / 1e6


def latency(name: str, repeat: int, warmup: int) -> dict[str, Any]:
    path, feeds = model_and_feeds(name)
    ort_run, names = open_ort(path, feeds)
    ctx_run, (ctx, g) = open_ctxrt(path, feeds)
    try:
        want, got = ort_run(), ctx_run()
        err = max(float(np.max(np.abs(got[k] - w))) for k, w in zip(names, want, strict=True))
        for _ in range(warmup):
            ctx_run(), ort_run()
        times: dict[str, list[float]] = {"ctxrt": [], "ort": []}
        block = max(1, repeat // 2)
        for i in range(0, repeat, block):
            pair = [("ctxrt", ctx_run), ("ort", ort_run)]
            for engine, run in pair if (i // block) % 2 == 0 else pair[::-1]:
                time.sleep(1.0)  # both runtimes' worker threads spin after work: let them go idle first
                run()
                times[engine].extend(timed(run) for _ in range(min(block, repeat - i)))
        return {"ctxrt_ms": statistics.median(times["ctxrt"]), "ort_ms": statistics.median(times["ort"]),
                "spillfill_bytes": g.spillfill_size, "lower_bound_bytes": g.lower_bound,
                "max_abs_diff": err, "inputs": {k: list(v.shape) for k, v in feeds.items()}}
    finally:
        ctx.free()


def peak_rss_bytes() -> int:
    # VmHWM belongs to this process image; Linux carries ru_maxrss across exec, so a child started by a
    # big parent would report the parent's peak.
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    scale = 1 if sys.platform == "darwin" else 1024  # bytes on macOS, KiB elsewhere
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


def child(engine: str, name: str, repeat: int, warmup: int) -> None:
    """Run one engine alone and print its peak RSS as JSON (the parent's peak would include both)."""
    path, feeds = model_and_feeds(name)
    base = peak_rss_bytes()
    run = (open_ort if engine == "ort" else open_ctxrt)(path, feeds)[0]
    for _ in range(warmup + repeat):
        run()
    print(json.dumps({"peak_rss_bytes": peak_rss_bytes(), "before_engine_bytes": base}))


def peak_rss(engine: str, name: str, repeat: int, warmup: int) -> dict[str, int]:
    cmd = [sys.executable, __file__, "--child", engine, "--models", name, "--repeat", str(repeat),
           "--warmup", str(warmup)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def table(results: dict[str, dict[str, Any]]) -> str:
    rows = ["| model | ctxrt ms | ort ms | ctxrt/ort | arena MiB / lower bound MiB | "
            "peak RSS ctxrt MiB | peak RSS ort MiB |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for name, r in results.items():
        arena, bound = r["spillfill_bytes"], r["lower_bound_bytes"]
        rows.append(f"| {name} | {r['ctxrt_ms']:.2f} | {r['ort_ms']:.2f} | {r['ctxrt_ms'] / r['ort_ms']:.2f} | "
                    f"{arena / MiB:.2f} / {bound / MiB:.2f} ({arena / max(bound, 1):.3f}) | "
                    f"{r['rss']['ctxrt']['peak_rss_bytes'] / MiB:.0f} | "
                    f"{r['rss']['ort']['peak_rss_bytes'] / MiB:.0f} |")
    return "\n".join(rows)


def markdown(header: list[str], rows: list[list[str]], left: int = 1) -> str:
    """A Markdown table: the first `left` columns left-aligned, the others right-aligned."""
    lines = ["| " + " | ".join(header) + " |",
             "| " + " | ".join("---" if k < left else "---:" for k in range(len(header))) + " |"]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def machine_line() -> str:
    env = environment()
    return (f"{env['processor']}, {env['cpus']} CPUs, Python {env['python']}, numpy {env['numpy']}, "
            f"onnxruntime {env['onnxruntime']}, ctxrt {env['ctxrt']}")


def environment() -> dict[str, Any]:
    import onnxruntime

    import ctxrt

    return {"machine": platform.machine(), "processor": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(), "python": platform.python_version(), "numpy": np.__version__,
            "ctxrt": ctxrt.__version__, "onnxruntime": onnxruntime.__version__}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="resnet50,bert", help="comma-separated: resnet50, bert")
    p.add_argument("--repeat", type=int, default=20, help="timed runs per engine (median reported)")
    p.add_argument("--warmup", type=int, default=3, help="untimed runs per engine first")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.add_argument("--child", choices=["ctxrt", "ort"], help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.repeat < 1 or args.warmup < 0:
        p.error("--repeat must be >= 1 and --warmup >= 0")
    names = [n for n in args.models.split(",") if n]
    if args.child:
        child(args.child, names[0], min(args.repeat, 5), args.warmup)
        return

    results = {}
    for name in names:
        model_and_feeds(name)  # build and cache the model first, so the children only load it
        results[name] = latency(name, args.repeat, args.warmup)
        results[name]["rss"] = {e: peak_rss(e, name, args.repeat, args.warmup) for e in ("ctxrt", "ort")}
    command = shlex.join(sys.orig_argv)
    if args.json:
        print(json.dumps({"command": command, "environment": environment(), "repeat": args.repeat,
                          "warmup": args.warmup, "models": results}, indent=2))
        return
    env = environment()
    print(f"$ {command}\n")
    print(table(results))
    print(f"\nmedian of {args.repeat} runs in alternating blocks after {args.warmup} warm-ups; peak RSS of each engine "
          f"alone in a fresh process; {env['processor']}, {env['cpus']} CPUs, Python {env['python']}, "
          f"numpy {env['numpy']}, onnxruntime {env['onnxruntime']}, ctxrt {env['ctxrt']}")


if __name__ == "__main__":
    main()
