"""QLinearConv and ConvInteger on OpenCL (quant/conv.py, kernels/qconv.cl): every case asserts that the node ran on
the device, matches the NumPy backend bit for bit and onnxruntime within one quantization step (where onnxruntime
has a kernel for the types), at odd channel counts and sizes, with zero points on both operands, per-tensor and
per-channel parameters, groups, depthwise, strides, asymmetric pads, dilations and saturation. Then: a context
binary round trip, what declines, and a QDQ-quantized CNN whose QLinearConvs run on the device."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from harness import RNG, rand
from onnx import helper
from quant_helpers import assert_ints, ints, ort_outputs, qmodel

import ctxrt
from ctxrt.backends import get_backend
from ctxrt.backends.cpu.backend import CpuBackend
from ctxrt.backends.kernel import NodeSpec, TensorSpec
from ctxrt.backends.opencl.backend import OpenCLBackend
from ctxrt.backends.opencl.quant.conv import QConv, QDepthwise
from ctxrt.cli import main as cli
from ctxrt.tuning.profiler import Bench

pytestmark = pytest.mark.usefixtures("opencl")
U8, S8, I32 = np.uint8, np.int8, np.int32


def _outputs(model: onnx.ModelProto, feeds: dict[str, np.ndarray], backend: Any):
    with ctxrt.compile(model, backend=backend) as ctx:
        g = ctx.graph()
        got = g.run(feeds)
        return {k: np.array(v) for k, v in got.items()}, [p["backend"] for p in g.partitions]


def check(model: onnx.ModelProto, feeds: dict[str, np.ndarray], placement=("opencl",), ort=True) -> np.ndarray:
    """OpenCL (placement asserted) == the NumPy backend's exact integer kernel, bit for bit (not oneDNN's int8
    convolution, which adds the bias after scaling and may round a value a step apart: 1 of 7,104 with biases past
    2^24); onnxruntime within a step where it has a kernel for the types."""
    want, _ = _outputs(model, feeds, CpuBackend(onednn=False))
    got, parts = _outputs(model, feeds, "opencl")
    assert tuple(parts) == tuple(placement), parts
    (name,) = want
    np.testing.assert_array_equal(got[name], want[name])
    assert got[name].dtype == want[name].dtype
    if ort:
        (o,) = ort_outputs(model, feeds, [want[name].dtype])
        assert_ints(got[name], o, within=1, rare=0.02, name="onnxruntime")
    return got[name]


def qconv_model(xt=U8, wt=S8, yt=U8, n=1, c=17, m=37, hw=(9, 11), k=(3, 3), group=1, per_channel=True,
                xz=None, wz=0, bias=True, gain=1.0, big_bias=False, **attrs):
    """A QLinearConv whose output spans the output type (times `gain`: > 1 saturates), with its feeds.
    wz: 0 (zeros), "pt" (one non-zero value) or "pc" (one per channel, non-zero). big_bias: biases past 2^24 (no
    float holds them) that dominate the output."""
    x = ints(xt, n, c, *hw)
    w = ints(wt, m, c // group, *k)
    lo, hi = np.iinfo(wt).min, np.iinfo(wt).max
    if wz == "pc":
        wzp = ints(wt, m, lo=lo + 20, hi=hi - 20)
    elif wz == "pt":
        wzp = np.array(ints(wt, 1, lo=lo + 20, hi=hi - 20)[0])
    else:
        wzp = np.zeros(m, wt) if per_channel else np.array(0, wt)
    if per_channel and wzp.ndim == 0:
        wzp = np.full(m, wzp, wt)
    xzp = np.array(xz if xz is not None else (128 if xt == U8 else -3), xt)
    xs, base = np.float32(0.02), 0.004
    ws = (base * RNG.uniform(0.5, 1.5, m) if per_channel else np.array(base)).astype(np.float32)
    taps = (c // group) * math.prod(k)
    ys = np.float32(0.02 * base * math.sqrt(taps) * 74 * 74 / 40 / gain)  # outputs of about 40 steps std
    if big_bias:
        ys = np.float32(0.02 * base * 2**25 / 100)
    yzp = np.array(128 if yt == U8 else 0, yt)
    inits = {"xs": xs, "xz": xzp, "w": w, "ws": ws, "wz": wzp, "ys": ys, "yz": yzp}
    ins = ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"]
    if bias:
        inits["b"] = ints(I32, m, lo=-20000, hi=20000)
        if big_bias:
            inits["b"] = (ints(I32, m, lo=2**24 + 1, hi=2**25) * RNG.choice([-1, 1], m)).astype(I32)
        ins.append("b")
    node = helper.make_node("QLinearConv", ins, ["y"], group=group, **attrs)
    return qmodel(node, {"x": x}, inits), {"x": x}


def _ort_has(xt, wt, yt) -> bool:
    """onnxruntime's QLinearConv: uint8 x with int8 or uint8 w, int8 x with int8 w, y of x's type."""
    return (xt, wt) in ((U8, S8), (U8, U8), (S8, S8)) and yt == xt


CASES = {  # name -> qconv_model arguments
    "u8s8_pc_bias_pad1": dict(pads=[1, 1, 1, 1]),
    "s8s8_pt_zps_stride2_asym": dict(xt=S8, wt=S8, yt=S8, c=3, m=17, per_channel=False, wz="pt", bias=False,
                                     strides=[2, 2], pads=[0, 1, 2, 1], hw=(13, 10)),
    "u8u8_pc_zps_group2_dil2_5x5": dict(wt=U8, c=6, m=10, k=(5, 5), group=2, wz="pc", xz=77, dilations=[2, 2],
                                        pads=[2, 3, 1, 2], hw=(14, 12)),
    "s8u8_group3_1x1": dict(xt=S8, wt=U8, yt=S8, c=9, m=21, k=(1, 1), group=3, wz="pt"),
    "u8s8_1x1_64_n2": dict(n=2, c=64, m=17, k=(1, 1), yt=S8, hw=(7, 9)),
    "u8s8_1x1_stride2": dict(c=16, m=40, k=(1, 1), strides=[2, 2], hw=(11, 11)),
    "u8s8_same_upper_stride2": dict(c=5, m=3, auto_pad="SAME_UPPER", strides=[2, 2], hw=(10, 13)),
    "u8s8_wide_k": dict(c=300, m=19, hw=(5, 6), pads=[1, 1, 1, 1], wz=0, xz=200),  # K = 2700: blocks of 256
    "u8s8_m_multiple": dict(c=8, m=64, hw=(12, 12), pads=[1, 1, 1, 1]),
    "depthwise_u8s8_stride2": dict(c=37, m=37, group=37, strides=[2, 2], pads=[1, 1, 1, 1], hw=(19, 23)),
    "depthwise_s8s8_pc_zps_dil2_5x5": dict(xt=S8, wt=S8, yt=S8, c=17, m=17, group=17, k=(5, 5), wz="pc",
                                           dilations=[2, 2], pads=[4, 3, 4, 2], hw=(20, 9)),
    "depthwise_mult2_u8u8_nobias": dict(wt=U8, c=6, m=12, group=6, wz="pc", bias=False, pads=[0, 2, 1, 0],
                                        hw=(70, 67)),
    "depthwise_big_bias": dict(c=16, m=16, group=16, pads=[1, 1, 1, 1], big_bias=True, hw=(12, 37)),
    "big_bias": dict(c=16, m=16, pads=[1, 1, 1, 1], big_bias=True),
    "depthwise_stride3_7x7": dict(c=5, m=5, group=5, k=(7, 7), strides=[3, 3], pads=[3, 3, 3, 3], hw=(30, 41)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_qlinearconv(name) -> None:
    args = CASES[name]
    model, feeds = qconv_model(**args)
    check(model, feeds, ort=_ort_has(args.get("xt", U8), args.get("wt", S8), args.get("yt", U8)))


def test_qlinearconv_1d() -> None:
    x = ints(U8, 2, 7, 30)
    w = ints(S8, 11, 7, 3)
    inits = {"xs": np.float32(0.03), "xz": np.uint8(100), "w": w, "ws": np.float32(0.005), "wz": np.int8(0),
             "ys": np.float32(0.3), "yz": np.uint8(120), "b": ints(I32, 11, lo=-500, hi=500)}
    node = helper.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"], ["y"], pads=[2, 1],
                            strides=[2], dilations=[2])
    check(qmodel(node, {"x": x}, inits), {"x": x})


@pytest.mark.parametrize("depthwise", [False, True], ids=["gemm", "depthwise"])
def test_saturation_at_both_ends(depthwise) -> None:
    args = dict(c=12, m=12, group=12) if depthwise else dict(c=12, m=20)
    model, feeds = qconv_model(gain=20.0, pads=[1, 1, 1, 1], xt=S8, yt=S8, **args)
    y = check(model, feeds)
    assert (y == -128).mean() > 0.1 and (y == 127).mean() > 0.1


def as_inputs(model: onnx.ModelProto, feeds: dict[str, np.ndarray], names: tuple[str, ...]) -> dict:
    """The initializers `names` made graph inputs (run-time tensors, not constants): feeds with their values."""
    g, feeds = model.graph, dict(feeds)
    for name in names:
        (init,) = [i for i in g.initializer if i.name == name]
        value = onnx.numpy_helper.to_array(init)
        g.initializer.remove(init)
        g.input.append(helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(value.dtype), value.shape))
        feeds[name] = value
    return feeds


def test_scales_at_run_time() -> None:
    """Scales and zero points that are graph inputs (not constants): read from their tensors when the kernel runs."""
    model, feeds = qconv_model(c=8, m=16, pads=[1, 1, 1, 1], xz=90, wt=U8, wz="pc")
    check(model, as_inputs(model, feeds, ("xs", "xz", "ws", "wz", "ys", "yz", "b")))
    model, feeds = qconv_model(c=8, m=8, group=8, pads=[1, 1, 1, 1], xz=90, wt=U8, wz="pc")
    check(model, as_inputs(model, feeds, ("xs", "xz", "ws", "wz", "ys", "yz", "b")))


def test_run_time_weights() -> None:
    """Run-time weights of a non-depthwise conv decline (they are prepacked at compile time): a CPU partition; a
    depthwise conv reads them as they are."""
    model, feeds = qconv_model(c=6, m=9, pads=[1, 1, 1, 1])
    check(model, as_inputs(model, feeds, ("w",)), placement=("cpu",))
    model, feeds = qconv_model(c=6, m=6, group=6, pads=[1, 1, 1, 1])
    check(model, as_inputs(model, feeds, ("w",)))


@pytest.mark.parametrize("xt, wt, zps, group", [(U8, S8, True, 1), (U8, U8, True, 2), (S8, S8, False, 1),
                                                (U8, S8, True, 13)], ids=["u8s8", "u8u8_g2", "s8s8_none", "dw"])
def test_conv_integer(xt, wt, zps, group) -> None:
    c = 14 if group == 2 else 13
    x, w = ints(xt, 1, c, 10, 9), ints(wt, 26, c // group, 3, 3)
    inits, ins = {"w": w}, ["x", "w"]
    if zps:
        inits["xz"], inits["wz"] = np.array(ints(xt, 1)[0]), np.array(ints(wt, 1)[0])
        ins += ["xz", "wz"]
    node = helper.make_node("ConvInteger", ins, ["y"], group=group, pads=[1, 2, 0, 1], strides=[1, 2])
    model = qmodel(node, {"x": x}, inits)
    y = check(model, {"x": x}, ort=False)
    assert y.dtype == I32
    (o,) = ort_outputs(model, {"x": x}, [I32])
    np.testing.assert_array_equal(y, o)


def test_context_binary_round_trip(tmp_path) -> None:
    """The prepacked 8-bit weights in a .ctx: loaded, they are read as they are (no repacking), same output."""
    model, feeds = qconv_model(c=17, m=37, pads=[1, 1, 1, 1], wz=0)
    dw, dw_feeds = qconv_model(c=16, m=16, group=16, pads=[1, 1, 1, 1])
    for k, (m, f) in enumerate(((model, feeds), (dw, dw_feeds))):
        src, out = tmp_path / f"q{k}.onnx", tmp_path / f"q{k}.ctx"
        onnx.save(m, src)
        want = check(m, f)
        shape = "x".join(map(str, f["x"].shape))
        assert cli(["compile", str(src), "-o", str(out), "--backend", "opencl", "--shape", f"x={shape}"]) == 0
        with ctxrt.context_from_binary(out, OpenCLBackend(0)) as ctx:
            g = ctx.graph()
            assert [p["backend"] for p in g.partitions] == ["opencl"]
            assert ctx.stats["programs_built_from_source"] == 0
            np.testing.assert_array_equal(np.array(g.run(f)["y"]), want)


def test_qdq_cnn_runs_its_convs_on_the_device(tmp_path) -> None:
    """small_nets.cnn quantized by onnxruntime (QDQ, per channel, reduce_range, u8 activations, s8 weights): its
    QLinearConvs run in OpenCL partitions, outputs within a quantization step of the NumPy backend's."""
    from onnxruntime import quantization as q

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
    from small_nets import cnn

    model, shape = cnn(16, 20)
    src, dst = tmp_path / "cnn.onnx", tmp_path / "cnn_qdq.onnx"
    onnx.save(model, src)
    feeds = [{"x": rand(*shape, low=-1.5, high=1.5)} for _ in range(4)]

    class Reader(q.CalibrationDataReader):
        def __init__(self) -> None:
            self.data = iter(feeds[1:])

        def get_next(self):
            return next(self.data, None)

    q.quantize_static(str(src), str(dst), Reader(), quant_format=q.QuantFormat.QDQ, per_channel=True,
                      reduce_range=True, activation_type=q.QuantType.QUInt8, weight_type=q.QuantType.QInt8)
    qmodel_ = onnx.load(dst)
    want, _ = _outputs(qmodel_, feeds[0], "cpu")
    with ctxrt.compile(qmodel_, backend="opencl") as ctx:
        g = ctx.graph()
        got = {k: np.array(v) for k, v in g.run(feeds[0]).items()}
        parts = g.partitions
    on_cpu = sum(p["ops"].get("QLinearConv", 0) for p in parts if p["backend"] == "cpu")
    on_device = sum(p["ops"].get("QLinearConv", 0) for p in parts if p["backend"] == "opencl")
    assert on_cpu == 0 and on_device == 4, parts
    (last,) = [n for n in qmodel_.graph.node if n.output[0] == "y"]
    assert last.op_type == "DequantizeLinear"
    (scale,) = [onnx.numpy_helper.to_array(i) for i in qmodel_.graph.initializer if i.name == last.input[1]]
    np.testing.assert_allclose(got["y"], want["y"], rtol=0, atol=float(scale) * 1.001)


