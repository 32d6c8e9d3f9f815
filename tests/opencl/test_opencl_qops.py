"""OpenCL kernels of the quantized ops (quant/ops.py, kernels/quant.cl): QuantizeLinear, DequantizeLinear,
DynamicQuantizeLinear, QLinearAdd/Mul, QLinearLookup (made by the QDQ pass), QLinearConcat, the quantized pools and
MaxPool of integers; and that data movement of int8 tensors runs on the device.

Every case asserts that the nodes ran on OpenCL only, then compares with the CPU backend bit for bit (the kernels
compute its float32 operations in its order) and, where one exists, with onnxruntime or onnx.reference to within a
step (their loops may round a value exactly half-way the other way).
"""

from __future__ import annotations

import numpy as np
import pytest
from harness import RNG, make_model, rand, read, reference
from onnx import helper
from quant_helpers import MS, assert_ints, ints, ort_outputs, qmodel

import ctxrt
from ctxrt.backends import get_backend
from ctxrt.backends.kernel import NodeSpec, TensorSpec
from ctxrt.backends.opencl.quant import ops as quant_ops

pytestmark = pytest.mark.usefixtures("opencl")
U8, I8, U16, I16 = np.uint8, np.int8, np.uint16, np.int16


def on_device(model, feeds, placement=("opencl",), ops=None):
    """Outputs on OpenCL (asserting where the steps ran, and which ops they are), equal to the CPU backend's."""
    with ctxrt.compile(model, backend="cpu") as ctx:
        got = ctx.graph().run(feeds)
        want = [np.array(got[o.name]) for o in model.graph.output]
    with ctxrt.compile(model, backend="opencl") as ctx:
        g = ctx.graph()
        assert tuple(p["backend"] for p in g.partitions) == placement, g.partitions
        if ops is not None:
            ran = {op for p in g.partitions for op in p["ops"]}
            assert set(ops) <= ran, (ops, g.partitions)
        got = g.run(feeds)
        outs = [np.array(got[o.name]) for o in model.graph.output]
    for out, y, w in zip(model.graph.output, outs, want, strict=True):
        assert (y.shape, y.dtype) == (w.shape, w.dtype), out.name
        np.testing.assert_array_equal(y, w, err_msg=out.name)
    return outs


# ---- QuantizeLinear, DequantizeLinear ---------------------------------------------------------------------------

def _ties(shape, scale):
    """Values x / scale lands exactly on halves (and on integers), both signs, plus far out of range."""
    k = RNG.integers(-300, 300, size=shape).astype(np.float32)
    x = ((k + np.float32(0.5) * RNG.integers(0, 2, size=shape)) * np.float32(scale)).astype(np.float32)
    flat = x.reshape(-1)
    flat[:4] = [1e6, -1e6, 0.5 * scale, -0.5 * scale]  # (onnx.reference casts through int32)
    return x


@pytest.mark.parametrize("dtype", [U8, I8, U16, I16])
@pytest.mark.parametrize("opset", [13, 19, 21])
def test_quantize_per_tensor_ties_and_saturation(dtype, opset) -> None:
    if opset < 21 and dtype in (U16, I16):
        pytest.skip("16-bit from opset 21")
    x = _ties((5, 37), 0.25)  # 0.25: x / scale exact, halves are ties
    zp = {U8: 3, I8: -7, U16: 1000, I16: -1000}[dtype]
    model = qmodel(helper.make_node("QuantizeLinear", ["x", "s", "z"], ["y"]), {"x": x},
                   {"s": np.float32(0.25), "z": np.array(zp, dtype)}, opset=opset)
    (y,) = on_device(model, {"x": x})
    assert_ints(y, reference(model, {"x": x})[0], within=0)
    lo, hi = np.iinfo(dtype).min, np.iinfo(dtype).max
    assert y.reshape(-1)[0] == hi and y.reshape(-1)[1] == lo  # saturation both ends
    assert y.reshape(-1)[2] == zp and y.reshape(-1)[3] == zp  # 0.5 and -0.5 round to even: 0


@pytest.mark.parametrize("axis", [0, 1, 2, 3, -1, -3])
def test_quantize_and_dequantize_per_axis(axis) -> None:
    x = rand(3, 4, 5, 7, low=-20, high=20)
    n = x.shape[axis]
    s = RNG.uniform(0.05, 0.3, size=n).astype(np.float32)
    z = RNG.integers(-20, 20, size=n).astype(I8)
    q = helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], axis=axis)
    d = helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], axis=axis)
    model = qmodel([q, d], {"x": x}, {"s": s, "z": z}, opset=19, outputs=["q", "y"])
    q_, y = on_device(model, {"x": x})
    want = reference(model, {"x": x})
    assert_ints(q_, want[0], within=1, rare=0.01)
    np.testing.assert_allclose(y, want[1], rtol=1e-6, atol=float(s.max()) * 1.01)


