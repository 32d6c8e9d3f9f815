"""CPU latency of ctxrt against onnxruntime, side by side in one process: every light model and a MiniLM-L6-shaped
BERT, ctxrt with oneDNN's kernels and with NumPy's alone, on a quiet machine and with one other process spinning
on a core (or several: --spin 1,2); then (with --memory) the three-model memory scenario of bench_memory.py.

    .venv/bin/python bench/bench_cpu.py [--models resnet50,shufflenet,...] [--repeat 10] [--rounds 3]
                                        [--threads N] [--ort-threads N] [--spin 1,2 | --no-spin] [--memory] [--json]

Per model the three engines (onnxruntime, ctxrt + oneDNN, ctxrt NumPy) run in `--rounds` rounds, the order
rotated each round; in a round each engine gets one untimed run and `--repeat` timed runs after a 0.3 s pause
(worker threads that spin after work would otherwise slow the engine that follows). An engine's figure is the
median over rounds of its per-round medians; the table reports each ctxrt variant's ratio to onnxruntime from
the same rounds. ctxrt runs with its default threads (the cores other processes leave idle) unless --threads
is given; onnxruntime with its defaults unless --ort-threads is. "spin" rows repeat the rounds while
`python -c 'while True: pass'` runs: the ratio's growth there is what contention costs ctxrt relative to
onnxruntime.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_latency import environment, markdown, model_and_feeds, zoo  # noqa: E402

MODELS = [*zoo.LIGHT, "bert", "qwen2", "llama"]
ENGINES = ("ort", "ctxrt+onednn", "ctxrt numpy")


def cpu_name() -> tuple[str, str]:
    """(model name, widest vector ISA) of this machine, from /proc/cpuinfo where there is one."""
    name, flags = platform.processor() or platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                name = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
    except OSError:
        pass
    isa = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2"
    return name, isa


def _feeds_for(name: str) -> tuple[Path, dict[str, np.ndarray]]:
    if name in ("qwen2", "llama"):  # small decoders: hundreds of tiny ops (hidden 128, 4 layers, 8 tokens)
        return zoo.decoder_model(name), zoo.decoder_feeds()
    return model_and_feeds(name) if name in ("resnet50", "bert") else (zoo.light_model(name), zoo.light_feeds(name))


def open_engines(name: str, threads: int | None, ort_threads: int
                 ) -> tuple[dict[str, Callable[[], Any]], dict[str, Any], list[Any]]:
    import onnxruntime as ort

    import ctxrt
    from ctxrt.backends.cpu.backend import CpuBackend

    path, feeds = _feeds_for(name)
    ort.set_default_logger_severity(3)
    so = ort.SessionOptions()
    so.intra_op_num_threads = ort_threads
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    runs: dict[str, Callable[[], Any]] = {"ort": lambda: sess.run(None, feeds)}
    info: dict[str, Any] = {}
    contexts = []
    for engine, onednn in (("ctxrt+onednn", True), ("ctxrt numpy", False)):
        ctx = ctxrt.compile(path, shapes={k: v.shape for k, v in feeds.items()}, backend=CpuBackend(onednn=onednn),
                            num_threads=threads)
        g = ctx.graph()
        outs = {o.name: np.empty(o.shape, np.dtype(o.dtype)) for o in g.outputs}
        runs[engine] = (lambda g=g, outs=outs: g.execute(feeds, outs))
        steps = g.compiled.steps
        onednn_steps = [s for s in steps if s.algorithm.startswith("onednn")]
        info[engine] = {"ctx": ctx, "outs": outs, "onednn_steps": len(onednn_steps),
                        "reorders": sum(s.op == "Reorder" for s in steps),
                        "isa": sorted({s.algorithm.rsplit(":", 1)[-1] for s in onednn_steps})}
        contexts.append(ctx)
    want = runs["ort"]()
    for engine in ENGINES[1:]:
        runs[engine]()
        got = [info[engine]["outs"][o.name] for o in sess.get_outputs()]
        info[engine]["max_abs_diff"] = max(float(np.max(np.abs(a - b))) for a, b in zip(got, want, strict=True))
    return runs, info, contexts


def rounds(runs: dict[str, Callable[[], Any]], info: dict[str, Any], repeat: int, n_rounds: int) -> dict[str, Any]:
    medians: dict[str, list[float]] = {e: [] for e in runs}
    threads_used: dict[str, list[int]] = {e: [] for e in runs if e != "ort"}
    order = list(runs)
    for r in range(n_rounds):
        for engine in order[r % len(order):] + order[:r % len(order)]:
            time.sleep(0.3)
            runs[engine]()
            times = []
            for _ in range(repeat):
                start = time.perf_counter_ns()
                runs[engine]()
                times.append((time.perf_counter_ns() - start) / 1e6)
            medians[engine].append(statistics.median(times))
            if engine in threads_used:
                threads_used[engine].append(info[engine]["ctx"].threads.last)
    out = {e: statistics.median(v) for e, v in medians.items()}
    out["ratios"] = {e: [a / b for a, b in zip(medians[e], medians["ort"], strict=True)] for e in threads_used}
    out["threads"] = threads_used
    return out


class Spinner:
    """`n` other processes, each keeping a core busy while the block runs."""

    def __init__(self, n: int = 1) -> None:
        self.n = n

    def __enter__(self) -> Spinner:
        self.procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(self.n)]
        time.sleep(1.0)  # let the default thread count see them
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in self.procs:
            proc.kill()
            proc.wait()
        time.sleep(1.0)


def measure(names: list[str], repeat: int, n_rounds: int, threads: int | None, ort_threads: int, spin: list[int]
            ) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for name in names:
        runs, info, contexts = open_engines(name, threads, ort_threads)
        try:
            for engine in runs:  # warm-up: first-touch pages, recordings, thread pools started
                for _ in range(2):
                    runs[engine]()
            entry = {"quiet": rounds(runs, info, repeat, n_rounds)}
            for n in spin:
                with Spinner(n):
                    entry["spin" if n == 1 else f"spin{n}"] = rounds(runs, info, repeat, n_rounds)
            entry["info"] = {e: {k: v for k, v in i.items() if k not in ("ctx", "outs")} for e, i in info.items()}
            results[name] = entry
            print(f"{name}: " + ", ".join(f"{c} ort {r['ort']:.2f} ms, oneDNN {r['ctxrt+onednn']:.2f}, NumPy "
                                          f"{r['ctxrt numpy']:.2f}" for c, r in entry.items() if c != "info"),
                  file=sys.stderr)
        finally:
            for ctx in contexts:
                ctx.free()
    return results


def table(results: dict[str, Any]) -> str:
    rows = []
    for name, entry in results.items():
        for cond in ("quiet", "spin", "spin2", "spin3"):
            if cond not in entry:
                continue
            r = entry[cond]
            cells = [name, cond, f"{r['ort']:.2f}"]
            for engine in ENGINES[1:]:
                ratio = statistics.median(r["ratios"][engine])
                cells += [f"{r[engine]:.2f}", f"{ratio:.2f}"]
            cells.append("/".join(str(statistics.median(r["threads"][e])) for e in ENGINES[1:]))
            rows.append(cells)
    return markdown(["model", "machine", "ort ms", "ctxrt+oneDNN ms", "ratio", "ctxrt NumPy ms", "ratio",
                     "ctxrt threads"], rows, left=2)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {','.join(MODELS)}")
    p.add_argument("--repeat", type=int, default=10, help="timed runs per engine per round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=0, help="ctxrt's num_threads (0: its default)")
    p.add_argument("--ort-threads", type=int, default=0,
                   help="onnxruntime's intra_op_num_threads (0: its default); 1 and --threads 1 compare the engines' "
                        "work per core, which a busy machine disturbs less")
    p.add_argument("--no-spin", action="store_true", help="skip the rounds with spinning processes")
    p.add_argument("--spin", default="1", help="comma-separated counts of spinning processes, one set of rounds "
                                               "each (default 1; e.g. 1,2)")
    p.add_argument("--memory", action="store_true", help="also the three-model memory scenario (bench_memory.py)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    names = [n for n in args.models.split(",") if n]
    unknown = sorted(set(names) - set(MODELS))
    if unknown or args.repeat < 1 or args.rounds < 1:
        p.error(f"unknown models {unknown}" if unknown else "--repeat and --rounds must be >= 1")
    for name in names:
        _feeds_for(name)  # build and cache the models first
    spin = [] if args.no_spin else [int(n) for n in args.spin.split(",")]
    results = measure(names, args.repeat, args.rounds, args.threads or None, args.ort_threads, spin)
    memory = None
    if args.memory:
        import bench_memory

        files = bench_memory.prepare()
        memory = {m: bench_memory.measure(m, files) for m in ("ctxrt-shared", "ctxrt-unshared", "ort-3")}
    cpu, isa = cpu_name()
    env = {**environment(), "cpu": cpu, "isa": isa, "cores": len(os.sched_getaffinity(0))}
    command = shlex.join(sys.orig_argv)
    if args.json:
        print(json.dumps({"command": command, "environment": env, "models": results, "memory": memory}, indent=2))
        return
    print(f"$ {command}\n")
    print(table(results))
    isas = sorted({i for r in results.values() for i in r["info"]["ctxrt+onednn"]["isa"]})
    print(f"\n{cpu} ({isa}), {env['cores']} cores; onnxruntime {env['onnxruntime']} (MLAS picks its own ISA), "
          f"oneDNN kernels seen: {', '.join(isas) or 'none'}; numpy {env['numpy']}; ratio = ctxrt / onnxruntime, "
          f"median of {args.rounds} rounds of {args.repeat} runs")
    if memory is not None:
        ort_beyond = memory["ort-3"]["beyond"]
        print("\nResNet-50 + BERT-6 + SqueezeNet in one process, memory beyond weights: " + ", ".join(
            f"{m} {r['beyond'] / 2**20:.1f} MiB ({r['beyond'] / ort_beyond:.2f}x)" for m, r in memory.items()))


if __name__ == "__main__":
    main()
