"""Memory of several models in one process: ctxrt with one shared spill-fill buffer vs onnxruntime sessions.

Two scenarios, each engine in a fresh child process (this script with --child) that imports what it needs,
reads its resident set size (the baseline), loads the models, runs each twice, and reads its peak RSS
(VmHWM):

- **three models**: ResNet-50 (light, random weights), a 6-layer BERT encoder (hidden 384, seq 128) and
  SqueezeNet, run one after another while all stay loaded: ctxrt as one ContextGroup of three context
  binaries sharing a spill-fill buffer (and, for reference, the same group with one buffer per context),
  onnxruntime as three InferenceSessions;
- **BERT split in 3**: `ctxrt compile --split 3` run as a chain sharing its spill-fill buffer, vs
  onnxruntime running the same three parts (cut out of the ONNX model with onnx.utils.extract_model at
  ctxrt's cut points) as three sessions, feeding each part's outputs to the next.

Shared libraries count in the baseline for both engines: onnxruntime's import loads its library, and ctxrt's
child loads oneDNN's (libdnnl, when installed) before reading it. A row with NumPy's kernels alone (contexts
compiled without oneDNN) is there for reference.

"Beyond weights" is peak RSS - baseline - the models' weight bytes: activations, scratch, IO buffers,
pre-packed weight copies and allocator overhead. The goal is ctxrt <= 0.5x onnxruntime there.

    .venv/bin/python bench/bench_memory.py [--json]
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_latency import ROOT, machine_line, markdown, model_and_feeds, peak_rss_bytes, zoo  # noqa: E402

MiB = 2**20
THREE = ["resnet50", "bert", "squeezenet"]
WORK = ROOT / ".cache" / "bench"


def _model(name: str) -> tuple[Path, dict[str, np.ndarray]]:
    if name == "squeezenet":
        return zoo.light_model("squeezenet"), zoo.light_feeds("squeezenet")
    return model_and_feeds(name)


def _shape_args(feeds: dict[str, np.ndarray]) -> list[str]:
    return [a for k, v in feeds.items() for a in ("--shape", f"{k}={'x'.join(map(str, v.shape))}")]


def _stale(ctx: Path, source: Path) -> bool:
    """Missing, older than its model, or made by other kernels than this ctxrt's (it does not load)."""
    if not ctx.exists() or ctx.stat().st_mtime < source.stat().st_mtime:
        return True
    import ctxrt

    try:
        ctxrt.context_from_binary(ctx).free()
    except ctxrt.CtxrtError:
        return True
    return False


def prepare() -> dict[str, Any]:
    """Context binaries, the split BERT and onnxruntime's three BERT parts, made once under .cache/bench."""
    import onnx.utils

    from ctxrt.cli import main as cli

    WORK.mkdir(parents=True, exist_ok=True)
    out: dict[str, Any] = {"ctx": [], "onnx": []}
    out["ctx_numpy"] = []
    for name in THREE:
        path, feeds = _model(name)
        ctx = WORK / f"{path.stem}.ctx"
        if _stale(ctx, path):
            assert cli(["compile", str(path), "-o", str(ctx), *_shape_args(feeds)]) == 0
        out["ctx"].append(str(ctx))
        out["onnx"].append(str(path))
        numpy_ctx = WORK / f"{path.stem}_numpy.ctx"  # NumPy's kernels only (no oneDNN): for comparison
        if _stale(numpy_ctx, path):
            from ctxrt.backends.cpu.backend import CpuBackend
            from ctxrt.compiler import compile_graphs, save_context

            be = CpuBackend(onednn=False)
            graphs, weights = compile_graphs([(str(path), {k: v.shape for k, v in feeds.items()}, path.stem)], be)
            save_context(numpy_ctx, graphs, weights, be, [str(path)])
        out["ctx_numpy"].append(str(numpy_ctx))
    bert, feeds = _model("bert")
    split = WORK / f"{bert.stem}_split3"
    wrapper = split / f"{bert.stem}_ctx.onnx"
    if not wrapper.exists() or any(_stale(p, bert) for p in split.glob("*.ctx")):
        assert cli(["compile", str(bert), "--split", "3", "-o", str(split), *_shape_args(feeds)]) == 0
    out["split"] = str(wrapper)
    import ctxrt

    # onnxruntime's parts: the exported model reads input shapes at run time (Shape nodes), so fix the
    # input shapes and let onnxruntime fold them (basic optimizations) before cutting the parts out.
    static = split / "ort_static.onnx"
    if not static.exists() or static.stat().st_mtime < wrapper.stat().st_mtime:
        import onnxruntime as ort

        model = onnx.load(str(bert))
        for inp in model.graph.input:
            for d, n in zip(inp.type.tensor_type.shape.dim, feeds[inp.name].shape, strict=True):
                d.ClearField("dim_param")
                d.dim_value = n
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        so.optimized_model_filepath = str(static)
        ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    parts = []
    for k, ctx in enumerate(sorted(split.glob("*.ctx"))):
        g = ctxrt.read_metadata(ctx)["graphs"][0]
        part = split / f"ort_part{k}.onnx"
        if not part.exists() or part.stat().st_mtime < ctx.stat().st_mtime:
            onnx.utils.extract_model(str(static), str(part), [t["name"] for t in g["inputs"]],
                                     [t["name"] for t in g["outputs"]])
        parts.append(str(part))
    out["ort_parts"] = parts
    out["ort_weights"] = {p: sum(int(np.prod(t.dims)) * onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
                                 for t in onnx.load(p, load_external_data=False).graph.initializer)
                          for p in out["onnx"] + parts}
    return out


