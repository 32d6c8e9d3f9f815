"""ctxrt vs onnxruntime on torch's own 2-layer bidirectional LSTM and GRU taggers (batch_first, exported with
torch.onnx.export, dynamo=False, opset 17). Both engines in this process on one thread, timed in alternating
blocks of runs; the figure per engine is the fastest block (the least disturbed by other load on the machine),
and the ratio is ctxrt / onnxruntime. Prints a Markdown table and the command line.

    python bench/bench_recurrent.py [--steps 50] [--batch 1 8] [--hidden 128] [--rounds 25]
"""

from __future__ import annotations

import argparse
import io
import shlex
import sys
import time

import numpy as np


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


def _export(model, x) -> bytes:
    import torch

    buf = io.BytesIO()
    torch.onnx.export(model, (x,), buf, dynamo=False, opset_version=17, input_names=["x"], output_names=["y"])
    return buf.getvalue()


def _time(fn, block: int) -> float:
    t0 = time.perf_counter()
    for _ in range(block):
        fn()
    return (time.perf_counter() - t0) / block


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=25)
    args = ap.parse_args()

    import onnxruntime as ort
    import torch
    from threadpoolctl import threadpool_limits

    import ctxrt

    rows = []
    with threadpool_limits(1):
        for kind in ("LSTM", "GRU"):
            model = _tagger(kind, 128, args.hidden)
            for batch in args.batch:
                x = torch.randn(batch, args.steps, 128)
                data, feeds = _export(model, x), {"x": x.numpy()}
                so = ort.SessionOptions()
                so.intra_op_num_threads = 1
                sess = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
                ctx = ctxrt.compile(data)
                g = ctx.graph()
                outs = {"y": np.empty(g.outputs[0].shape, np.float32)}
                g.execute(feeds, outs)
                want = sess.run(None, feeds)[0]
                err = float(np.abs(outs["y"] - want).max())
                run_ours = lambda g=g, feeds=feeds, outs=outs: g.execute(feeds, outs)  # noqa: E731
                run_theirs = lambda sess=sess, feeds=feeds: sess.run(None, feeds)  # noqa: E731
                ours, theirs = [], []
                for _ in range(args.rounds):  # alternating blocks: load hits both engines alike
                    ours.append(_time(run_ours, 5))
                    theirs.append(_time(run_theirs, 5))
                ctx.free()
                c, o = min(ours) * 1e3, min(theirs) * 1e3
                rows.append(f"| {kind} | {batch} | {args.steps} | {c:.3f} | {o:.3f} | {c / o:.2f} | {err:.1e} |")
    print("| model | batch | steps | ctxrt ms | onnxruntime ms | ratio | max abs diff |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    print("\n".join(rows))
    print(f"\n`python {shlex.join(sys.argv)}` (one thread each, fastest of {args.rounds} blocks of 5 runs)")


if __name__ == "__main__":
    main()
