"""oneDNN's int8 primitives for the integer ops QDQ units become (ir/passes/qdq.py) and quantized models write:
QLinearMatMul and QGemm with constant int8 weights (matmul), QLinearConv (convolution). Scales and zero points are
runtime arguments of the primitive (per-tensor, the weights' scales per output channel); the requantization
(x_scale * w_scale / y_scale, rounded to even, plus the output zero point, saturated) happens in its epilogue, the
int32 bias going in as float at scale x_scale * w_scale, where oneDNN 3.x adds it.

The weights stay in the binary as the model gives them (int8, ONNX's layout): oneDNN's int8 weights formats carry
compensation data and have no portable tag, so each kernel prepacks them when it is built, into memory of its own
(kernel-private bytes, the weights' size). oneDNN's int8 convolutions run in NHWC (on NCHW it has only its reference
kernel): the layout pass (ir/passes/layout.py) keeps a QDQ model's 8-bit activations NHWC between them; an input or
output left NCHW (a network's first convolution reads the quantized image as given) is reordered into planned
scratch or out of it in the same launch.

oneDNN on AVX2 without VNNI sums pairs of u8 x s8 products in saturating int16 (as onnxruntime's kernels do there):
without VNNI these kernels take weights in [-64, 64] only (reduce_range's 7-bit weights), where the sums are exact;
others stay with the NumPy integer kernels. s8 activations (shifted to u8 inside oneDNN, with a compensation) came
out steps off with zero points and padding: u8 only.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from ctxrt.backends.cpu.onednn import api
from ctxrt.backends.cpu.onednn.kernels import OneDnnKernel, _layouts, _window, create, reject_reference, reorder_maker
from ctxrt.backends.kernel import Kernel, NodeSpec
from ctxrt.errors import UnsupportedOpError
from ctxrt.ir.layouts import PLAIN

_TYPES = {np.dtype(np.uint8): api.U8, np.dtype(np.int8): api.S8}
_SCALE, _ZP = api.ARG_ATTR_SCALES, api.ARG_ATTR_ZERO_POINTS


class _Params:
    """The node's quantization parameters, checked, as the arrays a primitive reads at run time."""

    def __init__(self, spec: NodeSpec, at: dict[str, int], channels: int) -> None:
        what = f"{spec.op} {spec.name!r}"
        for key in ("x_scale", "w", "w_scale", "y_scale"):
            if at[key] >= len(spec.consts) or spec.consts[at[key]] is None:
                raise UnsupportedOpError(f"{what}: oneDNN int8 kernels need constant weights and scales")
        c = {k: (spec.consts[i] if i is not None and i < len(spec.consts) else None) for k, i in at.items()}
        given = {k: i is not None and i < len(spec.inputs) and spec.inputs[i] is not None for k, i in at.items()}
        for key in ("x_zp", "w_zp", "y_zp"):
            if given[key] and c[key] is None:
                raise UnsupportedOpError(f"{what}: oneDNN int8 kernels need constant zero points")
        x, y = np.dtype(spec.inputs[at["x"]].dtype), np.dtype(spec.outputs[0].dtype)
        # s8 inputs are shifted to u8 inside oneDNN (compensation); measured off by steps with zero points: u8 only
        if x != np.uint8 or y not in _TYPES or np.dtype(c["w"].dtype) != np.int8:
            raise UnsupportedOpError(f"{what}: oneDNN int8 kernels here take u8 activations and s8 weights")
        if not api.has_vnni() and np.abs(c["w"].astype(np.int16)).max(initial=0) > 64:
            raise UnsupportedOpError(f"{what}: weights beyond [-64, 64] would saturate oneDNN's int16 pair sums "
                                     "without VNNI (quantize with reduce_range): left to the exact NumPy kernel")
        if c["w_zp"] is not None and np.any(c["w_zp"]):
            raise UnsupportedOpError(f"{what}: oneDNN int8 kernels need symmetric weights (zero point 0)")
        if any(c[k].size != 1 for k in ("x_scale", "y_scale")) or c["w_scale"].size not in (1, channels) or any(
                c[k] is not None and c[k].size != 1 for k in ("x_zp", "y_zp")):
            raise UnsupportedOpError(f"{what}: oneDNN int8 kernels take per-tensor activations' parameters")
        self.x, self.y, self.weights = x, y, c["w"]
        self.per_channel = c["w_scale"].size > 1
        f32, s32 = np.float32, np.int32
        self.x_scale, self.w_scale = c["x_scale"].astype(f32).reshape(1), c["w_scale"].astype(f32).reshape(-1)
        self.y_scale = c["y_scale"].astype(f32).reshape(1)
        self.zps = {arg: c[k].astype(s32).reshape(1) for arg, k in ((api.ARG_SRC, "x_zp"), (api.ARG_DST, "y_zp"))
                    if c[k] is not None and np.any(c[k])}
        bias = c.get("bias")
        if given.get("bias") and bias is None:
            raise UnsupportedOpError(f"{what}: oneDNN int8 kernels need a constant bias")
        # oneDNN adds the bias after scaling the int32 sums by x_scale * w_scale: the int32 bias at that scale
        self.bias = None if bias is None else (bias.astype(np.float64).reshape(-1) * self.x_scale.astype(np.float64)
                                               * self.w_scale.astype(np.float64)).astype(f32)
        if self.bias is not None and self.bias.size != channels:
            raise UnsupportedOpError(f"{what}: the bias must have one value per output channel")

    def attr(self, weights_mask: int) -> api.Attr:
        return api.Attr(scales={api.ARG_SRC: 0, api.ARG_WEIGHTS: weights_mask if self.per_channel else 0,
                                api.ARG_DST: 0}, zero_points=dict.fromkeys(self.zps, 0))

    def held(self, packed: np.ndarray) -> tuple[list[np.ndarray], list[tuple[int, str, int, api.Desc]]]:
        """(arrays, their execution arguments): the prepacked weights, the bias, the scales, the zero points."""
        arrays, args = [packed], []
        if self.bias is not None:
            arrays.append(self.bias)
            args.append((api.ARG_BIAS, "held", 1, api.Desc.make((1, self.bias.size), "ab")))
        for arg, array in ((api.ARG_SRC, self.x_scale), (api.ARG_WEIGHTS, self.w_scale), (api.ARG_DST, self.y_scale)):
            args.append((_SCALE | arg, "held", len(arrays), api.Desc.make((array.size,), "a")))
            arrays.append(array)
        for arg, array in self.zps.items():
            args.append((_ZP | arg, "held", len(arrays), api.Desc.make((1,), "a", api.S32)))
            arrays.append(array)
        return arrays, args


