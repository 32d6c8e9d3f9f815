"""Quantized and half-precision models, ctxrt vs onnxruntime, side by side in one run.

Two small networks are built in code (the test suite's, tests/models/small_nets.py: a CNN of 3x3, depthwise and
1x1 convolutions, and a 2-layer BERT-style encoder) and derived with onnxruntime's own tools: int8 QDQ
(`quantize_static`, per-channel s8 weights with reduce_range, u8 activations), dynamic int8 (`quantize_dynamic`)
and float16 (`convert_float_to_float16`). Every (engine, variant) runs `--repeat` times per round, the rounds
interleaving all of them; a figure is the median of the rounds' medians. Ratios: ctxrt / onnxruntime for each
variant, and ctxrt float16 / ctxrt float32. `--threads` caps both engines (1 by default: stable on a shared
machine). Also printed: the weights section of each variant's context binary and the bytes its kernels hold
(prepacked or widened weights, `alloc_kernel_bytes`), and the largest difference from onnxruntime's output. Run by
hand:

    .venv/bin/python bench/bench_quant.py [--models cnn,encoder] [--variants float32,qdq_int8,dynamic_int8,float16]
                                          [--repeat 20] [--rounds 7] [--threads 1] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnxruntime import quantization as q
from onnxruntime.transformers.float16 import convert_float_to_float16

import ctxrt
from ctxrt.backends import get_backend
from ctxrt.compiler import compile_graphs, save_context

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "models"))
from bench_ops import _median_ms  # noqa: E402
from small_nets import calibration, cnn, encoder  # noqa: E402

MODELS: dict[str, Callable[[], tuple[onnx.ModelProto, tuple[int, ...]]]] = {
    "cnn": lambda: cnn(32, 56), "encoder": lambda: encoder(128, 512, seq=64, heads=4, layers=2)}
VARIANTS = ("float32", "qdq_int8", "dynamic_int8", "float16")


def variants(name: str, folder: Path, which: tuple[str, ...] = VARIANTS) -> tuple[dict[str, str], tuple[int, ...]]:
    model, shape = MODELS[name]()
    paths = {v: str(folder / f"{name}-{v}.onnx") for v in VARIANTS}
    onnx.save(model, paths["float32"])
    q.quantize_static(paths["float32"], paths["qdq_int8"], calibration(shape, 16), quant_format=q.QuantFormat.QDQ,
                      per_channel=True, reduce_range=True, activation_type=q.QuantType.QUInt8,
                      weight_type=q.QuantType.QInt8)
    q.quantize_dynamic(paths["float32"], paths["dynamic_int8"], weight_type=q.QuantType.QInt8)
    onnx.save(convert_float_to_float16(onnx.load(paths["float32"]), keep_io_types=True), paths["float16"])
    return {v: p for v, p in paths.items() if v in which}, shape


def _memory(path: str, folder: Path) -> tuple[int, int]:
    """(weights section bytes of the context binary, bytes the loaded kernels hold)."""
    backend = get_backend("cpu")
    graphs, weights = compile_graphs([(path, None, "main")], backend)
    binary = save_context(folder / (Path(path).stem + ".ctx"), graphs, weights, backend, [path])
    with ctxrt.context_from_binary(binary) as ctx:
        return ctxrt.read_metadata(binary)["weights_size"], int(ctx.stats["alloc_kernel_bytes"])


def bench(name: str, repeat: int, rounds: int, threads: int, which: tuple[str, ...] = VARIANTS) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        paths, shape = variants(name, folder, which)
        feeds = {"x": np.random.default_rng(0).standard_normal(shape).astype(np.float32)}
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        runs: dict[tuple[str, str], Callable[[], object]] = {}
        diffs, memory = {}, {}
        for v, path in paths.items():
            mine = ctxrt.InferenceSession(path, sess_options=options)
            theirs = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
            runs[(v, "ctxrt")] = lambda s=mine: s.run(None, feeds)
            runs[(v, "onnxruntime")] = lambda s=theirs: s.run(None, feeds)
            diffs[v] = float(np.abs(mine.run(None, feeds)[0].astype(np.float32)
                                    - theirs.run(None, feeds)[0].astype(np.float32)).max())
            memory[v] = _memory(path, folder)
        times: dict[tuple[str, str], list[float]] = {k: [] for k in runs}
        for _ in range(rounds):
            for key, fn in runs.items():
                fn()
                times[key].append(_median_ms(fn, repeat))
    ms = {k: statistics.median(v) for k, v in times.items()}
    rows = []
    for v in paths:
        a, b = ms[(v, "ctxrt")], ms[(v, "onnxruntime")]
        rows.append({"model": name, "variant": v, "ctxrt_ms": round(a, 3), "onnxruntime_ms": round(b, 3),
                     "ctxrt/ort": round(a / b, 2), "ctxrt/ctxrt_f32": round(a / ms[("float32", "ctxrt")], 2),
                     "max_abs_diff": float(f"{diffs[v]:.2e}"), "weights_bytes": memory[v][0],
                     "kernel_bytes": memory[v][1]})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--variants", default=",".join(VARIANTS), help="float32 must be among them")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    which = tuple(args.variants.split(","))
    rows = [r for name in args.models.split(",") for r in bench(name, args.repeat, args.rounds, args.threads, which)]
    if args.json:
        print(json.dumps(rows))
        return
    print("| model | variant | ctxrt ms | onnxruntime ms | ctxrt / ort | ctxrt / ctxrt f32 | max abs diff | "
          "weights bytes | kernel bytes |\n|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['variant']} | {r['ctxrt_ms']} | {r['onnxruntime_ms']} | {r['ctxrt/ort']} | "
              f"{r['ctxrt/ctxrt_f32']} | {r['max_abs_diff']} | {r['weights_bytes']} | {r['kernel_bytes']} |")


if __name__ == "__main__":
    main()
