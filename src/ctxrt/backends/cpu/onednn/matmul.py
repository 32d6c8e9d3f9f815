"""oneDNN's matmul for MatMul and Gemm nodes whose right-hand matrix is a constant (a layer's weights): the
primitive reads the weights where they are stored, in their plain layout ((N, K) after TransposeMatMulWeights), so
no second copy of them exists; only where oneDNN has no fast kernel for that layout are they prepacked at compile
time into the format it prefers. The bias, a residual add and a Relu or GELU (FuseActivation's,
FuseMatMulEpilogue's) are post-ops of the primitive. Measured at one thread against NumPy's SGEMM (OpenBLAS) on a
MiniLM layer's shapes: 128 x 384 by 384 x 1536 1.49 ms vs 2.38, 1536 -> 384 1.40 vs 1.95, 384 -> 384 0.37 vs 0.49.
A single row (a classifier at batch 1) is a GEMV that NumPy streams as fast: left to NumPy. A few rows (gemv.takes)
by plain weights run csrc/gemv.c's GEMV or register-blocked GEMM on the same weights (_FewRows) where the extension
is built: 8 x 128 x 352 ~10 us on one core, the primitive's launch 15-18 in a small decoder's run."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from ctxrt.backends.cpu import gemv, native
from ctxrt.backends.cpu.onednn import api
from ctxrt.backends.cpu.onednn.kernels import (
    OneDnnKernel,
    choose_weights,
    create,
    prepack,
    recreate_or_reorder,
    variant_of,
    weighted_args,
)
from ctxrt.backends.kernel import Kernel, NodeSpec
from ctxrt.errors import CtxrtError, UnsupportedOpError

STORED_MIN_BYTES = 2 << 20  # weights read as stored from this size (memory-bound); smaller ones prepacked
MIN_ROWS = 8  # fewer rows of A: a GEMV, as fast in NumPy (not in a range program: its rows vary, one kernel)
_ELTWISE = {("Relu", "none"): api.ELTWISE_RELU, ("Gelu", "none"): api.ELTWISE_GELU_ERF,
            ("Gelu", "tanh"): api.ELTWISE_GELU_TANH, ("Swish", "none"): api.ELTWISE_SWISH}  # x sigmoid(alpha x)


def _shapes(spec: NodeSpec) -> tuple[int, int, int, bool]:
    """(rows of A, K, N, whether B is stored (N, K)) or UnsupportedOpError."""
    what = f"{spec.op} {spec.name!r}"
    a, b = spec.inputs[0], spec.inputs[1]
    if spec.consts[1] is None or len(b.shape) != 2 or spec.consts[0] is not None:
        raise UnsupportedOpError(f"{what}: oneDNN here multiplies activations by constant 2-D weights only")
    if any(np.dtype(t.dtype) != np.float32 for t in (a, b, spec.outputs[0])):
        raise UnsupportedOpError(f"{what}: oneDNN here is float32 only")
    if spec.op == "Gemm" and (spec.attr("transA", 0) or float(spec.attr("alpha", 1.0)) != 1.0
                              or float(spec.attr("beta", 1.0)) != 1.0):
        raise UnsupportedOpError(f"{what}: transA, alpha or beta other than 1 are left to NumPy")
    transposed = bool(spec.attr("transB", 0))
    n, k = b.shape if transposed else b.shape[::-1]
    rows = math.prod(a.shape[:-1])
    if len(a.shape) < 2 or a.shape[-1] != k or rows < MIN_ROWS and not spec.options.get("ranges"):
        raise UnsupportedOpError(f"{what}: {rows} row(s): a GEMV, left to NumPy")
    return rows, k, n, transposed


def _stored_or_chosen(spec: NodeSpec, make: Any, wdims: tuple[int, int], stored: str) -> tuple[api.Primitive, str]:
    """For weights of at least STORED_MIN_BYTES, the primitive reading them as stored (plain, (K, N) or (N, K)):
    no copy of them exists; else (or where that has no fast kernel) the one reading the format oneDNN prefers
    (prepacked). Measured at 1 and 2 threads, 128 rows by a decoder's and an encoder's weights (768 x 2048, 2048 x
    768, 768 x 32000, 384 x 1536): the stored (N, K) layout as fast as the blocked one or faster, 16 rows by 768 x
    2048 twice as fast; but one row by a matrix that fits the caches (GPT-2's 256 x 1024, GELU fused) faster
    blocked: 0.45 vs 0.70 ms of oneDNN calls a token. In a range program (where the native kernels are built) every
    size is read as stored: its steps at a few rows (a decoder's token) run csrc/gemv.c's GEMV on those weights,
    sharing them among the idle cores (backends/cpu/extents.py, `small_rows`), and blocked weights would keep them on
    oneDNN's primitive at the program's thread count: a GPT-2-style token (4 layers, hidden 256, 2 cores) 0.29 ms
    against 0.42 with the small weights blocked (onnxruntime 0.25). The price, measured at many rows: 384 x 384 at
    128 and 1024 rows 6-7% slower than blocked (and no 576 KiB prepacked copy); 384 x 1536, 1536 x 384 the same."""
    plain = bool(spec.options.get("ranges")) and native.library() is not None
    if int(spec.consts[1].nbytes) < STORED_MIN_BYTES and not plain:
        return choose_weights(spec, make, wdims, int(spec.consts[1].nbytes))
    try:
        prim = make(stored)
    except CtxrtError:
        prim = None
    if prim is not None and not prim.impl.startswith("ref"):
        return prim, stored
    return choose_weights(spec, make, wdims, int(spec.consts[1].nbytes))


def matmul(spec: NodeSpec) -> Kernel:
    api.require(f"{spec.op} {spec.name!r}")
    packed = spec.attr("weights_tag")
    if packed:
        k, n = spec.attr("weight_shape")
        rows, transposed = math.prod(spec.inputs[0].shape[:-1]), False
    else:
        rows, k, n, transposed = _shapes(spec)
    act = (spec.attr("activation"), spec.attr("approximate", "none"))
    if act[0] is not None and act not in _ELTWISE:
        raise UnsupportedOpError(f"{spec.op} {spec.name!r}: fused activation {act} is not supported by oneDNN here")
    # Gemm's C, or the bias FuseMatMulEpilogue gave a MatMul; a residual from FuseActivation or from it
    has_bias = (spec.op == "Gemm" or spec.attr("bias")) and len(spec.inputs) > 2 and spec.inputs[2] is not None
    if has_bias and (spec.consts[2] is None or math.prod(spec.inputs[2].shape) != n):
        raise UnsupportedOpError(f"{spec.op} {spec.name!r}: oneDNN here adds a constant bias of N values only")
    residual = bool(spec.attr("residual")) and len(spec.inputs) > 3
    if residual and math.prod(spec.inputs[3].shape) != rows * n:
        raise UnsupportedOpError(f"{spec.op} {spec.name!r}: the residual must have the output's shape")
    src_md, dst_md = api.Desc.make((rows, k), "ab"), api.Desc.make((rows, n), "ab")
    bias_md = api.Desc.make((1, n), "ab") if has_bias else None
    attr = api.Attr(_ELTWISE.get(act), add=dst_md if residual else None,
                    alpha=float(spec.attr("alpha", 1.0)) if act[0] == "Swish" else 0.0)

    def make(wfmt: int | str, nthr: int | None = None) -> api.Primitive:
        w_md = api.Desc.make((k, n), wfmt)
        return create(spec, "matmul", src_md.handle, w_md.handle, bias_md.handle if bias_md else None,
                      dst_md.handle, attr=attr, nthr=nthr)

    attrs: dict[str, Any] = {}
    constants: dict[int, np.ndarray | None] = {}
    own = None
    if packed:
        prim, own = recreate_or_reorder(spec, make, (k, n), packed)
    else:
        stored = "ba" if transposed else "ab"
        prim, packed = _stored_or_chosen(spec, make, (k, n), stored)
        if not spec.options.get("probe") and packed != stored:
            constants = {1: prepack(spec.consts[1], (k, n), stored, prim.md(api.Q_WEIGHTS_MD))}
        attrs = {"weights_tag": packed, "weight_shape": [k, n]}
    args = weighted_args(prim, src_md, dst_md, bias_md, attr.binary_index if residual else None)
    native_act = gemv.activation(act[0], act[1], spec.attr("alpha", 1.0))
    few = packed in ("ab", "ba") and own is None and native.library() is not None and \
        gemv.takes(rows, packed == "ba") and native_act in gemv.ACTIVATIONS
    kernel = (_FewRows if few else OneDnnKernel)(spec, prim, args, "matmul", attrs, constants,
                                                 variant=variant_of(spec, make, (k, n), packed), weights=own)
    if few:  # the weights as stored, read by csrc/gemv.c's kernel of a few rows
        kernel.few = (rows, k, n, packed == "ba", native_act, has_bias, residual)
    return kernel


class _FewRows(OneDnnKernel):
    """A oneDNN GEMM of a few rows (gemv.takes) by weights stored plain: bound to the native GEMV or register-
    blocked GEMM (gemv.py) on the same weights and epilogue, the primitive where the arrays do not fit it."""

    few: tuple[int, int, int, bool, str | None, bool, bool]

    def bind(self, ins: list[Any], outs: list[Any], scratch: list[Any]) -> Callable[[], None]:
        rows, k, n, trans, act, has_bias, residual = self.few
        run = gemv.launch(ins[0].reshape(rows, k), ins[1].reshape((n, k) if trans else (k, n)), trans,
                          outs[0].reshape(rows, n), ins[2].reshape(n) if has_bias else None,
                          ins[3].reshape(rows, n) if residual else None, act)
        return run if run is not None else super().bind(ins, outs, scratch)
