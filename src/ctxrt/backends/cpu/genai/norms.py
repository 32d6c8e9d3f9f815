"""RMS and residual normalizations of decoder layers: SimplifiedLayerNormalization (onnxruntime's, in the default
domain), RMSNormalization-23, com.microsoft SkipSimplifiedLayerNormalization and SkipLayerNormalization.

Rows of the trailing axes are normalized like LayerNormalization's (backends/cpu/norm.py: row statistics are
GEMVs against a column of 1/n), in float32 at least (float16 tensors go through float32 scratch). The Skip ops
first add input + skip (+ bias), which is also their optional last output (the residual stream the next layer
reads); their mean output is zero for the RMS variant, as onnxruntime leaves it. float32 RMS rows without the
mean/inv_std_var outputs run the native kernel where it was built (csrc/genai.c: one pass a row, one call).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ctxrt.backends.cpu import native
from ctxrt.backends.cpu.elementwise import BoundKernel
from ctxrt.backends.cpu.norm import _fail, _Rows
from ctxrt.backends.kernel import Kernel, Launch, NodeSpec, scratch_view
from ctxrt.ir.canonical import output_slots

_STASH = {1: np.dtype(np.float32), 11: np.dtype(np.float64)}


def _compute_dtype(spec: NodeSpec, stash: int = 1) -> np.dtype:
    dts = [np.dtype(t.dtype) for t in spec.inputs if t is not None] + [np.dtype(spec.outputs[0].dtype)]
    if any(dt.kind != "f" for dt in dts):
        raise _fail(spec, f"dtypes {[str(d) for d in dts]}")
    if stash not in _STASH:
        raise _fail(spec, f"attribute 'stash_type' value {stash}")
    return max(np.dtype(spec.inputs[0].dtype), _STASH[stash], key=lambda d: d.itemsize)


def _buffer(tensor: np.ndarray, shape: tuple[int, ...], cdt: np.dtype, scratch: list[Any], k: int) -> np.ndarray:
    """The tensor as `shape` when it is of the compute type, else scratch buffer k of that shape."""
    if tensor.dtype == cdt:
        return tensor.reshape(shape)
    return scratch_view(scratch[k], shape, cdt)


def simplified_norm(spec: NodeSpec) -> Kernel:
    """SimplifiedLayerNormalization(X, scale) -> Y, inv_std_var?; RMSNormalization-23(X, scale) -> Y: rows of the
    axes from `axis` on divided by their root mean square, times scale (broadcast against them)."""
    shape = spec.inputs[0].shape
    rank = len(shape)
    axis = int(spec.attr("axis", -1))
    if not -rank <= axis < rank:
        raise _fail(spec, f"attribute 'axis' value {axis} (rank {rank})")
    axis %= rank
    cdt = _compute_dtype(spec, int(spec.attr("stash_type", 1)))
    rows, n = int(np.prod(shape[:axis], dtype=np.int64)), int(np.prod(shape[axis:], dtype=np.int64))
    stats = _Rows(rows, n, cdt, float(spec.attr("epsilon", 1e-5)), center=False)
    scale_shape = spec.inputs[1].shape
    flat = int(np.prod(scale_shape)) == n and len(scale_shape) <= rank - axis
    slots = output_slots(spec.attrs, len(spec.outputs), 2)
    item = cdt.itemsize
    fast = flat and slots[1] is None and _native_rms(spec)

    def make(ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        if fast:
            launch = _rms_launch(rows, n, float(spec.attr("epsilon", 1e-5)), ins[0], None, 0, None, ins[1], None,
                                 outs[0])
            if launch is not None:
                return launch
        x, y = _buffer(ins[0], (rows, n), cdt, scratch, 2), _buffer(outs[0], (rows, n), cdt, scratch, 3)
        load = ins[0].dtype != cdt
        run_stats, _, inv = stats.bind(x, y, scratch[:2])
        scale = ins[1].reshape(n) if flat else ins[1]
        target = y if flat else y.reshape(shape)
        store = outs[0] if outs[0].dtype != cdt else None
        extra = outs[slots[1]].reshape(rows, 1) if slots[1] is not None else None

        def run() -> None:
            if load:
                np.copyto(x, ins[0].reshape(rows, n))
            run_stats()
            np.multiply(target, scale, out=target)
            if store is not None:
                np.copyto(store.reshape(rows, n), y, casting="same_kind")
            if extra is not None:
                np.copyto(extra, inv, casting="same_kind")
        return run
    return BoundKernel(make, (*stats.scratch, rows * n * item, rows * n * item))


def skip_norm(spec: NodeSpec) -> Kernel:
    """Skip(Simplified)LayerNormalization(input, skip, gamma, [beta,] bias?) -> output, mean?, inv_std_var?,
    input_skip_bias_sum?: the sum input + skip (broadcast) + bias, normalized over its last axis (LayerNorm or
    RMS), times gamma (+ beta)."""
    simplified = spec.op.endswith("SkipSimplifiedLayerNormalization")
    shape = spec.inputs[0].shape
    if len(shape) not in (2, 3) or len(spec.inputs) < 3:
        raise _fail(spec, f"input of shape {list(shape)}")
    try:
        np.broadcast_shapes(spec.inputs[1].shape, shape)
    except ValueError:
        raise _fail(spec, f"skip of shape {list(spec.inputs[1].shape)} for input {list(shape)}") from None
    cdt, dt = _compute_dtype(spec), np.dtype(spec.inputs[0].dtype)
    n = shape[-1]
    rows = int(np.prod(shape[:-1], dtype=np.int64))
    eps = float(spec.attr("epsilon", 1e-12))
    stats = _Rows(rows, n, cdt, eps, center=not simplified)
    ins = spec.inputs + [None] * (5 - len(spec.inputs))
    beta_i, bias_i = (None, 3) if simplified else (3, 4)
    has_beta, has_bias = beta_i is not None and ins[beta_i] is not None, ins[bias_i] is not None
    for k in (2, beta_i, bias_i):
        if k is not None and ins[k] is not None and int(np.prod(ins[k].shape)) != n:
            raise _fail(spec, f"input {k} of shape {list(ins[k].shape)} for hidden size {n}")
    slots = output_slots(spec.attrs, len(spec.outputs), 4)
    k0 = len(stats.scratch)
    item = cdt.itemsize
    skip_shape = tuple(spec.inputs[1].shape)
    skip_stride = n if math.prod(skip_shape) == rows * n else 0 if math.prod(skip_shape) == n else None
    fast = simplified and skip_stride is not None and slots[1] is None and slots[2] is None and _native_rms(spec)

    def make(ins_: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        if fast:
            launch = _rms_launch(rows, n, eps, ins_[0], ins_[1], skip_stride, ins_[bias_i] if has_bias else None,
                                 ins_[2], outs[slots[3]] if slots[3] is not None else None, outs[0])
            if launch is not None:
                return launch
        x, skip = ins_[0], ins_[1]
        total = outs[slots[3]] if slots[3] is not None else None
        # the sum, in the compute type: the sum output itself when it has that type, else scratch
        s = total if total is not None and dt == cdt else scratch_view(scratch[k0], shape, cdt)
        y = _buffer(outs[0], (rows, n), cdt, scratch, k0 + 1)
        run_stats, mean, inv = stats.bind(s.reshape(rows, n), y, scratch[:k0])
        gamma = ins_[2].reshape(n)
        beta = ins_[beta_i].reshape(n) if has_beta else None
        bias = ins_[bias_i].reshape(n) if has_bias else None
        copies = [(outs[0].reshape(rows, n), y)] if outs[0].dtype != cdt else []
        if total is not None and s is not total:
            copies.append((total, s))
        for k, src in ((1, mean), (2, inv)):
            if slots[k] is not None:
                copies.append((outs[slots[k]].reshape(rows, 1), src))

        def run() -> None:
            np.add(x, skip, out=s, dtype=cdt)
            if bias is not None:
                np.add(s, bias, out=s)
            run_stats()
            np.multiply(y, gamma, out=y)
            if beta is not None:
                np.add(y, beta, out=y)
            for dst, src in copies:
                np.copyto(dst, src, casting="same_kind")
        return run
    return BoundKernel(make, (*stats.scratch, rows * n * item, rows * n * item))


def _native_rms(spec: NodeSpec) -> bool:
    """Whether the native RMS kernel can run this node: built, every tensor float32."""
    return native.library() is not None and all(
        np.dtype(t.dtype) == np.float32 for t in [*spec.inputs, *spec.outputs] if t is not None)


def _rms_launch(rows: int, n: int, eps: float, x: np.ndarray, skip: np.ndarray | None, skip_stride: int,
                bias: np.ndarray | None, gamma: np.ndarray, total: np.ndarray | None, y: np.ndarray) -> Launch | None:
    """csrc/genai.c's kernel over these tensors; None where one is not contiguous (NumPy's code runs then)."""
    arrays = [a for a in (x, skip, bias, gamma, total, y) if a is not None]
    if not all(a.flags.c_contiguous for a in arrays):
        return None
    args = native.RmsArgs(rows=rows, n=n, x=x.ctypes.data, skip=native.address(skip), skip_stride=skip_stride,
                          bias=native.address(bias), gamma=gamma.ctypes.data, sum=native.address(total),
                          y=y.ctypes.data, eps=eps)
    return native.launch("ctxrt_rms_rows", args, tuple(arrays))


KERNELS = {
    "SimplifiedLayerNormalization": simplified_norm,
    "RMSNormalization": simplified_norm,
    "com.microsoft.SkipSimplifiedLayerNormalization": skip_norm,
    "com.microsoft.SkipLayerNormalization": skip_norm,
}