@pytest.mark.parametrize("dtype", [U8, I8, U16, I16, np.int32])
def test_dequantize_types_and_missing_zero_point(dtype) -> None:
    x = ints(dtype, 3, 41) if dtype != np.int32 else RNG.integers(-2**31, 2**31 - 1, size=(3, 41)).astype(np.int32)
    zp = np.array(-5 if np.iinfo(dtype).min < 0 else 7, dtype)
    for inputs, inits in ((["x", "s", "z"], {"s": np.float32(0.0123), "z": zp}), (["x", "s"], {"s": np.float32(3)})):
        model = qmodel(helper.make_node("DequantizeLinear", inputs, ["y"]), {"x": x}, inits, opset=21)
        (y,) = on_device(model, {"x": x})
        np.testing.assert_allclose(y, reference(model, {"x": x})[0], rtol=1e-6)


@pytest.mark.parametrize("opset", [10, 13])
def test_linear_older_opsets_and_com_microsoft(opset) -> None:
    x = rand(2, 3, 9, low=-3, high=3)
    q = helper.make_node("QuantizeLinear", ["x", "s"], ["q"])  # no zero point: uint8, zero 0
    d = helper.make_node("DequantizeLinear", ["q", "s"], ["y"])
    model = qmodel([q, d], {"x": x}, {"s": np.float32(0.02)}, opset=opset, outputs=["q", "y"])
    on_device(model, {"x": x})
    s = np.float32([0.1, 0.02, 0.05])
    z = np.uint8([128, 0, 255])
    q = helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], domain=MS, axis=1)
    d = helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], domain=MS, axis=1)
    model = qmodel([q, d], {"x": x}, {"s": s, "z": z}, opset=opset, outputs=["q", "y"])
    q_, y = on_device(model, {"x": x})
    want = ort_outputs(model, {"x": x}, [U8, np.float32])
    assert_ints(q_, want[0], within=1, rare=0.01)


def test_run_time_scale_and_zero_point() -> None:
    """Parameters computed at run time (graph inputs): read by the kernel at each run."""
    x = rand(4, 33, low=-5, high=5)
    feeds = {"x": x, "s": np.array(0.05, np.float32), "z": np.array(9, I8)}
    model = qmodel(helper.make_node("QuantizeLinear", ["x", "s", "z"], ["y"]), feeds, opset=13)
    on_device(model, feeds)
    feeds = {**feeds, "s": np.array(0.5, np.float32), "z": np.array(-100, I8)}
    on_device(model, feeds)


def test_blocked_and_four_bit_decline() -> None:
    """Blocked parameters and 4-bit types run in a CPU partition."""
    x = rand(4, 8)
    model = qmodel(helper.make_node("QuantizeLinear", ["x", "s"], ["y"], axis=1, block_size=4, output_dtype=3),
                   {"x": x}, {"s": rand(4, 2, low=0.01, high=0.1)}, opset=21)
    on_device(model, {"x": x}, placement=("cpu",))


# ---- DynamicQuantizeLinear --------------------------------------------------------------------------------------

@pytest.mark.parametrize("case", ["mixed", "positive", "negative", "zeros", "odd", "large"])
def test_dynamic_quantize(case) -> None:
    x = {"mixed": rand(3, 41, low=-3, high=5), "positive": rand(7, 13, low=0.5, high=2),
         "negative": rand(5, 11, low=-4, high=-0.25), "zeros": np.zeros((3, 7), np.float32),
         "odd": rand(1, low=-1, high=1), "large": rand(131, 1031, low=-2, high=1)}[case]
    if case == "large":
        x[100, 17], x[3, 1000] = 9.5, -7.25  # the extremes far from the first group
    model = qmodel(helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "ys", "yz"]), {"x": x}, opset=13)
    y, ys, yz = on_device(model, {"x": x})
    want = ort_outputs(model, {"x": x}, [U8, np.float32, U8])
    np.testing.assert_allclose(ys, want[1], rtol=1e-7)
    assert_ints(yz, want[2], within=0)
    assert_ints(y, want[0], within=1, rare=0.01)


# ---- QLinearAdd, QLinearMul -------------------------------------------------------------------------------------

