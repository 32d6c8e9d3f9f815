"""ctxrt vs onnxruntime on torch's own 2-layer bidirectional LSTM, GRU and RNN taggers (batch_first), exported
with torch.onnx.export (dynamo=False, opset 17; `-dynamo`: dynamo=True, opset 18). Both engines in this process
on one thread (ctxrt's num_threads=1, onnxruntime's intra_op_num_threads=1), timed in interleaved blocks of runs
so that load on the machine hits both alike. Per engine: the median block, in wall-clock time and in the CPU
time of this thread (both engines run on the calling thread: CPU time leaves out the time other processes took
the core, the noise of a shared machine). Ratios are ctxrt / onnxruntime; "twin ratio" is a second compile of the
same model, timed in the same rotation: two identical programs differed by up to 10% on a shared VM, so a ratio
nearer 1 than that is no difference. Prints a Markdown table and the command line.

    python bench/bench_recurrent.py [--models lstm gru rnn gru-dynamo] [--steps 50] [--batch 1 8]
                                    [--hidden 128] [--rounds 25] [--block 5]
"""

from __future__ import annotations

import argparse
import io
import shlex
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np

MODELS = ("lstm", "gru", "rnn", "gru-dynamo")


def _tagger(kind: str, inputs: int, hidden: int):
    import torch

    class Tagger(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rnn = getattr(torch.nn, kind)(inputs, hidden, num_layers=2, bidirectional=True, batch_first=True)
            self.head = torch.nn.Linear(2 * hidden, 20)

        def forward(self, x):
            return self.head(self.rnn(x)[0])

    torch.manual_seed(0)
    return Tagger().eval()


def _export(model, x, dynamo: bool) -> bytes:
    import onnx
    import torch

    if dynamo:
        return torch.onnx.export(model, (x,), dynamo=True, opset_version=18, input_names=["x"],
                                 output_names=["y"]).model_proto.SerializeToString()
    buf = io.BytesIO()
    torch.onnx.export(model, (x,), buf, dynamo=False, opset_version=17, input_names=["x"], output_names=["y"])
    return onnx.load_from_string(buf.getvalue()).SerializeToString()


def _block(fn: Callable[[], object], runs: int) -> tuple[float, float]:
    """(wall-clock, this thread's CPU) seconds per run over `runs` runs."""
    w, c = time.perf_counter(), time.thread_time()
    for _ in range(runs):
        fn()
    return (time.perf_counter() - w) / runs, (time.thread_time() - c) / runs


def _row(name: str, batch: int, args: argparse.Namespace) -> str:
    import onnxruntime as ort
    import torch

    import ctxrt

    kind, _, exporter = name.partition("-")
    x = torch.randn(batch, args.steps, 128)
    data, feeds = _export(_tagger(kind.upper(), 128, args.hidden), x, exporter == "dynamo"), {"x": x.numpy()}
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
    ctx, twin = ctxrt.compile(data), ctxrt.compile(data)  # the twin: the same program, the host's noise floor
    ctx.num_threads = twin.num_threads = 1
    try:
        g, h = ctx.graph(), twin.graph()
        outs = {g.outputs[0].name: np.empty(g.outputs[0].shape, np.float32)}
        g.execute(feeds, outs)
        err = float(np.abs(next(iter(outs.values())) - sess.run(None, feeds)[0]).max())
        engines = {"ours": lambda: g.execute(feeds, outs), "twin": lambda: h.execute(feeds, outs),
                   "theirs": lambda: sess.run(None, feeds)}
        times: dict[str, list[tuple[float, float]]] = {k: [] for k in engines}
        order = list(engines)
        for r in range(args.rounds):  # interleaved blocks, each after one untimed run, the order rotated
            for k in order[r % 3:] + order[:r % 3]:
                engines[k]()
                times[k].append(_block(engines[k], args.block))
    finally:
        ctx.free()
        twin.free()
    (cw, cc), (tw, _), (ow, oc) = ([statistics.median(t[k] for t in times[e]) * 1e3 for k in (0, 1)]
                                   for e in ("ours", "twin", "theirs"))
    return (f"| {name} | {batch} | {args.steps} | {cw:.3f} | {ow:.3f} | {cw / ow:.2f} | {cc:.3f} | {oc:.3f} | "
            f"{cc / oc:.2f} | {tw / ow:.2f} | {err:.1e} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=25)
    ap.add_argument("--block", type=int, default=5, help="runs per timed block")
    args = ap.parse_args()

    from threadpoolctl import threadpool_limits

    with threadpool_limits(1):
        rows = [_row(name, batch, args) for name in args.models for batch in args.batch]
    print("| model | batch | steps | ctxrt ms | onnxruntime ms | ratio | ctxrt CPU ms | onnxruntime CPU ms | CPU ratio "
          "| twin ratio | max abs diff |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    print("\n".join(rows))
    print(f"\n`python {shlex.join(sys.argv)}` (one thread each; medians of {args.rounds} interleaved blocks of "
          f"{args.block} runs, the order rotated; \"twin ratio\": a second compile of the same model timed the same "
          "way, the host's noise: ratios closer than its distance from the first are not a difference)")


if __name__ == "__main__":
    main()
