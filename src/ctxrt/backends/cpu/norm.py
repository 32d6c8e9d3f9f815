"""Normalizations for the NumPy backend: LayerNormalization, InstanceNormalization, GroupNormalization and
BatchNormalization, with every optional input and output; LpNormalization and MeanVarianceNormalization.

The first three normalize rows of a (rows, n) view: row means are GEMVs against a column of 1/n (one BLAS call
instead of NumPy's slower reduction wrapper), 1/std is computed on the small [rows, 1] statistics and applied
with one multiply. Inputs narrower than the stash type (float16) are normalized in float32 scratch.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ctxrt.backends.cpu.elementwise import BoundKernel
from ctxrt.backends.kernel import Kernel, Launch, NodeSpec, scratch_view
from ctxrt.errors import UnsupportedOpError
from ctxrt.ir.canonical import output_slots

_STASH = {1: np.float32, 11: np.float64}  # ONNX element types allowed as stash_type


def _fail(spec: NodeSpec, what: str) -> UnsupportedOpError:
    return UnsupportedOpError(f"{spec.op} node {spec.name!r}: {what} is not supported")


def _compute_dtype(spec: NodeSpec) -> np.dtype:
    """The type statistics are computed in: the input's, widened to the stash type when narrower."""
    dt = np.dtype(spec.inputs[0].dtype)
    if dt.kind != "f":
        raise _fail(spec, f"dtype {dt}")
    stash = int(spec.attr("stash_type", 1))
    if stash not in _STASH:
        raise _fail(spec, f"attribute 'stash_type' value {stash}")
    return max(dt, np.dtype(_STASH[stash]), key=lambda d: d.itemsize)


class _Rows:
    """Per-row mean and 1/std of x viewed as (rows, n), normalized into y (both in the compute type). Without
    `center` (RMS normalization) the mean is not subtracted and the mean output is zeros."""

    def __init__(self, rows: int, n: int, cdt: np.dtype, eps: float, center: bool = True) -> None:
        self.rows, self.n, self.cdt, self.eps, self.center = rows, n, cdt, cdt.type(eps), center
        self.col = np.full((n, 1), 1 / n, cdt)
        item = cdt.itemsize
        self.scratch = (rows * item,) * (1 + center) + (rows * n * item,)

    def bind(self, x: np.ndarray, y: np.ndarray, scratch: list[Any]) -> tuple[Launch, np.ndarray, np.ndarray]:
        """(launch, mean [rows, 1], 1/std [rows, 1]); the launch leaves (x - mean) / std in y."""
        col, eps, center = self.col, self.eps, self.center
        mu = scratch_view(scratch[0], (self.rows, 1), self.cdt) if center else np.zeros((1, 1), self.cdt)
        inv = scratch_view(scratch[center], (self.rows, 1), self.cdt)
        sq = scratch_view(scratch[center + 1], (self.rows, self.n), self.cdt)
        src = y if center else x  # what is squared and scaled: the centred rows, or x itself

        def run() -> None:
            if center:
                np.matmul(x, col, out=mu)
                np.subtract(x, mu, out=y)
            np.multiply(src, src, out=sq)
            np.matmul(sq, col, out=inv)
            np.add(inv, eps, out=inv)
            np.sqrt(inv, out=inv)
            np.reciprocal(inv, out=inv)
            np.multiply(src, inv, out=y)
        return run, mu, inv


class _Converted:
    """x and y in the compute type: the tensors themselves, or float32 scratch copies of float16 ones."""

    def __init__(self, shape: tuple[int, ...], dt: np.dtype, cdt: np.dtype) -> None:
        self.shape, self.convert = shape, dt != cdt
        self.cdt = cdt
        self.scratch = (int(np.prod(shape)) * cdt.itemsize,) if self.convert else ()

    def bind(self, x: np.ndarray, y: np.ndarray, scratch: list[Any]) -> tuple[np.ndarray, np.ndarray, Launch, Launch]:
        if not self.convert:
            return x.reshape(self.shape), y.reshape(self.shape), _nothing, _nothing
        t = scratch_view(scratch[0], self.shape, self.cdt)
        xs, ys = x.reshape(self.shape), y.reshape(self.shape)
        return t, t, (lambda: np.copyto(t, xs)), (lambda: np.copyto(ys, t, casting="same_kind"))


def _nothing() -> None:
    pass


