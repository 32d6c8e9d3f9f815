"""onnxruntime's com.microsoft quantized ops against onnxruntime: QLinearAdd, QLinearMul, QLinearSigmoid,
QLinearLeakyRelu, QLinearConcat, QLinearSoftmax, QLinearGlobalAveragePool, QLinearAveragePool (within one step:
onnxruntime's vectorized loops and lookup tables may round a half-way value the other way), and MatMulNBits
(weights packed, dequantized per tile: never a float copy of the whole matrix)."""

from __future__ import annotations

import harness
import numpy as np
import pytest
from onnx import helper
from quant_helpers import MS, assert_ints, ints, ort_outputs, qmodel, run

import ctxrt

T8 = [np.uint8, np.int8]


def _zp(dt: object, value: int) -> np.ndarray:
    return np.array(value if np.dtype(dt).kind == "u" else value - 128, dt)


def _check(node: helper.NodeProto, feeds: dict[str, np.ndarray], inits: dict[str, np.ndarray], dt: object,
           within: int = 1, rare: float = 0.05) -> np.ndarray:
    model = qmodel(node, feeds, inits, opset=13)
    got = run(model, feeds)[0]
    assert_ints(got, ort_outputs(model, feeds, [dt])[0], within=within, rare=rare)
    return got


@pytest.mark.parametrize("dt", T8, ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("op", ["QLinearAdd", "QLinearMul"])
@pytest.mark.parametrize("shapes", [((3, 4, 5), (3, 4, 5)), ((3, 4, 5), (4, 1)), ((1, 5), (3, 1, 1)), ((6,), ())])
@pytest.mark.parametrize("zero_points", [True, False])
def test_binary(dt: object, op: str, shapes: tuple[tuple[int, ...], ...], zero_points: bool) -> None:
    a, b = ints(dt, *shapes[0]), ints(dt, *shapes[1])
    inits = {"as": np.float32(0.03), "az": _zp(dt, 7), "bs": np.float32(0.05), "bz": _zp(dt, 200),
             "cs": np.float32(0.07 if op == "QLinearAdd" else 0.4), "cz": _zp(dt, 130)}
    names = ["a", "as", "az", "b", "bs", "bz", "cs", "cz"]
    if zero_points:
        _check(helper.make_node(op, names, ["c"], domain=MS), {"a": a, "b": b}, inits, dt)
        return
    # onnxruntime cannot type the node without zero points: its oracle is the same node with zero points of 0
    feeds = {"a": a, "b": b}
    without = qmodel(helper.make_node(op, ["a", "as", "", "b", "bs", "", "cs"], ["c"], domain=MS), feeds, inits, 13)
    zeros = inits | {k: np.zeros((), dt) for k in ("az", "bz", "cz")}
    want = ort_outputs(qmodel(helper.make_node(op, names, ["c"], domain=MS), feeds, zeros, 13), feeds, [dt])[0]
    assert_ints(run(without, feeds)[0], want, within=1, rare=0.05)


@pytest.mark.parametrize("dt", T8, ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("op,attrs", [("QLinearSigmoid", {}), ("QLinearLeakyRelu", {"alpha": 0.1}),
                                      ("QLinearLeakyRelu", {"alpha": 1.5})])
def test_lookup_activations(dt: object, op: str, attrs: dict) -> None:
    x = np.arange(256).astype(np.uint8).view(np.dtype(dt)).reshape(4, 64)  # every input value
    inits = {"xs": np.float32(0.05), "xz": _zp(dt, 131), "ys": np.float32(1 / 256 if op == "QLinearSigmoid" else 0.04),
             "yz": _zp(dt, 0 if op == "QLinearSigmoid" else 100)}
    _check(helper.make_node(op, ["x", "xs", "xz", "ys", "yz"], ["y"], domain=MS, **attrs), {"x": x}, inits, dt)


@pytest.mark.parametrize("dt", T8, ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("axis", [1, -2, 0])
def test_concat(dt: object, axis: int) -> None:
    shapes = [(3, 4, 5), (3, 4, 5), (3, 4, 5)]
    xs = [ints(dt, *s) for s in shapes]
    inits = {"ys": np.float32(0.05), "yz": _zp(dt, 128)}
    names = ["ys", "yz"]
    for k, (scale, zp) in enumerate([(0.04, 120), (0.05, 128), (0.09, 3)]):
        inits |= {f"s{k}": np.float32(scale), f"z{k}": _zp(dt, zp)}
        names += [f"x{k}", f"s{k}", f"z{k}"]
    _check(helper.make_node("QLinearConcat", names, ["y"], domain=MS, axis=axis),
           {f"x{k}": x for k, x in enumerate(xs)}, inits, dt)


@pytest.mark.parametrize("dt", T8, ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("opset,axis", [(13, -1), (13, 1), (12, 1), (12, 2)])
def test_softmax(dt: object, opset: int, axis: int) -> None:
    """Scale 1/256 with zero point 0 (uint8) or -128 (int8), as the quantizer writes; onnxruntime wraps an int8
    softmax of exactly 1.0 to -128 (ctxrt saturates to 127): inputs keep every row's maximum below 1.0."""
    x = ints(dt, 2, 3, 16)
    inits = {"xs": np.float32(0.02), "xz": _zp(dt, 128), "ys": np.float32(1 / 256), "yz": _zp(dt, 0)}
    _check(helper.make_node("QLinearSoftmax", ["x", "xs", "xz", "ys", "yz"], ["y"], domain=MS, opset=opset, axis=axis),
           {"x": x}, inits, dt)


@pytest.mark.parametrize("dt", T8, ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("channels_last", [0, 1])
@pytest.mark.parametrize("shape", [(2, 3, 6, 7), (1, 4, 5), (1, 2, 3, 4, 5)])
def test_global_average_pool(dt: object, channels_last: int, shape: tuple[int, ...]) -> None:
    x = ints(dt, *shape)
    inits = {"xs": np.float32(0.05), "xz": _zp(dt, 131), "ys": np.float32(0.03), "yz": _zp(dt, 120)}
    _check(helper.make_node("QLinearGlobalAveragePool", ["x", "xs", "xz", "ys", "yz"], ["y"], domain=MS,
                            channels_last=channels_last), {"x": x}, inits, dt, within=0)


POOLS = {"2d pads": ((2, 3, 9, 8), dict(kernel_shape=[3, 2], pads=[1, 0, 1, 1], strides=[2, 1])),
         "2d include pad": ((1, 2, 7, 7), dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1], count_include_pad=1)),
         "2d ceil": ((1, 2, 8, 8), dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)),
         "1d": ((2, 3, 11), dict(kernel_shape=[3], strides=[2], pads=[1, 1])),
         "3d": ((1, 2, 5, 6, 4), dict(kernel_shape=[2, 3, 2], strides=[1, 2, 2]))}


@pytest.mark.parametrize("dt", T8, ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("case", POOLS)
@pytest.mark.parametrize("channels_last", [0, 1])
def test_average_pool(dt: object, case: str, channels_last: int) -> None:
    shape, attrs = POOLS[case]
    if channels_last:
        shape = (shape[0], *shape[2:], shape[1])
    x = ints(dt, *shape)
    inits = {"xs": np.float32(0.05), "xz": _zp(dt, 131), "ys": np.float32(0.03), "yz": _zp(dt, 120)}
    _check(helper.make_node("QLinearAveragePool", ["x", "xs", "xz", "ys", "yz"], ["y"], domain=MS,
                            channels_last=channels_last, **attrs), {"x": x}, inits, dt)


def _pack(q: np.ndarray, bits: int) -> np.ndarray:
    per = 8 // bits
    q = q.reshape(*q.shape[:-1], -1, per).astype(np.uint8)
    out = np.zeros(q.shape[:-1], np.uint8)
    for j in range(per):
        out |= q[..., j] << (j * bits)
    return out


NBITS = {"4-bit K 40 of 16": (4, 40, 5, 16), "4-bit K 64 of 32": (4, 64, 6, 32), "4-bit K 33 of 32": (4, 33, 3, 32),
         "8-bit": (8, 70, 4, 16), "2-bit": (2, 50, 3, 16)}


@pytest.mark.parametrize("case", NBITS)
@pytest.mark.parametrize("zero_points", ["none", "packed", "float"])
@pytest.mark.parametrize("dt", [np.float32, np.float16])
def test_matmul_nbits(case: str, zero_points: str, dt: object) -> None:
    """Against the definition ((q - zero_point) * scale per block, in float64) and onnxruntime (which has no
    8-bit weights with float zero points)."""
    bits, k, n, block = NBITS[case]
    kb = -(-k // block)
    q = harness.RNG.integers(0, 1 << bits, (n, kb * block))
    a = harness.rand(2, 3, k).astype(dt)
    inits = {"b": _pack(q, bits).reshape(n, kb, block * bits // 8),
             "s": harness.rand(n, kb, low=0.01, high=0.1).astype(dt), "bias": harness.rand(n).astype(dt)}
    names = ["a", "b", "s", "z" if zero_points != "none" else "", "", "bias"]
    zp = np.full((n, kb), 1 << (bits - 1), np.float64)
    if zero_points == "packed":
        zq = harness.RNG.integers(0, 1 << bits, (n, -(-kb * bits // 8) * (8 // bits)))
        inits["z"], zp = _pack(zq, bits), zq[:, :kb].astype(np.float64)
    elif zero_points == "float":
        inits["z"] = harness.rand(n, kb, low=0.0, high=(1 << bits) - 1.0).astype(dt)
        zp = inits["z"].astype(np.float64)
    node = helper.make_node("MatMulNBits", names, ["y"], domain=MS, K=k, N=n, bits=bits, block_size=block)
    model = qmodel(node, {"a": a}, inits)
    got = run(model, {"a": a})[0]
    assert got.dtype == np.dtype(dt)
    w = ((q.reshape(n, kb, block) - zp[:, :, None]) * inits["s"].astype(np.float64)[:, :, None]).reshape(n, -1)[:, :k]
    want = a.astype(np.float64) @ w.T + inits["bias"].astype(np.float64)
    tol = 2e-3 if dt == np.float16 else 1e-5
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=tol, atol=tol)
    if not (bits == 8 and zero_points == "float"):
        ort = ort_outputs(model, {"a": a}, [dt])[0]  # (its own float32 sums: a sum that cancels to ~0.1 from terms
        # of ~60 differs by ~1e-5 from ctxrt's, which is the nearer to the exact one above)
        scale = max(1.0, float(np.abs(want).max()))
        np.testing.assert_allclose(got.astype(np.float32), ort.astype(np.float32), rtol=tol, atol=tol * scale)


def test_matmul_nbits_keeps_weights_packed() -> None:
    """A 4096 x 4096 4-bit matrix: 8 MiB packed in the weights section; a float copy would be 64 MiB. The
    kernel's scratch holds one tile of it (1 MiB), the arena no whole float copy either."""
    k = n = 4096
    block = 64
    b = harness.RNG.integers(0, 256, (n, k // block, block // 2)).astype(np.uint8)
    inits = {"b": b, "s": harness.rand(n, k // block, low=0.001, high=0.01)}
    a = harness.rand(1, k)
    node = helper.make_node("MatMulNBits", ["a", "b", "s"], ["y"], domain=MS, K=k, N=n, bits=4, block_size=block)
    with ctxrt.compile(qmodel(node, {"a": a}, inits), backend=harness.BACKEND) as ctx:
        mem = ctx.memory()
        assert mem["weights"] < k * n // 2 + 2 * n * (k // block) * 4 + 4096
        assert mem["spillfill"] + mem["kernel"] < 4 << 20
        y = ctx.graph().run({"a": a})["y"]
    np.testing.assert_allclose(y, ort_outputs(qmodel(node, {"a": a}, inits), {"a": a}, [np.float32])[0],
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dt", T8, ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("op", ["QLinearAdd", "QLinearMul"])
@pytest.mark.parametrize("b_kind", ["fed", "fed row", "const", "bias", "scalar"])
@pytest.mark.parametrize("zero_points", [True, False])
def test_qlinear_binary_native_equals_numpy(dt: object, op: str, b_kind: str, zero_points: bool,
                                            monkeypatch) -> None:
    """The native QLinearAdd / QLinearMul (csrc/qelem.c) run the NumPy kernel's float32 operations in the same
    order: the same bytes, saturation and half-way values included (scales chosen so that many results land on .5).
    Native where B has the output's shape, one value, or one per position of the last axis (fed or constant: an
    attention mask, a bias, a squeeze-and-excitation scale in channels-last)."""
    from ctxrt.backends.cpu import native
    from ctxrt.backends.cpu.quant import elementwise

    if native.library() is None:
        pytest.skip("the native extension is not built here")
    b_shape = {"bias": (257,), "fed row": (257,), "scalar": ()}.get(b_kind, (64, 257))
    a, b = ints(dt, 64, 257), ints(dt, *b_shape)
    inits = {"as": np.float32(0.5), "az": _zp(dt, 7), "bs": np.float32(0.25), "bz": _zp(dt, 200),
             "cs": np.float32(0.5 if op == "QLinearAdd" else 8.0), "cz": _zp(dt, 130)}
    names = ["a", "as", "az", "b", "bs", "bz", "cs", "cz"] if zero_points else ["a", "as", "", "b", "bs", "", "cs"]
    b_const = not b_kind.startswith("fed")
    feeds = {"a": a} if b_const else {"a": a, "b": b}
    model = qmodel(helper.make_node(op, names, ["c"], domain=MS), feeds,
                   {**inits, **({"b": b} if b_const else {})}, opset=13)
    used = []
    real = elementwise._native_add
    monkeypatch.setattr(elementwise, "_native_add", lambda *args: used.append(real(*args)) or used[-1])
    got = harness.run_ctxrt(model, feeds, "cpu")[0]
    assert used and all(u is not None for u in used)
    monkeypatch.setattr(elementwise, "_native_add", lambda *args: None)
    np.testing.assert_array_equal(got, harness.run_ctxrt(model, feeds, "cpu")[0])


@pytest.mark.parametrize("dt", T8, ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("axis", [0, 1, 2, 3])
@pytest.mark.parametrize("fed", [False, True], ids=["constant parameters", "fed parameters"])
def test_qlinear_concat_native_equals_numpy(dt: object, axis: int, fed: bool, monkeypatch) -> None:
    """The native QLinearConcat (a 256-byte table per part, csrc/qelem.c's ctxrt_lut8) gives the NumPy kernel's
    bytes: every input value, saturation, half-way values, a part whose parameters equal the output's (a copy),
    along every axis; parameters fed at run time are read at each run (a second run with other scales)."""
    from ctxrt.backends.cpu import native
    from ctxrt.backends.cpu.quant import elementwise

    if native.library() is None:
        pytest.skip("the native extension is not built here")
    x0 = np.arange(256).astype(np.uint8).view(np.dtype(dt)).reshape(2, 4, 8, 4)  # every value
    xs = [x0, ints(dt, *[3 if a == axis else d for a, d in enumerate(x0.shape)]), ints(dt, *x0.shape)]
    params = {"ys": np.float32(0.5), "yz": _zp(dt, 128), "s0": np.float32(0.25), "z0": _zp(dt, 7),
              "s1": np.float32(0.5), "z1": _zp(dt, 128), "s2": np.float32(3.0), "z2": _zp(dt, 200)}
    names = ["ys", "yz", "x0", "s0", "z0", "x1", "s1", "z1", "x2", "s2", "z2"]
    feeds = {f"x{k}": x for k, x in enumerate(xs)}
    model = qmodel(helper.make_node("QLinearConcat", names, ["y"], domain=MS, axis=axis),
                   {**feeds, **{k: np.asarray(v) for k, v in params.items()}} if fed else feeds,
                   {} if fed else params, opset=13)
    other = {**params, "s0": np.float32(0.125), "ys": np.float32(0.75)}
    used = []
    real = elementwise._native_concat
    monkeypatch.setattr(elementwise, "_native_concat", lambda *args: used.append(real(*args)) or used[-1])
    runs = [{**feeds, **{k: np.asarray(v) for k, v in p.items()}} for p in (params, other)] if fed else [feeds]
    sess = ctxrt.InferenceSession(model.SerializeToString())
    got = [sess.run(None, f)[0] for f in runs]
    assert used and all(u is not None for u in used)
    monkeypatch.setattr(elementwise, "_native_concat", lambda *args: None)
    sess = ctxrt.InferenceSession(model.SerializeToString())
    for f, g in zip(runs, got, strict=True):
        np.testing.assert_array_equal(g, sess.run(None, f)[0])
    if fed:
        assert not np.array_equal(got[0], got[1])


GATHER_BQ = {"4-bit K 64 of 32": (4, (10, 32), 32), "4-bit K 40 of 16, rank 3": (4, (6, 3, 20), 16),
             "8-bit K 48 of 16": (8, (7, 48), 16), "2-bit K 64 of 16": (2, (9, 16), 16),
             "4-bit K 160 of 128": (4, (5, 80), 128)}


@pytest.mark.parametrize("case", GATHER_BQ)
@pytest.mark.parametrize("zero_points", [False, True])
@pytest.mark.parametrize("dt", [np.float32, np.float16])
def test_gather_block_quantized(case: str, zero_points: bool, dt: object) -> None:
    """The tied, quantized embedding of onnxruntime-genai's int4 Gemma: rows gathered and dequantized, negative
    indices from the end and indices out of range as rows of zeros, against onnxruntime."""
    bits, shape, block = GATHER_BQ[case]
    k = shape[-1] * (8 // bits)
    nb = -(-k // block)
    inits = {"data": harness.RNG.integers(0, 256, shape).astype(np.uint8),
             "s": harness.rand(*shape[:-1], nb, low=0.01, high=0.1).astype(dt)}
    if zero_points:
        inits["z"] = harness.RNG.integers(0, 256, (*shape[:-1], -(-nb * bits // 8))).astype(np.uint8)
    ids = np.array([[0, shape[0] - 1, -1], [3, -shape[0], shape[0] + 2]], np.int64)
    node = helper.make_node("GatherBlockQuantized", ["data", "ids", "s", "z" if zero_points else ""], ["y"],
                            domain=MS, bits=bits, block_size=block, gather_axis=0, quantize_axis=len(shape) - 1)
    model = qmodel(node, {"ids": ids}, inits)
    got = run(model, {"ids": ids})[0]
    want = ort_outputs(model, {"ids": ids}, [dt])[0]
    assert got.shape == want.shape == (2, 3, *shape[1:-1], k) and got.dtype == np.dtype(dt)
    np.testing.assert_array_equal(got, want)
    assert not got[1, 2].any()  # out of range: zeros


@pytest.mark.parametrize("op", ["QLinearAdd", "QLinearMul"])
def test_qlinear_binary_with_a_scalar_first_operand_is_native(op: str, monkeypatch) -> None:
    """A one-value A (the quantizer's GELU: Mul(0.5, x)) against a full B: the operands swapped for the native
    kernel (+ and x commute exactly in IEEE arithmetic), the NumPy kernel's bytes."""
    from ctxrt.backends.cpu import native
    from ctxrt.backends.cpu.quant import elementwise

    if native.library() is None:
        pytest.skip("the native extension is not built here")
    b = ints(np.uint8, 64, 257)
    inits = {"a": np.uint8(200), "as": np.float32(0.5), "az": np.uint8(7), "bs": np.float32(0.25),
             "bz": np.uint8(100), "cs": np.float32(0.5), "cz": np.uint8(130)}
    model = qmodel(helper.make_node(op, ["a", "as", "az", "b", "bs", "bz", "cs", "cz"], ["c"], domain=MS),
                   {"b": b}, inits, opset=13)
    used = []
    real = elementwise._native_add
    monkeypatch.setattr(elementwise, "_native_add", lambda *args: used.append(real(*args)) or used[-1])
    got = harness.run_ctxrt(model, {"b": b}, "cpu")[0]
    assert used[-1] is not None
    monkeypatch.setattr(elementwise, "_native_add", lambda *args: None)
    np.testing.assert_array_equal(got, harness.run_ctxrt(model, {"b": b}, "cpu")[0])


@pytest.mark.parametrize("dt", T8, ids=lambda t: np.dtype(t).name)
def test_fed_parameters_read_by_native_launches_in_a_batch(dt: object, monkeypatch) -> None:
    """QuantizeLinear, QLinearAdd, QLinearMul, QLinearGlobalAveragePool and DequantizeLinear with their scales and
    zero points fed at run time run as native launches (the kernels read the parameters themselves, so a graph
    replays them in one batch): each run reads the values fed then (a second run with other scales differs), the
    bytes the NumPy kernels give."""
    from ctxrt.backends.cpu import native

    if native.library() is None:
        pytest.skip("the native extension is not built here")
    x = harness.rand(1, 6, 5, 7, low=-3, high=3)
    nodes = [helper.make_node("QuantizeLinear", ["x", "s0", "z0"], ["q"]),
             helper.make_node("QLinearAdd", ["q", "s0", "z0", "q", "s1", "z1", "s2", "z2"], ["a"], domain=MS),
             helper.make_node("QLinearMul", ["a", "s2", "z2", "q", "s0", "z0", "s1", "z1"], ["m"], domain=MS),
             helper.make_node("QLinearGlobalAveragePool", ["m", "s1", "z1", "s0", "z0"], ["p"], domain=MS),
             helper.make_node("DequantizeLinear", ["p", "s0", "z0"], ["y"])]
    params = {"s0": np.float32(0.03), "z0": _zp(dt, 120), "s1": np.float32(0.05), "z1": _zp(dt, 140),
              "s2": np.float32(0.07), "z2": _zp(dt, 100)}
    feeds = {"x": x, **{k: np.asarray(v) for k, v in params.items()}}
    model = qmodel(nodes, feeds, {}, opset=13)
    other = {**feeds, "s0": np.asarray(np.float32(0.02)), "z1": np.asarray(_zp(dt, 130))}
    with ctxrt.compile(model, backend="cpu") as ctx:
        g = ctx.graph()
        got = [np.array(g.run(f)["y"]) for f in (feeds, other)]
        assert all(getattr(launch, "native", None) for launch in g._launches if launch is not None)
    assert not np.array_equal(got[0], got[1])
    monkeypatch.setattr(native, "read_params", lambda src, params: False)  # the NumPy kernels
    with ctxrt.compile(model, backend="cpu") as ctx:
        g = ctx.graph()
        assert not any(getattr(launch, "native", None) for launch in g._launches if launch is not None)
        for f, y in zip((feeds, other), got, strict=True):
            np.testing.assert_array_equal(y, g.run(f)["y"])