def _binary(op, a, b, params, zps=True):
    sa, za, sb, zb, sc, zc = params
    names = ["a", "sa", "za" if zps else "", "b", "sb", "zb" if zps else "", "sc", "zc" if zps else ""]
    inits = {"sa": np.float32(sa), "sb": np.float32(sb), "sc": np.float32(sc)}
    if zps:
        inits.update(za=np.array(za, a.dtype), zb=np.array(zb, a.dtype), zc=np.array(zc, a.dtype))
    while names[-1] == "":
        names.pop()
    return qmodel(helper.make_node(op, names, ["c"], domain=MS), {"a": a, "b": b}, inits)


@pytest.mark.parametrize("op", ["QLinearAdd", "QLinearMul"])
@pytest.mark.parametrize("shapes", [((3, 5, 7), (3, 5, 7)), ((3, 5, 7), ()), ((3, 5, 7), (7,)), ((3, 5, 7), (5, 1)),
                                    ((5, 1), (3, 1, 7)), ((1,), (2, 3, 4, 5))])
@pytest.mark.parametrize("dtype", [U8, I8])
def test_qlinear_binary_broadcasting(op, shapes, dtype) -> None:
    a, b = ints(dtype, *shapes[0]), ints(dtype, *shapes[1])
    signed = dtype == I8
    params = (0.031, -11 if signed else 120, 0.047, 5 if signed else 131, 0.05 if op == "QLinearAdd" else 0.5,
              -3 if signed else 128)
    model = _binary(op, a, b, params)
    (c,) = on_device(model, {"a": a, "b": b})
    assert_ints(c, ort_outputs(model, {"a": a, "b": b}, [dtype])[0], within=1, rare=0.05)


@pytest.mark.parametrize("op", ["QLinearAdd", "QLinearMul"])
@pytest.mark.parametrize("dtype", [U8, I8])
def test_qlinear_binary_half_way_values(op, dtype) -> None:
    """Scales that put many results exactly on .5 (rounded to even) and past both ends, as the CPU's."""
    a, b = ints(dtype, 16, 257), ints(dtype, 257)
    zp = 0 if dtype == I8 else 128
    c_scale = 0.5 if op == "QLinearAdd" else 8.0
    (c,) = on_device(_binary(op, a, b, (0.5, 7 + zp, 0.25, 72 + zp, c_scale, 2 + zp)), {"a": a, "b": b})
    lo, hi = np.iinfo(dtype).min, np.iinfo(dtype).max
    assert (c == lo).any() and (c == hi).any()


@pytest.mark.parametrize("op", ["QLinearAdd", "QLinearMul"])
def test_qlinear_binary_sixteen_bit_saturation_and_no_zero_points(op) -> None:
    a, b = ints(I16, 4, 9), ints(I16, 9)
    model = _binary(op, a, b, (0.5, -300, 0.25, 1000, 0.01, 7))  # most values saturate
    (c,) = on_device(model, {"a": a, "b": b})
    assert (c == 32767).any() and (c == -32768).any()
    a, b = ints(U8, 3, 17), ints(U8, 3, 17)
    on_device(_binary(op, a, b, (0.02, 0, 0.03, 0, 0.04, 0), zps=False), {"a": a, "b": b})


# ---- QLinearLookup, made by the QDQ pass ------------------------------------------------------------------------

def _qdq_unit(op_nodes, x, xq, yq, inits=None, opset=19):
    """DequantizeLinear -> op(s) -> QuantizeLinear of an 8-bit input (xq, yq: (scale, zero point))."""
    nodes = [helper.make_node("DequantizeLinear", ["x", "xs", "xz"], ["xf"]), *op_nodes,
             helper.make_node("QuantizeLinear", ["yf", "ys", "yz"], ["y"])]
    consts = {"xs": np.float32(xq[0]), "xz": np.array(xq[1], x.dtype), "ys": np.float32(yq[0]),
              "yz": np.array(yq[1], x.dtype), **(inits or {})}
    return make_model(nodes, {"x": x}, consts, opset)


@pytest.mark.parametrize("op", ["HardSwish", "Sigmoid"])
@pytest.mark.parametrize("dtype", [U8, I8])
def test_lookup_from_a_qdq_unit(op, dtype) -> None:
    x = ints(dtype, 2, 3, 17, 5)
    zp = 0 if dtype == I8 else 128
    model = _qdq_unit([helper.make_node(op, ["xf"], ["yf"])], x, (0.05, zp), (1 / 255 if op == "Sigmoid" else 0.03,
                                                                               -128 if dtype == I8 else 0))
    (y,) = on_device(model, {"x": x}, ops=["QLinearLookup"])
    assert_ints(y, reference(model, {"x": x})[0], within=1, rare=0.05)


