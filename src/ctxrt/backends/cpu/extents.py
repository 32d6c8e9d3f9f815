"""Launches for a range program's steps whose extents follow its dims (docs/shapes-and-control-flow.md).

A decoder's attention steps (the past concatenated with the new keys, Q.K^T, the mask, Softmax, the weighted sum)
change shape at every token. These makers build such a step's launch from the views it reads and writes, and the
attributes of the step at those dims, with no kernel object and no per-shape table: `maker(step, opset)` is chosen
once per step (None when the op, its attributes or its dtypes are not covered: the step then gets a kernel per
shape), and `make(step, ins, outs)` costs about a microsecond per view.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ctxrt.backends.cpu import gemv, native, strided
from ctxrt.backends.cpu.nn import bmm_launch
from ctxrt.backends.cpu.shape import concat_launch
from ctxrt.backends.kernel import Launch, leads
from ctxrt.errors import CtxrtError, RegistrationError

Make = Callable[[Any, list[Any], list[Any]], Launch]

_IGNORED = frozenset({"kernel", "threads"})  # implementation choices of the upper bound's kernel, not semantics

_BINARY: dict[str, Any] = {
    "Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.divide, "Pow": np.power,
    "Equal": np.equal, "Less": np.less, "Greater": np.greater, "LessOrEqual": np.less_equal,
    "GreaterOrEqual": np.greater_equal, "And": np.logical_and, "Or": np.logical_or, "Xor": np.logical_xor,
}
_FLOAT_ONLY = frozenset({"Div", "Pow"})  # integer Div truncates and integer Pow overflows unlike NumPy's
_UNARY: dict[str, Any] = {
    "Neg": np.negative, "Exp": np.exp, "Tanh": np.tanh, "Sqrt": np.sqrt, "Abs": np.absolute,
    "Reciprocal": np.reciprocal, "Cos": np.cos, "Sin": np.sin, "Not": np.logical_not, "Log": np.log,
    "Tan": np.tan, "Asin": np.arcsin, "Acos": np.arccos, "Atan": np.arctan, "Sinh": np.sinh, "Cosh": np.cosh,
    "Asinh": np.arcsinh, "Acosh": np.arccosh, "Atanh": np.arctanh,
}
_COPIES = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity"})
_ATTRS: dict[str, frozenset[str]] = {
    "Concat": frozenset({"axis"}), "Transpose": frozenset({"perm"}), "MatMul": frozenset({"transB"}),
    "Softmax": frozenset({"axis"}),
    "Expand": frozenset({"shape"}), "Trilu": frozenset({"upper"}), "Slice": frozenset({"starts", "ends", "axes",
                                                                                      "steps"}),
    "Reshape": frozenset({"shape", "allowzero"}), "Squeeze": frozenset({"axes"}), "Unsqueeze": frozenset({"axes"}),
    "Flatten": frozenset({"axis"}), "Cast": frozenset({"to", "saturate"}), "ConstantOfShape": frozenset({"value"}),
    "ReduceSum": frozenset({"axes", "keepdims", "noop_with_empty_axes"}),
    "LayerNormalization": frozenset({"axis", "epsilon", "stash_type", "outputs_present"}),
}


# attributes a maker never reads (the output's shape, which the output view already has): a step whose only other
# changes are extents stays live when they follow the dims (runtime/extents.py)
UNREAD_ATTRS: dict[str, frozenset[str]] = {
    "Expand": frozenset({"shape"}), "Reshape": frozenset({"shape"}), "Flatten": frozenset({"axis"}),
    "Squeeze": frozenset({"axes"}), "Unsqueeze": frozenset({"axes"}), "ConstantOfShape": frozenset({"shape"}),
}


def maker(step: Any, opset: int) -> Make | None:
    """The launch maker for `step` (a compiled Step at any dims of its range), or None when not covered."""
    op = step.op
    if set(step.attrs) - _IGNORED - _ATTRS.get(op, frozenset()):
        return None  # a fused activation, a residual, a layout: the kernel's own business
    ins = [None if r is None else np.dtype(r.dtype) for r in step.inputs]
    outs = [np.dtype(r.dtype) for r in step.outputs]
    if len(outs) != 1 or any(dt.kind not in "biuf" for dt in [*outs, *(d for d in ins if d is not None)]):
        return None
    if op in _BINARY and len(ins) == 2 and None not in ins:
        if op in _FLOAT_ONLY and outs[0].kind != "f":
            return None
        return _binary(_BINARY[op])
    if op in _UNARY and len(ins) == 1 and ins[0] is not None:
        if op not in ("Neg", "Abs", "Not") and outs[0].kind != "f":
            return None
        return _unary(_UNARY[op])
    if op == "Where" and len(ins) == 3 and None not in ins:
        return _where
    if op == "MatMul" and len(ins) == 2 and None not in ins and outs[0].kind == "f" and ins[0] == ins[1] == outs[0]:
        return _matmul
    if op == "Softmax" and opset >= 13 and len(ins) == 1 and outs[0].kind == "f":
        return _softmax
    if op == "LayerNormalization" and native.library() is not None and int(step.attrs.get("stash_type", 1)) == 1 \
            and all(dt == np.float32 for dt in [*outs, *(d for d in ins if d is not None)]):
        return _layer_norm  # Y only (one output), float32: csrc/norms_kernel.h; else a kernel per shape
    if op == "Concat" and None not in ins:
        return _concat
    if op in ("Transpose", "Slice", "Expand") or op in _COPIES:
        return _VIEWS[op]
    if op == "Trilu" and outs[0] == ins[0]:
        return _trilu
    if op == "Range" and len(ins) == 3 and None not in ins:
        return _range
    if op == "Cast" and len(ins) == 1 and not (ins[0].kind == "f" and outs[0].kind in "iu"):
        return _cast  # not float to integer: its rounding and range are the Cast kernel's business
    if op == "ConstantOfShape":
        return _fill
    if op == "ReduceSum" and len(ins) == 1 and ins[0] == outs[0] and outs[0].kind in "iuf":
        return _reduce_sum  # (a mask's row sums: the sequence lengths a GroupQueryAttention reads)
    return None


GEMV_ROWS = 8  # rows under which a GEMM is a GEMV that NumPy streams faster than oneDNN (onednn/matmul.py)


def small_rows(step: Any, live: bool = False) -> Make | None:
    """For a oneDNN GEMM step (MatMul, Gemm) whose weights are stored plain, (K, N) or (N, K), at fewer than
    GEMV_ROWS rows (up to 16 by (K, N) weights, or by (N, K) weights of at most gemv.WIDE_BYTES: a classifier in a
    batch loop, its primitive made per row count otherwise): the native GEMV with the same epilogue (bias,
    residual, then Relu; gemv.py), or NumPy's where the extension is not built, reading the same stored weights.
    A decoder's projections at one token: NumPy's GEMV was 25% faster than the primitive (8 GEMVs of 1 MiB in a
    row, one thread); the native one takes the idle cores. `live`: only where its launch at every row count up to
    the step's is one thread's (small weights and work), whose struct a shared launch list copies (a live step)."""
    a = step.attrs
    if step.op not in ("MatMul", "Gemm") or a.get("kernel") != "onednn" or a.get("weights_tag") not in ("ab", "ba"):
        return None
    if any(np.dtype(r.dtype) != np.float32 for r in [*step.inputs, *step.outputs] if r is not None):
        return None
    k, n = (int(d) for d in a["weight_shape"])
    rows = int(np.prod(step.inputs[0].shape[:-1]))
    act = gemv.activation(a.get("activation"), a.get("approximate", "none"), a.get("alpha", 1.0))
    wide = k * n * 4 <= gemv.WIDE_BYTES  # [N, K] weights that small: up to 16 rows too, no primitive per count
    if not gemv.takes(rows, a["weights_tag"] == "ba", wide) or step.inputs[0].shape[-1] != k or \
            act not in gemv.ACTIVATIONS:
        return None
    if rows >= GEMV_ROWS and native.library() is None:  # NumPy's GEMM of a few rows: oneDNN's primitive is faster
        return None
    numpy_act = act in (None, "Relu")  # a GELU costs NumPy 9 passes: without the native GEMV, oneDNN's fused one
    if not numpy_act and native.library() is None:  # is faster (1 x 256 by 256 x 1024: 26 vs 38 us)
        return None
    if live and not gemv.one_thread(rows, k, n):
        return None  # (a launch at any row count up to the step's: one thread's, whose struct a shared list copies)
    has_bias = (step.op == "Gemm" or a.get("bias")) and len(step.inputs) > 2 and step.inputs[2] is not None
    residual = bool(a.get("residual")) and len(step.inputs) > 3 and step.inputs[3] is not None

    def make(step: Any, ins: list[Any], outs: list[Any]) -> Launch:  # (at any rows up to the step's: live)
        stored = ins[1].reshape(k, n) if a["weights_tag"] == "ab" else ins[1].reshape(n, k)
        rows = ins[0].size // k
        x, y = ins[0].reshape(rows, k), outs[0].reshape(rows, n)
        bias = ins[2].reshape(n) if has_bias else None
        res = ins[3].reshape(rows, n) if residual else None
        fast = gemv.launch(x, stored, a["weights_tag"] == "ba", y, bias, res, act, wide=wide)
        if fast is not None:
            return fast
        if not numpy_act:
            raise CtxrtError(f"{step.op} {step.name!r}: the native GEMV did not take its arrays")
        w = stored if a["weights_tag"] == "ab" else stored.T
        adds = [t for t in (bias, res) if t is not None]
        relu = act == "Relu"

        def run() -> None:
            np.matmul(x, w, out=y)
            for t in adds:
                np.add(y, t, out=y)
            if relu:
                np.maximum(y, np.float32(0), out=y)
        return run
    return make


def in_place_reshape(x: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """`x` in another shape without a copy (a strided window, Tensor.window, reshaped as a step reads it);
    RegistrationError where that would need a copy, which the step would read stale or write in vain."""
    y = x.reshape(shape)
    if y.size and not x.flags.c_contiguous and not np.may_share_memory(y, x):
        raise RegistrationError(f"a strided window of shape {list(x.shape)} cannot be read as {list(shape)} in "
                                "place; bind a whole tensor")
    return y


def _binary(ufunc: Any) -> Make:
    def make(step: Any, ins: list[Any], outs: list[Any]) -> Launch:
        return strided.ufunc(ufunc, outs[0], ins[0], ins[1])
    return make


def _unary(ufunc: Any) -> Make:
    def make(step: Any, ins: list[Any], outs: list[Any]) -> Launch:
        return strided.ufunc(ufunc, outs[0], ins[0])
    return make


def _where(step: Any, ins: list[Any], outs: list[Any]) -> Launch:
    c, x, y, out = ins[0], ins[1], ins[2], outs[0]
    if out.size and not np.may_share_memory(out, x) and not np.may_share_memory(out, c):
        def run() -> None:  # NumPy's where has no `out`: y, then x where c (no temporary)
            np.copyto(out, y)
            np.copyto(out, x, where=c)
    else:
        def run() -> None:
            np.copyto(out, np.where(c, x, y))
    return strided.where(out, c, x, y, run)


BMM_WORK = 1 << 20  # multiply-adds of one matrix of a batched MatMul up to which the native loop runs it
# rows of each product up to which it does: its loop takes a row at a time (a token's products); more rows are
# NumPy's (BLAS's register-blocked GEMM: 6 heads of 128 x 64 by 64 x 128, an encoder's attention at 128 tokens,
# 680 us native against 155 on one BLAS thread; a T5 encoder's range program ran 1.26x its fixed-shape program)
BMM_ROWS = 1


def _matmul(step: Any, ins: list[Any], outs: list[Any]) -> Launch:
    a, b, y = ins[0], ins[1], outs[0]
    if step.attrs.get("transB"):  # B read through a Transpose of its last two axes (FoldTransposeIntoMatMul)
        b = np.swapaxes(b, -1, -2)
    if native.library() is not None and a.ndim >= 2 and y.size and a.shape[-1] and y.shape[-2] <= BMM_ROWS and \
            y.shape[-2] * y.shape[-1] * a.shape[-1] <= BMM_WORK:
        # attention's products at a token: a native call (csrc/strided.c), batched with its neighbours and, in a
        # range program's shared list, its struct predicted at a new past length (runtime/slots.py)
        run = native.bmm(a, b, y)
        if run is not None:
            return run
    return bmm_launch(a, b, y)


def _softmax(step: Any, ins: list[Any], outs: list[Any]) -> Launch:
    x, y = ins[0], outs[0]
    axis = int(step.attrs.get("axis", -1)) % max(x.ndim, 1)
    if native.library() is not None and x.size and axis == x.ndim - 1 and native.rows_fit(x, y):  # one call
        return native.softmax_rows(x, y, x.size // x.shape[-1], x.shape[-1])

    # the row statistics, made with the launch (a shape's launch is kept): nothing allocated per run
    m = np.empty(x.shape[:axis] + (1,) + x.shape[axis + 1:], y.dtype) if x.ndim else np.empty((), y.dtype)

    def run() -> None:
        np.maximum.reduce(x, axis=axis, keepdims=True, out=m)
        np.subtract(x, m, out=y)  # max subtraction: exp never overflows
        np.exp(y, out=y)
        np.add.reduce(y, axis=axis, keepdims=True, out=m)
        np.divide(y, m, out=y)
    return run if x.size else _nothing


def _layer_norm(step: Any, ins: list[Any], outs: list[Any]) -> Launch:
    """Y of LayerNormalization over the axes from `axis` by csrc/norms_kernel.h (maker() saw float32 and the
    default stash_type); NumPy's float32 arithmetic where Scale or B are not of the normalized size (broadcast)."""
    x, scale, y = ins[0], ins[1], outs[0]
    bias = ins[2] if len(ins) > 2 else None
    axis = int(step.attrs.get("axis", -1)) % max(x.ndim, 1)
    n = int(np.prod(x.shape[axis:], dtype=np.int64))
    eps = float(step.attrs.get("epsilon", 1e-5))
    if not x.size:
        return _nothing
    params = [t for t in (scale, bias) if t is not None]
    if all(t.size == n for t in params) and native.rows_fit(x, y, *params):
        return native.ln_rows(x, scale, bias, y, x.size // n, n, eps)
    axes = tuple(range(axis, x.ndim))

    def run() -> None:  # broadcast Scale or B: ONNX's definition in float32 (rare: not worth a scratch plan)
        d = x - x.mean(axis=axes, keepdims=True)
        inv = np.float32(1) / np.sqrt((d * d).mean(axis=axes, keepdims=True) + np.float32(eps))
        r = d * inv * scale
        np.copyto(y, r if bias is None else r + bias)
    return run


def _concat(step: Any, ins: list[Any], outs: list[Any]) -> Launch:
    axis = int(step.attrs["axis"]) % outs[0].ndim
    xs, y = list(ins), outs[0]
    if len(xs) > 1 and xs[0].size and leads(xs[0], y, axis):
        # the first input is the output's leading rows already (a KV cache's past and present bound as windows
        # of one tensor, Tensor.window): only the new rows are written
        rows = xs[0].shape[axis]
        tail, rest = y[(slice(None),) * axis + (slice(rows, None),)], xs[1:]
        made = strided.copy(tail, rest[0]) if len(rest) == 1 else concat_launch(rest, tail, axis)

        def run() -> None:  # its own function: the counts below are this view's
            made()
        run.native_at = lambda key: strided.natives(made, key)  # type: ignore[attr-defined]
        run.kept_bytes = xs[0].nbytes  # type: ignore[attr-defined]  counted per run (runtime/extents.py)
        run.appended_bytes = tail.nbytes  # type: ignore[attr-defined]
        return run
    return concat_launch(xs, y, axis)


def _transpose(step: Any, ins: list[Any], outs: list[Any]) -> Launch:
    rank = ins[0].ndim
    perm = [int(p) % rank for p in step.attrs.get("perm") or range(rank - 1, -1, -1)]
    return strided.copy(outs[0], ins[0].transpose(perm))


def _slice(step: Any, ins: list[Any], outs: list[Any]) -> Launch:
    a = step.attrs
    starts, ends = list(a["starts"]), list(a["ends"])
    axes = list(a.get("axes") or range(len(starts)))
    steps = list(a.get("steps") or [1] * len(starts))
    index = [slice(None)] * ins[0].ndim
    for start, end, axis, s in zip(starts, ends, axes, steps, strict=True):
        index[int(axis) % ins[0].ndim] = slice(int(start), int(end), int(s))
    return strided.copy(outs[0], ins[0][tuple(index)])


def _expand(step: Any, ins: list[Any], outs: list[Any]) -> Launch:
    return strided.copy(outs[0], np.broadcast_to(ins[0], outs[0].shape))  # ONNX Expand broadcasts as NumPy


def _copy(step: Any, ins: list[Any], outs: list[Any]) -> Launch:
    y, x = outs[0], ins[0]
    if not x.flags.c_contiguous:  # a strided window (Tensor.window): reshaped as it is read, at each run
        return lambda: np.copyto(y, x.reshape(y.shape))
    src = x.reshape(y.shape)
    if src.size and src.ctypes.data == y.ctypes.data:
        return _nothing  # aliased by the planner
    return strided.copy(y, src)


def _trilu(step: Any, ins: list[Any], outs: list[Any]) -> Launch:
    x, y = ins[0], outs[0]
    k = ins[1] if len(ins) > 1 and ins[1] is not None else None
    if native.library() is not None and y.size:  # a native call: batched, and its struct predicted (slots.py)
        run = native.trilu(x, y, k, bool(step.attrs.get("upper", 1)))
        if run is not None:
            return run
    rows, cols = x.shape[-2:] if x.ndim >= 2 else (0, 0)
    diag = np.arange(cols)[None, :] - np.arange(rows)[:, None]  # j - i
    zero_where = np.less if step.attrs.get("upper", 1) else np.greater  # upper: zero j - i < k
    same = x.size and x.ctypes.data == y.ctypes.data
    masks: dict[int, np.ndarray] = {}  # the positions zeroed, per value of k (a constant in a causal mask)
    zero = y.dtype.type(0)

    def run() -> None:
        if not same:
            np.copyto(y, x)
        d = 0 if k is None else int(k.reshape(-1)[0])
        mask = masks.get(d)
        if mask is None:
            if len(masks) >= 8:
                masks.clear()
            mask = masks[d] = zero_where(diag, d)
        np.copyto(y, zero, where=mask)
    return run if y.size else _nothing


def _range(step: Any, ins: list[Any], outs: list[Any]) -> Launch:
    start, delta, y = ins[0], ins[2], outs[0]
    if native.library() is not None:  # a native call: batched, and its struct predicted (slots.py)
        run = native.range_(start, delta, y)
        if run is not None:
            return run

    def run() -> None:  # ONNX: start + i * delta, in the output's type
        np.copyto(y, start.reshape(()) + delta.reshape(()) * np.arange(y.shape[0]), casting="unsafe")
    return run


def _cast(step: Any, ins: list[Any], outs: list[Any]) -> Launch:
    x, y = ins[0], outs[0]
    return lambda: np.copyto(y, x, casting="unsafe")  # to bool: non-zero is True, as ONNX's Cast


_FILLS: dict[tuple[str, Any], np.ndarray] = {}  # one array per fill value: the same address in every launch's struct


def _fill(step: Any, ins: list[Any], outs: list[Any]) -> Launch:
    y = outs[0]
    value = step.attrs.get("value")
    fill = y.dtype.type(0) if value is None else y.dtype.type(np.asarray(value).reshape(-1)[0])
    key = (y.dtype.str, fill.tobytes())
    src = _FILLS.get(key)
    if src is None:
        src = _FILLS[key] = np.array(fill, y.dtype)
    # a copy of the value broadcast (stride 0): a native call, its struct predicted at a new past length (a mask's
    # ConstantOfShape, runtime/slots.py)
    return strided.copy(y, np.broadcast_to(src, y.shape)) if y.size else (lambda: None)


def _reduce_sum(step: Any, ins: list[Any], outs: list[Any]) -> Launch:
    x, y = ins[0], outs[0]
    a = step.attrs
    axes = a.get("axes")
    if not axes:
        if a.get("noop_with_empty_axes", 0):
            return lambda: np.copyto(y, x)
        axes = range(x.ndim)
    axis = tuple(sorted(int(k) % max(x.ndim, 1) for k in axes))
    keep = bool(a.get("keepdims", 1))
    return lambda: np.add.reduce(x, axis=axis, keepdims=keep, out=y)  # over no elements: 0, as ONNX says


def _nothing() -> None:
    pass


_nothing.native = []  # type: ignore[attr-defined]  nothing to call in a batch
_nothing.structs = []  # type: ignore[attr-defined]


_VIEWS: dict[str, Make] = {"Transpose": _transpose, "Slice": _slice, "Expand": _expand,
                           **{op: _copy for op in _COPIES}}
