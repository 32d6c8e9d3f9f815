"""ctxrt's native kernels (csrc/, built by setup.py as the optional extension `ctxrt._native`), called through
ctypes with one argument struct made at bind time: a call costs ~1 us and allocates nothing.

Where the extension was not built (no C compiler at install, another platform), `library()` is None and the
kernels that would call it run NumPy's code instead; `inspect --kernels` names which (docs/cpu.md).
"""

from __future__ import annotations

import ctypes
import importlib
import os
from typing import Any

import numpy as np

_STATE: dict[str, Any] = {}
# The most threads a native kernel's launch uses; work buffers per thread are sized for this many whatever the
# machine, so that a program's scratch plan is the same on 2 cores and on 64 (a binary compiled on one machine
# loads on another).
MAX_THREADS = 16
# CTXRT_NATIVE=0 turns the native kernels off (NumPy's run instead): to compare them, or to rule them out
_ENV = "CTXRT_NATIVE"


class NBitsArgs(ctypes.Structure):
    """csrc/nbits.c's nbits_args."""

    _fields_ = [("m", ctypes.c_int64), ("k", ctypes.c_int64), ("n", ctypes.c_int64), ("block", ctypes.c_int64),
                ("a", ctypes.c_void_p), ("b", ctypes.c_void_p), ("scales", ctypes.c_void_p), ("zp", ctypes.c_void_p),
                ("zpf", ctypes.c_void_p), ("bias", ctypes.c_void_p), ("y", ctypes.c_void_p), ("work", ctypes.c_void_p),
                ("int8", ctypes.c_int64), ("threads", ctypes.c_int64)]


class GqaArgs(ctypes.Structure):
    """csrc/gqa.h's gqa_args."""

    _fields_ = [*((f, ctypes.c_int64) for f in ("s", "n", "kv", "h", "rows", "start", "total", "window", "half",
                                                "interleaved")),
                ("q", ctypes.c_void_p), ("q_stride", ctypes.c_int64), ("k_new", ctypes.c_void_p),
                ("v_new", ctypes.c_void_p), ("kv_stride", ctypes.c_int64), ("cos", ctypes.c_void_p),
                ("sin", ctypes.c_void_p), ("sinks", ctypes.c_void_p), ("sink", ctypes.c_int64),
                ("present_k", ctypes.c_void_p), ("present_v", ctypes.c_void_p), ("out", ctypes.c_void_p),
                ("out_stride", ctypes.c_int64), ("scale", ctypes.c_float), ("softcap", ctypes.c_float),
                ("work", ctypes.c_void_p), ("threads", ctypes.c_int64)]


class RmsArgs(ctypes.Structure):
    """csrc/norms.h's rms_args."""

    _fields_ = [("rows", ctypes.c_int64), ("n", ctypes.c_int64), ("x", ctypes.c_void_p), ("skip", ctypes.c_void_p),
                ("skip_stride", ctypes.c_int64), ("bias", ctypes.c_void_p), ("gamma", ctypes.c_void_p),
                ("sum", ctypes.c_void_p), ("y", ctypes.c_void_p), ("eps", ctypes.c_float)]


class LnArgs(ctypes.Structure):
    """csrc/norms.h's ln_args."""

    _fields_ = [("rows", ctypes.c_int64), ("n", ctypes.c_int64), ("x", ctypes.c_void_p), ("gamma", ctypes.c_void_p),
                ("beta", ctypes.c_void_p), ("y", ctypes.c_void_p), ("eps", ctypes.c_float)]


class SoftmaxArgs(ctypes.Structure):
    """csrc/norms.h's softmax_args."""

    _fields_ = [("rows", ctypes.c_int64), ("n", ctypes.c_int64), ("x", ctypes.c_void_p), ("y", ctypes.c_void_p)]


class SwishArgs(ctypes.Structure):
    """csrc/act.h's swish_args."""

    _fields_ = [("n", ctypes.c_int64), ("x", ctypes.c_void_p), ("y", ctypes.c_void_p), ("alpha", ctypes.c_float)]


class LstmArgs(ctypes.Structure):
    """csrc/lstm.h's lstm_args."""

    _fields_ = [*((f, ctypes.c_int64) for f in ("steps", "batch", "hidden", "reverse")),
                ("xp", ctypes.c_void_p), ("xp_t", ctypes.c_int64), ("xp_b", ctypes.c_int64), ("r", ctypes.c_void_p),
                ("peep", ctypes.c_void_p), ("h0", ctypes.c_void_p), ("c0", ctypes.c_void_p), ("s0_b", ctypes.c_int64),
                ("y", ctypes.c_void_p), ("y_t", ctypes.c_int64), ("y_b", ctypes.c_int64), ("yh", ctypes.c_void_p),
                ("yc", ctypes.c_void_p), ("s_b", ctypes.c_int64), ("work", ctypes.c_void_p)]


class GruArgs(ctypes.Structure):
    """csrc/lstm.h's gru_args."""

    _fields_ = [*((f, ctypes.c_int64) for f in ("steps", "batch", "hidden", "reverse")),
                ("xp", ctypes.c_void_p), ("xp_t", ctypes.c_int64), ("xp_b", ctypes.c_int64), ("r", ctypes.c_void_p),
                ("rbh", ctypes.c_void_p), ("h0", ctypes.c_void_p), ("s0_b", ctypes.c_int64), ("y", ctypes.c_void_p),
                ("y_t", ctypes.c_int64), ("y_b", ctypes.c_int64), ("yh", ctypes.c_void_p), ("s_b", ctypes.c_int64),
                ("work", ctypes.c_void_p)]


