"""Run-time control flow and data-dependent sizes, ctxrt vs onnxruntime (one thread each), interleaved.

    PYTHONPATH=src python bench/bench_control.py [--rounds 7] [--runs 200]

Cases: a data-dependent If (two 256x256 MatMul branches), a Loop whose trip count comes from the data (64
iterations of a small body, run by the Loop kernel), the same Loop with a constant trip count (unrolled),
and NonZero on a 256x256 input. Reports the median over rounds of each round's median latency, and the ratio.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto as T
from onnx import helper, numpy_helper

import ctxrt

RNG = np.random.default_rng(0)


def _vi(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def _model(nodes, inputs, outputs, inits):
    g = helper.make_graph(nodes, "g", inputs, outputs, [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def data_if():
    w = {k: RNG.standard_normal((256, 256)).astype(np.float32) / 16 for k in ("wa", "wb")}
    then = helper.make_graph([helper.make_node("MatMul", ["x", "wa"], ["t"])], "t", [], [_vi("t", T.FLOAT, [64, 256])])
    other = helper.make_graph([helper.make_node("MatMul", ["x", "wb"], ["e"])], "e", [], [_vi("e", T.FLOAT, [64, 256])])
    nodes = [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0), helper.make_node("Greater", ["s", "zero"], ["c"]),
             helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)]
    m = _model(nodes, [_vi("x", T.FLOAT, [64, 256])], [_vi("y", T.FLOAT, [64, 256])],
               {**w, "zero": np.array(0, np.float32)})
    return m, {"x": RNG.standard_normal((64, 256)).astype(np.float32)}


def loop(trips_from_data: bool):
    body = helper.make_graph(
        [helper.make_node("Mul", ["acc", "k"], ["a1"]), helper.make_node("Add", ["a1", "x"], ["acc2"]),
         helper.make_node("Identity", ["cond"], ["c2"])],
        "body", [_vi("i", T.INT64, []), _vi("cond", T.BOOL, []), _vi("acc", T.FLOAT, [1024])],
        [_vi("c2", T.BOOL, []), _vi("acc2", T.FLOAT, [1024])])
    inits = {"z": np.zeros(1024, np.float32), "k": np.array(0.5, np.float32)}
    nodes = []
    if trips_from_data:
        nodes = [helper.make_node("ReduceMax", ["n"], ["mx"], keepdims=0),
                 helper.make_node("Cast", ["mx"], ["M"], to=7)]
    else:
        inits["M"] = np.array(64, np.int64)
    nodes.append(helper.make_node("Loop", ["M", "", "z"], ["y"], body=body))
    inputs = [_vi("x", T.FLOAT, [1024])] + ([_vi("n", T.FLOAT, [1])] if trips_from_data else [])
    feeds = {"x": RNG.standard_normal(1024).astype(np.float32)}
    if trips_from_data:
        feeds["n"] = np.array([64], np.float32)
    return _model(nodes, inputs, [_vi("y", T.FLOAT, None)], inits), feeds


def nonzero():
    m = _model([helper.make_node("NonZero", ["x"], ["y"])], [_vi("x", T.FLOAT, [256, 256])], [_vi("y", T.INT64, None)],
               {})
    x = RNG.standard_normal((256, 256)).astype(np.float32) * (RNG.random((256, 256)) < 0.3)
    return m, {"x": x}


def _median_ms(fn, runs: int) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--runs", type=int, default=200)
    args = ap.parse_args()
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = opts.inter_op_num_threads = 1
    cases = {"If (data)": data_if(), "Loop (data trip count)": loop(True), "Loop (constant, unrolled)": loop(False),
             "NonZero 256x256": nonzero()}
    print(f"{'case':<28}{'ctxrt ms':>10}{'ort ms':>10}{'ctxrt/ort':>11}  ctxrt steps")
    for name, (m, feeds) in cases.items():
        ours = ctxrt.InferenceSession(m.SerializeToString())
        theirs = ort.InferenceSession(m.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        for got, want in zip(ours.run(None, feeds), theirs.run(None, feeds), strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * max(1.0, float(np.abs(want).max())))
        a, b = [], []
        for r in range(args.rounds):  # alternate which goes first
            pair = [(a, lambda s=ours, f=feeds: s.run(None, f)), (b, lambda s=theirs, f=feeds: s.run(None, f))]
            for out, fn in pair[::1 if r % 2 == 0 else -1]:
                out.append(_median_ms(fn, args.runs))
        ca, cb = statistics.median(a), statistics.median(b)
        steps = [s.op for s in ours._current.stages[0].graph.compiled.steps]
        more = " ..." if len(steps) > 6 else ""
        print(f"{name:<28}{ca:>10.3f}{cb:>10.3f}{ca / cb:>11.2f}  {', '.join(steps[:6])}{more}")
        ours.close()


if __name__ == "__main__":
    main()
