"""Single-op latency, ctxrt vs onnxruntime, for the spatial, resampling and activation kernels.

Each case is a one-node model with constant weights; both engines run it with their IO bound once (no copies).
The engines alternate in `--rounds` rounds of `--repeat` runs (onnxruntime second, then a pause: its threads
spin after work); a figure is the median of the rounds' medians. `--threads` caps both engines (ctxrt's BLAS
through threadpoolctl, onnxruntime's intra-op pool); the default, 1, keeps figures stable on a shared machine,
where a BLAS call waiting for a descheduled worker thread costs a scheduler quantum. Run by hand:

    .venv/bin/python bench/bench_ops.py [--cases conv1d,resize_linear2x] [--repeat 20] [--rounds 5] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper
from threadpoolctl import threadpool_limits

import ctxrt

RNG = np.random.default_rng(0)


def _rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def _model(op: str, x: tuple[int, ...], consts: dict[str, np.ndarray], opset: int = 19, **attrs) -> onnx.ModelProto:
    node = helper.make_node(op, ["x", *consts], ["y"], **attrs)
    graph = helper.make_graph([node], op, [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, x)],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(v, k) for k, v in consts.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _silu(x: tuple[int, ...]) -> onnx.ModelProto:
    nodes = [helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Mul", ["x", "s"], ["y"])]
    graph = helper.make_graph(nodes, "silu", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, x)],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


CASES: dict[str, tuple[Callable[[], onnx.ModelProto], tuple[int, ...]]] = {
    "conv1d": (lambda: _model("Conv", (1, 64, 16000), {"w": _rand(64, 64, 3) * 0.05, "b": _rand(64)},
                              pads=[1, 1]), (1, 64, 16000)),
    "conv3d": (lambda: _model("Conv", (1, 16, 16, 32, 32), {"w": _rand(32, 16, 3, 3, 3) * 0.05, "b": _rand(32)},
                              pads=[1] * 6), (1, 16, 16, 32, 32)),
    "convtranspose_k2s2": (lambda: _model("ConvTranspose", (1, 64, 56, 56), {"w": _rand(64, 32, 2, 2) * 0.1,
                                          "b": _rand(32)}, strides=[2, 2]), (1, 64, 56, 56)),
    "convtranspose_k3s2": (lambda: _model("ConvTranspose", (1, 64, 28, 28), {"w": _rand(64, 32, 3, 3) * 0.1,
                                          "b": _rand(32)}, strides=[2, 2], pads=[1, 1, 1, 1],
                                          output_padding=[1, 1]), (1, 64, 28, 28)),
    "maxpool3d": (lambda: _model("MaxPool", (1, 32, 16, 32, 32), {}, kernel_shape=[3, 3, 3], strides=[2, 2, 2],
                                 pads=[1] * 6), (1, 32, 16, 32, 32)),
    "resize_nearest2x": (lambda: _model("Resize", (1, 64, 80, 80), {"roi": np.zeros(0, np.float32),
                                        "scales": np.array([1, 1, 2, 2], np.float32)}, mode="nearest",
                                        coordinate_transformation_mode="asymmetric", nearest_mode="floor"),
                         (1, 64, 80, 80)),
    "resize_linear2x": (lambda: _model("Resize", (1, 64, 80, 80), {"roi": np.zeros(0, np.float32),
                                       "scales": np.array([1, 1, 2, 2], np.float32)}, mode="linear",
                                       coordinate_transformation_mode="pytorch_half_pixel"), (1, 64, 80, 80)),
    "hardswish": (lambda: _model("HardSwish", (1, 64, 112, 112), {}), (1, 64, 112, 112)),
    "silu_fused": (lambda: _silu((1, 64, 112, 112)), (1, 64, 112, 112)),
    "prelu": (lambda: _model("PRelu", (1, 64, 112, 112), {"s": _rand(64, 1, 1)}), (1, 64, 112, 112)),
}


def _median_ms(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def bench(name: str, repeat: int, rounds: int, threads: int) -> dict[str, float | str]:
    """Kernels without IO copies on either side: ctxrt's graph.execute on memory handles bound once,
    onnxruntime's run_with_iobinding with the input and a preallocated output bound once."""
    make, shape = CASES[name]
    model = make()
    x = _rand(*shape)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    sess = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    want = sess.run(None, {"x": x})[0]
    binding = sess.io_binding()
    binding.bind_cpu_input("x", x)
    binding.bind_ortvalue_output("y", ort.OrtValue.ortvalue_from_shape_and_type(want.shape, np.float32))
    ctx = ctxrt.compile(model, io_mem_type="memhandle")
    graph, backend = ctx.graph(), ctx.backend
    handles = {}
    for t in graph.inputs + graph.outputs:
        handles[t.name] = ctx.mem_register(backend.alloc_shared(t.nbytes, 64), 0, t.shape, t.dtype)
    handles["x"].view[...] = x
    ins, outs = {"x": handles["x"]}, {"y": handles["y"]}
    graph.execute(ins, outs)
    err = float(np.abs(handles["y"].view - want).max() / max(1e-12, np.abs(want).max()))
    ours, theirs = [], []
    for _ in range(rounds):
        with threadpool_limits(threads):
            graph.execute(ins, outs)
            ours.append(_median_ms(lambda: graph.execute(ins, outs), repeat))
        sess.run_with_iobinding(binding)
        theirs.append(_median_ms(lambda: sess.run_with_iobinding(binding), repeat))
        time.sleep(0.5)
    a, b = statistics.median(ours), statistics.median(theirs)
    return {"case": name, "ctxrt_ms": round(a, 3), "onnxruntime_ms": round(b, 3), "ratio": round(a / b, 2),
            "max_rel_err": float(f"{err:.1e}")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = [bench(name, args.repeat, args.rounds, args.threads) for name in args.cases.split(",")]
    if args.json:
        print(json.dumps(rows))
        return
    print("| case | ctxrt ms | onnxruntime ms | ctxrt / ort | max rel. error |\n|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['case']} | {r['ctxrt_ms']} | {r['onnxruntime_ms']} | {r['ratio']} | {r['max_rel_err']} |")


if __name__ == "__main__":
    main()