@pytest.mark.parametrize("dtype", [U8, I8])
def test_lookup_affine_from_a_batchnorm_unit(dtype) -> None:
    x = ints(dtype, 2, 6, 5, 7)
    c = 6
    bn = helper.make_node("BatchNormalization", ["xf", "g", "b", "m", "v"], ["yf"], epsilon=1e-3)
    inits = {"g": rand(c, low=0.5, high=2), "b": rand(c), "m": rand(c), "v": rand(c, low=0.5, high=2)}
    model = _qdq_unit([bn], x, (0.04, 3 if dtype == I8 else 128), (0.05, -2 if dtype == I8 else 120), inits)
    (y,) = on_device(model, {"x": x}, ops=["QLinearLookup"])
    assert_ints(y, reference(model, {"x": x})[0], within=1, rare=0.05)


@pytest.mark.parametrize("axis, count", [(1, 7), (-1, 5), (2, 5), (0, 1)])
def test_lookup_affine_direct(axis, count) -> None:
    """The affine form on any axis (channels last: per column), and one map for every value; ties of x a + b; and
    the table form: the kernels bound directly (the frontend takes no ctxrt-domain node), equal to the CPU's."""
    x = ints(I8, 3, 7, 5)
    ab = np.stack([RNG.uniform(-2, 2, count), RNG.integers(-40, 40, count) + 0.5]).astype(np.float32)
    ab[0, 0] = 1.0  # x + b: exact halves, rounded to even
    y = direct("QLinearLookup", {"axis": axis}, [x, None, ab], [2], [(x.shape, U8)])
    assert (y[0] == 255).any() or (y[0] == 0).any()
    table = RNG.integers(0, 256, size=(1, 256)).astype(U8)
    direct("QLinearLookup", {"axis": -1}, [x, table], [1], [(x.shape, I8)])


def direct(op, attrs, arrays, const_positions, outs):
    """The OpenCL kernel of `op` bound to device tensors (constants at `const_positions` given to the spec too),
    compared with the CPU kernel (harness.bind) bit for bit: the outputs."""
    from harness import bind

    consts = [a if k in const_positions else None for k, a in enumerate(arrays)]
    want = [np.zeros(shape, dt) for shape, dt in outs]
    bind(op, arrays, want, attrs, consts)()
    be = get_backend("opencl")
    spec = NodeSpec(op, op, attrs, [TensorSpec(a.shape, a.dtype) if a is not None else None for a in arrays],
                    [TensorSpec(w.shape, w.dtype) for w in want], consts, 21)
    kernel = quant_ops.KERNELS[op](spec, be)
    be.programs.prepare(kernel.programs, be.stats)
    bufs = []

    def tensor(a):
        bufs.append(be.alloc_device(max(a.nbytes, 1)))
        t = be.view(bufs[-1], 0, a.shape, a.dtype)
        if a.size:
            be.copy_in(t, a)
        return t
    try:
        ins = [tensor(a) if a is not None else None for a in arrays]
        ys = [tensor(w) for w in want]
        scratch = [tensor(np.zeros(n, U8)) for n in kernel.scratch]
        kernel.bind(ins, ys, scratch)()
        be.queue.finish()
        got = [read(be, t) for t in ys]
    finally:
        for b in bufs:
            b.release()
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)
    return got


@pytest.mark.parametrize("op, attrs", [("QLinearSigmoid", {}), ("QLinearLeakyRelu", {"alpha": 0.1})])
@pytest.mark.parametrize("dtype", [U8, I8])
def test_qlinear_sigmoid_and_leaky_relu_as_tables(op, attrs, dtype) -> None:
    """com.microsoft's unary ops with constant parameters: a table the CPU kernel made; run-time ones decline."""
    x = ints(dtype, 3, 5, 17)
    zp = np.array(-3 if dtype == I8 else 128, dtype)
    inits = {"xs": np.float32(0.06), "xz": zp, "ys": np.float32(1 / 255 if op == "QLinearSigmoid" else 0.04),
             "yz": np.array(-128 if dtype == I8 else 0, dtype) if op == "QLinearSigmoid" else zp}
    model = qmodel(helper.make_node(op, ["x", "xs", "xz", "ys", "yz"], ["y"], domain=MS, **attrs), {"x": x}, inits)
    (y,) = on_device(model, {"x": x})
    assert_ints(y, ort_outputs(model, {"x": x}, [dtype])[0], within=1, rare=0.05)
    feeds = {"x": x, "xs": np.array(0.06, np.float32)}
    model = qmodel(helper.make_node(op, ["x", "xs", "xz", "ys", "yz"], ["y"], domain=MS, **attrs), feeds,
                   {k: v for k, v in inits.items() if k != "xs"})
    on_device(model, feeds, placement=("cpu",))