def _prepack(weights: np.ndarray, dims: tuple[int, ...], tag: str, to: api.Desc) -> np.ndarray:
    """int8 weights in `tag` over `dims` reordered into the primitive's format (with its compensation data)."""
    src = np.ascontiguousarray(weights, np.int8)
    out = np.zeros(to.nbytes, np.int8)
    plain = api.Desc.make(dims, tag, api.S8)
    prim = api.reorder(plain, to)
    args = [(api.ARG_FROM, api.Memory(plain, src.ctypes.data)), (api.ARG_TO, api.Memory(to, out.ctypes.data))]
    pad = np.zeros(prim.scratchpad_bytes, np.uint8)  # once, when built (compensation sums)
    if pad.size:
        args.append((api.ARG_SCRATCHPAD, api.Memory(prim.md(api.Q_SCRATCHPAD_MD), pad.ctypes.data)))
    prim.launch(args)()
    return out


def qmatmul(spec: NodeSpec) -> Kernel:
    """QLinearMatMul, and QGemm with a quantized output (alpha 1, A not transposed)."""
    api.require(f"{spec.op} {spec.name!r}")
    gemm = spec.op == "QGemm"
    at = {"x": 0, "x_scale": 1, "x_zp": 2, "w": 3, "w_scale": 4, "w_zp": 5, "bias": 6 if gemm else None,
          "y_scale": 7 if gemm else 6, "y_zp": 8 if gemm else 7}
    what = f"{spec.op} {spec.name!r}"
    if gemm and (spec.attr("transA", 0) or float(spec.attr("alpha", 1.0)) != 1.0 or len(spec.inputs) < 9
                 or spec.inputs[8] is None):
        raise UnsupportedOpError(f"{what}: oneDNN here runs QGemm with alpha 1, A as given and a quantized output")
    a, b = spec.inputs[0], spec.inputs[3]
    if len(b.shape) != 2 or len(a.shape) < 2:
        raise UnsupportedOpError(f"{what}: oneDNN here multiplies activations by 2-D weights")
    transposed = bool(spec.attr("transB", 0)) if gemm else False
    n, k = b.shape if transposed else b.shape[::-1]
    rows = math.prod(a.shape[:-1])
    if a.shape[-1] != k:
        raise UnsupportedOpError(f"{what}: inner dimensions differ")
    p = _Params(spec, at, n)
    src_md, dst_md = api.Desc.make((rows, k), "ab", _TYPES[p.x]), api.Desc.make((rows, n), "ab", _TYPES[p.y])
    bias_md = api.Desc.make((1, n), "ab") if p.bias is not None else None
    attr = p.attr(1 << 1)

    def make(nthr: int | None = None) -> api.Primitive:
        w_md = api.Desc.make((k, n), api.TAG_ANY, api.S8)
        return create(spec, "matmul", src_md.handle, w_md.handle, bias_md.handle if bias_md else None, dst_md.handle,
                      attr=attr, nthr=nthr)

    prim = make()
    reject_reference(prim, spec)
    w_md = prim.md(api.Q_WEIGHTS_MD)
    if spec.options.get("probe"):
        packed = np.zeros(0, np.int8)
    else:
        packed = _prepack(p.weights, (k, n), "ba" if transposed else "ab", w_md)
    held, extra = p.held(packed)
    args = [(api.ARG_SRC, "in", 0, src_md), (api.ARG_WEIGHTS, "held", 0, w_md), (api.ARG_DST, "out", 0, dst_md),
            *extra]
    kernel = OneDnnKernel(spec, prim, args, "int8_matmul", variant=make)
    kernel.held = held
    return kernel


