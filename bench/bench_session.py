"""Per-run overhead of InferenceSession.run and run_with_iobinding against a bare graph execute with
pre-bound memory handles, with and without the tensor cache and pinning; onnxruntime's run and IOBinding
beside them, in one process on the same inputs.

    .venv/bin/python bench/bench_session.py [--models small,resnet50] [--repeat N] [--json]

`small` is a 2-layer BERT encoder (hidden 128, 4 heads, seq 64), where per-run overhead shows; `resnet50`
is ResNet-50 light with random weights (batch 1), where it does not.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_latency import machine_line, markdown, zoo  # noqa: E402


def model(name: str) -> tuple[Path, dict[str, np.ndarray]]:
    if name == "small":
        return zoo.bert_model(layers=2, hidden=128, heads=4, seq=64), zoo.bert_feeds(64)
    if name == "resnet50":
        return zoo.light_model("resnet50"), zoo.light_feeds("resnet50")
    raise SystemExit(f"unknown model {name!r}: expected small or resnet50")


def median_ms(fn: Callable[[], Any], repeat: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def loops(name: str, repeat: int) -> dict[str, Any]:
    import onnxruntime as ort

    import ctxrt

    ort.set_default_logger_severity(3)
    path, feeds = model(name)
    shapes = {k: v.shape for k, v in feeds.items()}
    out: dict[str, float] = {}

    # Bare: a context prepared for memhandles, every IO tensor bound once, graph.execute in a loop.
    ctx = ctxrt.compile(path, shapes=shapes, io_mem_type="memhandle")
    g, be = ctx.graph(), ctx.backend
    bufs, ins, outs = [], {}, {}
    for t in g.inputs + g.outputs:
        buf = be.alloc_shared(max(t.nbytes, 1), 64)
        bufs.append(buf)
        h = ctx.mem_register(buf, 0, t.shape, t.dtype)
        (ins if t in g.inputs else outs)[t.name] = h
        if t.name in feeds:
            h.view[...] = feeds[t.name]
    out["bare graph.execute, bound handles"] = median_ms(lambda: g.execute(ins, outs), repeat)
    counters: dict[str, dict[str, int]] = {}
    for label, opts in [("sess.run (tensor cache + pinning)", {}),
                        ("sess.run, no pinning", {"enable_pinning": False}),
                        ("sess.run, no tensor cache", {"enable_tensor_cache": False})]:
        with ctxrt.InferenceSession(path, shapes=shapes, **opts) as sess:
            out[label] = median_ms(lambda sess=sess: sess.run(None, feeds), repeat)
            s = sess.stats
            counters[label] = {k: s[k] for k in ("session_runs", "recordings", "tensors_created")}
    with ctxrt.InferenceSession(path, shapes=shapes) as sess:
        b = sess.io_binding()
        for k, v in feeds.items():
            b.bind_input(k, ctxrt.Tensor.from_numpy(v, sess))
        for o in sess.get_outputs():
            b.bind_output(o.name, ctxrt.Tensor.empty(o.shape, np.dtype(np.float32), sess))
        out["run_with_iobinding, bound Tensors"] = median_ms(lambda: sess.run_with_iobinding(b), repeat)
    theirs = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    out["onnxruntime run"] = median_ms(lambda: theirs.run(None, feeds), repeat)
    binding = theirs.io_binding()
    for k, v in feeds.items():
        binding.bind_cpu_input(k, v)
    for o in theirs.get_outputs():
        shape = [d if isinstance(d, int) else feeds[next(iter(feeds))].shape[i] for i, d in enumerate(o.shape)]
        binding.bind_ortvalue_output(o.name, ort.OrtValue.ortvalue_from_shape_and_type(shape, np.float32))
    out["onnxruntime run_with_iobinding"] = median_ms(lambda: theirs.run_with_iobinding(binding), repeat)
    ctx.free()
    for buf in bufs:
        buf.release()
    return {"times_ms": out, "counters": counters}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="small,resnet50")
    ap.add_argument("--repeat", type=int, default=0, help="runs per loop (default: 300 small, 20 resnet50)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    results = {m: loops(m, args.repeat or (300 if m == "small" else 20)) for m in args.models.split(",")}
    if args.json:
        print(json.dumps(results))
        return
    print(f"$ {shlex.join(sys.orig_argv)}\n")
    rows = []
    for m, r in results.items():
        t = r["times_ms"]
        bare = t["bare graph.execute, bound handles"]
        rows += [[m, label, f"{ms:.3f}", f"{ms / bare:.2f}x", f"{ms - bare:+.3f}"] for label, ms in t.items()]
    print(markdown(["model", "loop", "ms per run", "vs bare execute", "overhead ms"], rows, left=2))
    for m, r in results.items():
        for label, c in r["counters"].items():
            print(f"\n{m}, {label}: {c['session_runs']} runs, {c['recordings']} recordings, "
                  f"{c['tensors_created']} tensors created", end="")
    print(f"\n\n{machine_line()}")


if __name__ == "__main__":
    main()
