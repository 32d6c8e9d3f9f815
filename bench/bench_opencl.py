"""ctxrt on OpenCL against ctxrt on NumPy and onnxruntime, and loading a stored OpenCL context binary against
compiling from source.

Kernels (`--parts kernels`): the CNN kernel classes of bench/cnn_classes.py (convs, depthwise convs, pools,
BatchNormalization, LRN of ResNet-50, SqueezeNet, ShuffleNet, DenseNet-121, Inception-v1), each a small model
compiled for OpenCL and for NumPy and opened in onnxruntime, timed as the models are (rotated rounds, median), with
the step count that ran on the device (a class that fell back to the CPU would show it).

Latency: the three engines in this process on the same inputs, timed in rotated rounds (in each round every
engine, after a 1 s pause and one untimed run, makes `--block` timed runs; the order rotates between rounds),
the median of all timed runs per engine. Load: each in a fresh child process (this script with --child), the time to a
first result (a) loading the `.ctx` that `ctxrt compile --backend opencl` stored (program binaries inside),
(b) compiling the ONNX model for OpenCL with PoCL's kernel cache and PyOpenCL's binary cache turned off (what
a first compile on a device costs), with the program counters and the child's peak RSS. Prints Markdown.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
from bench_latency import machine_line, markdown, open_ort, peak_rss_bytes  # noqa: E402
from bench_latency import model_and_feeds as _zoo_model  # noqa: E402

MODELS = ("squeezenet", "resnet50", "shufflenet", "densenet121", "bert")
COLD = {"POCL_KERNEL_CACHE": "0", "PYOPENCL_NO_CACHE": "1", "CUDA_CACHE_DISABLE": "1"}  # PoCL, PyOpenCL, NVIDIA


def model_and_feeds(name: str) -> tuple[Path, dict[str, np.ndarray]]:
    import zoo

    if name in ("squeezenet", "shufflenet", "densenet121"):
        return zoo.light_model(name), zoo.light_feeds(name)
    return _zoo_model(name)


def open_ctxrt(path: Path, feeds: dict[str, np.ndarray], backend: str) -> tuple[Any, Any]:
    import ctxrt

    ctx = ctxrt.compile(path, shapes={k: v.shape for k, v in feeds.items()}, backend=backend)
    g = ctx.graph()
    return (lambda: g.run(feeds)), ctx


def latency(name: str, rounds: int, block: int) -> dict[str, Any]:
    path, feeds = model_and_feeds(name)
    ort_run, names = open_ort(path, feeds)
    cpu_run, cpu_ctx = open_ctxrt(path, feeds, "cpu")
    cl_run, cl_ctx = open_ctxrt(path, feeds, "opencl")
    engines = {"opencl": cl_run, "numpy": cpu_run, "ort": ort_run}
    try:
        want = dict(zip(names, ort_run(), strict=True))
        got = cl_run()
        err = max(float(np.max(np.abs(got[k] - w)) / (np.max(np.abs(w)) or 1)) for k, w in want.items())
        medians = rotated(engines, rounds, block, 1.0)
        parts = cl_ctx.graph().partitions
        on_device = sum(p["steps"] for p in parts if p["backend"] == "opencl")
        return {**{f"{e}_ms": t for e, t in medians.items()}, "max_rel_err": err,
                "steps": sum(p["steps"] for p in parts), "steps_on_device": on_device,
                "cpu_partitions": sum(p["backend"] == "cpu" for p in parts)}
    finally:
        cpu_ctx.free()
        cl_ctx.free()


def rotated(engines: dict[str, Any], rounds: int, block: int, pause: float) -> dict[str, float]:
    """Median ms per engine: in each round every engine, after a pause and one untimed run, makes `block` timed
    runs; the order rotates between rounds."""
    times: dict[str, list[float]] = {e: [] for e in engines}
    order = list(engines)
    for r in range(rounds):
        for engine in order[r % len(order):] + order[:r % len(order)]:
            run = engines[engine]
            time.sleep(pause)  # onnxruntime's and OpenBLAS's worker threads spin after work: let them go idle
            run()
            for _ in range(block):
                t0 = time.perf_counter()
                run()
                times[engine].append((time.perf_counter() - t0) * 1e3)
    return {e: statistics.median(t) for e, t in times.items()}


def bound(model: Any, feeds: dict[str, np.ndarray], backend: str) -> tuple[Any, Any, Any]:
    """(run, read the output, context): `model` compiled for memory handles, its inputs written once and its
    outputs bound, so a run is the kernels alone (no copy in or out), as onnxruntime reads NumPy arrays in place."""
    import ctxrt

    ctx = ctxrt.compile(model, backend=backend, io_mem_type="memhandle")
    g, be = ctx.graph(), ctx.backend
    handles: dict[str, dict[str, Any]] = {"in": {}, "out": {}}
    for t in g.inputs + g.outputs:
        buf = be.alloc_shared(max(t.nbytes, 1), 64)
        handles["in" if t.name in feeds else "out"][t.name] = ctx.mem_register(buf, 0, t.shape, t.dtype)
        if t.name in feeds:
            be.copy_in(be.view(buf, 0, t.shape, t.dtype), feeds[t.name])
    (name, out), = handles["out"].items()

    def read() -> np.ndarray:
        host = np.empty(out.shape, out.dtype)
        be.copy_out(host, out.view)
        return host
    return (lambda: g.execute(handles["in"], handles["out"])), read, ctx


def kernel_classes(rounds: int, block: int) -> list[list[str]]:
    import onnxruntime as ort
    from cnn_classes import CLASSES, class_model

    rows = []
    for index, (label, *_) in enumerate(CLASSES):
        model, feeds = class_model(index)
        sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        (cl_run, cl_read, cl_ctx), (cpu_run, _, cpu_ctx) = bound(model, feeds, "opencl"), bound(model, feeds, "cpu")
        try:
            want = sess.run(None, feeds)[0]
            cl_run()
            err = float(np.max(np.abs(cl_read() - want)) / (np.max(np.abs(want)) or 1))
            t = rotated({"opencl": cl_run, "numpy": cpu_run, "ort": functools.partial(sess.run, None, feeds)},
                        rounds, block, 0.2)
            parts = cl_ctx.graph().partitions
            on_device = sum(p["steps"] for p in parts if p["backend"] == "opencl")
            rows.append([label, f"{t['opencl']:.3f}", f"{t['numpy']:.3f}", f"{t['ort']:.3f}",
                         f"{t['opencl'] / t['ort']:.2f}", f"{t['opencl'] / t['numpy']:.2f}",
                         f"{on_device}/{sum(p['steps'] for p in parts)}", f"{err:.1e}"])
        finally:
            cl_ctx.free()
            cpu_ctx.free()
        print(f"  {label}: {rows[-1][1:4]} ms", file=sys.stderr, flush=True)
    return rows


def child(mode: str, name: str, ctx_path: str) -> None:
    """One cold start: load the stored .ctx, or compile from source; time to the first result."""
    import ctxrt

    path, feeds = model_and_feeds(name)
    t0 = time.perf_counter()
    if mode == "load":
        ctx = ctxrt.context_from_binary(ctx_path, "opencl")
    else:
        ctx = ctxrt.compile(path, shapes={k: v.shape for k, v in feeds.items()}, backend="opencl")
    ready = time.perf_counter() - t0
    ctx.graph().run(feeds)
    first = time.perf_counter() - t0
    print(json.dumps({"ready_s": ready, "first_result_s": first, "peak_rss_bytes": peak_rss_bytes(),
                      "built": ctx.stats["programs_built_from_source"],
                      "loaded": ctx.stats["programs_loaded_from_binary"]}))


def load(name: str, repeat: int, tmp: Path) -> dict[str, Any]:
    from ctxrt.cli import main as cli

    path, feeds = model_and_feeds(name)
    out = tmp / f"{name}_opencl.ctx"
    shapes = [a for k, v in feeds.items() for a in ("--shape", f"{k}={'x'.join(map(str, v.shape))}")]
    assert cli(["compile", str(path), "-o", str(out), "--backend", "opencl", *shapes]) == 0
    result: dict[str, Any] = {"ctx_bytes": out.stat().st_size}
    for mode in ("load", "compile"):
        runs = []
        for _ in range(repeat):
            cmd = [sys.executable, __file__, "--child", mode, "--models", name, "--ctx", str(out)]
            proc = subprocess.run(cmd, check=True, capture_output=True, text=True, env={**os.environ, **COLD})
            runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        result[mode] = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    return result


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--parts", default="kernels,latency,load", help="comma-separated, of kernels, latency, load")
    p.add_argument("--models", default="squeezenet,resnet50,shufflenet,densenet121,bert",
                   help=f"comma-separated, of {', '.join(MODELS)}")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--block", type=int, default=3, help="timed runs per engine per round")
    p.add_argument("--load-repeat", type=int, default=3, help="fresh processes per load measurement (median)")
    p.add_argument("--child", choices=["load", "compile"], help=argparse.SUPPRESS)
    p.add_argument("--ctx", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    names = [n for n in args.models.split(",") if n]
    if args.child:
        child(args.child, names[0], args.ctx)
        return
    import tempfile

    from ctxrt.backends import get_backend

    parts = set(args.parts.split(","))
    rows_kernels = kernel_classes(args.rounds, args.block) if "kernels" in parts else []
    rows_lat, rows_load = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            model_and_feeds(name)
            if "latency" in parts:
                r = latency(name, args.rounds, args.block)
                rows_lat.append([name, f"{r['opencl_ms']:.1f}", f"{r['numpy_ms']:.1f}", f"{r['ort_ms']:.1f}",
                                 f"{r['opencl_ms'] / r['ort_ms']:.2f}", f"{r['numpy_ms'] / r['ort_ms']:.2f}",
                                 f"{r['steps_on_device']}/{r['steps']} ({r['cpu_partitions']} CPU partitions)",
                                 f"{r['max_rel_err']:.1e}"])
            if "load" in parts:
                ld = load(name, args.load_repeat, Path(tmp))
                a, b = ld["load"], ld["compile"]
                rows_load.append([name, f"{a['first_result_s']:.2f} ({a['loaded']:.0f} loaded, "
                                  f"{a['built']:.0f} built)", f"{b['first_result_s']:.2f} ({b['built']:.0f} built)",
                                  f"{b['first_result_s'] / a['first_result_s']:.1f}x",
                                  f"{a['peak_rss_bytes'] / 2**20:.0f} / {b['peak_rss_bytes'] / 2**20:.0f}",
                                  f"{ld['ctx_bytes'] / 2**20:.1f}"])
    info = get_backend("opencl").info
    print(f"$ {shlex.join(sys.orig_argv)}\n")
    if rows_kernels:
        print(markdown(["kernel class", "OpenCL ms", "NumPy ms", "ort ms", "OpenCL/ort", "OpenCL/NumPy",
                        "steps on OpenCL", "max rel err"], rows_kernels))
        print()
    if rows_lat:
        print(markdown(["model", "OpenCL ms", "NumPy ms", "ort ms", "OpenCL/ort", "NumPy/ort", "steps on OpenCL",
                        "max rel err"], rows_lat))
        print()
    if rows_load:
        print(markdown(["model", "load .ctx + first run, s", "compile (cold) + first run, s", "speed-up",
                        "peak RSS MiB load / compile", ".ctx MiB"], rows_load))
    print(f"\nOpenCL device: {info.name} ({info.vendor}, driver {info.driver}); {machine_line()}; latency: median "
          f"of {args.rounds} rotated rounds x {args.block} runs; load: median of {args.load_repeat} fresh processes")

if __name__ == "__main__":
    main()
