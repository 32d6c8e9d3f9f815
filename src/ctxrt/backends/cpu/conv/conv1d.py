"""1-D convolutions of planar signals, [N, C, L] -> [N, M, OL], in one native call (csrc/dwconv.c, ctxrt_conv1d):
an audio front end's or a voice-activity detector's convs between their pools. NumPy's im2col and GEMM on the
lifted (N, C, 1, L) view took 4-7 calls a conv (8-30 us for 0.1-0.6 M multiply-adds); this kernel is one launch,
batched with the native ones around it.

Chosen when a model is compiled (float32, constant weights, an activation the native epilogue computes, no
residual, the extension there): the weights are then stored [G, C/G, K, M/G] (a tap's output channels
contiguous; the same bytes and shape as ONNX's), and the attribute `conv1d` chooses this kernel again when the
binary is loaded. Where the extension is missing then, NumPy's lifted kernel runs on the weights put back in
ONNX's order (a copy of its own, counted in `private_bytes`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from ctxrt.backends.cpu import gemv, native
from ctxrt.backends.kernel import Kernel, NodeSpec
from ctxrt.errors import UnsupportedOpError
from ctxrt.ir.memo import memo

FLAG = "conv1d"
# multiply-adds per image up to which a 1-D conv runs here: above, NumPy's im2col with BLAS's (or oneDNN's) GEMM is
# faster (measured: 32 -> 16 channels over 24,001 samples, 1.2 M a sample: 8.2 ms here, 4.3 by GEMM; an audio front
# end's 1 -> 16 channels, 80 taps at stride 4 over 2,000 samples, 0.64 M: 48 us here, 81 by GEMM)
MAX_WORK = 1 << 21


def eligible(spec: NodeSpec) -> bool:
    """Whether a 1-D Conv runs here: recorded so at compile time, or being compiled with the extension there and a
    node the kernel computes (float32, constant weights, no residual, a native activation)."""
    if spec.attr(FLAG):
        return True
    if not spec.options or spec.attr("kernel") or native.library() is None or spec.consts[1] is None \
            or len(spec.inputs[0].shape) != 3 or spec.consts[1].ndim != 3:
        return False
    m, cg, k = spec.consts[1].shape
    chosen = (spec.options.get("algorithms") or {}).get(spec.name)  # (a range compile's probe: the upper bound's)
    return (spec.outputs[0].dtype == np.float32 and spec.inputs[0].dtype == np.float32
            and not spec.attr("residual") and gemv.conv_activation(spec.attrs) is not None
            and (m * cg * k * spec.outputs[0].shape[2] <= MAX_WORK if chosen is None else
                 chosen == Conv1d.algorithm))


def _stored(w: np.ndarray, g: int) -> np.ndarray:
    """ONNX's [M, C/G, K] weights as this kernel reads them, [G, C/G, K, M/G], in an array of ONNX's shape."""
    m, cg, k = w.shape
    return np.ascontiguousarray(w.reshape(g, m // g, cg, k).transpose(0, 2, 3, 1)).reshape(w.shape)


def _onnx_order(w: np.ndarray, g: int) -> np.ndarray:
    m, cg, k = w.shape
    return np.ascontiguousarray(w.reshape(g, cg, k, m // g).transpose(0, 3, 1, 2)).reshape(w.shape)


class Conv1d(Kernel):
    algorithm = "native:conv1d"

    def __init__(self, spec: NodeSpec) -> None:
        from ctxrt.backends.cpu.nn import _window

        self.spec = spec
        self.m, self.cg, self.k = spec.inputs[1].shape
        self.g = int(spec.attr("group", 1))
        strides, dil, pb, _ = _window(spec, (self.k,))
        self.window = (self.k, strides[0], pb[0], dil[0])
        if min(pb[0], strides[0] - 1, dil[0] - 1) < 0:
            raise UnsupportedOpError(f"Conv {spec.name!r}: negative padding is not supported by the 1-D kernel")
        act = gemv.conv_activation(spec.attrs)
        if act is None or spec.attr("residual"):
            raise UnsupportedOpError(f"Conv {spec.name!r}: compiled for the native 1-D kernel, whose epilogue does "
                                     "not compute its activation or residual; compile the model again")
        self.act = act
        self.has_bias = len(spec.inputs) > 2 and spec.inputs[2] is not None
        n, c, length = spec.inputs[0].shape
        self.scratch = (4 * n * c * native.conv1d_pad(c, length, spec.outputs[0].shape[2], self.window),)
        # in a range program, one object for every length (runtime/extents.py) on the upper bound's scratch (the
        # padded copy grows with the length): its window fixed (explicit pads, not SAME's, which follow the size)
        self.any_shape = self.scratch_grows = spec.attr("auto_pad", "NOTSET") not in ("SAME_UPPER", "SAME_LOWER")
        self.private_bytes = 0
        self._fallback: tuple[np.ndarray, Kernel, list[np.ndarray]] | None = None  # (_numpy)
        if spec.attr(FLAG):
            self.attrs, self.constants = {}, {}
        else:
            self.attrs = {FLAG: 1}
            w, g = spec.consts[1], self.g
            self.constants = {} if spec.options.get("probe") else {1: memo(FLAG, w, g, lambda: _stored(w, g))}

    def bind(self, ins: list[Any], outs: list[Any], scratch: list[Any]) -> Any:
        x, w, y = ins[0], ins[1], outs[0]
        bias = ins[2] if self.has_bias else None
        act, alpha, beta = self.act
        run = None
        if native.library() is not None:
            pad = scratch[0].view(np.float32) if scratch and scratch[0] is not None else np.empty(0, np.float32)
            run = native.conv1d(x, w, y, bias, pad, self.window, self.g, gemv.act_code(act) or 0, alpha, beta)
        if run is None and (tuple(x.shape) != tuple(self.spec.inputs[0].shape) or
                            tuple(y.shape) != tuple(self.spec.outputs[0].shape)):
            raise UnsupportedOpError(f"Conv {self.spec.name!r}: the 1-D kernel's fallback runs its compiled shapes "
                                     f"only, not {list(x.shape)} -> {list(y.shape)}")
        return run if run is not None else self._numpy(ins, outs, scratch)

    def _numpy(self, ins: list[Any], outs: list[Any], scratch: list[Any]) -> Any:
        """NumPy's lifted kernel on the weights put back in ONNX's order (the extension is missing): the weights'
        copy, the kernel and its scratch made at the first bind, shared by the later ones (a run at a time: the
        context's lock)."""
        if self._fallback is None:
            from ctxrt.backends.cpu.image import spatial

            w = _onnx_order(np.asarray(ins[1]).reshape(self.m, self.cg, self.k), self.g)
            consts = list(self.spec.consts)
            consts[1] = w
            attrs = {k: v for k, v in self.spec.attrs.items() if k != FLAG}
            inner = spatial.Lifted(replace(self.spec, attrs=attrs, consts=consts, options={}), _plain_conv)
            got = [np.empty(int(b), np.uint8) for b in inner.scratch]
            self.private_bytes += w.nbytes + sum(int(b) for b in inner.scratch)
            self._fallback = (w, inner, got)
        w, inner, got = self._fallback
        run = inner.bind([ins[0], w, *ins[2:]], outs, got)
        run.held = (w, got)  # type: ignore[attr-defined]
        return run


def _plain_conv(spec: NodeSpec) -> Kernel:
    from ctxrt.backends.cpu import nn

    return nn.conv(spec)


__all__ = ["FLAG", "Conv1d", "eligible"]