class GemvArgs(ctypes.Structure):
    """csrc/gemv.h's gemv_args."""

    _fields_ = [("m", ctypes.c_int64), ("k", ctypes.c_int64), ("n", ctypes.c_int64), ("a", ctypes.c_void_p),
                ("lda", ctypes.c_int64), ("w", ctypes.c_void_p), ("trans", ctypes.c_int64), ("bias", ctypes.c_void_p),
                ("residual", ctypes.c_void_p), ("ldr", ctypes.c_int64), ("y", ctypes.c_void_p), ("ldy", ctypes.c_int64),
                ("accumulate", ctypes.c_int64), ("act", ctypes.c_int64), ("threads", ctypes.c_int64),
                ("alpha", ctypes.c_float), ("beta", ctypes.c_float)]


class QSrc(ctypes.Structure):
    """csrc/qelem.h's qsrc: where a launch's scales and zero points are read at run time."""

    _fields_ = [("at", ctypes.c_void_p * 6), ("kinds", ctypes.c_int64)]


_QSRC_KINDS = {np.dtype(np.float32): 0, np.dtype(np.int8): 1, np.dtype(np.uint8): 2}


def read_params(src: QSrc, params: list[np.ndarray | None]) -> bool:
    """Point `src` at the one value of each parameter (None: the struct's own field stays as set), so the kernel
    reads run-time scales and zero points itself: False (nothing set) where one is not a float32, int8 or uint8
    scalar. The caller's launch must hold the arrays."""
    if any(a is not None and (a.size != 1 or a.dtype not in _QSRC_KINDS) for a in params):
        return False
    kinds = 0
    for i, a in enumerate(params):
        if a is not None:
            src.at[i] = a.ctypes.data
            kinds |= _QSRC_KINDS[a.dtype] << (4 * i)
    src.kinds = kinds
    return True


class QAddArgs(ctypes.Structure):
    """csrc/qelem.h's qadd_args."""

    _fields_ = [("n", ctypes.c_int64), ("a", ctypes.c_void_p), ("b", ctypes.c_void_p), ("fixed", ctypes.c_void_p),
                ("period", ctypes.c_int64), ("y", ctypes.c_void_p),
                *((f, ctypes.c_float) for f in ("sa", "za", "sb", "zb", "sc", "zc")),
                ("is_signed", ctypes.c_int64), ("mul", ctypes.c_int64), ("src", QSrc)]


class Linear8Args(ctypes.Structure):
    """csrc/qelem.h's linear8_args (QuantizeLinear and DequantizeLinear per tensor, 8 bits)."""

    _fields_ = [("n", ctypes.c_int64), ("x", ctypes.c_void_p), ("y", ctypes.c_void_p), ("scale", ctypes.c_float),
                ("zp", ctypes.c_float), ("is_signed", ctypes.c_int64), ("src", QSrc)]


class DynQuantArgs(ctypes.Structure):
    """csrc/qelem.h's dynquant_args (DynamicQuantizeLinear)."""

    _fields_ = [("n", ctypes.c_int64), ("x", ctypes.c_void_p), ("y", ctypes.c_void_p), ("scale", ctypes.c_void_p),
                ("zp", ctypes.c_void_p)]


class QMatMulArgs(ctypes.Structure):
    """csrc/qelem.h's qmatmul_args."""

    _fields_ = [*((f, ctypes.c_int64) for f in ("batch", "m", "k", "n")), ("a", ctypes.c_void_p),
                ("b", ctypes.c_void_p), ("y", ctypes.c_void_p),
                *((f, ctypes.c_float) for f in ("za", "zb", "zc", "mult")),
                *((f, ctypes.c_int64) for f in ("a_signed", "b_signed", "y_signed")),
                *((f, ctypes.c_void_p) for f in ("bf", "acc", "arow"))]


class Lut8Args(ctypes.Structure):
    """csrc/qelem.h's lut8_args: y rows = lut[x rows] (8 bits to 8 bits)."""

    _fields_ = [("rows", ctypes.c_int64), ("cols", ctypes.c_int64), ("x", ctypes.c_void_p), ("ldx", ctypes.c_int64),
                ("y", ctypes.c_void_p), ("ldy", ctypes.c_int64), ("lut", ctypes.c_void_p)]


class Affine8Args(ctypes.Structure):
    """csrc/qelem.h's affine8_args: y = saturate(round(x a + b)) per channel, 8 bits to 8 bits."""

    _fields_ = [("rows", ctypes.c_int64), ("cols", ctypes.c_int64), ("x", ctypes.c_void_p), ("ldx", ctypes.c_int64),
                ("y", ctypes.c_void_p), ("ldy", ctypes.c_int64), ("a", ctypes.c_void_p), ("b", ctypes.c_void_p),
                *((f, ctypes.c_int64) for f in ("channels", "per", "x_signed", "y_signed"))]


class ActArgs(ctypes.Structure):
    """csrc/gemv.h's act_args: y = act(x) over n floats (`act`: csrc/vmath.h act8's codes)."""

    _fields_ = [("n", ctypes.c_int64), ("x", ctypes.c_void_p), ("y", ctypes.c_void_p), ("act", ctypes.c_int64),
                ("alpha", ctypes.c_float), ("beta", ctypes.c_float)]


ACT_TEAM_MIN = 1 << 15  # csrc/gemv.c's


