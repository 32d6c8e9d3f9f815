"""NumPy kernels for CNNs and linear algebra: GEMM convolution, pooling, LRN, Gemm, MatMul, Det (normalizations:
norm.py)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ctxrt.backends.cpu import gemv, native, threads
from ctxrt.backends.cpu.conv import depthwise, winograd
from ctxrt.backends.cpu.shared import relu_zeros
from ctxrt.backends.kernel import FnKernel, Kernel, NodeSpec, scratch_view
from ctxrt.errors import UnsupportedOpError


def _window(spec: NodeSpec, kernel: tuple[int, ...]) -> tuple[list[int], list[int], list[int], list[int]]:
    """(strides, dilations, pads_begin, pads_end) for spatial ops of any rank, auto_pad resolved. The kernels
    here are 2-D; spatial.py sends them 1-D ops as (N, C, 1, L) and runs 3-D ones itself."""
    in_hw = spec.inputs[0].shape[2:]
    out_hw = spec.outputs[0].shape[2:]
    nd = len(in_hw)
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
    """The input copied into scratch with a constant border wide enough for every output window.

    With `phases` = s > 1 its columns are stored de-interleaved by residue mod s, (C, Hp, s, Wp / s): a
    column tap kx of a stride-s window then reads contiguous columns (`phase_windows`), so the im2col copy
    moves whole rows instead of every s-th element.
    """

    def __init__(self, spec: NodeSpec, kernel, strides, dil, pb, pe, fill: float, phases: int = 1) -> None:
        n, c, h, w = spec.inputs[0].shape
        oh, ow = spec.outputs[0].shape[2:]
        self.hp = max(h + pb[0] + pe[0], (oh - 1) * strides[0] + (kernel[0] - 1) * dil[0] + 1)
        self.wp = max(w + pb[1] + pe[1], (ow - 1) * strides[1] + (kernel[1] - 1) * dil[1] + 1)
        self.phases = s = phases
        self.needed = self.hp != h or self.wp != w or pb != [0, 0] or s > 1
        self.dtype = np.dtype(spec.inputs[0].dtype)
        top, left = pb[0], pb[1]
        if s == 1:
            self.shape: tuple[int, ...] = (c, self.hp, self.wp)
            self.fills = [((slice(None), slice(top, top + h), slice(left, left + w)), (Ellipsis,))]
            boxes = [(0, top, 0, self.wp), (top + h, self.hp, 0, self.wp), (top, top + h, 0, left),
                     (top, top + h, left + w, self.wp)]
            self.borders = [(slice(None), slice(r0, r1), slice(c0, c1)) for r0, r1, c0, c1 in boxes
                            if r1 > r0 and c1 > c0]
        else:
            wq = -(-self.wp // s)
            self.shape = (c, self.hp, s, wq)
            rows = slice(top, top + h)
            self.borders = [(slice(None), slice(r0, r1)) for r0, r1 in ((0, top), (top + h, self.hp)) if r1 > r0]
            self.fills = []
            for r in range(s):  # padded column s*q + r holds x column s*q + r - left
                x0 = (r - left) % s
                q0, cnt = (x0 + left) // s, len(range(x0, w, s))
                self.borders += [(slice(None), rows, r, slice(a, b)) for a, b in ((0, q0), (q0 + cnt, wq)) if b > a]
                if cnt:
                    self.fills.append(((slice(None), rows, r, slice(q0, q0 + cnt)),
                                       (slice(None), slice(None), slice(x0, None, s))))
        self.nbytes = int(np.prod(self.shape)) * self.dtype.itemsize if self.needed else 0
        self.fill = fill

    def view(self, x: np.ndarray, buf: np.ndarray | None) -> np.ndarray:
        """Where the windows are read from: the padded scratch (at bind time), or x itself."""
        return scratch_view(buf, self.shape, self.dtype) if self.needed else x

    def refresh(self, x: np.ndarray, padded: np.ndarray) -> None:
        if self.needed:
            for border in self.borders:  # scratch is shared arena memory: the border is rewritten every time
                padded[border].fill(self.fill)
            for dst, src in self.fills:
                np.copyto(padded[dst], x[src])


def phase_windows(p: np.ndarray, kernel, strides, dil, out_hw) -> list[np.ndarray]:
    """Per column tap kx, a (C, KH, OH, OW) view of the windows of a phase-split (C, Hp, s, Wq) input (dilation
    1 along the width): output column ox reads padded column s*ox + kx = s*(ox + kx // s) + kx % s."""
    s = p.shape[2]
    sc, sh, _, sw = p.strides
    return [as_strided(p[:, :, kx % s, kx // s:], (p.shape[0], kernel[0], out_hw[0], out_hw[1]),
                       (sc, sh * dil[0], sh * strides[0], sw), writeable=False) for kx in range(kernel[1])]


def _windows(p: np.ndarray, kernel, strides, dil, out_hw) -> np.ndarray:
    """A (C, KH, KW, OH, OW) view of every window of the padded (C, Hp, Wp) input."""
    sc, sh, sw = p.strides
    return as_strided(p, (p.shape[0], kernel[0], kernel[1], out_hw[0], out_hw[1]),
                      (sc, sh * dil[0], sw * dil[1], sh * strides[0], sw * strides[1]), writeable=False)


_COL_BUDGET = 2 << 20  # bytes of im2col columns (or of 1x1 input columns) per GEMM block
_POOL_BUDGET = 256 << 10  # bytes of a pool's row-reduced scratch: pooled in blocks of channels
_FOLD_MIN = 1 << 20  # bytes of conv output (per image) from which a constant bias is folded into the GEMM
_PHASE_MIN_COLS = 64  # output columns from which strided windows are read from a phase-split input
_PHASE_MAX_TAPS = 16  # column taps up to which it is (one copy per tap)


def _activation(spec: NodeSpec) -> bool:
    """True when a fused Relu follows (attribute set by the FuseActivation pass)."""
    act = spec.attr("activation")
    if act not in (None, "Relu"):
        raise UnsupportedOpError(f"{spec.op} {spec.name!r}: fused activation {act!r} is not supported")
    return act == "Relu"


class _Bound(Kernel):
    """A kernel whose views (windows, padded scratch, reshapes) are made once, at bind time."""

    def __init__(self, bind, scratch: tuple[int, ...], algorithm: str = "default") -> None:
        self._bind, self.scratch, self.algorithm = bind, scratch, algorithm

    def bind(self, ins, outs, scratch):
        return self._bind(ins, outs, scratch)


DW_PLANAR = "dw_planar"  # the attribute that chooses DwPlanar again when a binary is loaded


class DwPlanar(Kernel):
    """A depthwise convolution of planar (NCHW) float32 images, one native call (csrc/dwconv.c,
    ctxrt_dwconv_planar: per output row the taps' multiply-adds over contiguous runs of input rows, rows shared on
    OpenMP's team): a depthwise conv the layout pass leaves planar (SegFormer's Mix-FFN between Reshapes, ConvNeXt's
    first stage), where oneDNN has only its GEMM-based kernel and NumPy's im2col took 1.3-1.5 ms for 128 channels
    of 64 x 64 by 3 x 3. Chosen at compile time where the extension is built (attribute `dw_planar`); no scratch, so
    where the extension is missing at load, or a view does not fit, NumPy's loop over the taps runs instead."""

    algorithm = "native:dw_planar"

    def __init__(self, spec: NodeSpec, window: tuple[int, ...], relu: bool) -> None:
        self.window, self.relu, self.scratch = window, relu, ()
        self.has_bias = len(spec.inputs) > 2 and spec.inputs[2] is not None
        self.attrs = {} if spec.attr(DW_PLANAR) else {DW_PLANAR: 1}

    def bind(self, ins: list[Any], outs: list[Any], scratch: list[Any]):
        x, w, y = ins[0], ins[1], outs[0]
        bias = ins[2] if self.has_bias else None
        run = native.dwconv_planar(x, w, y, bias, self.window, int(self.relu)) if native.library() is not None \
            else None
        return run if run is not None else self._numpy(x, w, y, bias)

    def _numpy(self, x: np.ndarray, w: np.ndarray, y: np.ndarray, bias: np.ndarray | None):
        sh, sw, ph, pw, dh, dw = self.window
        (_, c, h, wd), (oh, ow), (kh, kw) = x.shape, y.shape[2:], w.shape[2:]
        taps = []
        for ky in range(kh):
            for kx in range(kw):
                oy0, oy1 = _inside(oh, h, sh, ky * dh - ph)
                ox0, ox1 = _inside(ow, wd, sw, kx * dw - pw)
                if oy0 < oy1 and ox0 < ox1:
                    iy, ix = oy0 * sh + ky * dh - ph, ox0 * sw + kx * dw - pw
                    taps.append((w[:, 0, ky, kx].reshape(1, c, 1, 1), y[:, :, oy0:oy1, ox0:ox1],
                                 x[:, :, iy:iy + (oy1 - oy0 - 1) * sh + 1:sh, ix:ix + (ox1 - ox0 - 1) * sw + 1:sw]))
        start = 0.0 if bias is None else bias.reshape(1, c, 1, 1)

        def run() -> None:
            y[...] = start
            for wt, out, src in taps:
                out += wt * src
            if self.relu:
                np.maximum(y, 0, out=y)
        return run


def _inside(out: int, size: int, stride: int, offset: int) -> tuple[int, int]:
    """The output positions [o0, o1) whose input position o * stride + offset lies in [0, size)."""
    o0 = max(0, -(offset // stride)) if offset < 0 else 0
    o1 = min(out, (size - 1 - offset) // stride + 1) if size - 1 - offset >= 0 else 0
    return o0, o1


def conv(spec: NodeSpec) -> Kernel:
    """Winograd, a direct depthwise kernel, or im2col + GEMM. Choices that change the weights (Winograd's
    transform, a bias folded into the GEMM) are made at compile time, recorded in the `kernel` attribute, and
    their weights stored in the binary in the form the kernel reads (`Kernel.constants`)."""
    recorded = spec.attr("kernel")
    if recorded == "winograd":  # input 1 holds the transformed weights
        _, _, pads, _ = _window(spec, (3, 3))
        return winograd.build(spec, (pads[0], pads[1]))
    n, c, h, w = spec.inputs[0].shape
    m, cg, kh, kw = spec.attr("weight_shape") or spec.inputs[1].shape
    g = int(spec.attr("group", 1))
    strides, dil, pb, pe = _window(spec, (kh, kw))
    oh, ow = spec.outputs[0].shape[2:]
    dt = np.dtype(spec.outputs[0].dtype)
    wconst = spec.consts[1]
    compiling = bool(spec.options) and recorded is None
    if (compiling and spec.options.get("prefer", "speed") == "speed" and kh == kw == 3 and strides == dil == [1, 1]
            and g == 1 and wconst is not None and n * oh * ow > 0):
        tile = winograd.choose(c, m, oh, ow, dt)
        if tile is not None:  # its transformed weights are 16/9 or 36/9 the size: not with prefer="memory"
            return winograd.build(spec, (pb[0], pb[1]), tile)
    if recorded is None and (spec.attr(DW_PLANAR) or compiling and native.library() is not None) and \
            g == c == m and cg == 1 and dt == np.float32 and wconst is not None and not spec.attr("residual"):
        return DwPlanar(spec, (*strides, *pb, *dil), _activation(spec))
    chosen = (spec.options.get("algorithms") or {}).get(spec.name)  # (a range compile's probe: the upper bound's)
    if g > 1 and (depthwise.eligible(spec) if chosen is None else
                  chosen == depthwise.DepthwiseConv.algorithm and depthwise.eligible(spec, any_size=True)):
        return depthwise.conv(spec)
    k, p = cg * kh * kw, oh * ow
    wmat = None if wconst is None else np.ascontiguousarray(wconst).reshape(g, m // g, -1)
    bias = spec.consts[2] if len(spec.consts) > 2 else None
    has_bias = len(spec.inputs) > 2 and spec.inputs[2] is not None
    relu = _activation(spec)
    residual = bool(spec.attr("residual", 0))  # a 4th input added in the epilogue (FuseActivation)
    pointwise = kh == kw == 1 and strides == [1, 1] and pb == pe == [0, 0]
    # Strided windows from a phase-split input where output rows are long enough for that to pay (ResNet-50's
    # 7x7 stride-2 stem, 112 columns: im2col copy 0.73 -> 0.48 ms; 3x3 stride 2 to 28 columns: no gain).
    # Not for wide kernels: a copy per column tap (a 1-D audio front end's 80 taps at stride 4, batch 3: the conv
    # 0.165 ms with one copy per tap, 0.094 with one strided copy of every window).
    phases = strides[1] if strides[1] > 1 and dil[1] == 1 and 1 < kw <= _PHASE_MAX_TAPS and ow >= _PHASE_MIN_COLS \
        else 1
    pad = _Padded(spec, (kh, kw), strides, dil, pb, pe, 0.0, phases)
    # A constant bias rides in the GEMM as one more column of the weights against a row of ones below the
    # im2col columns: a pass over the output saved where the output is large (1 MiB and up; a smaller one is
    # still in cache for the pass). For a 1x1 conv that means copying the input under the ones, cheaper than
    # the pass where the conv widens (ResNet-50's 64 -> 256 at 56x56: 0.93 -> 0.77 ms). The (M, K + 1) matrix
    # is made at compile time and replaces the weights and the bias in the binary (the same bytes).
    fold = recorded == "im2col_fold" or (
        compiling and g == 1 and has_bias and bias is not None and wmat is not None
        and m * p * dt.itemsize >= _FOLD_MIN and (not pointwise or 2 * c <= m))
    attrs: dict = {}
    constants: dict = {}
    if fold and recorded is None:
        wmat = np.ascontiguousarray(np.concatenate([wmat, bias.astype(dt).reshape(1, m, 1)], axis=2))
        attrs, constants = {"kernel": "im2col_fold", "weight_shape": [m, cg, kh, kw]}, {1: wmat, 2: None}
    kf = k + fold
    # im2col in blocks of output rows: a bounded column buffer (less arena, better cache use).
    row_bytes = g * kf * ow * dt.itemsize
    rows = max(1, min(oh, _COL_BUDGET // max(row_bytes, 1)))
    col_bytes = (kf * h * w * dt.itemsize if fold else 0) if pointwise else row_bytes * rows

    def bind(i, o, s):
        wm = wmat if wmat is not None else i[1].reshape(g, m // g, k)
        bb = None if not has_bias or fold else (bias if bias is not None else i[2]).reshape(g, m // g, 1)
        res = [i[3][b].reshape(g, m // g, p) for b in range(n)] if residual else None
        # Per image: (padded source, [(im2col copies, weights, GEMM operand, out, bias, residual)]).
        # Every block's epilogue (bias, residual, Relu) runs on the block just computed, while it is in cache.
        plans = []
        for b in range(n):
            out = o[0][b].reshape(g, m // g, p)
            rb = res[b] if res else None
            if pointwise:
                # Blocks of output channels: contiguous output rows, the input re-read from cache.
                mb = max(16, _COL_BUDGET // max(1, p * dt.itemsize) // 16 * 16) if g == 1 else m
                src = i[0][b].reshape(g, c // g, h * w)
                copies = []
                if fold:  # the input copied above a row of ones, by the first block
                    x1 = scratch_view(s[0], (1, kf, h * w), dt)
                    copies, src = [(x1[:, :c], src)], x1
                blocks = []
                for a in range(0, m // g, mb):
                    blocks.append((copies, wm[:, a:a + mb], src, out[:, a:a + mb],
                                   bb[:, a:a + mb] if bb is not None else None,
                                   rb[:, a:a + mb] if rb is not None else None))
                    copies = []
                plans.append((None, blocks))
                continue
            src = pad.view(i[0][b], s[1] if pad.needed else None)
            if phases > 1:
                taps = phase_windows(src, (kh, kw), strides, dil, (oh, ow))
            else:
                win = _windows(src, (kh, kw), strides, dil, (oh, ow))
            blocks = []
            for r0 in range(0, oh, rows):
                r1 = min(oh, r0 + rows)
                cols = scratch_view(s[0], (g, kf, (r1 - r0) * ow), dt)
                col = cols[:, :k].reshape(c, kh, kw, r1 - r0, ow)
                # (destination, source) of the im2col copy: one per column tap when the input is phase-split
                copies = [(col[:, :, kx], t[:, :, r0:r1]) for kx, t in enumerate(taps)] if phases > 1 else \
                    [(col, win[:, :, :, r0:r1])]
                blocks.append((copies, wm, cols,
                               out[:, :, r0 * ow:r1 * ow], bb,
                               rb[:, :, r0 * ow:r1 * ow] if rb is not None else None))
            plans.append((src, blocks))

        zeros = {blk[3].shape[-1]: relu_zeros(blk[3].shape, dt) for _, blocks in plans for blk in blocks}
        gemms = [[_gemm_calls(blk[1], blk[2], blk[3]) for blk in blocks] for _, blocks in plans]

        def run():
            for b, (src, blocks) in enumerate(plans):
                if src is not None:
                    pad.refresh(i[0][b], src)
                for (copies, wb, cols, out, bias_b, res_b), calls in zip(blocks, gemms[b], strict=True):
                    if copies:
                        for to, frm in copies:
                            np.copyto(to, frm)
                        if fold:
                            cols[:, k].fill(1)  # the arena is shared: the ones are rewritten every run
                    if calls is None or not threads.blas_held():
                        np.matmul(wb, cols, out=out)
                    else:  # (BLAS has one thread here: oneDNN's GEMM on OpenMP's)
                        for call in calls:
                            call()
                    if bias_b is not None:
                        np.add(out, bias_b, out=out)
                    if res_b is not None:
                        np.add(out, res_b, out=out)
                    if relu:
                        np.maximum(out, zeros[out.shape[-1]], out=out)
        return run

    scratch = (col_bytes, pad.nbytes) if not pointwise else ((col_bytes,) if fold else ())
    kernel = _Bound(bind, scratch, "gemm_1x1" if pointwise else "im2col_gemm")
    kernel.attrs, kernel.constants = attrs, constants
    return kernel


# multiply-adds of a conv's GEMM block from which it runs on oneDNN's GEMM (OpenMP's threads) rather than NumPy's
# where a run holds BLAS at one thread (a context with oneDNN kernels: threads.blas_held). magika's 256 -> 512
# conv of 5 taps along 508 rows (333 M): 7.5 ms on one BLAS thread, 3.5 on two, oneDNN's GEMM on two OpenMP
# threads 3.1-3.5.
_SGEMM_MIN = 1 << 22


def _gemm_calls(w: np.ndarray, cols: np.ndarray, out: np.ndarray) -> list | None:
    """Per group, oneDNN's GEMM computing out[g] = w[g] @ cols[g] on OpenMP's threads; None (NumPy's matmul)
    for a small GEMM, without oneDNN, or for views it cannot take."""
    if math.prod(w.shape) * out.shape[-1] < _SGEMM_MIN:
        return None
    from ctxrt.backends.cpu.onednn import api

    calls = [api.sgemm(w[j], cols[j], out[j]) for j in range(w.shape[0])]
    return None if None in calls else calls


def _pool_attrs(spec: NodeSpec):
    kernel = tuple(spec.attr("kernel_shape"))
    strides, dil, pb, pe = _window(spec, kernel)
    return kernel, strides, dil, pb, pe


def _pool(spec: NodeSpec, fill: float, combine, inv: np.ndarray | None = None) -> Kernel:
    """Reduce every window with `combine`, separably: first over the kw taps along the width (into a
    [C, Hp, OW] scratch), then over the kh taps along the height: kh + kw - 2 passes, not kh * kw - 1."""
    kernel, strides, dil, pb, pe = _pool_attrs(spec)
    n, c = spec.inputs[0].shape[:2]
    oh, ow = spec.outputs[0].shape[2:]
    pad = _Padded(spec, kernel, strides, dil, pb, pe, fill)
    dt = np.dtype(spec.outputs[0].dtype)
    cb = max(1, min(c, _POOL_BUDGET // max(1, pad.hp * ow * dt.itemsize)))  # channels per block: bounded scratch

    def bind(i, o, s):
        srcs = [pad.view(i[0][b], s[1] if pad.needed else None) for b in range(n)]
        rows = scratch_view(s[0], (cb, pad.hp, ow), dt)
        plans = []
        for b in range(n):
            src, out = srcs[b], o[0][b]
            blocks = []
            for c0 in range(0, c, cb):
                k = min(cb, c - c0)
                r = rows[:k]
                wtaps = [src[c0:c0 + k, :, a * dil[1]:a * dil[1] + (ow - 1) * strides[1] + 1:strides[1]]
                         for a in range(kernel[1])]
                htaps = [r[:, a * dil[0]:a * dil[0] + (oh - 1) * strides[0] + 1:strides[0]] for a in range(kernel[0])]
                blocks.append((r, wtaps, htaps, out[c0:c0 + k]))
            plans.append((src, blocks))

        def run():
            for b, (src, blocks) in enumerate(plans):
                pad.refresh(i[0][b], src)
                for r, wtaps, htaps, out in blocks:
                    np.copyto(r, wtaps[0])
                    for t in wtaps[1:]:
                        combine(r, t, out=r)
                    np.copyto(out, htaps[0])
                    for t in htaps[1:]:
                        combine(out, t, out=out)
                    if inv is not None:
                        np.multiply(out, inv, out=out)
        return run
    return _Bound(bind, (cb * pad.hp * ow * dt.itemsize, pad.nbytes))


def maxpool(spec: NodeSpec) -> Kernel:
    if len(spec.outputs) > 1:
        raise UnsupportedOpError(f"MaxPool {spec.name!r}: the Indices output is not supported")
    return _pool(spec, -np.inf, np.fmax)  # a NaN skipped, as onnxruntime's MLAS skips it


def window_counts(out: int, size: int, k: int, stride: int, begin: int, end: int, include: bool) -> np.ndarray:
    """AveragePool's divisor of each of `out` windows along one axis (undilated): its taps inside the input, or
    inside the padded input with `include` (count_include_pad), at least 1."""
    lo, hi = (-begin, size + end) if include else (0, size)
    starts = np.arange(out) * stride - begin
    return np.clip(np.minimum(starts + k, hi) - np.maximum(starts, lo), 1, None)


def avgpool(spec: NodeSpec) -> Kernel:
    kernel, strides, _, pb, pe = _pool_attrs(spec)
    _, _, h, w = spec.inputs[0].shape
    oh, ow = spec.outputs[0].shape[2:]
    include = bool(spec.attr("count_include_pad", 0))
    inv = (1.0 / np.outer(window_counts(oh, h, kernel[0], strides[0], pb[0], pe[0], include),
                          window_counts(ow, w, kernel[1], strides[1], pb[1], pe[1], include))
           ).astype(spec.outputs[0].dtype)
    return _pool(spec, 0.0, np.add, inv)


def global_avgpool(spec: NodeSpec) -> Kernel:
    shape = spec.inputs[0].shape
    rows, cols = int(np.prod(shape[:2])), int(np.prod(shape[2:]))
    inv = 1.0 / cols

    def run(i, o, s):
        # A plain row sum over a contiguous (N*C, H*W) view: np.mean over axes (2, 3) buffers.
        out = o[0].reshape(rows)
        np.add.reduce(i[0].reshape(rows, cols), axis=1, out=out)
        np.multiply(out, inv, out=out)
    return FnKernel(run)


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
        sq, acc = scratch_view(s[0], shape, dt), y  # the window sums build up in the output itself
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
    return FnKernel(run, scratch=(nbytes,))


def gemm(spec: NodeSpec) -> Kernel:
    """Y = alpha A'B' + beta C, A' = A or Aᵀ (transA), B' likewise, C (optional) broadcast to [M, N] from a scalar,
    [N], [1, N], [M, 1] or [M, N]. A constant C is scaled once; a run-time one with beta != 1 into scratch."""
    dt = np.dtype(spec.outputs[0].dtype)
    alpha, beta = dt.type(spec.attr("alpha", 1.0)), dt.type(spec.attr("beta", 1.0))
    ta, tb = bool(spec.attr("transA", 0)), bool(spec.attr("transB", 0))
    has_c = len(spec.inputs) > 2 and spec.inputs[2] is not None and beta != 0  # beta 0: C is not read
    cconst = spec.consts[2] if has_c else None
    bconst = spec.consts[1]
    bmat = None if bconst is None else (bconst.T if tb else bconst)  # a transposed view: NT GEMM, no copy
    cscaled = None if cconst is None else (cconst * beta).astype(dt)
    scale_c = has_c and cconst is None and beta != 1
    relu = _activation(spec)
    zeros = relu_zeros(spec.outputs[0].shape, dt)
    # a few rows by constant weights, C a bias: the native GEMV (gemv.py: memory-bound, on the idle cores)
    bias_c = cconst is not None and cscaled.size == spec.outputs[0].shape[-1] and cscaled.ndim <= 2 and \
        cscaled.shape[0] == cscaled.size
    native = not ta and alpha == 1 and bconst is not None and (not has_c or bias_c) and \
        gemv.takes(spec.inputs[0].shape[0], tb)

    def bind(i, o, s):
        if native:
            run = gemv.launch(i[0], i[1], tb, o[0], cscaled.reshape(-1) if has_c else None,
                              act="Relu" if relu else None)
            if run is not None:
                return run
        a = i[0].T if ta else i[0]
        b = bmat if bmat is not None else (i[1].T if tb else i[1])
        y = o[0]
        c = cscaled if cscaled is not None else i[2] if has_c else None
        t = scratch_view(s[0], i[2].shape, dt) if scale_c else None

        def run():
            np.matmul(a, b, out=y)
            if alpha != 1:
                np.multiply(y, alpha, out=y)
            if t is not None:
                np.multiply(c, beta, out=t)
                np.add(y, t, out=y)
            elif c is not None:
                np.add(y, c, out=y)
            if relu:
                np.maximum(y, zeros, out=y)
        return run
    return _Bound(bind, (spec.inputs[2].nbytes,) if scale_c else ())


def matmul(spec: NodeSpec) -> Kernel:
    # B stored [N, K] by the TransposeMatMulWeights pass (an NT GEMM, no copy), or read through a Transpose of its
    # last two axes (FoldTransposeIntoMatMul: attention's keys as stored)
    tb = bool(spec.attr("transB", 0))
    a, b = spec.inputs[0], spec.inputs[1]
    if spec.consts[1] is not None and len(b.shape) == 2 and len(a.shape) >= 1 and \
            gemv.takes(math.prod(a.shape[:-1]), tb):  # a few rows by constant weights: the native GEMV (gemv.py)
        def bind(i, o, s):
            run = gemv.launch(i[0], i[1], tb, o[0])
            if run is not None:
                return run
            w = i[1].T if tb else i[1]
            return lambda: np.matmul(i[0], w, out=o[0])
        return _Bound(bind, ())
    def bind_bmm(i, o, s):
        return bmm_launch(i[0], np.swapaxes(i[1], -1, -2) if tb else i[1], o[0])
    return _Bound(bind_bmm, ())


def bmm_launch(a: np.ndarray, b: np.ndarray, y: np.ndarray):
    """y = a @ b (NumPy's matmul: batched, broadcast): where each matrix product is a large float32 GEMM
    (_SGEMM_MIN multiply-adds), oneDNN's GEMM per product on OpenMP's threads in a run that holds BLAS at one
    thread (a context with oneDNN kernels, `threads.blas_held`), else NumPy's. Attention's products over a long
    sequence: a Whisper encoder's 6 heads of 1500 x 1500 by 64 ran on one BLAS thread, 21 ms each, half its run."""
    calls = _bmm_calls(a, b, y)
    if calls is None:
        return lambda: np.matmul(a, b, out=y)
    held = threads.blas_held

    def run() -> None:
        if held():
            for call in calls:
                call()
        else:
            np.matmul(a, b, out=y)
    return run


def _bmm_calls(a: np.ndarray, b: np.ndarray, y: np.ndarray) -> list | None:
    if y.ndim < 2 or a.ndim < 2 or b.ndim < 2 or y.dtype != np.float32 or a.dtype != np.float32 or \
            b.dtype != np.float32 or y.shape[-2] * y.shape[-1] * a.shape[-1] < _SGEMM_MIN:
        return None
    batch = y.shape[:-2]
    if math.prod(batch) > 256:
        return None
    from ctxrt.backends.cpu.onednn import api

    try:
        aa, bb = np.broadcast_to(a, (*batch, *a.shape[-2:])), np.broadcast_to(b, (*batch, *b.shape[-2:]))
    except ValueError:
        return None
    calls = [api.sgemm(aa[idx], bb[idx], y[idx]) for idx in np.ndindex(*batch)]
    return None if None in calls else calls


# Conv, MaxPool and AveragePool are registered by spatial.py, which sends 2-D (and lifted 1-D) nodes here.
def det(spec: NodeSpec) -> Kernel:
    """Determinants of the [..., M, M] input's square matrices (LAPACK's LU through np.linalg.det; 1 for M = 0),
    float16 computed in float32."""
    shape = spec.inputs[0].shape
    dt = np.dtype(spec.inputs[0].dtype)
    if dt.kind != "f":
        raise UnsupportedOpError(f"Det node {spec.name!r}: dtype {dt} is not supported")
    if len(shape) < 2 or shape[-1] != shape[-2]:
        raise UnsupportedOpError(f"Det node {spec.name!r}: input of shape {list(shape)} is not a batch of square "
                                 "matrices")
    wide = np.dtype(np.float32) if dt.itemsize < 4 else None

    def run(ins: list[Any], outs: list[Any], _s: list[Any]) -> None:
        x = ins[0] if wide is None else ins[0].astype(wide)
        np.copyto(outs[0], np.linalg.det(x), casting="unsafe")
    return FnKernel(run)


KERNELS = {"GlobalAveragePool": global_avgpool, "LRN": lrn, "Gemm": gemm, "MatMul": matmul, "Det": det}