def _rss_now() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def child(mode: str, files: dict[str, Any]) -> dict[str, Any]:
    feeds = {name: _model(name)[1] for name in THREE}
    if mode.startswith("ctxrt"):
        import ctxrt  # noqa: F401
        import ctxrt.frontend.epcontext  # noqa: F401
        from ctxrt.backends.cpu.onednn import api
        from ctxrt.runtime.group import ContextGroup

        api.library()  # a shared library, loaded before the baseline as onnxruntime's is by its import
        base = _rss_now()
        if mode == "ctxrt-split":
            group = ContextGroup.from_epcontext(files["split"])
            for _ in range(2):
                group.run(feeds["bert"])
        else:
            group = ContextGroup(files["ctx_numpy" if mode.endswith("numpy") else "ctx"],
                                 share_spillfill=mode.startswith("ctxrt-shared"))
            for _ in range(2):
                for ctx, name in zip(group.contexts, THREE, strict=True):
                    ctx.graph().run(feeds[name])
        mem = group.memory()
        return {"base": base, "peak": peak_rss_bytes(), "weights": mem["weights"], "memory": mem}
    import onnxruntime as ort

    ort.set_default_logger_severity(3)
    paths = files["ort_parts"] if mode == "ort-split" else files["onnx"]
    weights = sum(files["ort_weights"][p] for p in paths)  # counted by the parent: no model read here
    base = _rss_now()
    sessions = [ort.InferenceSession(p, providers=["CPUExecutionProvider"]) for p in paths]
    for _ in range(2):
        if mode == "ort-split":
            values = dict(feeds["bert"])
            for s in sessions:
                names = [o.name for o in s.get_outputs()]
                values.update(zip(names, s.run(None, {i.name: values[i.name] for i in s.get_inputs()}), strict=True))
        else:
            for s, name in zip(sessions, THREE, strict=True):
                s.run(None, feeds[name])
    return {"base": base, "peak": peak_rss_bytes(), "weights": weights}


def measure(mode: str, files: dict[str, Any]) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", mode, "--files", json.dumps(files)]
    p = subprocess.run(cmd, capture_output=True, text=True, check=True)
    r = json.loads(p.stdout.strip().splitlines()[-1])
    r["beyond"] = r["peak"] - r["base"] - r["weights"]
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--files", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, json.loads(args.files))))
        return
    files = prepare()
    scenarios = {
        "ResNet-50 + BERT-6 + SqueezeNet": ["ctxrt-shared", "ctxrt-unshared", "ctxrt-shared-numpy", "ort-3"],
        "BERT-6 split in 3": ["ctxrt-split", "ort-split"],
    }
    results = {s: {m: measure(m, files) for m in modes} for s, modes in scenarios.items()}
    if args.json:
        print(json.dumps(results))
        return
    print(f"$ {shlex.join(sys.orig_argv)}\n")
    labels = {"ctxrt-shared": "ctxrt, shared spill-fill", "ctxrt-unshared": "ctxrt, one spill-fill each",
              "ctxrt-shared-numpy": "ctxrt without oneDNN, shared spill-fill",
              "ort-3": "onnxruntime, 3 sessions", "ctxrt-split": "ctxrt chain, shared spill-fill",
              "ort-split": "onnxruntime, 3 part sessions"}
    rows = []
    for s, runs in results.items():
        ort_beyond = next(r["beyond"] for m, r in runs.items() if m.startswith("ort"))
        for m, r in runs.items():
            rows.append([s, labels[m], f"{r['peak'] / MiB:.0f} MiB", f"{r['base'] / MiB:.0f} MiB",
                         f"{r['weights'] / MiB:.1f} MiB", f"{r['beyond'] / MiB:.1f} MiB",
                         "" if m.startswith("ort") else f"{r['beyond'] / ort_beyond:.2f}x"])
    print(markdown(["scenario", "engine", "peak RSS", "baseline", "weights", "beyond weights", "vs onnxruntime"],
                   rows, left=2))
    for s, runs in results.items():
        for m, r in runs.items():
            if "memory" in r:
                mem = r["memory"]
                print(f"\n{s}, {labels[m]}: spill-fill {mem['spillfill'] / MiB:.1f} MiB "
                      f"(one per context: {mem['spillfill_unshared'] / MiB:.1f} MiB, saved "
                      f"{mem['spillfill_saved'] / MiB:.1f} MiB), IO {mem['io'] / MiB:.1f} MiB", end="")
    print(f"\n\n{machine_line()}")


if __name__ == "__main__":
    main()