def act(x: np.ndarray, y: np.ndarray, code: int, alpha: float = 0.0, beta: float = 0.0) -> Any:
    """The launch of y = act(x) over float32 C-contiguous arrays of one size (csrc/gemv.c's ctxrt_act, `code` its
    act_args code, `alpha` and `beta` those of codes 7 .. 10); the library must be loaded. From ACT_TEAM_MIN
    elements on, shared on OpenMP's team where oneDNN loaded it (the run's thread count)."""
    if y.size >= ACT_TEAM_MIN:
        openmp_team()
    return launch("ctxrt_act", ActArgs(n=y.size, x=x.ctypes.data, y=y.ctypes.data, act=code, alpha=alpha, beta=beta),
                  (x, y))


class GapArgs(ctypes.Structure):
    """csrc/gemv.h's gap_args: a GlobalAveragePool of channels-last images."""

    _fields_ = [("n", ctypes.c_int64), ("p", ctypes.c_int64), ("c", ctypes.c_int64), ("x", ctypes.c_void_p),
                ("y", ctypes.c_void_p), ("scale", ctypes.c_float)]


def gap(x: np.ndarray, y: np.ndarray) -> Any | None:
    """The launch of y[n, c] = the mean over pixels of x[n, pixels, c] (float32, C-contiguous; csrc/gemv.c's
    ctxrt_gap), or None where they do not fit it; the library must be loaded."""
    if x.ndim != 3 or y.shape != (x.shape[0], x.shape[2]) or x.dtype != np.float32 or y.dtype != np.float32 \
            or not x.flags.c_contiguous or not y.flags.c_contiguous or not x.size or not x.shape[1]:
        return None
    args = GapArgs(n=x.shape[0], p=x.shape[1], c=x.shape[2], x=x.ctypes.data, y=y.ctypes.data,
                   scale=1.0 / x.shape[1])
    return launch("ctxrt_gap", args, (x, y))


class ResizeArgs(ctypes.Structure):
    """csrc/gemv.h's resize_args: a separable resize of two adjacent axes."""

    _fields_ = [(name, ctypes.c_int64) for name in ("n", "h", "w", "c", "oh", "ow", "ty", "tx")] + \
        [(name, ctypes.c_void_p) for name in ("iy", "ix", "wy", "wx", "x", "y", "tmp")]


def resize2d(x: np.ndarray, y: np.ndarray, rows: tuple[np.ndarray, np.ndarray],
             cols: tuple[np.ndarray, np.ndarray], tmp: np.ndarray) -> Any | None:
    """The launch of y [n, oh, ow, c] = x [n, h, w, c] resized along axes 1 and 2 (csrc/gemv.c's ctxrt_resize2d):
    `rows` (int64 [oh, ty] input rows, float32 [oh, ty] weights), `cols` likewise, `tmp` a float32 scratch of w * c
    values; or None where the arrays do not fit it. The tables are kept alive with the launch."""
    (iy, wy), (ix, wx) = rows, cols
    tables = [iy, wy, ix, wx]
    if x.ndim != 4 or y.ndim != 4 or x.shape[0] != y.shape[0] or x.shape[3] != y.shape[3] or not y.size \
            or tmp.dtype != np.float32 or tmp.size < x.shape[2] * x.shape[3] or not tmp.flags.c_contiguous \
            or x.dtype != np.float32 or y.dtype != np.float32 or not x.flags.c_contiguous \
            or not y.flags.c_contiguous or iy.shape != wy.shape or ix.shape != wx.shape \
            or iy.shape[0] != y.shape[1] or ix.shape[0] != y.shape[2] \
            or any(not t.flags.c_contiguous for t in tables) or iy.dtype != np.int64 or ix.dtype != np.int64 \
            or wy.dtype != np.float32 or wx.dtype != np.float32:
        return None
    args = ResizeArgs(n=x.shape[0], h=x.shape[1], w=x.shape[2], c=x.shape[3], oh=y.shape[1], ow=y.shape[2],
                      ty=iy.shape[1], tx=ix.shape[1], iy=iy.ctypes.data, ix=ix.ctypes.data, wy=wy.ctypes.data,
                      wx=wx.ctypes.data, x=x.ctypes.data, y=y.ctypes.data, tmp=tmp.ctypes.data)
    return launch("ctxrt_resize2d", args, (x, y, tmp, *tables))


class DwArgs(ctypes.Structure):
    """csrc/dwconv.h's dw_args: a depthwise convolution of channels-last images."""

    _fields_ = [(name, ctypes.c_int64) for name in ("n", "h", "w", "c", "oh", "ow", "kh", "kw", "sh", "sw", "ph",
                                                     "pw", "dh", "dw")] + \
        [("x", ctypes.c_void_p), ("wt", ctypes.c_void_p), ("bias", ctypes.c_void_p), ("residual", ctypes.c_void_p),
         ("y", ctypes.c_void_p), ("act", ctypes.c_int64), ("alpha", ctypes.c_float), ("beta", ctypes.c_float),
         ("threads", ctypes.c_int64)]


