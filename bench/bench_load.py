"""Load time and shared memory: a ctxrt context binary vs an onnxruntime session on the same model.

- load: time from nothing loaded to the first outputs, in a fresh process (imports excluded):
  ctxrt `context_from_binary(.ctx)` + first run vs onnxruntime `InferenceSession(.onnx)` + first run.
- 4 processes: each loads the same model and runs once, then all four are measured together:
  the sum of their RSS and of their PSS (proportional set size: pages shared between the processes,
  such as a memory-mapped weights section, count once in total).

    .venv/bin/python bench/bench_load.py [--models resnet50,bert] [--repeat 5] [--json]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "models"))
sys.path.insert(0, str(REPO / "bench"))

from bench_latency import model_and_feeds  # noqa: E402


def _binary(name: str) -> Path:
    from ctxrt.backends import get_backend
    from ctxrt.compiler import compile_graphs, save_context

    path, feeds = model_and_feeds(name)
    out = REPO / ".cache" / "models" / f"{path.stem}.ctx"
    if not out.exists() or out.stat().st_mtime < path.stat().st_mtime:
        be = get_backend("cpu")
        graphs, weights = compile_graphs([(path, {k: v.shape for k, v in feeds.items()}, "main")], be)
        save_context(out, graphs, weights, be, [str(path)])
    return out


def _load_and_run(engine: str, name: str) -> Any:
    path, feeds = model_and_feeds(name)
    if engine == "ctxrt":
        from ctxrt.runtime.loader import context_from_binary

        binary = _binary(name)
        t0 = time.perf_counter()
        ctx = context_from_binary(binary)
        ctx.graph().run(feeds)
        return time.perf_counter() - t0, ctx
    import onnxruntime as ort

    t0 = time.perf_counter()
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    sess.run(None, feeds)
    return time.perf_counter() - t0, sess


def _child_time(engine: str, name: str, q: mp.Queue) -> None:
    q.put(_load_and_run(engine, name)[0])


def _child_hold(engine: str, name: str, ready: mp.Queue, done: Any) -> None:
    _, keep = _load_and_run(engine, name)
    ready.put(1)
    done.wait()
    del keep


def _mem(pid: int) -> tuple[int, int]:
    rss = pss = 0
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("Rss", "Pss"):
            kb = int(rest.split()[0]) * 1024
            rss, pss = (kb, pss) if key == "Rss" else (rss, kb)
    return rss, pss


def load_time(engine: str, name: str, repeat: int) -> float:
    ctx = mp.get_context("spawn")
    times = []
    for _ in range(repeat):
        q = ctx.Queue()
        p = ctx.Process(target=_child_time, args=(engine, name, q))
        p.start()
        times.append(q.get())
        p.join()
    return statistics.median(times) * 1e3


def four_processes(engine: str, name: str) -> tuple[int, int]:
    ctx = mp.get_context("spawn")
    ready, done = ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=_child_hold, args=(engine, name, ready, done)) for _ in range(4)]
    for p in procs:
        p.start()
    for _ in procs:
        ready.get()
    totals = [_mem(p.pid) for p in procs]
    done.set()
    for p in procs:
        p.join()
    return sum(t[0] for t in totals), sum(t[1] for t in totals)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="resnet50,bert")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    results = {}
    for name in args.models.split(","):
        _binary(name)  # compile once, outside any timing
        r = {e: load_time(e, name, args.repeat) for e in ("ctxrt", "ort")}
        mem = {e: four_processes(e, name) for e in ("ctxrt", "ort")}
        results[name] = {"load_ms": r, "rss4": {e: m[0] for e, m in mem.items()},
                         "pss4": {e: m[1] for e, m in mem.items()}}
    if args.json:
        print(json.dumps(results))
        return
    mib = 2 ** 20
    print(f"$ .venv/bin/python bench/bench_load.py {' '.join(argv or sys.argv[1:])}".rstrip())
    print("\n| model | load+first run ctxrt ms | ort ms | ctxrt/ort | 4 procs RSS ctxrt MiB | ort MiB "
          "| 4 procs PSS ctxrt MiB | ort MiB | PSS ctxrt/ort |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, r in results.items():
        lt, rss, pss = r["load_ms"], r["rss4"], r["pss4"]
        print(f"| {name} | {lt['ctxrt']:.1f} | {lt['ort']:.1f} | {lt['ctxrt'] / lt['ort']:.2f} | "
              f"{rss['ctxrt'] / mib:.0f} | {rss['ort'] / mib:.0f} | {pss['ctxrt'] / mib:.0f} | "
              f"{pss['ort'] / mib:.0f} | {pss['ctxrt'] / pss['ort']:.2f} |")
    print(f"\nload: median of {args.repeat} fresh processes, imports excluded; 4 processes: each loaded the "
          "model and ran once, measured together from /proc/PID/smaps_rollup")


if __name__ == "__main__":
    main()
