"""The OpenCL CNN kernels (Conv as an implicit GEMM, the direct window kernel for depthwise Conv, MaxPool and
AveragePool, global pools, LRN, BatchNormalization): each case asserts that its nodes ran on the device, not in a
CPU partition, and matches both onnx.reference (onnxruntime where the reference is wrong) and the NumPy backend, at
odd sizes (no multiple of any tile), with edge attributes and fused epilogues. Then: what declines, other
configurations of each space computing the default's output, tuning a conv, and how much of three real models
runs on the device."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import zoo
from harness import make_model, onnxruntime_outputs, rand, reference
from onnx import helper

import ctxrt
from ctxrt.backends import get_backend, select_kernel
from ctxrt.backends.kernel import NodeSpec, TensorSpec
from ctxrt.cli import main as cli
from ctxrt.compiler import compile_model
from ctxrt.tuning import LocalDevice, Tuner, TuningConfig
from ctxrt.tuning.profiler import Settings, profile

pytestmark = pytest.mark.usefixtures("opencl")


def run(model: onnx.ModelProto, feeds: dict[str, np.ndarray], backend: str) -> tuple[dict[str, np.ndarray], Any]:
    with ctxrt.compile(model, backend=backend) as ctx:
        g = ctx.graph()
        return {k: np.array(v) for k, v in g.run(feeds).items()}, g


def check_on_device(nodes, feeds, inits=None, oracle="reference", opset=17, rtol=1e-5, atol=1e-5,
                    steps: list[str] | None = None) -> None:
    """Compile for OpenCL, assert that every step ran there (and, given `steps`, which ops the compiled graph has:
    fused epilogues), and compare with the oracle (rtol, atol) and with the NumPy backend."""
    model = make_model(nodes, feeds, inits, opset)
    want = (reference(model, feeds) if oracle == "reference" else onnxruntime_outputs(model, feeds)
            if oracle == "onnxruntime" else oracle(**feeds))
    got, g = run(model, feeds, "opencl")
    assert {p["backend"] for p in g.partitions} == {"opencl"}, g.partitions
    if steps is not None:
        assert [s.op for s in g.compiled.steps] == steps
    numpy_backend, _ = run(model, feeds, "cpu")
    for out, w in zip(model.graph.output, want, strict=True):
        y = got[out.name]
        assert (y.shape, y.dtype) == (w.shape, w.dtype), out.name
        np.testing.assert_allclose(y, w, rtol=rtol, atol=atol, err_msg=f"{out.name} vs {oracle}")
        # the NumPy backend's own algorithms (Winograd) round differently: the bar of the model tests
        cpu = numpy_backend[out.name]
        assert np.max(np.abs(y - cpu)) <= 1e-4 * np.max(np.abs(cpu)) + 1e-5, f"{out.name} vs cpu"


def conv_case(x: tuple[int, ...], w: tuple[int, ...], bias: bool = True, relu: bool = False, dtype=np.float32,
              **attrs: Any) -> tuple[list, dict, dict]:
    feeds = {"x": rand(*x, dtype=dtype)}
    inits = {"w": rand(*w, dtype=dtype)}
    if bias:
        inits["b"] = rand(w[0], dtype=dtype)
    nodes = [helper.make_node("Conv", ["x", "w", "b"][:2 + bias], ["c" if relu else "y"], **attrs)]
    if relu:
        nodes.append(helper.make_node("Relu", ["c"], ["y"]))
    return nodes, feeds, inits


# ---- Conv: implicit GEMM -----------------------------------------------------------------------------------

@pytest.mark.parametrize("x, w, attrs", [
    ((1, 3, 7, 9), (5, 3, 3, 3), {"pads": [1, 1, 1, 1]}),  # 5 channels: vectors narrower than the default
    ((2, 6, 11, 13), (10, 3, 3, 2), {"pads": [1, 0, 2, 1], "strides": [2, 3], "dilations": [2, 1], "group": 2}),
    ((1, 40, 13, 13), (67, 40, 3, 3), {"pads": [1, 1, 1, 1]}),  # 67 channels: the last vector starts at 51
    ((1, 17, 9, 9), (33, 17, 1, 1), {}),  # 1x1: a GEMM, no masks
    ((1, 19, 9, 11), (70, 19, 1, 1), {"strides": [2, 2]}),
    ((1, 8, 10, 11), (12, 8, 3, 3), {"auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    ((1, 8, 10, 11), (12, 8, 4, 4), {"auto_pad": "SAME_LOWER", "strides": [3, 2]}),
    ((1, 8, 10, 11), (12, 8, 3, 5), {"auto_pad": "VALID", "dilations": [2, 1]}),
    ((2, 5, 9, 9), (1, 5, 3, 3), {"pads": [2, 2, 2, 2]}),  # one output channel: scalar lanes; all-padding taps
    ((1, 3, 29, 31), (64, 3, 7, 7), {"pads": [3, 3, 3, 3], "strides": [2, 2]}),  # a ResNet stem, odd input
    ((3, 4, 10), (6, 4, 3), {"pads": [2, 1], "dilations": [2]}),  # 1-D: run as H = 1
    ((1, 12, 6, 6), (24, 3, 3, 3), {"pads": [1, 1, 1, 1], "group": 4}),  # grouped, not depthwise
])
def test_conv_odd_sizes_and_attributes(x, w, attrs) -> None:
    nodes, feeds, inits = conv_case(x, w, **attrs)
    check_on_device(nodes, feeds, inits)


def test_conv_fused_epilogues_run_in_one_step() -> None:
    """Conv + bias + Relu, and Conv + bias + residual Add + Relu (FuseActivation): one OpenCL step each."""
    nodes, feeds, inits = conv_case((1, 9, 11, 13), (21, 9, 3, 3), relu=True, pads=[1, 1, 1, 1])
    check_on_device(nodes, feeds, inits, steps=["Conv"])
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["r", "c"], ["s"]), helper.make_node("Relu", ["s"], ["y"])]
    feeds = {"x": rand(2, 9, 11, 13), "r": rand(2, 21, 11, 13)}
    check_on_device(nodes, feeds, {"w": rand(21, 9, 3, 3), "b": rand(21)}, steps=["Conv"])
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], group=9, pads=[1, 1, 1, 1]),  # depthwise
             helper.make_node("Add", ["c", "r"], ["s"]), helper.make_node("Relu", ["s"], ["y"])]
    feeds = {"x": rand(2, 9, 11, 13), "r": rand(2, 9, 11, 13)}
    check_on_device(nodes, feeds, {"w": rand(9, 1, 3, 3), "b": rand(9)}, steps=["Conv"])


def test_conv_float64() -> None:
    if not get_backend("opencl").info.fp64:
        pytest.skip("this OpenCL device has no cl_khr_fp64")
    nodes, feeds, inits = conv_case((1, 5, 8, 9), (7, 5, 3, 3), dtype=np.float64, relu=True, pads=[1, 1, 1, 1])
    check_on_device(nodes, feeds, inits, rtol=1e-12, atol=1e-12)
    nodes, feeds, inits = conv_case((1, 5, 8, 9), (5, 1, 3, 3), dtype=np.float64, group=5, strides=[2, 2])
    check_on_device(nodes, feeds, inits, rtol=1e-12, atol=1e-12)


# ---- depthwise Conv and pools: the direct window kernel ------------------------------------------------------

@pytest.mark.parametrize("x, w, attrs", [
    ((1, 8, 9, 11), (8, 1, 3, 3), {"pads": [1, 1, 1, 1], "group": 8}),
    ((2, 6, 10, 7), (12, 1, 3, 2), {"pads": [0, 1, 2, 0], "strides": [2, 1], "dilations": [1, 2], "group": 6}),
    ((1, 7, 31, 37), (7, 1, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2], "group": 7}),  # vector loads, stride 2
    ((1, 5, 19, 40), (5, 1, 5, 5), {"pads": [2, 2, 2, 2], "strides": [3, 3], "group": 5}),
    ((1, 5, 20), (5, 1, 5), {"pads": [2, 2], "strides": [3], "group": 5}),
])
def test_depthwise_conv(x, w, attrs) -> None:
    nodes, feeds, inits = conv_case(x, w, relu=True, **attrs)
    check_on_device(nodes, feeds, inits, steps=["Conv"])


@pytest.mark.parametrize("op, x, attrs", [
    ("MaxPool", (1, 3, 9, 11), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ("MaxPool", (2, 5, 10, 13), {"kernel_shape": [3, 2], "strides": [2, 3], "ceil_mode": 1}),
    ("MaxPool", (1, 4, 15), {"kernel_shape": [4], "strides": [2], "pads": [1, 2], "dilations": [2]}),
    ("MaxPool", (1, 6, 8, 9), {"kernel_shape": [2, 2], "auto_pad": "SAME_LOWER"}),
    ("MaxPool", (1, 3, 37, 45), {"kernel_shape": [2, 2], "strides": [2, 2]}),  # vector loads, stride 2
    ("AveragePool", (1, 3, 9, 11), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ("AveragePool", (1, 3, 9, 11), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1],
                                    "count_include_pad": 1}),
    ("AveragePool", (2, 5, 10, 13), {"kernel_shape": [3, 2], "strides": [2, 3], "ceil_mode": 1,
                                     "pads": [0, 1, 1, 0], "count_include_pad": 1}),
    ("AveragePool", (2, 5, 10, 13), {"kernel_shape": [3, 2], "strides": [2, 3], "ceil_mode": 1, "pads": [0, 1, 1, 0]}),
    ("AveragePool", (1, 2, 10, 13), {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1,
                                     "count_include_pad": 1}),  # no padding: the ceil_mode overhang is not counted
    ("AveragePool", (1, 4, 17), {"kernel_shape": [5], "strides": [3], "auto_pad": "SAME_UPPER",
                                 "count_include_pad": 1}),
    ("AveragePool", (1, 6, 7, 7), {"kernel_shape": [7, 7]}),
    ("AveragePool", (1, 3, 20, 21), {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),
])
def test_pools(op, x, attrs) -> None:
    # onnxruntime is the oracle of ceil_mode windows (what the frontend resolved the output shape to)
    check_on_device(helper.make_node(op, ["x"], ["y"], **attrs), {"x": rand(*x)}, oracle="onnxruntime")


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool"])
@pytest.mark.parametrize("x", [(2, 5, 7, 9), (1, 3, 131), (1, 3, 5, 4, 3), (3, 2, 1, 1)])
def test_global_pools(op, x) -> None:
    # onnx.reference's GlobalMaxPool keeps a spatial axis of rank-5 inputs: onnxruntime is the oracle
    check_on_device(helper.make_node(op, ["x"], ["y"]), {"x": rand(*x, low=-3, high=1)}, oracle="onnxruntime")


def lrn64(x: np.ndarray, size: int, alpha: float = 1e-4, beta: float = 0.75, bias: float = 1.0) -> list[np.ndarray]:
    """LRN in float64 as the ONNX spec defines it (onnx.reference's is off by up to 1.6e-4; onnxruntime takes
    only odd sizes and 4-D inputs)."""
    sq, lo, c = x.astype(np.float64) ** 2, (size - 1) // 2, x.shape[1]
    s = np.stack([sq[:, max(0, k - lo):min(c, k + size - lo)].sum(1) for k in range(c)], 1)
    return [(x / (bias + np.float32(alpha) / size * s) ** np.float32(beta)).astype(x.dtype)]


@pytest.mark.parametrize("x, attrs", [
    ((2, 11, 5, 7), {"size": 5, "alpha": 1e-3, "beta": 0.75, "bias": 2.0}),
    ((1, 6, 3, 3), {"size": 4}),  # even size: one more channel after than before
    ((1, 20, 37, 37), {"size": 3, "beta": 0.5}),
    ((1, 3, 41), {"size": 7, "alpha": 0.1}),  # window wider than the channels
])
def test_lrn(x, attrs) -> None:
    check_on_device(helper.make_node("LRN", ["x"], ["y"], **attrs), {"x": rand(*x, low=-2, high=2)},
                    oracle=lambda x: lrn64(x, **attrs))


@pytest.mark.parametrize("x", [(2, 5, 7, 9), (1, 3, 100), (3, 4), (1, 19, 33, 35)])
def test_batchnorm_inference(x) -> None:
    c = x[1]
    inits = {"s": rand(c, low=0.5, high=1.5), "b": rand(c), "m": rand(c), "v": rand(c, low=0.5, high=1.5)}
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], epsilon=1e-3)
    check_on_device(node, {"x": rand(*x)}, inits)


# ---- what declines runs in a CPU partition ------------------------------------------------------------------

@pytest.mark.parametrize("case", ["conv3d", "runtime_weights", "maxpool_indices", "dilated_avgpool", "int_maxpool"])
def test_declined_nodes_run_in_a_cpu_partition(case) -> None:
    feeds: dict[str, np.ndarray] = {"x": rand(1, 2, 5, 6, 7) if case == "conv3d" else rand(1, 2, 7, 8)}
    inits: dict[str, np.ndarray] = {}
    if case == "conv3d":
        node, inits = helper.make_node("Conv", ["x", "w"], ["y"]), {"w": rand(3, 2, 2, 2, 2)}
    elif case == "runtime_weights":
        node, feeds["w"] = helper.make_node("Conv", ["x", "w"], ["y"]), rand(3, 2, 3, 3)
    elif case == "maxpool_indices":
        node = helper.make_node("MaxPool", ["x"], ["y", "i"], kernel_shape=[2, 2])
    elif case == "dilated_avgpool":
        node = helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[2, 2], dilations=[2, 2])
    else:
        feeds["x"] = (feeds["x"] * 100).astype(np.int32)
        node = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2])
    model = make_model(node, feeds, inits, opset=19)
    got, g = run(model, feeds, "opencl")
    assert [p["backend"] for p in g.partitions] == ["cpu"]
    if case == "int_maxpool":  # neither onnxruntime nor onnx.reference has an int32 MaxPool: the float one
        as_float = {"x": feeds["x"].astype(np.float32)}
        want = [w.astype(np.int32) for w in reference(make_model(node, as_float, opset=19), as_float)]
    else:  # onnx.reference's Indices are not onnxruntime's
        want = onnxruntime_outputs(model, feeds)
    for out, w in zip(model.graph.output, want, strict=True):
        np.testing.assert_allclose(got[out.name], w, rtol=1e-5, atol=1e-5)


# ---- tunable spaces -------------------------------------------------------------------------------------------

def _recorded(spec: NodeSpec) -> NodeSpec:
    """The node as the compiler records it once its kernel prepacked constants (what tuners and loaders see)."""
    kernel, _ = select_kernel(get_backend("opencl"), spec)
    consts, ins = list(spec.consts), list(spec.inputs)
    for i, array in kernel.constants.items():
        consts[i], ins[i] = array, TensorSpec(array.shape, array.dtype)
    return NodeSpec(spec.op, spec.name, {**spec.attrs, **kernel.attrs}, ins, spec.outputs, consts)


def _spec(op: str, x: tuple[int, ...], y: tuple[int, ...], attrs: dict, w: tuple[int, ...] | None = None) -> NodeSpec:
    f32 = np.dtype(np.float32)
    rng = np.random.default_rng(0)
    ins, consts = [TensorSpec(x, f32)], [None]
    if w is not None:
        ins += [TensorSpec(w, f32), TensorSpec((w[0],), f32)]
        consts += [rng.uniform(-1, 1, w).astype(f32), rng.uniform(-1, 1, w[0]).astype(f32)]
    if op == "BatchNormalization":
        ins += [TensorSpec((x[1],), f32)] * 4
        consts += [rng.uniform(0.5, 1.5, x[1]).astype(f32) for _ in range(4)]
    return NodeSpec(op, op.lower(), attrs, ins, [TensorSpec(y, f32)], consts)


SPACES = {
    "conv": _spec("Conv", (1, 13, 9, 11), (1, 37, 5, 6), {"pads": [1, 1, 1, 1], "strides": [2, 2],
                                                           "activation": "Relu"}, (37, 13, 3, 3)),
    "conv1x1": _spec("Conv", (1, 13, 9, 11), (1, 21, 9, 11), {}, (21, 13, 1, 1)),
    "depthwise": _spec("Conv", (1, 6, 9, 11), (1, 6, 9, 11), {"pads": [1, 1, 1, 1], "group": 6}, (6, 1, 3, 3)),
    "avgpool": _spec("AveragePool", (1, 3, 9, 11), (1, 3, 5, 6), {"kernel_shape": [3, 3], "strides": [2, 2],
                                                                  "pads": [1, 1, 1, 1], "count_include_pad": 1}),
    "global": _spec("GlobalAveragePool", (2, 5, 7, 9), (2, 5, 1, 1), {}),
    "lrn": _spec("LRN", (1, 7, 5, 9), (1, 7, 5, 9), {"size": 3}),
    "batchnorm": _spec("BatchNormalization", (1, 7, 5, 9), (1, 7, 5, 9), {}),
}


@pytest.mark.parametrize("name", list(SPACES))
def test_other_configurations_compute_the_defaults_output(name) -> None:
    """What a tuner relies on: candidates (local memory, vector widths, tiles) agree with the default."""
    be = get_backend("opencl")
    kernel, where = select_kernel(be, _recorded(SPACES[name]))
    assert where == "opencl"
    cands = list(kernel.space.candidates(kernel.problem(), be.info))
    rng = np.random.default_rng(0)
    picks = [cands[i] for i in rng.choice(len(cands), min(8, len(cands)), replace=False)]
    if "LOCAL" in kernel.params:  # the GPU path: local memory tiles
        picks.append({**kernel.space.defaults["gpu"], "VW": 8, "WM": 2, "RM": 2, "RN": 8})
    default, trials, _ = profile(be, kernel, picks, Settings(min_runs=1, min_total_s=0.0))
    assert default.error is None
    assert all(t.error is None for t in trials), [(t.params, t.error) for t in trials if t.error]


def test_defaults_fit_this_device_and_a_gpu() -> None:
    import dataclasses

    be = get_backend("opencl")
    gpu = dataclasses.replace(be.info, type="gpu", max_work_group_size=256, max_work_item_sizes=(256, 256, 64),
                              local_memory=32768)
    for spec in SPACES.values():
        kernel, _ = select_kernel(be, _recorded(spec))
        for info in (be.info, gpu):
            params = kernel.space.default(info, kernel.variant())
            assert kernel.space.why_invalid(params, kernel.problem(), info) is None, (type(kernel), info.type)


def test_tuning_a_conv_keeps_its_output(tmp_path: Path) -> None:
    nodes, feeds, inits = conv_case((1, 16, 12, 13), (24, 16, 3, 3), relu=True, pads=[1, 1, 1, 1])
    path = tmp_path / "conv.onnx"
    onnx.save(make_model(nodes, feeds, inits), path)
    be = get_backend("opencl")
    tuner = Tuner(TuningConfig(tuning_mode=True, tuning_budget_candidates=4), LocalDevice(be))
    tuned, _ = compile_model(path, None, be, "main", tuner=tuner)
    (entry,) = [e for e in tuned.tuning if e["op"] == "Conv"]
    assert entry["kernel"] == "Conv" and entry["tried"] == 4 and entry["failed"] == 0
    plain = ctxrt.compile(path, backend=be).graph().run(feeds)["y"]
    with ctxrt.compile(path, backend=be, tuning_mode=True, tuning_budget_candidates=4) as ctx:
        np.testing.assert_allclose(ctx.graph().run(feeds)["y"], plain, rtol=1e-5, atol=1e-5)


# ---- real models: how much runs on the device -----------------------------------------------------------------

def test_stored_context_reads_its_prepacked_weights(squeezenet, tmp_path: Path) -> None:
    """A .ctx stores the conv weights prepacked, with the node's `kernel` attribute: loading runs them as they are."""
    path, feeds, want = squeezenet
    out = tmp_path / "squeezenet.ctx"
    assert cli(["compile", str(path), "-o", str(out), "--backend", "opencl"]) == 0
    with ctxrt.context_from_binary(out, "opencl") as ctx:
        steps = ctx.graph().compiled.steps
        assert all(s.attrs.get("kernel") == "opencl_conv" for s in steps if s.op == "Conv")
        got = ctx.graph().run(feeds)
    for name, w in want.items():
        assert np.max(np.abs(got[name] - w)) <= 1e-4 * np.max(np.abs(w)) + 1e-5


CATALOGUE = {"Conv", "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "LRN", "BatchNormalization",
             "Gemm", "MatMul", "Relu", "Add"}


@pytest.mark.parametrize("name, on_device", [("resnet50", 56), ("squeezenet", 30), ("shufflenet", 58)])
def test_cnn_models_run_on_the_device(name, on_device) -> None:
    """Every conv, pool and element-wise step runs on OpenCL; CPU partitions hold only ops outside this catalogue
    (Softmax, Concat, Transpose today)."""
    feeds = zoo.light_feeds(name)
    with ctxrt.compile(zoo.light_model(name), shapes={k: v.shape for k, v in feeds.items()}, backend="opencl") as ctx:
        parts = ctx.graph().partitions
    device = sum(p["steps"] for p in parts if p["backend"] == "opencl")
    fallback = {op for p in parts if p["backend"] == "cpu" for op in p["ops"]}
    assert device >= on_device and not fallback & CATALOGUE, parts