def dwconv(x: np.ndarray, w: np.ndarray, y: np.ndarray, bias: np.ndarray | None, residual: np.ndarray | None,
           window: tuple[int, ...], act: int, alpha: float, beta: float) -> Any | None:
    """The launch of y = act(depthwise conv(x) + bias (+ residual)) on channels-last float32 images x [n, h, w, c]
    -> y [n, oh, ow, c], weights w [kh, kw, c], `window` (strides, pads before, dilations: sh, sw, ph, pw, dh, dw),
    `act` csrc/gemv.h's code (csrc/dwconv.c: its rows on OpenMP's team of the run), or None where the arrays do
    not fit it; the library must be loaded."""
    arrays = [x, w, y] + [t for t in (bias, residual) if t is not None]
    if x.ndim != 4 or y.ndim != 4 or w.ndim != 3 or x.shape[0] != y.shape[0] or len({x.shape[3], y.shape[3],
                                                                                     w.shape[2]}) != 1 \
            or any(t.dtype != np.float32 or not t.flags.c_contiguous for t in arrays) or not y.size \
            or residual is not None and residual.shape != y.shape or bias is not None and bias.shape != (y.shape[3],):
        return None
    n, h, wd, c = x.shape
    sh, sw, ph, pw, dh, dw = window
    args = DwArgs(n=n, h=h, w=wd, c=c, oh=y.shape[1], ow=y.shape[2], kh=w.shape[0], kw=w.shape[1], sh=sh, sw=sw,
                  ph=ph, pw=pw, dh=dh, dw=dw, x=x.ctypes.data, wt=w.ctypes.data,
                  bias=None if bias is None else bias.ctypes.data,
                  residual=None if residual is None else residual.ctypes.data, y=y.ctypes.data, act=act,
                  alpha=alpha, beta=beta, threads=0)
    return launch("ctxrt_dwconv", args, tuple(arrays))


class DwpArgs(ctypes.Structure):
    """csrc/dwconv.h's dwp_args: a depthwise convolution of planar (NCHW) images into planar output."""

    _fields_ = [(name, ctypes.c_int64) for name in ("planes", "c", "h", "w", "oh", "ow", "kh", "kw", "sh", "sw", "ph",
                                                     "pw", "dh", "dw")] + \
        [("x", ctypes.c_void_p), ("wt", ctypes.c_void_p), ("bias", ctypes.c_void_p), ("y", ctypes.c_void_p),
         ("act", ctypes.c_int64), ("alpha", ctypes.c_float), ("beta", ctypes.c_float), ("threads", ctypes.c_int64)]


def dwconv_planar(x: np.ndarray, w: np.ndarray, y: np.ndarray, bias: np.ndarray | None, window: tuple[int, ...],
                  act: int, alpha: float = 0.0, beta: float = 0.0) -> Any | None:
    """The launch of y = act(depthwise conv(x) + bias) of planar float32 images x [n, c, h, w] into planar
    y [n, c, oh, ow], weights w [c, 1, kh, kw] (ONNX's), `window` (sh, sw, ph, pw, dh, dw), `act` csrc/gemv.h's
    code (csrc/dwconv.c: its rows on OpenMP's team of the run), or None where the arrays do not fit it; the library
    must be loaded."""
    arrays = [x, w, y] + ([bias] if bias is not None else [])
    if x.ndim != 4 or y.ndim != 4 or w.ndim != 4 or x.shape[:2] != y.shape[:2] or w.shape[:2] != (x.shape[1], 1) \
            or any(t.dtype != np.float32 or not t.flags.c_contiguous for t in arrays) or not y.size \
            or bias is not None and bias.shape != (x.shape[1],):
        return None
    n, c, h, wd = x.shape
    sh, sw, ph, pw, dh, dw = window
    args = DwpArgs(planes=n * c, c=c, h=h, w=wd, oh=y.shape[2], ow=y.shape[3], kh=w.shape[2], kw=w.shape[3], sh=sh,
                   sw=sw, ph=ph, pw=pw, dh=dh, dw=dw, x=x.ctypes.data, wt=w.ctypes.data,
                   bias=None if bias is None else bias.ctypes.data, y=y.ctypes.data, act=act, alpha=alpha, beta=beta,
                   threads=0)
    return launch("ctxrt_dwconv_planar", args, tuple(arrays))


class PlanarArgs(ctypes.Structure):
    """csrc/dwconv.h's planar_args: a convolution of planar (NCHW) images into channels-last output."""

    _fields_ = [(name, ctypes.c_int64) for name in ("n", "c", "h", "w", "m", "oh", "ow", "kh", "kw", "sh", "sw", "ph",
                                                     "pw", "dh", "dw")] + \
        [("x", ctypes.c_void_p), ("wt", ctypes.c_void_p), ("bias", ctypes.c_void_p), ("y", ctypes.c_void_p),
         ("act", ctypes.c_int64), ("alpha", ctypes.c_float), ("beta", ctypes.c_float), ("threads", ctypes.c_int64)]


def planar_conv(x: np.ndarray, w: np.ndarray, y: np.ndarray, bias: np.ndarray | None, window: tuple[int, ...],
                act: int, alpha: float, beta: float) -> Any | None:
    """The launch of y = act(conv(x) + bias) of planar float32 images x [n, c, h, w] into channels-last
    y [n, oh, ow, m], one group, weights w [c, kh, kw, m], `window` (sh, sw, ph, pw, dh, dw), `act` csrc/gemv.h's
    code (csrc/dwconv.c: its rows on OpenMP's team of the run), or None where the arrays do not fit it; the
    library must be loaded."""
    arrays = [x, w, y] + ([bias] if bias is not None else [])
    if x.ndim != 4 or y.ndim != 4 or w.ndim != 4 or x.shape[0] != y.shape[0] or x.shape[1] != w.shape[0] \
            or y.shape[3] != w.shape[3] or any(t.dtype != np.float32 or not t.flags.c_contiguous for t in arrays) \
            or not y.size or bias is not None and bias.shape != (y.shape[3],):
        return None
    n, c, h, wd = x.shape
    sh, sw, ph, pw, dh, dw = window
    args = PlanarArgs(n=n, c=c, h=h, w=wd, m=y.shape[3], oh=y.shape[1], ow=y.shape[2], kh=w.shape[1], kw=w.shape[2],
                      sh=sh, sw=sw, ph=ph, pw=pw, dh=dh, dw=dw, x=x.ctypes.data, wt=w.ctypes.data,
                      bias=None if bias is None else bias.ctypes.data, y=y.ctypes.data, act=act, alpha=alpha,
                      beta=beta, threads=0)
    return launch("ctxrt_planar_conv", args, tuple(arrays))