def test_stored_context_keeps_the_table(tmp_path) -> None:
    """A .ctx stores the table in place of the scale (the node's `kernel` attribute says so): loading runs it."""
    import onnx

    from ctxrt.cli import main as cli

    x = ints(U8, 2, 33)
    inits = {"xs": np.float32(0.05), "xz": np.uint8(120), "ys": np.float32(1 / 256), "yz": np.uint8(0)}
    model = qmodel(helper.make_node("QLinearSigmoid", ["x", "xs", "xz", "ys", "yz"], ["y"], domain=MS), {"x": x},
                   inits)
    (want,) = on_device(model, {"x": x})
    path, out = tmp_path / "sigmoid.onnx", tmp_path / "sigmoid.ctx"
    onnx.save(model, path)
    assert cli(["compile", str(path), "-o", str(out), "--backend", "opencl"]) == 0
    with ctxrt.context_from_binary(out, "opencl") as ctx:
        (step,) = ctx.graph().compiled.steps
        assert step.attrs.get("kernel") == "lut"
        np.testing.assert_array_equal(ctx.graph().run({"x": x})["y"], want)


# ---- QLinearConcat ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("dtype", [U8, I8])
def test_qlinear_concat(axis, dtype) -> None:
    shapes = [[3, 4, 5], [3, 4, 5], [3, 4, 5]]
    for k, s in enumerate(shapes):
        s[axis] += k * 2
    xs = [ints(dtype, *s) for s in shapes]
    signed = dtype == I8
    inits = {"ys": np.float32(0.05), "yz": np.array(-4 if signed else 125, dtype)}
    names = ["ys", "yz"]
    for k in range(3):
        inits.update({f"s{k}": np.float32(0.03 + 0.02 * k), f"z{k}": np.array((k - 1) * 9 + (0 if signed else 128),
                                                                               dtype)})
        names += [f"x{k}", f"s{k}", f"z{k}"]
    feeds = {f"x{k}": x for k, x in enumerate(xs)}
    model = qmodel(helper.make_node("QLinearConcat", names, ["y"], domain=MS, axis=axis), feeds, inits)
    (y,) = on_device(model, feeds)
    assert_ints(y, ort_outputs(model, feeds, [dtype])[0], within=1, rare=0.02)


def test_requantize_from_the_qdq_pass() -> None:
    """DQ -> Q with other parameters: the pass's one-part QLinearConcat."""
    x = ints(U8, 2, 3, 11)
    nodes = [helper.make_node("DequantizeLinear", ["x", "xs", "xz"], ["xf"]),
             helper.make_node("QuantizeLinear", ["xf", "ys", "yz"], ["y"])]
    model = make_model(nodes, {"x": x}, {"xs": np.float32(0.1), "xz": np.uint8(100), "ys": np.float32(0.07),
                                         "yz": np.uint8(90)}, 19)
    (y,) = on_device(model, {"x": x}, ops=["QLinearConcat"])
    assert_ints(y, reference(model, {"x": x})[0], within=1, rare=0.02)


# ---- quantized pools --------------------------------------------------------------------------------------------

def _pool_inits(dtype):
    signed = dtype == I8
    return {"xs": np.float32(0.07), "xz": np.array(-5 if signed else 130, dtype), "ys": np.float32(0.03),
            "yz": np.array(6 if signed else 120, dtype)}


@pytest.mark.parametrize("last", [0, 1])
@pytest.mark.parametrize("dtype", [U8, I8])
def test_qlinear_global_average_pool(last, dtype) -> None:
    x = ints(dtype, 2, 13, 11, 3) if last else ints(dtype, 2, 3, 13, 11)
    node = helper.make_node("QLinearGlobalAveragePool", ["x", "xs", "xz", "ys", "yz"], ["y"], domain=MS,
                            channels_last=last)
    model = qmodel(node, {"x": x}, _pool_inits(dtype))
    (y,) = on_device(model, {"x": x})
    assert_ints(y, ort_outputs(model, {"x": x}, [dtype])[0], within=1, rare=0.05)


AVG_CASES = {
    "3x3 s1 p1": dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
    "3x3 s2 p1 include": dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], count_include_pad=1),
    "2x3 s2 ceil": dict(kernel_shape=[2, 3], strides=[2, 2], ceil_mode=1),
    "3x3 same_upper": dict(kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_UPPER"),
    "asymmetric include": dict(kernel_shape=[3, 2], pads=[0, 1, 2, 0], count_include_pad=1),
}


