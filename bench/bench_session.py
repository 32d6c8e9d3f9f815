"""Per-run overhead of InferenceSession.run and run_with_iobinding against a bare graph execute with
pre-bound memory handles, with and without the tensor cache and pinning; onnxruntime's run and IOBinding
beside them, in one process on the same inputs.

    .venv/bin/python bench/bench_session.py [--models mlp,bert2,resnet50] [--repeat N] [--rounds R] [--json]

`mlp` is a 3-layer MLP (batch 1, width 256, 8 launches) where per-run overhead is a large part of a run;
`bert2` a 2-layer BERT encoder (hidden 128, 4 heads, seq 64, 71 launches); `resnet50` ResNet-50 light with
random weights (batch 1), where overhead is lost in the noise. Every loop of one model runs in each of
`--rounds` rounds (its order rotated from round to round, so no loop always follows another), `--repeat`
runs per round after 3 warm-up runs; a loop's figure is the median over rounds of its per-round medians.
onnxruntime's loops run last in each round, followed by a pause (its worker threads spin after work).
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_latency import machine_line, markdown, zoo  # noqa: E402

BARE = "bare graph.execute, bound handles"
ORT_IOB = "onnxruntime run_with_iobinding"


def mlp_model(folder: Path) -> Path:
    """x[1, 256] -> 3 x (MatMul 256x256 + Add + Relu, the last without Relu) -> y[1, 256]."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes, inits, cur = [], [], "x"
    for k in range(3):
        inits += [numpy_helper.from_array((rng.standard_normal((256, 256)) / 16).astype(np.float32), f"w{k}"),
                  numpy_helper.from_array(rng.standard_normal(256).astype(np.float32), f"b{k}")]
        nodes += [helper.make_node("MatMul", [cur, f"w{k}"], [f"m{k}"]),
                  helper.make_node("Add", [f"m{k}", f"b{k}"], [f"a{k}" if k < 2 else "y"])]
        if k < 2:
            nodes.append(helper.make_node("Relu", [f"a{k}"], [f"r{k}"]))
            cur = f"r{k}"
    g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 256])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 256])], inits)
    path = folder / "mlp.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path


def model(name: str, folder: Path) -> tuple[Path, dict[str, np.ndarray]]:
    if name == "mlp":
        return mlp_model(folder), {"x": np.random.default_rng(1).standard_normal((1, 256)).astype(np.float32)}
    if name == "bert2":
        return zoo.bert_model(layers=2, hidden=128, heads=4, seq=64), zoo.bert_feeds(64)
    if name == "resnet50":
        return zoo.light_model("resnet50"), zoo.light_feeds("resnet50")
    raise SystemExit(f"unknown model {name!r}: expected mlp, bert2 or resnet50")


def median_ms(fn: Callable[[], Any], repeat: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def loops(name: str, repeat: int, rounds: int, folder: Path) -> dict[str, Any]:
    import onnxruntime as ort

    import ctxrt

    ort.set_default_logger_severity(3)
    path, feeds = model(name, folder)
    shapes = {k: v.shape for k, v in feeds.items()}
    ours: dict[str, Callable[[], Any]] = {}
    sessions: dict[str, ctxrt.InferenceSession] = {}

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
    ours[BARE] = lambda: g.execute(ins, outs)
    for label, opts in [("sess.run (tensor cache + pinning)", {}),
                        ("sess.run, no pinning", {"enable_pinning": False}),
                        ("sess.run, no tensor cache", {"enable_tensor_cache": False})]:
        sess = sessions[label] = ctxrt.InferenceSession(path, shapes=shapes, **opts)
        ours[label] = lambda sess=sess: sess.run(None, feeds)
    sess = sessions["run_with_iobinding, bound Tensors"] = ctxrt.InferenceSession(path, shapes=shapes)
    b = sess.io_binding()
    for k, v in feeds.items():
        b.bind_input(k, ctxrt.Tensor.from_numpy(v, sess))
    for o in sess.get_outputs():
        b.bind_output(o.name, ctxrt.Tensor.empty(o.shape, np.dtype(np.float32), sess))
    ours["run_with_iobinding, bound Tensors"] = lambda: sess.run_with_iobinding(b)

    theirs = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    binding = theirs.io_binding()
    for k, v in feeds.items():
        binding.bind_cpu_input(k, v)
    for o in theirs.get_outputs():
        shape = [d if isinstance(d, int) else feeds[next(iter(feeds))].shape[i] for i, d in enumerate(o.shape)]
        binding.bind_ortvalue_output(o.name, ort.OrtValue.ortvalue_from_shape_and_type(shape, np.float32))
    other = {"onnxruntime run": lambda: theirs.run(None, feeds), ORT_IOB: lambda: theirs.run_with_iobinding(binding)}

    per_round: dict[str, list[float]] = {k: [] for k in [*ours, *other]}
    labels = list(ours)
    for r in range(rounds):
        for label in labels[r % len(labels):] + labels[:r % len(labels)]:
            per_round[label].append(median_ms(ours[label], repeat))
        for label, fn in other.items():
            per_round[label].append(median_ms(fn, repeat))
        time.sleep(0.5)  # onnxruntime's spinning threads settle before ctxrt's next round
    counters = {}
    for label, s in sessions.items():
        st = s.stats
        counters[label] = {k: st[k] for k in ("session_runs", "recordings", "tensors_created")}
        s.close()
    ctx.free()
    for buf in bufs:
        buf.release()
    return {"times_ms": {k: statistics.median(v) for k, v in per_round.items()},
            "rounds_ms": per_round, "counters": counters}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="mlp,bert2,resnet50")
    ap.add_argument("--repeat", type=int, default=0,
                    help="runs per loop and round (default: 2000 mlp, 200 bert2, 10 resnet50)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    default = {"mlp": 2000, "bert2": 200, "resnet50": 10}
    with tempfile.TemporaryDirectory() as tmp:
        results = {m: loops(m, args.repeat or default.get(m, 20), args.rounds, Path(tmp))
                   for m in args.models.split(",")}
    if args.json:
        print(json.dumps(results))
        return
    print(f"$ {shlex.join(sys.orig_argv)}\n")
    rows = []
    for m, r in results.items():
        t = r["times_ms"]
        bare = t[BARE]
        for label, ms in t.items():
            base = t[ORT_IOB] if label.startswith("onnxruntime") else bare  # each engine's leanest loop
            rows.append([m, label, f"{ms * 1e3:.1f}", f"{ms / bare:.2f}x", f"{(ms - base) * 1e3:+.1f}"])
    print(markdown(["model", "loop", "us per run", "vs ctxrt bare execute", "us over the engine's leanest loop"],
                   rows, left=2))
    for m, r in results.items():
        for label, c in r["counters"].items():
            print(f"\n{m}, {label}: {c['session_runs']} runs, {c['recordings']} recordings, "
                  f"{c['tensors_created']} tensors created", end="")
    print(f"\n\n{machine_line()}")


if __name__ == "__main__":
    main()