class Conv1dArgs(ctypes.Structure):
    """csrc/dwconv.h's conv1d_args: a convolution of planar 1-D signals."""

    _fields_ = [(name, ctypes.c_int64) for name in ("n", "c", "l", "m", "ol", "k", "g", "s", "p", "d", "lp")] + \
        [("x", ctypes.c_void_p), ("wt", ctypes.c_void_p), ("bias", ctypes.c_void_p), ("y", ctypes.c_void_p),
         ("pad", ctypes.c_void_p), ("act", ctypes.c_int64), ("alpha", ctypes.c_float), ("beta", ctypes.c_float),
         ("threads", ctypes.c_int64)]


def conv1d_pad(c: int, length: int, out: int, window: tuple[int, int, int, int]) -> int:
    """Floats per channel of csrc/dwconv.c's padded copy of a signal of `length` (Conv1dArgs.lp), the output of
    `out` positions over `window` (taps, stride, pad before, dilation): every read of its blocks of 4 positions."""
    k, s, p, d = window
    return max(p + length, (-(-max(out, 1) // 4) * 4 - 1) * s + (k - 1) * d + 1)


def conv1d(x: np.ndarray, w: np.ndarray, y: np.ndarray, bias: np.ndarray | None, pad: np.ndarray,
           window: tuple[int, int, int, int], groups: int, act: int, alpha: float, beta: float) -> Any | None:
    """The launch of y = act(conv1d(x) + bias) of planar float32 signals x [n, c, l] into y [n, m, ol], weights w
    stored [g, c / g, k, m / g] (flat or shaped), `window` (taps, stride, pad before, dilation), `pad` float32
    scratch of n * c * conv1d_pad(...) floats at least, `act` csrc/gemv.h's code (csrc/dwconv.c: its positions on
    OpenMP's team of the run); None where the arrays do not fit it. The library must be loaded."""
    k, s, p, d = window
    arrays = [x, w, y, pad] + ([bias] if bias is not None else [])
    if x.ndim != 3 or y.ndim != 3 or x.shape[0] != y.shape[0] or any(
            t.dtype != np.float32 or not t.flags.c_contiguous for t in arrays) or not y.size or not x.size:
        return None
    n, c, length = x.shape
    m, ol = y.shape[1:]
    lp = conv1d_pad(c, length, ol, window)
    if groups < 1 or c % groups or m % groups or w.size != m * (c // groups) * k or pad.size < n * c * lp \
            or bias is not None and bias.size != m or min(k, s, d) < 1 or p < 0:
        return None
    args = Conv1dArgs(n=n, c=c, l=length, m=m, ol=ol, k=k, g=groups, s=s, p=p, d=d, lp=lp, x=x.ctypes.data,
                      wt=w.ctypes.data, bias=None if bias is None else bias.ctypes.data, y=y.ctypes.data,
                      pad=pad.ctypes.data, act=act, alpha=alpha, beta=beta, threads=0)
    return launch("ctxrt_conv1d", args, tuple(arrays))


class Pool1dArgs(ctypes.Structure):
    """csrc/dwconv.h's pool1d_args: MaxPool or AveragePool of planar 1-D signals."""

    _fields_ = [(name, ctypes.c_int64) for name in ("rows", "l", "ol", "k", "s", "p", "d", "max")] + \
        [("x", ctypes.c_void_p), ("inv", ctypes.c_void_p), ("y", ctypes.c_void_p)]


def pool1d(x: np.ndarray, y: np.ndarray, window: tuple[int, int, int, int], inv: np.ndarray | None) -> Any | None:
    """The launch of a 1-D MaxPool (`inv` None) or AveragePool (`inv` [OL]: 1 / each position's divisor) of float32
    signals x [..., L] into y [..., OL] over `window` (taps, stride, pad before, dilation); None where the arrays do
    not fit it. The library must be loaded."""
    k, s, p, d = window
    arrays = [x, y] + ([inv] if inv is not None else [])
    if x.shape[:-1] != y.shape[:-1] or any(t.dtype != np.float32 or not t.flags.c_contiguous for t in arrays) \
            or not y.size or inv is not None and inv.shape != (y.shape[-1],) or min(k, s, d) < 1:
        return None
    args = Pool1dArgs(rows=y.size // y.shape[-1], l=x.shape[-1], ol=y.shape[-1], k=k, s=s, p=p, d=d,
                      max=int(inv is None), x=x.ctypes.data, inv=None if inv is None else inv.ctypes.data,
                      y=y.ctypes.data)
    return launch("ctxrt_pool1d", args, tuple(arrays))


class Sum8Args(ctypes.Structure):
    """csrc/qelem.h's sum8_args: y[o, i] = sum over c of x[o, c, i], 8 bits into int32."""

    _fields_ = [*((f, ctypes.c_int64) for f in ("outer", "count", "inner")), ("x", ctypes.c_void_p),
                ("y", ctypes.c_void_p), ("is_signed", ctypes.c_int64), ("q", ctypes.c_void_p),
                *((f, ctypes.c_float) for f in ("xs", "xz", "ys", "yz")), ("q_signed", ctypes.c_int64),
                ("src", QSrc)]


class IGemmArgs(ctypes.Structure):
    """csrc/qelem.h's igemm_args."""

    _fields_ = [*((f, ctypes.c_int64) for f in ("m", "k", "n")), ("a", ctypes.c_void_p), ("b", ctypes.c_void_p),
                ("y", ctypes.c_void_p), ("za", ctypes.c_void_p), ("zb", ctypes.c_void_p), ("zb_count", ctypes.c_int64),
                ("a_signed", ctypes.c_int64), ("b_signed", ctypes.c_int64), ("a16", ctypes.c_void_p),
                ("b16", ctypes.c_void_p)]


EW_RANK = 6  # csrc/strided.h


class EwArgs(ctypes.Structure):
    """csrc/strided.h's ew_args: y = op(a, b) element by element, each operand by its strides (in elements)."""

    _fields_ = [("op", ctypes.c_int64), ("rank", ctypes.c_int64), ("size", ctypes.c_int64),
                ("shape", ctypes.c_int64 * EW_RANK), ("y", ctypes.c_void_p), ("a", ctypes.c_void_p),
                ("b", ctypes.c_void_p), ("c", ctypes.c_void_p),
                *((f, ctypes.c_int64 * EW_RANK) for f in ("ys", "as_", "bs", "cs"))]


BMM_RANK = 4


class BmmArgs(ctypes.Structure):
    """csrc/strided.h's bmm_args: y = a @ b (or a @ b^T) per batch index, every operand by its strides."""

    _fields_ = [("rank", ctypes.c_int64), ("m", ctypes.c_int64), ("n", ctypes.c_int64), ("k", ctypes.c_int64),
                ("batch", ctypes.c_int64 * BMM_RANK), ("a", ctypes.c_void_p), ("b", ctypes.c_void_p),
                ("y", ctypes.c_void_p), *((f, ctypes.c_int64 * BMM_RANK) for f in ("as_", "bs", "ys")),
                *((f, ctypes.c_int64) for f in ("am", "ak", "bk", "bn", "ym", "yn"))]


class TriluArgs(ctypes.Structure):
    """csrc/strided.h's trilu_args: ONNX Trilu over the last two dims, every operand by its strides."""

    _fields_ = [*((f, ctypes.c_int64) for f in ("batch", "rows", "cols", "size", "upper")), ("k", ctypes.c_void_p),
                ("k_value", ctypes.c_int64), ("x", ctypes.c_void_p), ("y", ctypes.c_void_p),
                *((f, ctypes.c_int64) for f in ("xb", "xr", "xc", "yb", "yr", "yc"))]


class RangeArgs(ctypes.Structure):
    """csrc/strided.h's range_args: y[i] = start + i delta."""

    _fields_ = [("n", ctypes.c_int64), ("type", ctypes.c_int64), ("start", ctypes.c_void_p),
                ("delta", ctypes.c_void_p), ("y", ctypes.c_void_p), ("start_i", ctypes.c_int64),
                ("delta_i", ctypes.c_int64), ("start_f", ctypes.c_double), ("delta_f", ctypes.c_double)]


def _own(a: np.ndarray) -> bool:
    """Whether a scalar input is a launch's own constant (a copy made with its launch: a range program's small
    integer that follows the dims) or a weight, whose value goes into the struct (a word of a polynomial in the
    dims, predicted with the rest: runtime/slots.py), rather than a view of a program buffer read at run time."""
    return a.base is None or not a.flags.writeable


RANGE_TYPES = {np.dtype(np.int64): 0, np.dtype(np.int32): 1, np.dtype(np.float32): 2, np.dtype(np.float64): 3}


class BatchArgs(ctypes.Structure):
    """csrc/strided.h's batch_args: n native launches (function, argument struct) run in order in one call."""

    _fields_ = [("n", ctypes.c_int64), ("fns", ctypes.c_void_p), ("args", ctypes.c_void_p),
                ("failed", ctypes.c_int64)]


class DnnlArgs(ctypes.Structure):
    """csrc/strided.h's dnnl_args: dnnl_primitive_execute's arguments, for a oneDNN primitive's native launch."""

    _fields_ = [("execute", ctypes.c_void_p), ("primitive", ctypes.c_void_p), ("stream", ctypes.c_void_p),
                ("nargs", ctypes.c_int64), ("args", ctypes.c_void_p)]


def library() -> ctypes.CDLL | None:
    """The native library, loaded once; None where it was not built or CTXRT_NATIVE=0."""
    if "lib" not in _STATE:
        _STATE["lib"] = None if os.environ.get(_ENV, "1") == "0" else _load()
    return _STATE["lib"]


def _load() -> ctypes.CDLL | None:
    try:
        module = importlib.import_module("ctxrt._native")
        lib = ctypes.CDLL(module.__file__)
        _declare(lib)
        _STATE["ew_args"] = module.ew_args  # csrc/strided.c's struct maker, called directly
        _STATE["array_addresses"] = module.addresses
        _STATE["bmm_args"] = module.bmm_args
    except (ImportError, OSError, TypeError, AttributeError):  # AttributeError: a build of other sources
        return None
    return lib


def _declare(lib: ctypes.CDLL) -> None:
    """Every function's argument and result types (AttributeError where the library lacks one)."""
    for name in ("nbits4_matmul", "gqa", "rms_rows", "gemv", "qadd", "quantize", "dequantize", "dynquant", "qmatmul",
                 "igemm", "swish", "lstm", "gru", "ln_rows", "softmax_rows", "lut8", "affine8", "act", "sum8", "ew",
                 "batch", "dnnl", "bmm", "trilu", "range", "gap", "dwconv", "dwconv_planar", "planar_conv", "resize2d",
                 "conv1d", "pool1d"):
        fn = getattr(lib, f"ctxrt_{name}")  # each takes its argument struct
        fn.argtypes, fn.restype = [ctypes.c_void_p], ctypes.c_int
    lib.ctxrt_nbits4_dequantize.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    lib.ctxrt_nbits4_dequantize.restype = ctypes.c_int
    lib.ctxrt_isa.argtypes, lib.ctxrt_isa.restype = [], ctypes.c_char_p
    lib.ctxrt_openmp.argtypes, lib.ctxrt_openmp.restype = [ctypes.c_void_p] * 4, ctypes.c_int
    lib.ctxrt_gemm_avx512.argtypes, lib.ctxrt_gemm_avx512.restype = [ctypes.c_int64], ctypes.c_int


def openmp_team() -> bool:
    """Whether csrc/gemv.c's many-rows GEMM shares its rows on OpenMP's team: libgomp's entry points (the runtime
    oneDNN's primitives run on, found among the process's mapped files once it is loaded) handed to the library
    once. False where the library or libgomp is not there (it then shares them on its own pool)."""
    if "openmp" not in _STATE:
        lib, found = library(), None
        try:
            with open("/proc/self/maps") as maps:
                found = next((line.split()[-1] for line in maps if "/libgomp" in line), None)
        except OSError:
            pass
        if lib is None or found is None:
            return False  # not kept: libgomp may be loaded later (with oneDNN)
        try:
            gomp = ctypes.CDLL(found)
            names = ("GOMP_parallel", "omp_get_thread_num", "omp_get_num_threads", "omp_get_max_threads")
            entries = [ctypes.cast(getattr(gomp, name), ctypes.c_void_p).value for name in names]
        except (OSError, AttributeError):
            entries = [None] * 4
        lib.ctxrt_openmp(*entries)
        _STATE["openmp"], _STATE["openmp_entries"] = entries[0] is not None, entries
    return _STATE["openmp"]


def nbits4_work_bytes(m: int, k: int, block: int, int8: bool) -> int:
    """Bytes of csrc/nbits.c's work for m rows (its row_of's layout: per row kb * block floats, or int8 values,
    then 2 * kb four-byte sums and scales). Computed here, not by the library: a program's scratch plan is the same
    where the extension is not built."""
    kb = -(-k // block)
    return m * (kb * block * (1 if int8 else 4) + kb * 8) + 64


def gqa_work_bytes(rows: int, h: int) -> int:
    """Bytes of csrc/genai.c's GroupQueryAttention work: per thread (MAX_THREADS) a row of scores and a rotated
    query."""
    return MAX_THREADS * (rows + h) * 4


def rows_fit(*arrays: np.ndarray) -> bool:
    """Float32 C-contiguous arrays, which the row kernels (softmax_rows, ln_rows) take."""
    return all(a.dtype == np.float32 and a.flags.c_contiguous for a in arrays)


def ew_args(op: int, y: Any, a: Any, b: Any, c: Any) -> tuple[bytearray, int] | None:
    """csrc/strided.c's ew_args for these views: (the struct's bytes, its address), or None where they do not fit;
    the library must be loaded."""
    return _STATE["ew_args"](op, y, a, b, c)


def array_addresses(items: list[Any], writable: bool) -> list[int | None]:
    """Per item, the data address of a numpy.ndarray that is C-contiguous (writable where asked), aligned to its
    item size and not empty, else None (csrc/strided.c's `addresses`); the library must be loaded."""
    return _STATE["array_addresses"](items, np.ndarray, writable)


def function(fn: str) -> int:
    """The address of the library's function `fn` (for a batch of native launches: backends/cpu/strided.py)."""
    addresses = _STATE.setdefault("addresses", {})
    if fn not in addresses:
        addresses[fn] = ctypes.cast(getattr(library(), fn), ctypes.c_void_p).value
    return addresses[fn]


def launch(fn: str, args: ctypes.Structure, keep: tuple[Any, ...]) -> Any:
    """The launch of kernel `fn` on its argument struct, the arrays it points into kept alive. Its `native` lists
    the (function, argument struct) addresses it calls, for a batch of launches run in one call
    (backends/cpu/strided.py)."""
    ref, call = ctypes.byref(args), getattr(library(), fn)

    def run(_keep: object = keep) -> None:
        call(ref)
    run.native = [(function(fn), ctypes.addressof(args))]  # type: ignore[attr-defined]
    run.structs = [(run.native[0][0], args)]  # type: ignore[attr-defined]  (strided.structs)
    return run


def threaded_launch(fn: str, args: ctypes.Structure, keep: tuple[Any, ...], most: int = MAX_THREADS) -> Any:
    """The launch of kernel `fn` whose struct's `threads` is the run's idle cores (threads.idle_now, at most
    `most`), set as it runs; in a batch, a copy of the struct per count (`native_at`)."""
    from ctxrt.backends.cpu import threads

    ref, call, idle = ctypes.byref(args), getattr(library(), fn), threads.idle_now
    copies: dict[int, ctypes.Structure] = {}

    def run(_keep: object = keep) -> None:
        args.threads = min(idle() or 1, most)
        call(ref)

    def native_at(key: tuple[int, int]) -> list[tuple[int, int]]:
        count = min(key[1] or 1, most)
        copy = copies.get(count)
        if copy is None:
            copy = copies[count] = type(args).from_buffer_copy(args)
            copy.threads = count
        return [(function(fn), ctypes.addressof(copy))]
    run.native_at, run.keyed = native_at, True  # type: ignore[attr-defined]
    return run


def bmm(a: np.ndarray, b: np.ndarray, y: np.ndarray) -> Any | None:
    """The launch of y = a @ b (NumPy's matmul broadcasting over the batch dims; `b` any view, a transposed one
    read as stored) on float32 views of at least two dims (csrc/strided.c's ctxrt_bmm), or None where they do not
    fit (another dtype, more than BMM_RANK batch dims, a stride not a whole element); the library must be loaded."""
    if not a.dtype == b.dtype == y.dtype == np.float32:
        return None
    blob = _STATE["bmm_args"](a, b, y)  # csrc/strided.c: the struct made in C
    return None if blob is None else launch("ctxrt_bmm", BmmArgs.from_buffer(blob), (a, b, y))


def _rows_of(x: np.ndarray) -> tuple[int, int] | None:
    """(the rows of matrices, their stride in elements) of x's dims before its last two merged into one, or None
    where they do not merge (a stride per dim would be needed)."""
    lead = [(n, s) for n, s in zip(x.shape[:-2], x.strides[:-2], strict=True) if n != 1]
    count = 1
    for n, _ in lead:
        count *= n
    for (_, s), (n, t) in zip(lead, lead[1:], strict=False):  # each dim with the next
        if s != t * n:
            return None
    return count, (lead[-1][1] // x.itemsize if lead else 0)


def trilu(x: np.ndarray, y: np.ndarray, k: np.ndarray | None, upper: bool) -> Any | None:
    """The launch of ONNX Trilu (csrc/strided.c's ctxrt_trilu): y = x with the other triangle of the last two dims
    zeroed, `k` an int64 scalar read at each run (None: 0; a launch's own constant, `_own`: by value); None where
    the views do not fit (a rank under 2,
    element size not 1, 2, 4 or 8, a stride not a whole element, leading dims that do not merge, x overlapping y
    other than element for element, k not an int64 scalar); the library must be loaded."""
    size = y.itemsize
    if x.ndim < 2 or x.shape != y.shape or x.dtype != y.dtype or size not in (1, 2, 4, 8) or \
            any(s % size for s in x.strides + y.strides):
        return None
    if k is not None and (k.dtype != np.int64 or k.size != 1 or not k.flags.c_contiguous):
        return None
    bx, by = _rows_of(x), _rows_of(y)
    if bx is None or by is None:
        return None
    same = x.ctypes.data == y.ctypes.data and x.strides == y.strides
    if not same and np.may_share_memory(x, y):
        return None
    by_value = k is None or _own(k)
    args = TriluArgs(batch=bx[0], rows=y.shape[-2], cols=y.shape[-1], size=size, upper=int(bool(upper)),
                     k=None if by_value else k.ctypes.data, k_value=0 if k is None else int(k.reshape(-1)[0]) if
                     by_value else 0, x=x.ctypes.data, y=y.ctypes.data, xb=bx[1],
                     xr=x.strides[-2] // size, xc=x.strides[-1] // size, yb=by[1], yr=y.strides[-2] // size,
                     yc=y.strides[-1] // size)
    return launch("ctxrt_trilu", args, (x, y, k))


def range_(start: np.ndarray, delta: np.ndarray, y: np.ndarray) -> Any | None:
    """The launch of ONNX Range into y (csrc/strided.c's ctxrt_range; its length y's), start and delta scalars
    read at each run (or, a launch's own constants, `_own`, by value); None where the types are not one of
    RANGE_TYPES alike or y is not contiguous."""
    kind = RANGE_TYPES.get(y.dtype)
    if kind is None or start.dtype != y.dtype or delta.dtype != y.dtype or y.ndim != 1 or \
            not (y.flags.c_contiguous and start.flags.c_contiguous and delta.flags.c_contiguous) or \
            start.size != 1 or delta.size != 1:
        return None
    args = RangeArgs(n=y.shape[0], type=kind, y=y.ctypes.data)
    for name, a in (("start", start), ("delta", delta)):  # a launch's own constant by value, else by address
        if _own(a):
            v = a.reshape(()).item()
            setattr(args, f"{name}_i" if kind < 2 else f"{name}_f", v)
        else:
            setattr(args, name, a.ctypes.data)
    return launch("ctxrt_range", args, (start, delta, y))


def softmax_rows(x: np.ndarray, y: np.ndarray, rows: int, n: int) -> Any:
    """The launch of y = softmax(x) over `rows` rows of `n` (csrc/norms_kernel.h); the library must be loaded."""
    return launch("ctxrt_softmax_rows", SoftmaxArgs(rows=rows, n=n, x=x.ctypes.data, y=y.ctypes.data), (x, y))


def ln_rows(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray | None, y: np.ndarray, rows: int, n: int,
            eps: float) -> Any:
    """The launch of LayerNormalization's Y over `rows` rows of `n` (csrc/norms_kernel.h); the library must be
    loaded."""
    args = LnArgs(rows=rows, n=n, x=x.ctypes.data, gamma=gamma.ctypes.data, beta=address(beta), y=y.ctypes.data,
                  eps=eps)
    return launch("ctxrt_ln_rows", args, (x, gamma, beta, y))


def address(a: np.ndarray | None) -> int | None:
    """The address of an array's first element (None for None), for a struct's pointer field."""
    return None if a is None else a.ctypes.data