def _spec(c, m, group, hw, k, pads, strides, wt=U8):
    """A QLinearConv NodeSpec with per-channel weights, non-zero zero points, a bias, and its inputs."""
    oh, ow = ((hw[i] + pads[i] + pads[i + 2] - k[i]) // strides[i] + 1 for i in range(2))
    T = TensorSpec
    values = [ints(U8, 1, c, *hw), np.float32(0.02), np.uint8(117), ints(wt, m, c // group, *k),
              RNG.uniform(0.002, 0.006, m).astype(np.float32), ints(wt, m, lo=20, hi=230), np.float32(0.6),
              np.uint8(128), ints(I32, m, lo=-5000, hi=5000)]
    ins = [T(np.shape(v), np.asarray(v).dtype) for v in values]
    spec = NodeSpec("QLinearConv", "q", {"group": group, "pads": list(pads), "strides": list(strides)}, ins,
                    [T((1, m, oh, ow), np.dtype(U8))], [None, *values[1:]], 21, {})
    return spec, values


@pytest.mark.parametrize("kind", ["gemm", "depthwise"])
def test_every_configuration_computes_what_the_default_does(kind) -> None:
    """Work-groups of many work-items (the GPU defaults), scalars and narrow vectors, odd tiles."""
    be = get_backend("opencl")
    if kind == "gemm":
        cls, (spec, values) = QConv, _spec(17, 37, 1, (9, 11), (3, 3), (1, 0, 2, 1), (1, 1))
        picks = [{"RM": 4, "RN": 16, "WM": 1, "WN": 4, "VW": 4}, {"RM": 4, "RN": 16, "WM": 1, "WN": 4, "VW": 1},
                 {"RM": 1, "RN": 1, "WM": 3, "WN": 3, "VW": 8}, {"RM": 2, "RN": 8, "WM": 2, "WN": 2, "VW": 16}]
    else:
        cls, (spec, values) = QDepthwise, _spec(13, 13, 13, (19, 40), (3, 3), (1, 1, 1, 1), (2, 2))
        picks = [{"VW": 1, "RY": 1, "WX": 32, "WY": 4}, {"VW": 2, "RY": 2, "WX": 2, "WY": 2},
                 {"VW": 8, "RY": 4, "WX": 1, "WY": 1}, {"VW": 16, "RY": 8, "WX": 1, "WY": 1}]
    default = cls(spec, be)
    bench = Bench(be, default, values)
    try:
        want, _ = bench.run_once(bench.kernel(default.params))
        for params in picks:
            kernel = bench.kernel(params)
            be.programs.prepare(kernel.programs, be.stats)
            got, _ = bench.run_once(kernel)
            np.testing.assert_array_equal(got[0], want[0], err_msg=str(params))
    finally:
        bench.close()


def test_16_bit_declines_to_the_cpu() -> None:
    """16-bit operands (QDQ units of 16-bit activations become such QLinearConvs) run in a CPU partition."""
    x = ints(np.uint16, 1, 5, 7, 8)
    inits = {"xs": np.float32(0.001), "xz": np.uint16(30000), "w": ints(S8, 6, 5, 3, 3), "ws": np.float32(0.01),
             "wz": np.int8(0), "ys": np.float32(0.5), "yz": np.uint16(32768)}
    node = helper.make_node("QLinearConv", ["x", *inits], ["y"], pads=[1, 1, 1, 1])
    check(qmodel(node, {"x": x}, inits), {"x": x}, placement=("cpu",), ort=False)



def test_gpu_defaults_fit_every_case() -> None:
    """A GPU's defaults hold for every case's shape (an H200 ran u8s8_same_upper_stride2's 3 output channels on the
    CPU: its 4-wide default refused, no scalar default for GPUs): where the device type's default does not fit, the
    next level of the chain does. PoCL posing as a GPU compiles each case on the device, and the programs of the
    kernels that divide ask for correctly rounded division."""
    import copy
    import dataclasses

    from ctxrt.backends.opencl.kernel import DIVIDE, _correct_divide

    be = copy.copy(get_backend("opencl"))
    be.info = dataclasses.replace(be.info, type="gpu")
    for name, args in CASES.items():
        model, feeds = qconv_model(**args)
        with ctxrt.compile(model, backend=be) as ctx:
            assert [p["backend"] for p in ctx.graph().partitions] == ["opencl"], name
    spec, _ = _spec(5, 3, 1, (10, 13), (3, 3), (1, 1, 1, 1), (2, 2))
    k = QConv(spec, be)
    assert k.params["VW"] == 1 and k.divides
    assert (DIVIDE in k.programs[0].options) == _correct_divide(be)
