"""Quantized and half-precision models, ctxrt vs onnxruntime, side by side in one run.

Models (`--models`): ResNet-50 and SqueezeNet (the onnx package's light models with seeded random weights, lifted
from opset 9 to 13 first, as per-channel quantization needs), MobileNetV3 as torch.onnx.export (dynamo) writes it,
a MiniLM-L6-shaped BERT (6 layers, hidden 384, sequence 128), and the test suite's two small networks
(tests/models/small_nets.py: a CNN of 3x3, depthwise and 1x1 convolutions, and a 2-layer BERT-style encoder).
Each is derived with onnxruntime's own tools: int8 QDQ (`quantize_static` on 8 seeded calibration feeds,
per-channel s8 weights with reduce_range, u8 activations), dynamic int8 (`quantize_dynamic`) and float16
(`convert_float_to_float16`, keep_io_types). Every (engine, variant) runs `--repeat` times per round, the rounds
interleaving all of them; a figure is the median of the rounds' medians. Ratios: ctxrt / onnxruntime for each
variant, and ctxrt's variant / ctxrt float32. `--threads` caps both engines (1 by default: stable on a shared
machine). Also printed: the weights section of each variant's context binary and the bytes its kernels hold
(prepacked or widened weights, `alloc_kernel_bytes`), and the largest difference from onnxruntime's output.
`--backend opencl` runs ctxrt's side on the OpenCL device (onnxruntime stays on its CPU provider) and adds the
steps that ran on the device and the weight bytes uploaded to it. Run by hand:

    .venv/bin/python bench/bench_quant.py [--models resnet50,squeezenet,mobilenet,bert6,cnn,encoder]
                                          [--variants float32,qdq_int8,dynamic_int8,float16]
                                          [--repeat 20] [--rounds 7] [--threads 1] [--backend cpu|opencl] [--json]
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
from small_nets import cnn, encoder  # noqa: E402

Feeds = dict[str, np.ndarray]


def _small(make: Callable[[], tuple[onnx.ModelProto, tuple[int, ...]]]) -> Callable[[], tuple[object, Callable]]:
    """A network of small_nets.py: (its ModelProto, feeds by seed) with one input "x"."""
    def model() -> tuple[object, Callable[[int], Feeds]]:
        proto, shape = make()
        return proto, lambda seed: {"x": np.random.default_rng(seed).standard_normal(shape).astype(np.float32)}
    return model


def _light(name: str) -> Callable[[], tuple[object, Callable[[int], Feeds]]]:
    """A light model of the onnx package with seeded random weights (tests/models/zoo.py)."""
    import zoo

    return lambda: (zoo.light_model(name), lambda seed: zoo.light_feeds(name, seed=seed))


def _mobilenet() -> tuple[object, Callable[[int], Feeds]]:
    """MobileNetV3 as torch.onnx.export (dynamo) writes it (tests/models/exported.py), batch 1."""
    import exported

    return exported.exported_model("mobilenet_v3"), lambda seed: exported.exported_feeds("mobilenet_v3", 1, seed)


def _bert6() -> tuple[object, Callable[[int], Feeds]]:
    """A MiniLM-L6-shaped BERT (6 layers, hidden 384, 12 heads, sequence 128), dynamo export."""
    import zoo

    path = zoo.bert_model(layers=6, hidden=384, heads=12, intermediate=1536, seq=128, vocab=30522,
                          exporter="dynamo")
    return path, lambda seed: zoo.bert_feeds(128, batch=1, vocab=30522, pad=0, seed=seed)


# name -> () -> (the float32 model: a ModelProto or a path, feeds of a seed)
MODELS: dict[str, Callable[[], tuple[object, Callable[[int], Feeds]]]] = {
    "resnet50": _light("resnet50"), "squeezenet": _light("squeezenet"), "mobilenet": _mobilenet, "bert6": _bert6,
    "cnn": _small(lambda: cnn(32, 56)), "encoder": _small(lambda: encoder(128, 512, seq=64, heads=4, layers=2))}
VARIANTS = ("float32", "qdq_int8", "dynamic_int8", "float16")


def _calibration(feeds: Callable[[int], Feeds], count: int) -> object:
    """onnxruntime.quantization's calibration reader: `count` seeded feeds (seeds 3, 4, ...)."""
    class Reader(q.CalibrationDataReader):
        def __init__(self) -> None:
            self.data = iter([feeds(3 + i) for i in range(count)])

        def get_next(self) -> Feeds | None:
            return next(self.data, None)
    return Reader()


