"""Shapes that change every call, ctxrt against onnxruntime in one run (issue 19):

- **generation**: a GPT-2-style decoder (4 layers, hidden 256, random weights, dynamo export) generating 64 tokens
  greedily from a 4-token prompt and an empty past, through `InferenceSession.run`: ms per token of the first
  generation (compiles included) and of a second one (steady), for ctxrt with `dim_ranges` (one range program),
  ctxrt loading a context binary compiled ahead with the same ranges (`ctxrt compile --dim ...`, the deployment
  path), the ONNX model with those ranges through a warm `cache_dir` (compiled by an earlier session: a new
  process's path), ctxrt with its default ranges (widened as the past grows) and onnxruntime; "new shape": the
  median run of
  the first generation's tokens after the prompt (each at a past length met for the first time, the model
  already compiled), "steady": the second generation (the same past lengths again); then peak RSS beyond the
  weights of each, each in a fresh process (sampled every millisecond; both runtimes' libraries, oneDNN's and
  ctxrt's compiler and kernel modules included, loaded before the baseline);
- **batch cycle**: MobileNetV3 (dynamo export) at batch 1, 2, ..., 12, cycled 3 times: median ms per call (the
  first cycle, where each runtime meets each size for the first time, included); and apart, the median of the
  second and third cycles' calls and the mean of the first cycle's (its first call, the compile, left out);
- **audio lengths**: a 1-D audio net (strided convs and pools) fed 24 clips of new lengths: the whole loop from the
  session's creation, compiles included, and the median call after the first.

    .venv/bin/python bench/bench_shapes.py [--rounds R] [--json]

Rounds interleave the runtimes (ctxrt, then onnxruntime, alternating which goes first); figures are medians over
rounds. The machine is shared: say what else ran.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "models"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_latency import machine_line  # noqa: E402

LAYERS, DIM, HEADS, TOKENS = 4, 256, 4, 64
RANGES = {"past_sequence": (0, 128), "sequence": (1, 16), "batch": (1, 1)}


def _decoder() -> Path:
    import decoders

    return decoders.gpt2_decoder("dynamo", layers=LAYERS, dim=DIM, heads=HEADS)


def _context_binary(path: Path) -> Path:
    """The decoder compiled ahead as one range program (what `ctxrt compile --dim` writes)."""
    from ctxrt.cli import main as cli

    out = path.with_suffix(".ranges.ctx")
    if not out.exists():
        dims = [a for name, (lo, hi) in RANGES.items() for a in ("--dim", f"{name}={lo}:{hi}")]
        if cli(["compile", str(path), "-o", str(out), *dims]) != 0:
            raise SystemExit("ctxrt compile failed")
    return out


def _session(kind: str, path: Path) -> Any:
    if kind == "onnxruntime":
        import onnxruntime as ort

        return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    import ctxrt

    if kind == "ctxrt .ctx":
        return ctxrt.InferenceSession(_context_binary(path))
    if kind == "ctxrt cache":  # the ONNX model through a warm cache_dir (`_warm_cache` filled it)
        return ctxrt.InferenceSession(path, dim_ranges=RANGES, cache_dir=_CACHE_DIR)
    return ctxrt.InferenceSession(path, dim_ranges=RANGES if kind == "ctxrt ranges" else None)


_CACHE_DIR = ROOT / ".cache" / "bench_shapes_cache"


def _warm_cache(path: Path) -> None:
    """The cache_dir of the "ctxrt cache" runs, filled by one generation (a first run of the session compiled)."""
    import ctxrt

    with ctxrt.InferenceSession(path, dim_ranges=RANGES, cache_dir=_CACHE_DIR) as sess:
        _generate(sess)


def _generate(sess: Any, per_token: list[float] | None = None) -> tuple[float, list[list[int]]]:
    """(ms per token of a 64-token generation, its tokens); `per_token` gets each step's ms."""
    import decoders

    feeds = decoders.empty_past(LAYERS, seq=4, dim=DIM, heads=HEADS)

    def run(f: Any) -> Any:
        t0 = time.perf_counter()
        out = sess.run(None, f)
        if per_token is not None:
            per_token.append((time.perf_counter() - t0) * 1e3)
        return out
    t = time.perf_counter()
    tokens = decoders.generate(run, feeds, TOKENS, LAYERS)
    return (time.perf_counter() - t) / TOKENS * 1e3, tokens


