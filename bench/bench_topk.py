"""TopK latency, ctxrt's CPU kernel vs onnxruntime, on wide rows (a vocabulary's logits) and along a leading axis.

Both engines run a one-node model with K a constant and their IO bound once (no copies), alternating in
`--rounds` rounds of `--repeat` runs; a figure is the median of the rounds' medians. Threads are capped at
`--threads` (default 1: stable figures on a shared machine). Outputs are checked against onnxruntime first
(values and indices, ties included). Run by hand:

    .venv/bin/python bench/bench_topk.py [--cases rows1x50k_k10,...] [--repeat 20] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper
from threadpoolctl import threadpool_limits

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_ops import _median_ms  # noqa: E402

import ctxrt

# name: (input shape, k, axis, largest, dtype)
CASES: dict[str, tuple[tuple[int, ...], int, int, int, type]] = {
    "rows1x50k_k10": ((1, 50000), 10, -1, 1, np.float32),
    "rows64x50k_k10": ((64, 50000), 10, -1, 1, np.float32),
    "rows16x50k_k1000": ((16, 50000), 1000, -1, 1, np.float32),
    "rows64x50k_k10_smallest": ((64, 50000), 10, -1, 0, np.float32),
    "rows64x50k_k10_ties": ((64, 50000), 10, -1, 1, np.float16),  # few distinct values: many ties
    "axis0_50kx64_k10": ((50000, 64), 10, 0, 1, np.float32),
    "rows64x50k_k10_f64": ((64, 50000), 10, -1, 1, np.float64),
}


def _model(shape: tuple[int, ...], k: int, axis: int, largest: int, dtype: type) -> onnx.ModelProto:
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    node = helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=axis, largest=largest)
    graph = helper.make_graph([node], "topk", [helper.make_tensor_value_info("x", elem, shape)],
                              [helper.make_tensor_value_info("v", elem, None),
                               helper.make_tensor_value_info("i", onnx.TensorProto.INT64, None)],
                              [numpy_helper.from_array(np.array([k], np.int64), "k")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def bench(name: str, repeat: int, rounds: int, threads: int) -> dict[str, float | str]:
    shape, k, axis, largest, dtype = CASES[name]
    x = np.random.default_rng(0).standard_normal(shape).astype(dtype)
    model = _model(shape, k, axis, largest, dtype)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    sess = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    want = sess.run(None, {"x": x})
    binding = sess.io_binding()
    binding.bind_cpu_input("x", x)
    for out, w in zip(("v", "i"), want, strict=True):
        binding.bind_ortvalue_output(out, ort.OrtValue.ortvalue_from_shape_and_type(w.shape, w.dtype))
    ctx = ctxrt.compile(model, io_mem_type="memhandle")
    graph, backend = ctx.graph(), ctx.backend
    handles = {t.name: ctx.mem_register(backend.alloc_shared(t.nbytes, 64), 0, t.shape, t.dtype)
               for t in graph.inputs + graph.outputs}
    handles["x"].view[...] = x
    ins, outs = {"x": handles["x"]}, {"v": handles["v"], "i": handles["i"]}
    graph.execute(ins, outs)
    same = bool(np.array_equal(handles["v"].view, want[0]) and np.array_equal(handles["i"].view, want[1]))
    ours, theirs = [], []
    for _ in range(rounds):
        with threadpool_limits(threads):
            ours.append(_median_ms(lambda: graph.execute(ins, outs), repeat))
        sess.run_with_iobinding(binding)
        theirs.append(_median_ms(lambda: sess.run_with_iobinding(binding), repeat))
        time.sleep(0.2)
    a, b = statistics.median(ours), statistics.median(theirs)
    ctx.free()
    return {"case": name, "ctxrt_ms": round(a, 3), "onnxruntime_ms": round(b, 3), "ratio": round(a / b, 2),
            "same": same}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    print("| case | ctxrt ms | onnxruntime ms | ctxrt / ort | same as ort |\n|---|---|---|---|---|")
    for name in args.cases.split(","):
        r = bench(name, args.repeat, args.rounds, args.threads)
        print(f"| {r['case']} | {r['ctxrt_ms']} | {r['onnxruntime_ms']} | {r['ratio']} | {r['same']} |", flush=True)


if __name__ == "__main__":
    main()