def variants(name: str, folder: Path, which: tuple[str, ...] = VARIANTS
             ) -> tuple[dict[str, str], Callable[[int], Feeds]]:
    model, feeds = MODELS[name]()
    model = model if isinstance(model, onnx.ModelProto) else onnx.load(str(model))
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset < 13:  # per-channel QuantizeLinear needs opset 13 (the light models are opset 9): as a user would
        model = onnx.version_converter.convert_version(model, 13)
    paths = {v: str(folder / f"{name}-{v}.onnx") for v in VARIANTS}
    onnx.save(model, paths["float32"])
    if "qdq_int8" in which:
        q.quantize_static(paths["float32"], paths["qdq_int8"], _calibration(feeds, 8), quant_format=q.QuantFormat.QDQ,
                          per_channel=True, reduce_range=True, activation_type=q.QuantType.QUInt8,
                          weight_type=q.QuantType.QInt8)
    if "dynamic_int8" in which:
        q.quantize_dynamic(paths["float32"], paths["dynamic_int8"], weight_type=q.QuantType.QInt8)
    if "float16" in which:
        onnx.save(convert_float_to_float16(model, keep_io_types=True), paths["float16"])
    return {v: p for v, p in paths.items() if v in which}, feeds


def _memory(path: str, folder: Path, backend_name: str = "cpu") -> dict[str, object]:
    """The weights section of the context binary, the bytes the loaded kernels hold, and on OpenCL the weight bytes
    uploaded to the device and the steps that run there (of all steps)."""
    backend = get_backend(backend_name)
    graphs, weights = compile_graphs([(path, None, "main")], backend)
    binary = save_context(folder / (Path(path).stem + ".ctx"), graphs, weights, backend, [path])
    with ctxrt.context_from_binary(binary, backend=backend_name) as ctx:
        g = ctx.graph()
        on_device = sum(p["steps"] for p in g.partitions if p["backend"] != "cpu")
        return {"weights_bytes": ctxrt.read_metadata(binary)["weights_size"],
                "kernel_bytes": int(ctx.stats["alloc_kernel_bytes"]),
                "uploaded_bytes": int(ctx.stats["weights_uploaded_bytes"]),
                "device_steps": f"{on_device}/{sum(p['steps'] for p in g.partitions)}"}


def bench(name: str, repeat: int, rounds: int, threads: int, which: tuple[str, ...] = VARIANTS,
          backend: str = "cpu") -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        paths, make_feeds = variants(name, folder, which)
        feeds = make_feeds(0)
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        runs: dict[tuple[str, str], Callable[[], object]] = {}
        diffs, memory = {}, {}
        for v, path in paths.items():
            mine = ctxrt.InferenceSession(path, backend, sess_options=options)
            theirs = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
            runs[(v, "ctxrt")] = lambda s=mine: s.run(None, feeds)
            runs[(v, "onnxruntime")] = lambda s=theirs: s.run(None, feeds)
            diffs[v] = float(np.abs(mine.run(None, feeds)[0].astype(np.float32)
                                    - theirs.run(None, feeds)[0].astype(np.float32)).max())
            memory[v] = _memory(path, folder, backend)
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
                     "max_abs_diff": float(f"{diffs[v]:.2e}"), **memory[v]})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--variants", default=",".join(VARIANTS), help="float32 must be among them")
    parser.add_argument("--backend", default="cpu", help="ctxrt's backend: cpu or opencl[:N]")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    which = tuple(args.variants.split(","))
    rows = [r for name in args.models.split(",")
            for r in bench(name, args.repeat, args.rounds, args.threads, which, args.backend)]
    if args.json:
        print(json.dumps(rows))
        return
    device = args.backend != "cpu"
    extra = " uploaded bytes | steps on device |" if device else ""
    print(f"| model | variant | ctxrt ms | onnxruntime ms | ctxrt / ort | ctxrt / ctxrt f32 | max abs diff | "
          f"weights bytes | kernel bytes |{extra}\n|---|---|---|---|---|---|---|---|---|{'---|---|' if device else ''}")
    for r in rows:
        more = f" {r['uploaded_bytes']} | {r['device_steps']} |" if device else ""
        print(f"| {r['model']} | {r['variant']} | {r['ctxrt_ms']} | {r['onnxruntime_ms']} | {r['ctxrt/ort']} | "
              f"{r['ctxrt/ctxrt_f32']} | {r['max_abs_diff']} | {r['weights_bytes']} | {r['kernel_bytes']} |{more}")


if __name__ == "__main__":
    main()