@pytest.mark.parametrize("name", sorted(AVG_CASES))
@pytest.mark.parametrize("last", [0, 1])
def test_qlinear_average_pool(name, last) -> None:
    dtype = I8 if last else U8
    x = ints(dtype, 2, 9, 11, 3) if last else ints(dtype, 2, 3, 9, 11)
    node = helper.make_node("QLinearAveragePool", ["x", "xs", "xz", "ys", "yz"], ["y"], domain=MS,
                            channels_last=last, **AVG_CASES[name])
    model = qmodel(node, {"x": x}, _pool_inits(dtype))
    (y,) = on_device(model, {"x": x})
    assert_ints(y, ort_outputs(model, {"x": x}, [dtype])[0], within=1, rare=0.05)


def test_qlinear_average_pool_1d_and_from_a_qdq_unit() -> None:
    x = ints(U8, 2, 3, 19)
    node = helper.make_node("QLinearAveragePool", ["x", "xs", "xz", "ys", "yz"], ["y"], domain=MS,
                            kernel_shape=[4], strides=[3], pads=[1, 2])
    on_device(qmodel(node, {"x": x}, _pool_inits(U8)), {"x": x})
    x = ints(I8, 1, 4, 10, 10)
    unit = _qdq_unit([helper.make_node("AveragePool", ["xf"], ["yf"], kernel_shape=[3, 3], strides=[2, 2])], x,
                     (0.05, -3), (0.04, 2))
    (y,) = on_device(unit, {"x": x}, ops=["QLinearAveragePool"])
    assert_ints(y, reference(unit, {"x": x})[0], within=1, rare=0.05)


@pytest.mark.parametrize("unit", ["Add", "Add+Relu", "Mul", "Concat", "GlobalAveragePool"])
def test_fused_qdq_units_run_on_opencl(unit) -> None:
    """Units of two quantized inputs (and the pools', the concat's) fused by the pass, then run on the device."""
    a, b = ints(U8, 2, 4, 5, 6), ints(U8, 2, 4, 5, 6)
    dq = [helper.make_node("DequantizeLinear", [n, f"{n}s", f"{n}z"], [f"{n}f"]) for n in "ab"]
    op = unit.split("+")[0]
    if op == "GlobalAveragePool":
        body = [helper.make_node(op, ["af"], ["yf"])]
    elif op == "Concat":
        body = [helper.make_node(op, ["af", "bf"], ["yf"], axis=1)]
    else:
        body = [helper.make_node(op, ["af", "bf"], ["sf" if "Relu" in unit else "yf"])]
    if "Relu" in unit:
        body.append(helper.make_node("Relu", ["sf"], ["yf"]))
    q = helper.make_node("QuantizeLinear", ["yf", "ys", "yz"], ["y"])
    inits = {"as": np.float32(0.02), "az": np.uint8(120), "bs": np.float32(0.03), "bz": np.uint8(131),
             "ys": np.float32(0.04 if op != "Mul" else 0.1), "yz": np.uint8(0 if "Relu" in unit else 125)}
    feeds = {"a": a, "b": b} if op != "GlobalAveragePool" else {"a": a}
    if op == "GlobalAveragePool":
        dq = dq[:1]
    model = make_model([*dq, *body, q], feeds, inits, 19)
    fused = {"Add": "QLinearAdd", "Mul": "QLinearMul", "Concat": "QLinearConcat",
             "GlobalAveragePool": "QLinearGlobalAveragePool"}[op]
    (y,) = on_device(model, feeds, ops=[fused])
    # (the pool's 8 outputs: one rounded apart by onnx.reference's float sums is 1/8 of them)
    assert_ints(y, reference(model, feeds)[0], within=1, rare=0.05 if op != "GlobalAveragePool" else 0.125)


# ---- MaxPool of integers ----------------------------------------------------------------------------------------

MAX_CASES = {
    "3x3 s2 p1": dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
    "2x2 dilated ceil": dict(kernel_shape=[2, 2], dilations=[2, 2], ceil_mode=1, strides=[2, 2]),
    "same_lower": dict(kernel_shape=[3, 2], auto_pad="SAME_LOWER"),
    "1-D": dict(kernel_shape=[3], strides=[2], pads=[1, 1]),
}