class _IntegerMatMul(OneDnnKernel):
    """MatMulInteger (ConvInteger) on oneDNN's u8 x s8 -> s32 matmul (convolution): A's zero point (a run-time
    input, u8) copied as int32 into the held value the primitive reads before each launch."""

    zp_input: int | None = None  # input position of A's run-time zero point

    def bind(self, ins: list[Any], outs: list[Any], scratch: list[Any]) -> Callable[[], None]:
        run = super().bind(ins, outs, scratch)
        if self.zp_input is None:
            return run
        src, dst = ins[self.zp_input].reshape(1), self.held[1]

        def launch() -> None:
            np.copyto(dst, src)  # u8 -> int32, no scalar object made per run
            run()
        return launch


def _integer_checks(spec: NodeSpec, what: str, terms: int) -> bool:
    """MatMulInteger's and ConvInteger's conditions for oneDNN (VNNI, constant s8 weights with zero point 0, A's
    zero point per tensor, `terms` products a sum that int32 holds); whether A has a zero point."""
    if not api.has_vnni():
        raise UnsupportedOpError(f"{what}: without VNNI oneDNN's int8 sums saturate: the exact kernel runs")
    wzp = spec.consts[3] if len(spec.consts) > 3 else None
    if len(spec.inputs) > 3 and spec.inputs[3] is not None and (wzp is None or np.any(wzp)):
        raise UnsupportedOpError(f"{what}: oneDNN int8 kernels need symmetric weights (zero point 0)")
    has_zp = len(spec.inputs) > 2 and spec.inputs[2] is not None
    if has_zp and math.prod(spec.inputs[2].shape) != 1:
        raise UnsupportedOpError(f"{what}: the activations' zero point must be per tensor")
    if terms * 255 * 128 >= 2**31:  # the int32 sums (the zero point subtracted after) could wrap
        raise UnsupportedOpError(f"{what}: {terms} products a sum: int32 sums could overflow")
    return has_zp