class LayerNorm(Kernel):
    """Rows of the trailing axes from `axis` normalized, then Scale and B (broadcast against X, as the
    function body does); optional outputs Mean and InvStdDev [X.shape[:axis], 1...]. May run in place."""

    def __init__(self, spec: NodeSpec) -> None:
        shape = spec.inputs[0].shape
        rank = len(shape)
        axis = int(spec.attr("axis", -1))
        if not -rank <= axis < rank:
            raise _fail(spec, f"attribute 'axis' value {axis} (rank {rank})")
        axis %= rank
        self.shape, self.dt, self.cdt = shape, np.dtype(spec.inputs[0].dtype), _compute_dtype(spec)
        n = int(np.prod(shape[axis:], dtype=np.int64))
        rows = int(np.prod(shape[:axis], dtype=np.int64))
        self.stats = _Rows(rows, n, self.cdt, float(spec.attr("epsilon", 1e-5)))
        self.conv = _Converted((rows, n), self.dt, self.cdt)
        self.slots = output_slots(spec.attrs, len(spec.outputs), 3)
        # Scale/B equal to the normalized shape broadcast over rows; anything else over the whole X
        self.flat = [t is not None and int(np.prod(t.shape)) == n and len(t.shape) <= rank - axis
                     for t in spec.inputs[1:3]]
        self.scratch = self.stats.scratch + self.conv.scratch

    def bind(self, ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        rows, n = self.stats.rows, self.stats.n
        x, y, load, store = self.conv.bind(ins[0], outs[0], scratch[3:])
        stats, mu, inv = self.stats.bind(x, y, scratch[:3])
        affine = []
        for k, flat in zip((1, 2), self.flat, strict=False):
            if k < len(ins) and ins[k] is not None:
                p = ins[k]
                target = y if flat else y.reshape(self.shape)
                affine.append((np.multiply if k == 1 else np.add, target, p.reshape(n) if flat else p))
        extra = [(outs[self.slots[j]].reshape(rows, 1), src) for j, src in ((1, mu), (2, inv))
                 if self.slots[j] is not None]

        def run() -> None:
            load()
            stats()
            for f, t, p in affine:
                f(t, p, out=t)
            store()
            for dst, src in extra:
                np.copyto(dst, src, casting="same_kind")
        return run


def instance_norm(spec: NodeSpec) -> Kernel:
    """Per (image, channel) over the spatial axes; scale and B per channel (constants or run-time inputs)."""
    shape = spec.inputs[0].shape
    if len(shape) < 3:
        raise _fail(spec, f"input of rank {len(shape)}")
    dt = np.dtype(spec.inputs[0].dtype)
    if dt.kind != "f":
        raise _fail(spec, f"dtype {dt}")
    nb, c = shape[:2]
    n = int(np.prod(shape[2:]))
    stats = _Rows(nb * c, n, dt, float(spec.attr("epsilon", 1e-5)))

    def make(ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        x, y = ins[0].reshape(nb * c, n), outs[0].reshape(nb * c, n)
        run_stats, _, _ = stats.bind(x, y, scratch)
        scale, bias = ins[1].reshape(c, 1), ins[2].reshape(c, 1)
        y3 = y.reshape(nb, c, n)

        def run() -> None:
            run_stats()
            np.multiply(y3, scale, out=y3)
            np.add(y3, bias, out=y3)
        return run
    return BoundKernel(make, stats.scratch)


def group_norm(spec: NodeSpec) -> Kernel:
    """Per (image, group of channels); scale and bias per group (opset 18) or per channel (opset 21)."""
    shape = spec.inputs[0].shape
    if len(shape) < 2:
        raise _fail(spec, f"input of rank {len(shape)}")
    dt, cdt = np.dtype(spec.inputs[0].dtype), _compute_dtype(spec)
    nb, c = shape[:2]
    g = int(spec.attr("num_groups"))
    if g <= 0 or c % g:
        raise _fail(spec, f"attribute 'num_groups' value {g} for {c} channels")
    per_channel = spec.opset >= 21
    want = (c,) if per_channel else (g,)
    for t in spec.inputs[1:3]:
        if int(np.prod(t.shape)) != want[0]:
            raise _fail(spec, f"scale/bias of shape {t.shape} at opset {spec.opset} (expected {want})")
    s = int(np.prod(shape[2:]))
    m = (c // g) * s
    stats = _Rows(nb * g, m, cdt, float(spec.attr("epsilon", 1e-5)))
    conv = _Converted((nb * g, m), dt, cdt)
    pshape = (g, c // g, 1) if per_channel else (g, 1, 1)

    def make(ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        x, y, load, store = conv.bind(ins[0], outs[0], scratch[3:])
        run_stats, _, _ = stats.bind(x, y, scratch[:3])
        y4 = y.reshape(nb, g, c // g, s)
        scale, bias = ins[1].reshape(pshape), ins[2].reshape(pshape)

        def run() -> None:
            load()
            run_stats()
            np.multiply(y4, scale, out=y4, casting="same_kind")
            np.add(y4, bias, out=y4, casting="same_kind")
            store()
        return run
    return BoundKernel(make, stats.scratch + conv.scratch)


def layer_norm(spec: NodeSpec) -> Kernel:
    return LayerNorm(spec)


def batch_norm(spec: NodeSpec) -> Kernel:
    """Inference: y = (x - mean) / sqrt(var + eps) * scale + bias, the per-channel factors folded once when the
    parameters are constants, else each run. Training (training_mode=1 at opset 14+, or BatchNormalization-9
    with its optional outputs): y from the batch's mean and population variance; running_mean/var updated with
    momentum; BatchNormalization-9's saved_mean and saved_var are the batch mean and 1/std, as onnxruntime."""
    shape = spec.inputs[0].shape
    dt = np.dtype(spec.outputs[0].dtype)
    if dt.kind != "f" or len(shape) < 2:
        raise _fail(spec, f"input {dt}{list(shape)}")
    slots = output_slots(spec.attrs, len(spec.outputs), 3 if spec.opset >= 14 else 5)
    training = bool(spec.attr("training_mode", 0)) if spec.opset >= 14 else any(k is not None for k in slots[1:])
    eps, momentum = float(spec.attr("epsilon", 1e-5)), float(spec.attr("momentum", 0.9))
    c = shape[1]
    bshape = (c,) + (1,) * (len(shape) - 2)
    if training:
        return _batch_norm_training(spec, slots, eps, momentum, bshape)
    params = spec.consts[1:5]
    if all(p is not None for p in params):
        gamma, beta, mean, var = (p.astype(np.float64) for p in params)
        scale = gamma / np.sqrt(var + eps)
        folded = (scale.astype(dt).reshape(bshape), (beta - mean * scale).astype(dt).reshape(bshape))
    else:
        folded = None

    def make(ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        x, y = ins[0], outs[0]
        if folded is not None:
            scale, shift = folded
            refresh = _nothing
        else:
            scale, shift = (scratch_view(s, (c,), dt) for s in scratch)
            gamma, beta, mean, var = ins[1:5]

            def refresh() -> None:
                np.add(var, eps, out=scale)
                np.sqrt(scale, out=scale)
                np.divide(gamma, scale, out=scale)
                np.multiply(mean, scale, out=shift)
                np.subtract(beta, shift, out=shift)
        s, b = scale.reshape(bshape), shift.reshape(bshape)

        def run() -> None:
            refresh()
            np.multiply(x, s, out=y)
            np.add(y, b, out=y)
        return run
    return BoundKernel(make, () if folded is not None else (c * dt.itemsize,) * 2)


def _batch_norm_training(spec: NodeSpec, slots: list[int | None], eps: float, momentum: float,
                         bshape: tuple[int, ...]) -> Kernel:
    shape = spec.inputs[0].shape
    dt = np.dtype(spec.outputs[0].dtype)
    nb, c = shape[:2]
    s = int(np.prod(shape[2:]))
    count = nb * s
    col = np.full((s, 1), 1 / count, dt)  # per (image, channel) partial means, summed over images after

    def make(ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        x, y = ins[0].reshape(nb, c, s), outs[0].reshape(nb, c, s)
        part = scratch_view(scratch[0], (nb, c, 1), dt)
        sq = scratch_view(scratch[1], (nb, c, s), dt)
        mean, var, factor = (scratch_view(scratch[k], (c, 1), dt) for k in (2, 3, 4))
        gamma, beta = ins[1].reshape(c, 1), ins[2].reshape(c, 1)
        run_mean, run_var = ins[3].reshape(c, 1), ins[4].reshape(c, 1)
        out = {k: outs[slots[k]].reshape(c, 1) for k in range(1, len(slots)) if slots[k] is not None}

        def run() -> None:
            np.matmul(x, col, out=part)
            np.add.reduce(part, axis=0, out=mean)
            np.subtract(x, mean, out=sq)
            np.multiply(sq, sq, out=sq)
            np.matmul(sq, col, out=part)
            np.add.reduce(part, axis=0, out=var)  # the population variance of the batch
            for k, (running, batch) in ((1, (run_mean, mean)), (2, (run_var, var))):
                if k in out:  # running * momentum + batch * (1 - momentum)
                    np.subtract(running, batch, out=out[k])
                    np.multiply(out[k], momentum, out=out[k])
                    np.add(out[k], batch, out=out[k])
            np.add(var, eps, out=factor)
            np.sqrt(factor, out=factor)
            np.reciprocal(factor, out=factor)
            if 3 in out:
                np.copyto(out[3], mean)
            if 4 in out:
                np.copyto(out[4], factor)
            np.multiply(factor, gamma, out=factor)
            np.subtract(x, mean, out=y)
            np.multiply(y, factor, out=y)
            np.add(y, beta, out=y)
        return run
    item = dt.itemsize
    return BoundKernel(make, (nb * c * item, nb * c * s * item, c * item, c * item, c * item))


def lp_norm(spec: NodeSpec) -> Kernel:
    """x / ||x||_p along `axis` (p 1 or 2); where the norm is 0 (the whole row is 0) the output is 0, as in
    onnx.reference. The L1 norm sums |x| (onnx.reference's sums x itself, wrong for negative values)."""
    shape = spec.inputs[0].shape
    dt = np.dtype(spec.inputs[0].dtype)
    if dt.kind != "f":
        raise _fail(spec, f"dtype {dt}")
    p = int(spec.attr("p", 2))
    if p not in (1, 2):
        raise _fail(spec, f"attribute 'p' value {p}")
    rank = len(shape)
    axis = int(spec.attr("axis", -1))
    if not -rank <= axis < rank:
        raise _fail(spec, f"attribute 'axis' value {axis} (input rank {rank})")
    axis %= rank
    view = (int(np.prod(shape[:axis])), shape[axis], int(np.prod(shape[axis + 1:])))
    stat = (view[0], 1, view[2])
    n_stat = int(np.prod(stat))
    if n_stat * view[1] == 0:
        return BoundKernel(lambda ins, outs, _s: lambda: None)
    pre = np.abs if p == 1 else np.square
    inf = dt.type(np.inf)

    def make(ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        x, y = ins[0].reshape(view), outs[0].reshape(view)
        t = scratch_view(scratch[0], view, dt)
        norm = scratch_view(scratch[1], stat, dt)
        zero = scratch_view(scratch[2], stat, np.bool_)

        def run() -> None:
            pre(x, out=t)
            np.add.reduce(t, axis=1, keepdims=True, out=norm)
            if p == 2:
                np.sqrt(norm, out=norm)
            np.equal(norm, 0, out=zero)
            np.copyto(norm, inf, where=zero)  # 0 / inf = 0: a row of zeros stays zeros
            np.divide(x, norm, out=y)
        return run
    return BoundKernel(make, (spec.inputs[0].nbytes, n_stat * dt.itemsize, n_stat))


def mean_variance_norm(spec: NodeSpec) -> Kernel:
    """(x - mean) / (std + 1e-9) over `axes` (default [0, 2, 3]), ONNX's function with the variance computed as
    the mean of the squared deviations (its E[x^2] - E[x]^2 cancels, and goes negative: a NaN std, for a
    constant slice)."""
    shape = spec.inputs[0].shape
    dt = np.dtype(spec.inputs[0].dtype)
    if dt.kind != "f":
        raise _fail(spec, f"dtype {dt}")
    rank = len(shape)
    axes = list(spec.attr("axes", [0, 2, 3]))
    if any(not -rank <= a < rank for a in axes):
        raise _fail(spec, f"attribute 'axes' value {axes} (input rank {rank})")
    axes = tuple(sorted({a % rank for a in axes}))
    stat = tuple(1 if d in axes else n for d, n in enumerate(shape))
    count = int(np.prod([shape[a] for a in axes]))
    n_stat = int(np.prod(stat))
    if count * n_stat == 0:
        return BoundKernel(lambda ins, outs, _s: lambda: None)
    scale, eps = dt.type(1 / count), dt.type(np.float32(1e-9))

    def make(ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        x, y = ins[0], outs[0]
        t = scratch_view(scratch[0], shape, dt)
        mean = scratch_view(scratch[1], stat, dt)
        std = scratch_view(scratch[2], stat, dt)

        def run() -> None:
            np.add.reduce(x, axis=axes, keepdims=True, out=mean)
            np.multiply(mean, scale, out=mean)
            np.subtract(x, mean, out=y)  # in place too: x is read before y is written
            np.square(y, out=t)
            np.add.reduce(t, axis=axes, keepdims=True, out=std)
            np.multiply(std, scale, out=std)
            np.sqrt(std, out=std)
            np.add(std, eps, out=std)
            np.divide(y, std, out=y)
        return run
    return BoundKernel(make, (spec.inputs[0].nbytes, n_stat * dt.itemsize, n_stat * dt.itemsize))


KERNELS = {"LayerNormalization": layer_norm, "InstanceNormalization": instance_norm,
           "GroupNormalization": group_norm, "BatchNormalization": batch_norm, "LpNormalization": lp_norm,
           "MeanVarianceNormalization": mean_variance_norm}
