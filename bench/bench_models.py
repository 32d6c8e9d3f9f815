"""ctxrt against onnxruntime, side by side in one run, on the architectures people export (tests/models/exported.py:
MobileNetV3, EfficientNet, U-Net, ViT, a GPT, LSTM/GRU taggers, a 1-D audio conv net, a model with a data-dependent
branch; torch's dynamo exporter, batch 1) and on ONNX files shipped inside PyPI packages (tests/models/field.py:
silero VAD, magika, PaddleOCR det/rec/cls), each opened as a user opens it: `InferenceSession(path)`. `--models
encoders`: mid-size encoders instead (tests/models/encoders.py: Wav2Vec2, a Whisper encoder, SegFormer, ConvNeXt,
ViT-S-wide, DistilBERT, a T5 encoder; transformers' configs, random weights), where kernels decide the latency.

    .venv/bin/python bench/bench_models.py [--rounds R] [--runs N] [--models a,b,...|encoders] [--json]

Per model: R rounds, each timing N runs of one runtime then N of the other (which goes first alternates), a pause
and 3 untimed runs before each block so neither runtime's spinning worker threads take the cores from the other's
block (nor make ctxrt count them as busy cores); medians of the blocks' medians. The outputs are compared once (max
abs difference). "open": the CPU ms of opening a session and running it once (ctxrt's compile of its range
program included; the median of max(3, R / 2) rounds after one that warms the modules). The machine is shared:
say what else ran.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "models"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_latency import machine_line  # noqa: E402
from bench_session import median_ms  # noqa: E402

EXPORTED = ["mobilenet_v3", "efficientnet", "unet", "vit", "gpt", "lstm_tagger", "gru_tagger", "audio1d", "branchy"]
FIELD = ["silero_vad", "silero_vad_op18_ifless", "magika", "ppocr_det", "ppocr_rec", "ppocr_cls"]


def _model(name: str) -> tuple[Path, dict[str, np.ndarray]]:
    import encoders

    if name in encoders.ENCODERS:
        return encoders.encoder_model(name), encoders.encoder_feeds(name)
    if name in FIELD:
        import field

        return field.field_model(name), field.field_feeds(name, 1)
    import exported

    return exported.exported_model(name, "dynamo"), exported.exported_feeds(name, batch=1)


def _opened(name: str, path: Any, feeds: dict[str, np.ndarray], rounds: int) -> tuple[float, float]:
    """Median CPU ms of opening a session and running it once (ctxrt's compile included; a warm process: each
    runtime's modules imported by an earlier session), ctxrt and onnxruntime alternating."""
    import onnxruntime as ort

    import ctxrt

    def ours() -> None:
        with ctxrt.InferenceSession(path) as s:
            s.run(None, feeds)

    def theirs() -> None:
        ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)

    times: dict[Any, list[float]] = {ours: [], theirs: []}
    for r in range(rounds + 1):
        for f in (ours, theirs) if r % 2 == 0 else (theirs, ours):
            gc.collect()
            t = time.process_time()
            f()
            if r:  # the first round warms each runtime's modules
                times[f].append((time.process_time() - t) * 1e3)
    return statistics.median(times[ours]), statistics.median(times[theirs])


def bench(name: str, rounds: int, runs: int) -> dict[str, float]:
    import onnxruntime as ort

    import ctxrt

    path, feeds = _model(name)
    opened = _opened(name, path, feeds, max(3, rounds // 2))
    ours = ctxrt.InferenceSession(path)
    theirs = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got, want = ours.run(None, feeds), theirs.run(None, feeds)
    diff = max(float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)))) if np.size(a) else 0.0
               for a, b in zip(got, want, strict=True))
    pair = [("ctxrt", lambda: ours.run(None, feeds)), ("onnxruntime", lambda: theirs.run(None, feeds))]
    blocks: dict[str, list[float]] = {"ctxrt": [], "onnxruntime": []}
    for r in range(rounds):
        for kind, run in pair if r % 2 == 0 else pair[::-1]:
            # the other runtime's worker threads stop spinning, and ctxrt's count of idle cores (sampled from
            # /proc/stat every 0.25 s) no longer sees them busy
            time.sleep(0.6)
            blocks[kind].append(median_ms(run, runs, warmup=3))
    a, b = statistics.median(blocks["ctxrt"]), statistics.median(blocks["onnxruntime"])
    return {"ctxrt_ms": a, "onnxruntime_ms": b, "ratio": a / b, "max_abs_diff": diff, "ctxrt_open_ms": opened[0],
            "onnxruntime_open_ms": opened[1], "open_ratio": opened[0] / opened[1]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--runs", type=int, default=30)
    p.add_argument("--models", default=",".join(EXPORTED + FIELD))
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    warnings.simplefilter("ignore")  # (a session's notes on ranges: not figures)
    if args.models == "encoders":
        import encoders

        args.models = ",".join(encoders.ENCODERS)
    results = {m: bench(m, args.rounds, args.runs) for m in args.models.split(",") if m}
    if args.json:
        print(json.dumps(results, indent=1))
        return
    print(machine_line())
    print(f"{'model':<24}{'ctxrt ms':>10}{'ort ms':>10}{'ratio':>8}{'max diff':>11}   {'open: ctxrt':>12}{'ort':>8}"
          f"{'ratio':>7}")
    for m, r in results.items():
        print(f"{m:<24}{r['ctxrt_ms']:>10.3f}{r['onnxruntime_ms']:>10.3f}{r['ratio']:>8.2f}"
              f"{r['max_abs_diff']:>11.1e}   {r['ctxrt_open_ms']:>12.1f}{r['onnxruntime_open_ms']:>8.1f}"
              f"{r['open_ratio']:>7.1f}")
    models = "" if args.models == ",".join(EXPORTED + FIELD) else f" --models {args.models}"
    print(f"command: .venv/bin/python bench/bench_models.py --rounds {args.rounds} --runs {args.runs}{models}")


if __name__ == "__main__":
    main()