def generation(rounds: int) -> dict[str, dict[str, float]]:
    path = _decoder()
    _context_binary(path)
    _warm_cache(path)
    kinds = ["ctxrt ranges", "ctxrt .ctx", "ctxrt cache", "ctxrt default", "onnxruntime"]
    first: dict[str, list[float]] = {k: [] for k in kinds}
    fresh: dict[str, list[float]] = {k: [] for k in kinds}
    steady: dict[str, list[float]] = {k: [] for k in kinds}
    tokens: dict[str, list[list[int]]] = {}
    for r in range(rounds):
        for kind in kinds if r % 2 == 0 else kinds[::-1]:
            t = time.perf_counter()
            sess = _session(kind, path)
            opened = time.perf_counter() - t
            steps: list[float] = []
            ms, tokens[kind] = _generate(sess, steps)
            first[kind].append(ms + opened * 1e3 / TOKENS)  # session creation counted in the first generation
            fresh[kind].append(statistics.median(steps[2:]))  # a token at a past length not met before
            steady[kind].append(_generate(sess)[0])
            del sess
    if any(t != tokens["onnxruntime"] for t in tokens.values()):
        raise SystemExit(f"tokens differ: {tokens}")
    return {k: {"first_ms_per_token": statistics.median(first[k]), "new_shape_ms": statistics.median(fresh[k]),
                "steady_ms_per_token": statistics.median(steady[k])} for k in kinds}


def _rss_child(kind: str, out: Any) -> None:
    import onnx

    path = _decoder()
    weights = sum(onnx.numpy_helper.to_array(t).nbytes for t in onnx.load(str(path)).graph.initializer)
    import threading

    import onnxruntime  # noqa: F401

    import ctxrt  # noqa: F401  both runtimes imported before the baseline: the libraries are not the model's
    from ctxrt.backends.cpu.onednn import api

    api.library()  # oneDNN's code, loaded on first use, as onnxruntime's is by its import (14 MiB)
    import ctxrt.compiler.ranges  # noqa: F401  ctxrt's compiler and kernels' modules, imported on first use (as
    import ctxrt.frontend.onnx  # noqa: F401  onnxruntime's code is by its import; bench_generate does the same)
    from ctxrt.backends import get_backend

    get_backend("cpu")
    base = _rss_now()
    peak, done = [base], threading.Event()

    def sample() -> None:  # the resident set every millisecond: ru_maxrss would include the imports' peak
        while not done.is_set():
            peak[0] = max(peak[0], _rss_now())
            time.sleep(0.001)

    watcher = threading.Thread(target=sample, daemon=True)
    watcher.start()
    sess = _session(kind, path)
    _generate(sess)
    done.set()
    watcher.join()
    out.put((kind, max(peak[0], _rss_now()) - base - weights, weights))


def _rss_now() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def memory() -> dict[str, dict[str, float]]:
    ctx = mp.get_context("spawn")
    out: dict[str, dict[str, float]] = {}
    _context_binary(_decoder())
    _warm_cache(_decoder())
    for kind in ("ctxrt ranges", "ctxrt .ctx", "ctxrt cache", "ctxrt default", "onnxruntime"):
        q = ctx.Queue()
        p = ctx.Process(target=_rss_child, args=(kind, q))
        p.start()
        name, beyond, weights = q.get(timeout=600)
        p.join()
        out[name] = {"rss_beyond_weights_mib": beyond / 2 ** 20, "weights_mib": weights / 2 ** 20}
    return out


def batch_cycle(rounds: int) -> dict[str, float]:
    import exported
    import onnxruntime as ort

    import ctxrt

    path = exported.exported_model("mobilenet_v3", "dynamo")
    feeds = [exported.exported_feeds("mobilenet_v3", b) for b in range(1, 13)]
    times: dict[str, list[float]] = {"ctxrt": [], "onnxruntime": []}
    later: dict[str, list[float]] = {"ctxrt": [], "onnxruntime": []}  # cycles 2 and 3
    first: dict[str, list[float]] = {"ctxrt": [], "onnxruntime": []}  # cycle 1 but its first call
    compiles = 0
    for r in range(rounds):
        order = ["ctxrt", "onnxruntime"] if r % 2 == 0 else ["onnxruntime", "ctxrt"]
        for kind in order:
            sess = ctxrt.InferenceSession(path) if kind == "ctxrt" else \
                ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
            per_call = []
            for _ in range(3):
                for f in feeds:
                    t = time.perf_counter()
                    sess.run(None, f)
                    per_call.append(time.perf_counter() - t)
            times[kind].append(statistics.median(per_call) * 1e3)
            later[kind].append(statistics.median(per_call[len(feeds):]) * 1e3)
            first[kind].append(statistics.mean(per_call[1:len(feeds)]) * 1e3)
            if kind == "ctxrt":
                compiles = sess.stats["shape_variants_compiled"]
    c, o = statistics.median(times["ctxrt"]), statistics.median(times["onnxruntime"])
    lc, lo = statistics.median(later["ctxrt"]), statistics.median(later["onnxruntime"])
    fc, fo = statistics.median(first["ctxrt"]), statistics.median(first["onnxruntime"])
    return {"ctxrt_ms": c, "onnxruntime_ms": o, "ratio": c / o, "ctxrt_compiles": compiles,
            "later_ctxrt_ms": lc, "later_onnxruntime_ms": lo, "later_ratio": lc / lo,
            "first_cycle_ctxrt_ms": fc, "first_cycle_onnxruntime_ms": fo}


