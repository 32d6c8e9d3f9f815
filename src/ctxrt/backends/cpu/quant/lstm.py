"""DynamicQuantizeLSTM (com.microsoft, onnxruntime's quantize_dynamic): an LSTM whose W and R are 8-bit.

Inputs X, W [D, I, 4H], R [D, H, 4H] (int8 or uint8: input and gate axes swapped from ONNX LSTM's [D, 4H, I]), B,
sequence_lens, initial_h, initial_c, P, W_scale, W_zero_point, R_scale, R_zero_point (scales float32 [D] or
[D, 4H] per column, zero points the same shape in W's type); attributes and gate order (iofc) as ONNX LSTM's.

The weights stay 8-bit in the context: each run dequantizes them, (q - zp) * scale in float32, into scratch in
ONNX LSTM's [D, 4H, I] / [D, 4H, H] layout, and the float32 LSTM built for run-time W and R runs on them (the node
seen as an LSTM whose W and R are not constants: rnn_native's kernel where it computes the node, else
rnn_cells.LSTM). onnxruntime instead quantizes X and H to uint8 per step and sums integer products: the two differ
by that quantization of the activations, about as much as onnxruntime differs from the float model's LSTM
(tests/models/test_dynamic_lstm.py), ctxrt being the nearer to the float model.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from ctxrt.backends.cpu import native
from ctxrt.backends.cpu.quant.common import EIGHT_BIT, F32, Bound, dequantize_into, fail, given, require
from ctxrt.backends.cpu.rnn import rnn_native, rnn_onednn
from ctxrt.backends.cpu.rnn.rnn_cells import LSTM
from ctxrt.backends.kernel import Kernel, Launch, NodeSpec, TensorSpec, scratch_view

X, W, R, B, SEQ_LENS, INITIAL_H, INITIAL_C, P, W_SCALE, W_ZP, R_SCALE, R_ZP = range(12)


def _param(spec: NodeSpec, i: int, d: int, g: int) -> tuple[int, int] | None:
    """A scale or zero point's broadcast shape against the [D, 4H, K] weights: [D, 1, 1] or [D, 4H, 1]."""
    if not given(spec, i):
        return None
    n = int(np.prod(spec.inputs[i].shape, dtype=np.int64))
    if n == d:
        return (d, 1, 1)
    if n == d * g:
        return (d, g, 1)
    raise fail(spec, f"input {i} of shape {list(spec.inputs[i].shape)} (expected [{d}] or [{d}, {g}])")


def _cells(spec: NodeSpec) -> Kernel:
    """The LSTM on the dequantized weights: csrc's native kernel (one call per direction runs every step) where
    rnn_native would take the float node (the default activations, no clip, no input_forget, no padded sequences,
    up to `ROWS` batch rows, compiled now with the extension built and not for a range program's kernels; it reads
    W, R, B and P at run time, so their being in scratch does not matter), else the NumPy cells. The choice is
    recorded as the float LSTM's is (`recurrent: native`, Kernel.attrs), so a loaded context repeats it;
    NativeLSTM itself falls back to the NumPy cells, in the same scratch, where the extension is not built."""
    mark = spec.attr(rnn_native.MARK)
    if mark is not None:
        return rnn_native.NativeLSTM(spec) if mark == "native" else LSTM(spec)
    if "prefer" not in spec.options or spec.options.get("ranges") or native.library() is None:
        return LSTM(spec)
    shown = [np.broadcast_to(np.float32(0), t.shape) if c is None and t is not None and k in (W, R, B, P) else c
             for k, (t, c) in enumerate(zip(spec.inputs, spec.consts, strict=True))]  # as constants: shapes only
    xs = spec.inputs[X].shape
    if rnn_onednn.refusal(replace(spec, consts=shown), need_onednn=False) is None and xs[1] <= rnn_native.ROWS:
        return rnn_native.NativeLSTM(spec)
    return LSTM(spec)


def dynamic_quantize_lstm(spec: NodeSpec) -> Kernel:
    if not given(spec, W_SCALE) or not given(spec, R_SCALE):
        raise fail(spec, "W_scale and R_scale are required")
    wt = require(spec, W, EIGHT_BIT, "W")
    rt = require(spec, R, EIGHT_BIT, "R")
    if np.dtype(spec.inputs[X].dtype) != F32:
        raise fail(spec, f"X of type {spec.inputs[X].dtype} is not supported (float32 expected)")
    for zp, dt in ((W_ZP, wt), (R_ZP, rt)):
        if given(spec, zp) and np.dtype(spec.inputs[zp].dtype) != dt:
            raise fail(spec, f"input {zp} of type {spec.inputs[zp].dtype} (the weights' {dt} expected)")
    ws, rs = tuple(spec.inputs[W].shape), tuple(spec.inputs[R].shape)
    if len(ws) != 3 or len(rs) != 3 or rs[2] != 4 * rs[1] or ws[2] != rs[2] or ws[0] != rs[0]:
        raise fail(spec, f"W of shape {list(ws)} with R of shape {list(rs)} (expected [D, I, 4H], [D, H, 4H])")
    d, i, g = ws
    h = rs[1]
    wf_shape, rf_shape = (d, g, i), (d, g, h)
    shapes = {k: _param(spec, k, d, g) for k in (W_SCALE, W_ZP, R_SCALE, R_ZP)}
    for k in (W_ZP, R_ZP):  # a constant zero point of 0 (quantize_dynamic's int8 weights): one multiply a run
        z = spec.consts[k] if k < len(spec.consts) else None
        if z is not None and not np.asarray(z).any():
            shapes[k] = None

    # the node as an ONNX LSTM whose W and R are float32 tensors known only at run time
    consts = list(spec.consts) + [None] * (len(spec.inputs) - len(spec.consts))
    inputs = list(spec.inputs[:P + 1])
    inputs[W], inputs[R] = TensorSpec(wf_shape, F32), TensorSpec(rf_shape, F32)
    lstm_consts = [None if k in (W, R) else c for k, c in enumerate(consts[:len(inputs)])]
    lstm = _cells(NodeSpec("LSTM", spec.name, dict(spec.attrs), inputs, list(spec.outputs), lstm_consts,
                           spec.opset, spec.options))
    own = (int(np.prod(wf_shape)) * 4, int(np.prod(rf_shape)) * 4)

    def make(ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        wf, rf = scratch_view(scratch[0], wf_shape, F32), scratch_view(scratch[1], rf_shape, F32)
        parts = []
        for q, s, z, out in ((W, W_SCALE, W_ZP, wf), (R, R_SCALE, R_ZP, rf)):
            zp = ins[z].reshape(shapes[z]) if shapes[z] is not None else None
            parts.append((ins[q].transpose(0, 2, 1), zp, ins[s].reshape(shapes[s]), out))
        lstm_ins = [ins[k] if k < len(ins) else None for k in range(len(inputs))]
        lstm_ins[W], lstm_ins[R] = wf, rf
        run = lstm.bind(lstm_ins, outs, list(scratch[2:]))

        def launch() -> None:
            for q, zp, scale, out in parts:
                if zp is None:
                    np.multiply(q, scale, out=out)  # int8 times float32: float32, one pass
                else:
                    dequantize_into(q, zp, scale, out)
            run()
        return launch

    kernel = Bound(make, own + tuple(lstm.scratch), "dequantize_" + lstm.algorithm)
    kernel.attrs = dict(lstm.attrs)
    return kernel


KERNELS = {"DynamicQuantizeLSTM": dynamic_quantize_lstm}