def _int_maxpool(x, attrs, ref_model):
    """INT_MAXPOOL bound to device tensors directly; and the model on the CPU backend."""
    with ctxrt.compile(ref_model, backend="cpu") as ctx:
        want = np.array(ctx.graph().run({"x": x})["y"])
    be = get_backend("opencl")
    spec = NodeSpec("MaxPool", "mp", attrs, [TensorSpec(x.shape, x.dtype)], [TensorSpec(want.shape, want.dtype)],
                    [None], 12)
    kernel = quant_ops.INT_MAXPOOL(spec, be)
    be.programs.prepare(kernel.programs, be.stats)
    bufs = [be.alloc_device(max(a.nbytes, 1)) for a in (x, want)]
    try:
        tx, ty = (be.view(b, 0, a.shape, a.dtype) for b, a in zip(bufs, (x, want), strict=True))
        be.copy_in(tx, x)
        kernel.bind([tx], [ty], [])()
        be.queue.finish()
        got = read(be, ty)
    finally:
        for b in bufs:
            b.release()
    np.testing.assert_array_equal(got, want)
    return got


@pytest.mark.parametrize("name", sorted(MAX_CASES))
@pytest.mark.parametrize("dtype", [U8, I8, I16])
def test_integer_maxpool(name, dtype) -> None:
    x = ints(dtype, 2, 3, 10, 9) if name != "1-D" else ints(dtype, 2, 3, 17)
    attrs = MAX_CASES[name]
    model = make_model(helper.make_node("MaxPool", ["x"], ["y"], **attrs), {"x": x}, opset=12)
    got = _int_maxpool(x, attrs, model)
    if "auto_pad" not in attrs:  # (onnx.reference pads integers with NaN there)
        np.testing.assert_array_equal(got, reference(model, {"x": x})[0])


def test_integer_maxpool_wired_for_a_qdq_unit(monkeypatch) -> None:
    """DQ -> MaxPool -> Q with one quantization (the pass's drop rule leaves MaxPool on int8): with window.py's
    MaxPool handing integer nodes to INT_MAXPOOL (as the lead wires it), the model runs on OpenCL alone."""
    be = get_backend("opencl")
    float_pool = be.kernels["MaxPool"]

    def dispatch(spec, backend=be):
        if np.dtype(spec.inputs[0].dtype).kind in "iu":
            return quant_ops.INT_MAXPOOL(spec, backend)
        return float_pool(spec)
    monkeypatch.setitem(be.kernels, "MaxPool", dispatch)
    x = ints(I8, 1, 4, 9, 9)
    unit = _qdq_unit([helper.make_node("MaxPool", ["xf"], ["yf"], kernel_shape=[3, 3], strides=[2, 2])], x,
                     (0.05, -3), (0.05, -3))
    (y,) = on_device(unit, {"x": x}, ops=["MaxPool"])
    assert_ints(y, reference(unit, {"x": x})[0], within=0)


# ---- data movement of int8 tensors ------------------------------------------------------------------------------

def test_int8_data_movement_runs_on_opencl() -> None:
    x = ints(I8, 2, 6, 4, 5)
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 3, 1]),
             helper.make_node("Reshape", ["t", "shape"], ["r"]),
             helper.make_node("Slice", ["r", "st", "en", "ax"], ["s"]),
             helper.make_node("Split", ["s"], ["p", "q"], axis=1, num_outputs=2),
             helper.make_node("Concat", ["q", "p"], ["c"], axis=1),
             helper.make_node("Gather", ["c", "idx"], ["g"], axis=1),
             helper.make_node("Unsqueeze", ["g", "one"], ["u"]),
             helper.make_node("Squeeze", ["u", "one"], ["sq"]),
             helper.make_node("Flatten", ["sq"], ["f"], axis=1),
             helper.make_node("Expand", ["f", "eshape"], ["e"]),
             helper.make_node("Tile", ["e", "reps"], ["tl"]),
             helper.make_node("Pad", ["tl", "pads", "pv"], ["y"])]
    inits = {"shape": np.int64([2, 20, 6]), "st": np.int64([1]), "en": np.int64([19]), "ax": np.int64([1]),
             "idx": np.int64([[0, 5], [17, 2]]), "one": np.int64([1]), "eshape": np.int64([3, 1, 1]),
             "reps": np.int64([1, 1, 2]), "pads": np.int64([0, 1, 0, 1, 2, 0]), "pv": np.array(-7, I8)}
    model = make_model(nodes, {"x": x}, inits, 18)
    (y,) = on_device(model, {"x": x})
    np.testing.assert_array_equal(y, reference(model, {"x": x})[0])
    x = ints(U8, 1, 8, 3, 5)
    nodes = [helper.make_node("DepthToSpace", ["x"], ["d"], blocksize=2, mode="CRD"),
             helper.make_node("SpaceToDepth", ["d"], ["y"], blocksize=2)]
    model = make_model(nodes, {"x": x}, {}, 18)
    (y,) = on_device(model, {"x": x})
    np.testing.assert_array_equal(y, reference(model, {"x": x})[0])