def _integer_kernel(spec: NodeSpec, prim: api.Primitive, args: list[Any], packed: np.ndarray, has_zp: bool,
                    algorithm: str, make: Callable[..., api.Primitive]) -> _IntegerMatMul:
    """The kernel of MatMulInteger's or ConvInteger's primitive: the prepacked weights held, and A's zero point (a
    constant, or the run-time input 2 copied in before each launch) as the primitive's int32 value."""
    zp = np.zeros(1, np.int32)
    const_zp = spec.consts[2] if has_zp and len(spec.consts) > 2 else None
    if const_zp is not None:
        zp[0] = int(const_zp.reshape(-1)[0])
    if has_zp:
        args = [*args, (_ZP | api.ARG_SRC, "held", 1, api.Desc.make((1,), "a", api.S32))]
    kernel = _IntegerMatMul(spec, prim, args, algorithm, variant=make)
    kernel.held = [packed, zp]
    kernel.zp_input = 2 if has_zp and const_zp is None else None
    return kernel


def matmul_integer(spec: NodeSpec) -> Kernel:
    """MatMulInteger of u8 A by constant s8 B (zero point 0) where oneDNN has VNNI: its int32 sums of u8 x s8
    products are exact there (without VNNI it sums pairs in saturating int16: csrc/qelem.c's exact GEMM runs
    instead). A's zero point per tensor, a constant or a run-time input (DynamicQuantizeLinear's)."""
    api.require(f"{spec.op} {spec.name!r}")
    what = f"{spec.op} {spec.name!r}"
    a = spec.inputs[0]
    w = spec.consts[1] if len(spec.consts) > 1 else None
    if np.dtype(a.dtype) != np.uint8 or w is None or w.dtype != np.int8 or w.ndim != 2 or len(a.shape) < 2 or \
            a.shape[-1] != w.shape[0] or np.dtype(spec.outputs[0].dtype) != np.int32:
        raise UnsupportedOpError(f"{what}: oneDNN here multiplies u8 activations by constant 2-D s8 weights")
    k, n = (int(d) for d in w.shape)
    has_zp = _integer_checks(spec, what, k)
    rows = math.prod(a.shape[:-1])
    src_md, dst_md = api.Desc.make((rows, k), "ab", api.U8), api.Desc.make((rows, n), "ab", api.S32)
    attr = api.Attr(zero_points={api.ARG_SRC: 0} if has_zp else None)

    def make(nthr: int | None = None) -> api.Primitive:
        w_md = api.Desc.make((k, n), api.TAG_ANY, api.S8)
        return create(spec, "matmul", src_md.handle, w_md.handle, None, dst_md.handle, attr=attr, nthr=nthr)

    prim = make()
    reject_reference(prim, spec)
    w_md = prim.md(api.Q_WEIGHTS_MD)
    packed = np.zeros(0, np.int8) if spec.options.get("probe") else _prepack(w, (k, n), "ab", w_md)
    args = [(api.ARG_SRC, "in", 0, src_md), (api.ARG_WEIGHTS, "held", 0, w_md), (api.ARG_DST, "out", 0, dst_md)]
    return _integer_kernel(spec, prim, args, packed, has_zp, "int8_matmul", make)


class Int8Conv(Kernel):
    """An int8 convolution whose input or output is NCHW: that side reordered from or to NHWC in scratch around the
    primitive; each step a OneDnnKernel (None: that side is NHWC already, the layout pass's choice), so each runs
    its variant for the run's thread count."""

    def __init__(self, into: OneDnnKernel | None, conv: OneDnnKernel, back: OneDnnKernel | None,
                 nbytes: tuple[int, int]) -> None:
        self.into, self.conv, self.back = into, conv, back
        self.scratch = (*nbytes, *conv.scratch)
        self.algorithm = conv.algorithm
        self.attrs = conv.attrs

    def bind(self, ins: list[Any], outs: list[Any], scratch: list[Any]) -> Callable[[], None]:
        src = scratch[0] if self.into is not None else ins[0]
        dst = scratch[1] if self.back is not None else outs[0]
        conv = self.conv.bind([src, *ins[1:]], [dst], scratch[2:])  # the other inputs: a run-time zero point
        into = self.into.bind([ins[0]], [src], []) if self.into is not None else None
        back = self.back.bind([dst], [outs[0]], []) if self.back is not None else None

        def run() -> None:
            if into is not None:
                into()
            conv()
            if back is not None:
                back()
        return run