def _audio_model() -> Path:
    """tests/models' 1-D audio net (legacy export: convs of stride 4, pools of 4, 4 and 2, ceil_mode) with its
    samples axis dynamic too."""
    import exported
    import onnx
    import zoo

    path = zoo.cache_dir() / "bench_audio_lengths.onnx"
    if not path.exists():
        model = onnx.load(exported.exported_model("audio1d", "legacy"))
        model.graph.input[0].type.tensor_type.shape.dim[2].dim_param = "samples"
        del model.graph.value_info[:]
        onnx.save(model, path)
    return path


def audio_lengths(rounds: int, calls: int = 24) -> dict[str, float]:
    """A 1-D audio net fed a clip of another length every call (0.25-2 s at 16 kHz, seeded): the whole loop from
    the session's creation (its compiles included) and the median call after the first, per runtime."""
    import numpy as np
    import onnxruntime as ort

    import ctxrt

    path = _audio_model()
    rng = np.random.default_rng(0)
    clips = [rng.standard_normal((1, 1, int(n))).astype(np.float32) for n in rng.integers(4000, 32000, calls)]
    total: dict[str, list[float]] = {"ctxrt": [], "onnxruntime": []}
    later: dict[str, list[float]] = {"ctxrt": [], "onnxruntime": []}
    compiles = 0
    for r in range(rounds):
        for kind in (["ctxrt", "onnxruntime"] if r % 2 == 0 else ["onnxruntime", "ctxrt"]):
            t0 = time.perf_counter()
            sess = ctxrt.InferenceSession(path) if kind == "ctxrt" else \
                ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
            per_call = []
            for x in clips:
                t = time.perf_counter()
                sess.run(None, {"waveform": x})
                per_call.append(time.perf_counter() - t)
            total[kind].append((time.perf_counter() - t0) * 1e3)
            later[kind].append(statistics.median(per_call[1:]) * 1e3)
            if kind == "ctxrt":
                compiles = sess.stats["shape_variants_compiled"]
    c, o = statistics.median(total["ctxrt"]), statistics.median(total["onnxruntime"])
    lc, lo = statistics.median(later["ctxrt"]), statistics.median(later["onnxruntime"])
    return {"calls": calls, "ctxrt_ms": c, "onnxruntime_ms": o, "ratio": c / o, "ctxrt_compiles": compiles,
            "later_ctxrt_ms": lc, "later_onnxruntime_ms": lo, "later_ratio": lc / lo}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    gen = generation(args.rounds)
    mem = memory()
    cyc = batch_cycle(args.rounds)
    aud = audio_lengths(args.rounds)
    if args.json:
        print(json.dumps({"generation": gen, "memory": mem, "batch_cycle": cyc, "audio_lengths": aud}))
        return
    print(machine_line())
    o = gen["onnxruntime"]
    print(f"GPT-2-style decoder, {LAYERS} layers, hidden {DIM}, {TOKENS} tokens from an empty past (ms per token):")
    print(f"  {'runtime':<16}{'first gen':>11}{'ratio':>8}{'new shape':>11}{'ratio':>8}{'steady':>9}{'ratio':>8}"
          f"{'RSS beyond weights':>21}")
    for k, v in gen.items():
        m = mem[k]["rss_beyond_weights_mib"]
        print(f"  {k:<16}{v['first_ms_per_token']:>11.2f}{v['first_ms_per_token'] / o['first_ms_per_token']:>8.2f}"
              f"{v['new_shape_ms']:>11.2f}{v['new_shape_ms'] / o['new_shape_ms']:>8.2f}"
              f"{v['steady_ms_per_token']:>9.2f}{v['steady_ms_per_token'] / o['steady_ms_per_token']:>8.2f}"
              f"{m:>15.1f} MiB ({m / max(mem['onnxruntime']['rss_beyond_weights_mib'], 1e-9):.2f}x)")
    print(f"  weights {mem['onnxruntime']['weights_mib']:.1f} MiB")
    print(f"MobileNetV3 batch 1..12 x3: ctxrt {cyc['ctxrt_ms']:.2f} ms, onnxruntime {cyc['onnxruntime_ms']:.2f} ms "
          f"per call, ratio {cyc['ratio']:.2f} ({cyc['ctxrt_compiles']} compile); cycles 2-3 alone "
          f"{cyc['later_ctxrt_ms']:.2f} / {cyc['later_onnxruntime_ms']:.2f} ms, ratio {cyc['later_ratio']:.2f}; "
          f"the first cycle's new sizes {cyc['first_cycle_ctxrt_ms']:.2f} / {cyc['first_cycle_onnxruntime_ms']:.2f} "
          "ms a call")
    print(f"1-D audio net, {aud['calls']} clips of new lengths: ctxrt {aud['ctxrt_ms']:.0f} ms, onnxruntime "
          f"{aud['onnxruntime_ms']:.0f} ms from the session's creation, ratio {aud['ratio']:.2f} "
          f"({aud['ctxrt_compiles']} compile); a call after the first {aud['later_ctxrt_ms']:.2f} / "
          f"{aud['later_onnxruntime_ms']:.2f} ms, ratio {aud['later_ratio']:.2f}")


if __name__ == "__main__":
    main()