# ---- tuning: every candidate computes the default's bytes ---------------------------------------------------------

def _spec(op, attrs, arrays, outs, consts=()):
    return NodeSpec(op, op, attrs, [TensorSpec(a.shape, a.dtype) if a is not None else None for a in arrays],
                    [TensorSpec(shape, np.dtype(dt)) for shape, dt in outs],
                    [a if k in consts else None for k, a in enumerate(arrays)], 21)


def _cases():
    x8, f = ints(U8, 2, 3, 9, 11), rand(3, 301, low=-4, high=3)
    p = [np.float32(0.05), np.array(120, U8), np.float32(0.07), np.array(125, U8)]
    return {
        "Quantize": ([f, np.float32(0.03), np.array(-3, I8)],
                     _spec("QuantizeLinear", {}, [f, p[0], np.array(-3, I8)], [(f.shape, I8)])),
        "Dynamic": ([f], _spec("DynamicQuantizeLinear", {}, [f], [(f.shape, U8), ((), np.float32), ((), U8)])),
        "Binary": ([x8, p[0], p[1], x8[:, :1], p[2], p[3], p[2], p[1]],
                   _spec("QLinearAdd", {}, [x8, p[0], p[1], x8[:, :1], p[2], p[3], p[2], p[1]], [(x8.shape, U8)])),
        "AvgPool": ([x8, *p], _spec("QLinearAveragePool", {"kernel_shape": [3, 3], "strides": [2, 2],
                                                           "pads": [1, 1, 1, 1]}, [x8, *p], [((2, 3, 5, 6), U8)])),
        "MaxPool": ([x8], _spec("MaxPool", {"kernel_shape": [2, 3], "pads": [1, 0, 0, 1]}, [x8],
                                [((2, 3, 9, 10), U8)])),
    }


@pytest.mark.parametrize("name", ["Quantize", "Dynamic", "Binary", "AvgPool", "MaxPool"])
def test_every_candidate_computes_what_the_default_does(name) -> None:
    from ctxrt.tuning.profiler import Bench

    be = get_backend("opencl")
    inputs, spec = _cases()[name]
    factory = quant_ops.INT_MAXPOOL if spec.op == "MaxPool" else quant_ops.KERNELS[spec.op]
    default = factory(spec, be)
    cls = type(default)
    cands = list(cls.space.candidates(default.problem(), be.info))
    assert len(cands) > 1
    bench = Bench(be, default, [np.asarray(a) for a in inputs])
    try:
        want, _ = bench.run_once(bench.kernel(default.params))
        for params in [cands[0], cands[len(cands) // 2], cands[-1]]:
            kernel = bench.kernel(params)
            be.programs.prepare(kernel.programs, be.stats)
            got, event = bench.run_once(kernel)
            assert event is not None
            for g, w in zip(got, want, strict=True):
                np.testing.assert_array_equal(g, w, err_msg=str(params))
    finally:
        bench.close()


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("opset, axis", [(13, -1), (13, 1), (1, 1)])
def test_qlinear_softmax_on_the_device(dtype, opset, axis) -> None:
    """QLinearSoftmax (a QOperator model's): dequantized into scratch, the float Softmax, quantized, all on the
    device; within a step of the CPU backend (their exponentials' last bits differ) and of onnxruntime."""
    zp = np.array(128 if dtype == np.uint8 else 0, dtype)
    x = ints(dtype, 2, 3, 37)
    inits = {"xs": np.float32(0.05), "xz": zp, "ys": np.float32(1 / 256),
             "yz": np.array(0 if dtype == np.uint8 else -128, dtype)}
    model = qmodel(helper.make_node("QLinearSoftmax", ["x", "xs", "xz", "ys", "yz"], ["y"], domain=MS,
                                    opset=opset, axis=axis), {"x": x}, inits, opset=13)
    with ctxrt.compile(model, backend="cpu") as ctx:
        want = ctx.graph().run({"x": x})["y"]
    with ctxrt.compile(model, backend="opencl") as ctx:
        g = ctx.graph()
        assert [p["backend"] for p in g.partitions] == ["opencl"], g.partitions
        got = g.run({"x": x})["y"]
    assert_ints(got, want, within=1, rare=0.05)
    assert_ints(got, ort_outputs(model, {"x": x}, [dtype])[0], within=1, rare=0.05)