def qconv(spec: NodeSpec) -> Kernel:
    """QLinearConv, 2-D, with constant int8 weights; its input and output NCHW or (the layout pass's `src_layout`,
    `dst_layout`) NHWC, where the primitive runs."""
    api.require(f"QLinearConv {spec.name!r}")
    src, dst = _layouts(spec)
    if len(spec.inputs[0].shape) != 4 or spec.attr("channels_last", 0) or any(
            lay.block or not (lay is PLAIN or lay.channels_last) for lay in (src, dst)):
        raise UnsupportedOpError(f"QLinearConv {spec.name!r}: oneDNN here runs 2-D convolutions over NCHW or NHWC")
    x, y = src.logical(tuple(spec.inputs[0].shape)), dst.logical(tuple(spec.outputs[0].shape))
    at = {"x": 0, "x_scale": 1, "x_zp": 2, "w": 3, "w_scale": 4, "w_zp": 5, "y_scale": 6, "y_zp": 7, "bias": 8}
    m, cg, kh, kw = spec.inputs[3].shape
    g = int(spec.attr("group", 1))
    p = _Params(spec, at, m)
    strides, dil, pb, pe = _window(spec, x, y, (kh, kw))
    wdims = (m, cg, kh, kw) if g == 1 else (g, m // g, cg, kh, kw)
    xt, yt = _TYPES[p.x], _TYPES[p.y]
    mds = {"x": api.Desc.make(x, "abcd", xt), "y": api.Desc.make(y, "abcd", yt),
           "src": api.Desc.make(x, "acdb", xt), "dst": api.Desc.make(y, "acdb", yt)}
    bias_md = api.Desc.make((m,), "a") if p.bias is not None else None
    attr = p.attr(1 if g == 1 else 3)
    w_any = api.Desc.make(wdims, api.TAG_ANY, api.S8)

    def make(nthr: int | None = None) -> api.Primitive:
        return create(spec, "convolution_forward", api.FORWARD_INFERENCE, api.CONVOLUTION_DIRECT, mds["src"].handle,
                      w_any.handle, bias_md.handle if bias_md else None, mds["dst"].handle, api.Dims(*strides),
                      api.Dims(*dil), api.Dims(*pb), api.Dims(*pe), attr=attr, nthr=nthr)

    prim = make()
    reject_reference(prim, spec)
    w_md = prim.md(api.Q_WEIGHTS_MD)
    packed = np.zeros(0, np.int8) if spec.options.get("probe") else \
        _prepack(p.weights, wdims, "abcd" if g == 1 else "abcde", w_md)
    held, extra = p.held(packed)
    if bias_md is not None:  # the conv's bias is 1-D
        extra = [(arg, side, i, bias_md if arg == api.ARG_BIAS else md) for arg, side, i, md in extra]
    args = [(api.ARG_SRC, "in", 0, mds["src"]), (api.ARG_WEIGHTS, "held", 0, w_md), (api.ARG_DST, "out", 0, mds["dst"]),
            *extra]
    conv = OneDnnKernel(spec, prim, args, "int8_conv", variant=make)
    conv.held = held
    return _nhwc(spec, conv, mds, src is PLAIN and x[2] * x[3] > 1, dst is PLAIN and y[2] * y[3] > 1)


def _nhwc(spec: NodeSpec, conv: OneDnnKernel, mds: dict[str, api.Desc], into: bool, back: bool) -> Kernel:
    """The NHWC primitive `conv` with, where its input (`into`) or output (`back`) is NCHW, a reorder from or to it
    (`mds`: "x" and "y" NCHW, "src" and "dst" NHWC); a plain side of one pixel per image holds NHWC's bytes."""
    kernels: list[OneDnnKernel | None] = []
    for a, b, plain in (("x", "src", into), ("dst", "y", back)):
        if not plain:
            kernels.append(None)
            continue
        mk = reorder_maker(spec, mds[a], mds[b])
        kernels.append(OneDnnKernel(spec, mk(), [(api.ARG_FROM, "in", 0, mds[a]), (api.ARG_TO, "out", 0, mds[b])],
                                    "reorder", variant=mk))
    if any(k is not None and k.scratch for k in kernels):
        raise UnsupportedOpError(f"{spec.op} {spec.name!r}: oneDNN's NHWC reorders here would need a scratchpad")
    first, last = kernels
    if first is None and last is None:
        return conv
    return Int8Conv(first, conv, last, (mds["src"].nbytes if first else 0, mds["dst"].nbytes if last else 0))


def conv_integer(spec: NodeSpec) -> Kernel:
    """ConvInteger (2-D, NCHW) of u8 x by constant s8 weights (zero point 0) where oneDNN has VNNI, its int32 sums
    exact there: oneDNN's NHWC u8 x s8 -> s32 convolution between reorders. x's zero point per tensor, a constant
    or a run-time input (DynamicQuantizeLinear's), copied into the primitive's value before each launch."""
    api.require(f"ConvInteger {spec.name!r}")
    what = f"ConvInteger {spec.name!r}"
    w = spec.consts[1] if len(spec.consts) > 1 else None
    xs = tuple(spec.inputs[0].shape)
    if len(xs) != 4 or np.dtype(spec.inputs[0].dtype) != np.uint8 or w is None or w.dtype != np.int8 or \
            w.ndim != 4 or np.dtype(spec.outputs[0].dtype) != np.int32:
        raise UnsupportedOpError(f"{what}: oneDNN here convolves 2-D u8 activations by constant s8 weights")
    m, cg, kh, kw = (int(d) for d in w.shape)
    has_zp = _integer_checks(spec, what, cg * kh * kw)
    g = int(spec.attr("group", 1))
    y = tuple(spec.outputs[0].shape)
    strides, dil, pb, pe = _window(spec, xs, y, (kh, kw))
    wdims = (m, cg, kh, kw) if g == 1 else (g, m // g, cg, kh, kw)
    mds = {"x": api.Desc.make(xs, "abcd", api.U8), "y": api.Desc.make(y, "abcd", api.S32),
           "src": api.Desc.make(xs, "acdb", api.U8), "dst": api.Desc.make(y, "acdb", api.S32)}
    attr = api.Attr(zero_points={api.ARG_SRC: 0} if has_zp else None)
    w_any = api.Desc.make(wdims, api.TAG_ANY, api.S8)

    def make(nthr: int | None = None) -> api.Primitive:
        return create(spec, "convolution_forward", api.FORWARD_INFERENCE, api.CONVOLUTION_DIRECT, mds["src"].handle,
                      w_any.handle, None, mds["dst"].handle, api.Dims(*strides), api.Dims(*dil), api.Dims(*pb),
                      api.Dims(*pe), attr=attr, nthr=nthr)

    prim = make()
    reject_reference(prim, spec)
    w_md = prim.md(api.Q_WEIGHTS_MD)
    packed = np.zeros(0, np.int8) if spec.options.get("probe") else \
        _prepack(w, wdims, "abcd" if g == 1 else "abcde", w_md)
    args = [(api.ARG_SRC, "in", 0, mds["src"]), (api.ARG_WEIGHTS, "held", 0, w_md),
            (api.ARG_DST, "out", 0, mds["dst"])]
    conv = _integer_kernel(spec, prim, args, packed, has_zp, "int8_conv", make)
    return _nhwc(spec, conv, mds, xs[2] * xs[3] > 1, y[2] * y[3] > 1)
