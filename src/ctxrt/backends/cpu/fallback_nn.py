"""Fallback CNN / linear-algebra kernels: im2col GEMM convolution, pooling, LRN, Gemm, MatMul, BatchNorm."""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ctxrt.backends.kernel import FnKernel, Kernel, NodeSpec, scratch_view
from ctxrt.errors import UnsupportedOpError


def _window(spec: NodeSpec, kernel: tuple[int, ...]) -> tuple[list[int], list[int], list[int], list[int]]:
    """(strides, dilations, pads_begin, pads_end) for 2-D spatial ops, auto_pad resolved."""
    in_hw = spec.inputs[0].shape[2:]
    out_hw = spec.outputs[0].shape[2:]
    nd = len(in_hw)
    if nd != 2:
        raise UnsupportedOpError(f"{spec.op} {spec.name!r}: only 2-D spatial inputs are supported, got {in_hw}")
    strides = list(spec.attr("strides") or [1] * nd)
    dil = list(spec.attr("dilations") or [1] * nd)
    auto = spec.attr("auto_pad", "NOTSET")
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        total = [max(0, (o - 1) * s + (k - 1) * d + 1 - i)
                 for o, s, k, d, i in zip(out_hw, strides, kernel, dil, in_hw, strict=True)]
        small = [t // 2 for t in total]
        big = [t - t // 2 for t in total]
        pb, pe = (small, big) if auto == "SAME_UPPER" else (big, small)
    elif auto == "VALID":
        pb, pe = [0] * nd, [0] * nd
    else:
        pads = list(spec.attr("pads") or [0] * (2 * nd))
        pb, pe = pads[:nd], pads[nd:]
    return strides, dil, pb, pe


class _Padded:
    """The input copied into scratch with a constant border wide enough for every output window."""

    def __init__(self, spec: NodeSpec, kernel, strides, dil, pb, pe, fill: float) -> None:
        n, c, h, w = spec.inputs[0].shape
        oh, ow = spec.outputs[0].shape[2:]
        self.hp = max(h + pb[0] + pe[0], (oh - 1) * strides[0] + (kernel[0] - 1) * dil[0] + 1)
        self.wp = max(w + pb[1] + pe[1], (ow - 1) * strides[1] + (kernel[1] - 1) * dil[1] + 1)
        self.needed = self.hp != h or self.wp != w or pb != [0, 0]
        self.shape = (c, self.hp, self.wp)
        self.dtype = np.dtype(spec.inputs[0].dtype)
        self.nbytes = c * self.hp * self.wp * self.dtype.itemsize if self.needed else 0
        self.interior = (slice(None), slice(pb[0], pb[0] + h), slice(pb[1], pb[1] + w))
        self.fill = fill

    def __call__(self, x: np.ndarray, buf: np.ndarray | None) -> np.ndarray:
        if not self.needed:
            return x
        p = scratch_view(buf, self.shape, self.dtype)
        p.fill(self.fill)  # scratch is shared arena memory: the border must be rewritten every time
        np.copyto(p[self.interior], x)
        return p


def _windows(p: np.ndarray, kernel, strides, dil, out_hw) -> np.ndarray:
    """A (C, KH, KW, OH, OW) view of every window of the padded (C, Hp, Wp) input."""
    sc, sh, sw = p.strides
    return as_strided(p, (p.shape[0], kernel[0], kernel[1], out_hw[0], out_hw[1]),
                      (sc, sh * dil[0], sw * dil[1], sh * strides[0], sw * strides[1]), writeable=False)


def conv(spec: NodeSpec) -> Kernel:
    n, c, h, w = spec.inputs[0].shape
    m, cg, kh, kw = spec.inputs[1].shape
    g = int(spec.attr("group", 1))
    strides, dil, pb, pe = _window(spec, (kh, kw))
    oh, ow = spec.outputs[0].shape[2:]
    k, p = cg * kh * kw, oh * ow
    dt = np.dtype(spec.outputs[0].dtype)
    wconst = spec.consts[1]
    wmat = None if wconst is None else np.ascontiguousarray(wconst).reshape(g, m // g, k)
    bias = spec.consts[2] if len(spec.consts) > 2 else None
    has_bias = len(spec.inputs) > 2 and spec.inputs[2] is not None
    pointwise = kh == kw == 1 and strides == [1, 1] and pb == pe == [0, 0]
    pad = _Padded(spec, (kh, kw), strides, dil, pb, pe, 0.0)
    col_bytes = 0 if pointwise else c * kh * kw * p * dt.itemsize

    def run(i, o, s):
        wm = wmat if wmat is not None else i[1].reshape(g, m // g, k)
        for b in range(n):
            out = o[0][b].reshape(g, m // g, p)
            if pointwise:
                np.matmul(wm, i[0][b].reshape(g, c // g, h * w), out=out)
            else:
                src = pad(i[0][b], s[1] if pad.needed else None)
                col = scratch_view(s[0], (c, kh, kw, oh, ow), dt)
                np.copyto(col, _windows(src, (kh, kw), strides, dil, (oh, ow)))
                np.matmul(wm, col.reshape(g, k, p), out=out)
            if has_bias:
                bb = bias if bias is not None else i[2]
                np.add(o[0][b], bb.reshape(m, 1, 1), out=o[0][b])

    scratch = (col_bytes, pad.nbytes) if not pointwise else ()
    return FnKernel(run, scratch=scratch, algorithm="gemm_1x1" if pointwise else "im2col_gemm")


def _pool_attrs(spec: NodeSpec):
    kernel = tuple(spec.attr("kernel_shape"))
    strides, dil, pb, pe = _window(spec, kernel)
    return kernel, strides, dil, pb, pe


def maxpool(spec: NodeSpec) -> Kernel:
    if len(spec.outputs) > 1:
        raise UnsupportedOpError(f"MaxPool {spec.name!r}: the Indices output is not supported")
    kernel, strides, dil, pb, pe = _pool_attrs(spec)
    n = spec.inputs[0].shape[0]
    out_hw = spec.outputs[0].shape[2:]
    pad = _Padded(spec, kernel, strides, dil, pb, pe, -np.inf)

    def run(i, o, s):
        for b in range(n):
            win = _windows(pad(i[0][b], s[0] if pad.needed else None), kernel, strides, dil, out_hw)
            out = o[0][b]
            np.copyto(out, win[:, 0, 0])
            for a in range(kernel[0]):
                for c in range(kernel[1]):
                    if a or c:
                        np.maximum(out, win[:, a, c], out=out)
    return FnKernel(run, scratch=(pad.nbytes,) if pad.needed else ())


def avgpool(spec: NodeSpec) -> Kernel:
    kernel, strides, dil, pb, pe = _pool_attrs(spec)
    n, _, h, w = spec.inputs[0].shape
    oh, ow = spec.outputs[0].shape[2:]
    pad = _Padded(spec, kernel, strides, dil, pb, pe, 0.0)
    include = bool(spec.attr("count_include_pad", 0))

    def counts(o_n, size, k, st, b, e):
        lo, hi = (-b, size + e) if include else (0, size)
        starts = np.arange(o_n) * st - b
        return np.clip(np.minimum(starts + k, hi) - np.maximum(starts, lo), 1, None)

    inv = (1.0 / np.outer(counts(oh, h, kernel[0], strides[0], pb[0], pe[0]),
                          counts(ow, w, kernel[1], strides[1], pb[1], pe[1]))).astype(spec.outputs[0].dtype)

    def run(i, o, s):
        for b in range(n):
            win = _windows(pad(i[0][b], s[0] if pad.needed else None), kernel, strides, [1, 1], (oh, ow))
            out = o[0][b]
            np.copyto(out, win[:, 0, 0])
            for a in range(kernel[0]):
                for c in range(kernel[1]):
                    if a or c:
                        np.add(out, win[:, a, c], out=out)
            np.multiply(out, inv, out=out)
    return FnKernel(run, scratch=(pad.nbytes,) if pad.needed else ())


def global_avgpool(spec: NodeSpec) -> Kernel:
    axes = tuple(range(2, len(spec.inputs[0].shape)))
    return FnKernel(lambda i, o, s: np.mean(i[0], axis=axes, keepdims=True, out=o[0]))


def lrn(spec: NodeSpec) -> Kernel:
    size = int(spec.attr("size"))
    alpha, beta, bias = float(spec.attr("alpha", 1e-4)), float(spec.attr("beta", 0.75)), float(spec.attr("bias", 1.0))
    shape = spec.inputs[0].shape
    c = shape[1]
    dt = np.dtype(spec.outputs[0].dtype)
    nbytes = spec.outputs[0].nbytes
    lo, hi = (size - 1) // 2, size - 1 - (size - 1) // 2

    def run(i, o, s):
        x, y = i[0], o[0]
        sq, acc = scratch_view(s[0], shape, dt), scratch_view(s[1], shape, dt)
        np.multiply(x, x, out=sq)
        acc.fill(0)
        for off in range(-lo, hi + 1):
            dst = slice(max(0, -off), c - max(0, off))
            src = slice(max(0, off), c + min(0, off))
            np.add(acc[:, dst], sq[:, src], out=acc[:, dst])
        np.multiply(acc, alpha / size, out=acc)
        np.add(acc, bias, out=acc)
        np.power(acc, beta, out=acc)
        np.divide(x, acc, out=y)
    return FnKernel(run, scratch=(nbytes, nbytes))


def gemm(spec: NodeSpec) -> Kernel:
    alpha, beta = float(spec.attr("alpha", 1.0)), float(spec.attr("beta", 1.0))
    ta, tb = bool(spec.attr("transA", 0)), bool(spec.attr("transB", 0))
    has_c = len(spec.inputs) > 2 and spec.inputs[2] is not None
    cconst = spec.consts[2] if has_c else None
    bconst = spec.consts[1]
    bmat = None if bconst is None else np.ascontiguousarray(bconst.T if tb else bconst)
    cscaled = None if cconst is None else (cconst * beta).astype(spec.outputs[0].dtype)
    if has_c and cconst is None and beta != 1.0:
        raise UnsupportedOpError(f"Gemm {spec.name!r}: a non-constant C with beta != 1 is not supported")

    def run(i, o, s):
        a = i[0].T if ta else i[0]
        b = bmat if bmat is not None else (i[1].T if tb else i[1])
        np.matmul(a, b, out=o[0])
        if alpha != 1.0:
            np.multiply(o[0], alpha, out=o[0])
        if has_c:
            np.add(o[0], cscaled if cscaled is not None else i[2], out=o[0])
    return FnKernel(run)


def matmul(spec: NodeSpec) -> Kernel:
    return FnKernel(lambda i, o, s: np.matmul(i[0], i[1], out=o[0]))


def batchnorm(spec: NodeSpec) -> Kernel:
    params = spec.consts[1:5]
    if any(p is None for p in params):
        raise UnsupportedOpError(f"BatchNormalization {spec.name!r}: non-constant parameters are not supported")
    gamma, beta, mean, var = (p.astype(np.float64) for p in params)
    eps = float(spec.attr("epsilon", 1e-5))
    nd = len(spec.inputs[0].shape)
    scale = gamma / np.sqrt(var + eps)
    shift = beta - mean * scale
    bshape = (-1,) + (1,) * (nd - 2)
    dt = spec.outputs[0].dtype
    scale, shift = scale.astype(dt).reshape(bshape), shift.astype(dt).reshape(bshape)

    def run(i, o, s):
        np.multiply(i[0], scale, out=o[0])
        np.add(o[0], shift, out=o[0])
    return FnKernel(run)


FALLBACK_NN = {"Conv": conv, "MaxPool": maxpool, "AveragePool": avgpool, "GlobalAveragePool": global_avgpool,
               "LRN": lrn, "Gemm": gemm, "MatMul": matmul, "BatchNormalization": batchnorm}
