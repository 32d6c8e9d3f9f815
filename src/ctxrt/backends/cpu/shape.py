"""Data movement: concatenation, transposes, slices, splits, gathers, tiling, padding, copies, ReverseSequence;
EyeLike.

Views of the inputs (slices, transposes, reshapes) are made once at bind time; a launch is then a copy
(or a gather) into the output. Shape, Size and parameter inputs are folded by the frontend.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np

from ctxrt.backends.cpu import strided
from ctxrt.backends.cpu.elementwise import BoundKernel, flat
from ctxrt.backends.kernel import Kernel, Launch, NodeSpec, check_indices, constant_indices_error, scratch_view
from ctxrt.errors import InvalidInputError, UnsupportedOpError


def _fail(spec: NodeSpec, what: str) -> UnsupportedOpError:
    return UnsupportedOpError(f"{spec.op} node {spec.name!r}: {what} is not supported")


def _axis(spec: NodeSpec, axis: int, rank: int) -> int:
    if not -rank <= axis < rank:
        raise UnsupportedOpError(f"{spec.op} node {spec.name!r}: axis {axis} is out of range for rank {rank}")
    return axis % rank


def _copy_from(view: Callable[[np.ndarray], np.ndarray]) -> Kernel:
    """A kernel copying `view(x)` (a view of input 0 made at bind time) into the output."""
    def make(ins: list[Any], outs: list[Any], _s: list[Any]) -> Launch:
        return strided.copy(outs[0], view(ins[0]))
    return BoundKernel(make)


def copy(spec: NodeSpec) -> Kernel:
    """Reshape, Flatten, Squeeze, Unsqueeze, Identity: the planner aliases them when it can."""
    shape = spec.outputs[0].shape
    return _copy_from(lambda x: x.reshape(shape))


def expand(spec: NodeSpec) -> Kernel:
    return _copy_from(lambda x: x)  # copyto broadcasts like ONNX Expand


def transpose(spec: NodeSpec) -> Kernel:
    rank = len(spec.inputs[0].shape)
    perm = [_axis(spec, p, rank) for p in spec.attr("perm") or range(rank - 1, -1, -1)]
    return _copy_from(lambda x: x.transpose(perm))


def slice_(spec: NodeSpec) -> Kernel:
    shape = spec.inputs[0].shape
    starts, ends = list(spec.attr("starts")), list(spec.attr("ends"))
    axes = list(spec.attr("axes") or range(len(starts)))
    steps = list(spec.attr("steps") or [1] * len(starts))
    index = [slice(None)] * len(shape)
    for start, end, axis, step in zip(starts, ends, axes, steps, strict=True):
        if step == 0:
            raise _fail(spec, "step 0")
        # Python slices clamp like ONNX: negatives count from the end, then bounds clamp to [0, dim]
        # (to [-1, dim - 1] for negative steps, -1 being "before the start").
        index[_axis(spec, int(axis), len(shape))] = slice(int(start), int(end), int(step))
    idx = tuple(index)
    return _copy_from(lambda x: x[idx])


def _split_sizes(spec: NodeSpec, dim: int) -> list[int]:
    split = spec.attr("split")
    if split is None:
        n = int(spec.attr("num_outputs", len(spec.outputs)))
        step = -(-dim // n)  # opset 18: equal parts but the last, which may be smaller
        split = [max(0, min(step, dim - k * step)) for k in range(n)]
    return [int(s) for s in split]


def split(spec: NodeSpec) -> Kernel:
    shape = spec.inputs[0].shape
    axis = _axis(spec, int(spec.attr("axis", 0)), len(shape))
    sizes = _split_sizes(spec, shape[axis])
    if [o.shape[axis] for o in spec.outputs] != sizes:
        raise _fail(spec, f"outputs of sizes {[o.shape[axis] for o in spec.outputs]} for split {sizes} "
                          "(all outputs must be kept)")
    bounds = np.cumsum([0] + sizes).tolist()

    def make(ins: list[Any], outs: list[Any], _s: list[Any]) -> Launch:
        return strided.chain([strided.copy(y, ins[0][(slice(None),) * axis + (slice(bounds[k], bounds[k + 1]),)])
                              for k, y in enumerate(outs)])
    return BoundKernel(make)


def concat(spec: NodeSpec) -> Kernel:
    axis = _axis(spec, int(spec.attr("axis")), len(spec.outputs[0].shape))

    def make(ins: list[Any], outs: list[Any], _s: list[Any]) -> Launch:
        return concat_launch(list(ins), outs[0], axis)
    return BoundKernel(make)


def concat_launch(xs: list[Any], y: np.ndarray, axis: int) -> Launch:
    """y = the xs along `axis`: a native copy per part where they fit, else NumPy's concatenate."""
    def parts() -> Launch:
        out, start = [], 0
        for x in xs:
            out.append(strided.copy(y[(slice(None),) * axis + (slice(start, start + x.shape[axis]),)], x))
            start += x.shape[axis]
        return strided.chain(out)
    return strided.deferred(lambda: np.concatenate(xs, axis=axis, out=y), parts)


def _index_kernel(spec: NodeSpec, gather: Any, idx_pos: int = 1, per_data: Any = None) -> Kernel:
    """Run `gather(data, int64 indices, out)`; indices of other types are widened into scratch first
    (np.take would allocate the converted copy), constant ones once. `per_data(data, out)`: the gather function
    for the data and output bound (None: `gather`)."""
    const = spec.consts[idx_pos] if len(spec.consts) > idx_pos else None
    ishape = spec.inputs[idx_pos].shape

    def chosen(data: Any, y: Any) -> Any:
        return (per_data(data, y) if per_data is not None else None) or gather

    if const is not None:
        fixed = np.array(const, np.int64).reshape(ishape)  # a 0-d index may come as 1-d

        def fixed_launch(ins: list[Any], outs: list[Any], _s: list[Any]) -> Launch:
            fn = chosen(ins[0], outs[0])
            return lambda: fn(ins[0], fixed, outs[0])
        return BoundKernel(fixed_launch)
    if np.dtype(spec.inputs[idx_pos].dtype) == np.int64:
        def direct(ins: list[Any], outs: list[Any], _s: list[Any]) -> Launch:
            fn = chosen(ins[0], outs[0])
            return lambda: fn(ins[0], ins[idx_pos], outs[0])
        return BoundKernel(direct)

    def make(ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        data, idx, y = ins[0], ins[idx_pos], outs[0]
        wide = scratch_view(scratch[0], ishape, np.int64)
        fn = chosen(data, y)

        def run() -> None:
            np.copyto(wide, idx, casting="unsafe")
            fn(data, wide, y)
        return run
    return BoundKernel(make, (max(1, int(np.prod(ishape))) * 8,))


# A constant table at least this large, gathered along its rows, whose bytes are a mapped file's (a context binary's
# weights, a model's external data): its rows are read from the file (docs/cpu.md, "Embedding rows read from the
# file"), never mapped in, so an embedding's table does not become resident.
ROWS_FROM_FILE = 4 << 20


def gather(spec: NodeSpec) -> Kernel:
    axis = _axis(spec, int(spec.attr("axis", 0)), len(spec.inputs[0].shape))
    n_axis = spec.inputs[0].shape[axis]

    def take(data: np.ndarray, idx: np.ndarray, y: np.ndarray) -> None:
        # (constant indices too, when the node runs, not when it is built: a model compiled with its dims bound to 1
        # may hold a Gather no run at consistent shapes reaches out of range, as onnxruntime runs it)
        check_indices(spec, idx, n_axis)
        # mode="wrap" maps negative indices from the end in the same pass ("raise" would buffer y).
        np.take(data, idx, axis=axis, out=y, mode="wrap")

    table = spec.consts[0] if spec.consts else None
    if axis != 0 or table is None or spec.inputs[0].nbytes < ROWS_FROM_FILE or len(spec.inputs[0].shape) < 2:
        return _index_kernel(spec, take)

    def per_data(data: np.ndarray, y: np.ndarray) -> Any:
        from ctxrt.mapped import file_of

        found = file_of(data) if isinstance(data, np.ndarray) and data.shape[0] else None
        if found is None or not y.flags.c_contiguous:
            return None
        ref, base = found
        n, row = data.shape[0], data.nbytes // data.shape[0]
        rows = y.reshape(-1).view(np.uint8).reshape(-1, row)
        buffers = [[rows[i]] for i in range(len(rows))]  # the output's rows as preadv takes them, made once

        def read_rows(data: np.ndarray, idx: np.ndarray, y: np.ndarray) -> None:
            check_indices(spec, idx, n)
            for buf, j in zip(buffers, idx.reshape(-1).tolist(), strict=True):
                if os.preadv(ref.fd, buf, base + (j % n) * row) != row:
                    raise OSError(f"short read of row {j % n} of a gathered table from its file")
        return read_rows
    return _index_kernel(spec, take, per_data=per_data)


def gather_elements(spec: NodeSpec) -> Kernel:
    dshape, ishape = spec.inputs[0].shape, spec.inputs[1].shape
    axis = _axis(spec, int(spec.attr("axis", 0)), len(dshape))
    strides = [int(np.prod(dshape[d + 1:])) for d in range(len(dshape))]
    # Flat offset in `data` of every index position, but along `axis`, where the index supplies it.
    grid = np.indices(ishape, dtype=np.int64)
    base = sum((grid[d] * strides[d] for d in range(len(dshape)) if d != axis), np.zeros(ishape, np.int64))
    const = spec.consts[1] if len(spec.consts) > 1 else None
    if const is not None:
        flat_idx = np.mod(const.astype(np.int64), dshape[axis]) * strides[axis] + base
        error = constant_indices_error(spec, np.asarray(const), dshape[axis])

        def fixed(ins: list[Any], outs: list[Any], _s: list[Any]) -> Launch:
            data, y = ins[0].reshape(-1), outs[0]

            def run() -> None:
                if error is not None:
                    raise error
                np.take(data, flat_idx, out=y, mode="clip")
            return run
        return BoundKernel(fixed)

    def make(ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        data, idx, y = ins[0].reshape(-1), ins[1], outs[0]
        t = scratch_view(scratch[0], ishape, np.int64)

        def run() -> None:
            np.copyto(t, idx, casting="unsafe")
            check_indices(spec, t, dshape[axis])
            np.mod(t, dshape[axis], out=t)  # negative indices count from the end
            np.multiply(t, strides[axis], out=t)
            np.add(t, base, out=t)
            np.take(data, t, out=y, mode="clip")
        return run
    return BoundKernel(make, (max(1, base.size) * 8,))


def gather_nd(spec: NodeSpec) -> Kernel:
    dshape, ishape = spec.inputs[0].shape, spec.inputs[1].shape
    b = int(spec.attr("batch_dims", 0))
    k = ishape[-1]
    inner = int(np.prod(dshape[b + k:]))
    nidx = int(np.prod(ishape[:-1]))
    dims = np.array(dshape[b:b + k], np.int64)
    strides = np.array([int(np.prod(dshape[b + j + 1:b + k])) for j in range(k)], np.int64)
    # Row of the (rows, inner) data matrix where each batch's block starts, per index tuple.
    per_batch = int(np.prod(dshape[b:b + k]))
    batch_of = np.indices(ishape[:-1], dtype=np.int64)[:b] if b else None
    bstrides = [int(np.prod(dshape[j + 1:b])) for j in range(b)]
    base = (sum((batch_of[j] * bstrides[j] for j in range(b)), np.zeros(ishape[:-1], np.int64)) * per_batch
            ).reshape(nidx)

    def make(ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        data, idx = ins[0].reshape(-1, inner), ins[1].reshape(nidx, k)
        y = outs[0].reshape(nidx, inner)
        t = scratch_view(scratch[0], (nidx, k), np.int64)
        rows = scratch_view(scratch[1], (nidx,), np.int64)

        def run() -> None:
            np.copyto(t, idx, casting="unsafe")
            check_indices(spec, t, dims)
            np.mod(t, dims, out=t)  # negative indices count from the end
            np.matmul(t, strides, out=rows)
            np.add(rows, base, out=rows)
            np.take(data, rows, axis=0, out=y, mode="clip")
        return run
    return BoundKernel(make, (max(1, nidx * k) * 8, max(1, nidx) * 8))


def tile(spec: NodeSpec) -> Kernel:
    shape = spec.inputs[0].shape
    reps = [int(r) for r in spec.attr("repeats")]
    # The output as (r0, d0, r1, d1, ...): one broadcasting copy of x as (1, d0, 1, d1, ...).
    src_shape = tuple(v for d in shape for v in (1, d))
    out_shape = tuple(v for r, d in zip(reps, shape, strict=True) for v in (r, d))

    def make(ins: list[Any], outs: list[Any], _s: list[Any]) -> Launch:
        x, y = ins[0].reshape(src_shape), outs[0].reshape(out_shape)
        return lambda: np.copyto(y, x)
    return BoundKernel(make)


def _pad_index(mode: str, n: int, before: int, after: int) -> np.ndarray:
    """For each output position along one axis, the input position it copies (edge/reflect/wrap).

    Negative pads crop first; the padding then reads the cropped range only (as onnxruntime)."""
    lo, m = max(-before, 0), n - max(-before, 0) - max(-after, 0)
    j = np.arange(-max(before, 0), m + max(after, 0))
    if mode == "edge":
        j = np.clip(j, 0, m - 1)
    elif mode == "wrap":
        j = np.mod(j, m)
    else:
        period = max(2 * (m - 1), 1)
        j = np.mod(j, period)
        j = np.where(j < m, j, period - j)
    return j + lo


def pad(spec: NodeSpec) -> Kernel:
    shape, out_shape = spec.inputs[0].shape, spec.outputs[0].shape
    rank = len(shape)
    axes = [_axis(spec, int(a), rank) for a in spec.attr("axes") or range(rank)]
    pads = [int(p) for p in spec.attr("pads")]
    before, after = [0] * rank, [0] * rank
    for j, a in enumerate(axes):
        before[a], after[a] = pads[j], pads[j + len(axes)]
    mode = spec.attr("mode", "constant")
    if mode == "constant":
        return _pad_constant(spec, before, after)
    if mode not in ("edge", "reflect", "wrap"):
        raise _fail(spec, f"mode {mode!r}")
    if mode == "reflect" and any(n < 2 and (b > 0 or e > 0) for n, b, e in zip(shape, before, after, strict=True)):
        raise _fail(spec, "reflect padding of an axis of size 1")
    # One np.take per padded axis: a chain of gathers through two scratch buffers into the output.
    dt = np.dtype(spec.outputs[0].dtype)
    steps, cur = [], tuple(shape)
    for a in range(rank):
        if before[a] or after[a]:
            cur = cur[:a] + (out_shape[a],) + cur[a + 1:]
            steps.append((a, _pad_index(mode, shape[a], before[a], after[a]), cur))
    size = max([int(np.prod(s)) for _, _, s in steps[:-1]], default=0) * dt.itemsize

    def make(ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        plan, src = [], ins[0]
        for k, (a, index, s) in enumerate(steps):
            dst = outs[0] if k == len(steps) - 1 else scratch_view(scratch[k % 2], s, dt)
            plan.append((src, index, a, dst))
            src = dst
        if not plan:
            return lambda: np.copyto(outs[0], ins[0])

        def run() -> None:
            for x, index, a, y in plan:
                np.take(x, index, axis=a, out=y, mode="clip")
        return run
    return BoundKernel(make, (size, size) if len(steps) > 1 else ())


def _pad_constant(spec: NodeSpec, before: list[int], after: list[int]) -> Kernel:
    shape, out_shape = spec.inputs[0].shape, spec.outputs[0].shape
    dt = np.dtype(spec.outputs[0].dtype)
    value = dt.type(np.asarray(spec.attr("constant_value", spec.attr("value", 0))).reshape(-1)[0])
    # Negative pads crop: the copied part of x, and where it lands in y.
    src = tuple(slice(max(-b, 0), n - max(-e, 0)) for n, b, e in zip(shape, before, after, strict=True))
    dst = tuple(slice(max(b, 0), n - max(e, 0)) for n, b, e in zip(out_shape, before, after, strict=True))
    # The border as disjoint slabs: along axis a, the padded ends, full range on the axes before it and
    # the interior on the axes after it (filled once each; the interior is written by the copy).
    slabs = []
    for a in range(len(shape)):
        for part in (slice(0, dst[a].start), slice(dst[a].stop, out_shape[a])):
            if part.stop > part.start:
                slabs.append((slice(None),) * a + (part,) + dst[a + 1:])

    def make(ins: list[Any], outs: list[Any], _s: list[Any]) -> Launch:
        x, y = ins[0][src], outs[0]
        views, inner = [y[s] for s in slabs], y[dst]
        # constant_value computed at run time: a 0-d view of its input, read by every launch
        fill = ins[2].reshape(()) if len(ins) > 2 and ins[2] is not None else value

        def run() -> None:
            for v in views:
                np.copyto(v, fill)
            np.copyto(inner, x)
        return run
    return BoundKernel(make)


def depth_space_split(spec: NodeSpec) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """DepthToSpace / SpaceToDepth as a 6-D split of the input and a permutation of it (every backend's)."""
    n, c, h, w = spec.inputs[0].shape
    b = int(spec.attr("blocksize"))
    dcr = spec.attr("mode", "DCR") == "DCR"  # SpaceToDepth has the mode since opset 28 (CRD: channels first)
    if spec.op == "SpaceToDepth":
        return (n, c, h // b, b, w // b, b), (0, 3, 5, 1, 2, 4) if dcr else (0, 1, 3, 5, 2, 4)
    if dcr:
        return (n, b, b, c // (b * b), h, w), (0, 3, 4, 1, 5, 2)
    return (n, c // (b * b), b, b, h, w), (0, 1, 4, 2, 5, 3)


def depth_space(spec: NodeSpec) -> Kernel:
    split, perm = depth_space_split(spec)
    moved = tuple(split[p] for p in perm)

    def make(ins: list[Any], outs: list[Any], _s: list[Any]) -> Launch:
        x, y = ins[0].reshape(split).transpose(perm), outs[0].reshape(moved)
        return lambda: np.copyto(y, x)
    return BoundKernel(make)


def range_(spec: NodeSpec) -> Kernel:
    """Range: its output shape depends on its input values, so a static graph has them as constants."""
    if any(c is None for c in spec.consts[:3]):
        raise _fail(spec, "Range of values unknown at compile time")
    start, _, delta = (c.item() for c in spec.consts[:3])
    (n,) = spec.outputs[0].shape
    values = (start + delta * np.arange(n)).astype(spec.outputs[0].dtype)  # ONNX: start + i * delta
    return BoundKernel(lambda ins, outs, _s: lambda: np.copyto(outs[0], values))


def constant_of_shape(spec: NodeSpec) -> Kernel:
    value = spec.attr("value")
    dt = np.dtype(spec.outputs[0].dtype)
    fill = dt.type(0) if value is None else dt.type(np.asarray(value).reshape(-1)[0])
    return BoundKernel(lambda ins, outs, _s: lambda: outs[0].fill(fill))


def center_crop_pad(spec: NodeSpec) -> Kernel:
    """The input cropped or zero-padded to `shape` on `axes` (all by default), centred: an odd difference puts the
    extra element at the end (onnx.reference's split)."""
    shape_in, shape_out = spec.inputs[0].shape, spec.outputs[0].shape
    rank = len(shape_in)
    target = spec.attr("shape")
    if target is None:
        raise _fail(spec, "input shape unknown at compile time")
    target = [int(v) for v in np.asarray(target).reshape(-1)]
    axes = [_axis(spec, int(a), rank) for a in (spec.attr("axes") or range(rank))]
    if len(axes) != len(target) or len(set(axes)) != len(axes):
        raise _fail(spec, f"shape {target} for axes {axes}")
    src, dst = [slice(None)] * rank, [slice(None)] * rank
    for a, t in zip(axes, target, strict=True):
        d = shape_in[a]
        if t < d:
            src[a] = slice((d - t) // 2, (d - t) // 2 + t)
        elif t > d:
            dst[a] = slice((t - d) // 2, (t - d) // 2 + d)
        if shape_out[a] != t:
            raise _fail(spec, f"an output of shape {list(shape_out)} for shape {target} on axes {axes}")
    padded = any(s != slice(None) for s in dst)
    zero = np.dtype(spec.outputs[0].dtype).type(0)

    def make(ins: list[Any], outs: list[Any], _s: list[Any]) -> Launch:
        x, y = ins[0][tuple(src)], outs[0]
        inner = y[tuple(dst)]

        def run() -> None:
            if padded:
                y.fill(zero)
            np.copyto(inner, x)
        return run
    return BoundKernel(make)


def eye_like(spec: NodeSpec) -> Kernel:
    """Ones on the k-th diagonal of a 2-D output of the input's shape (its values are not read), zeros elsewhere."""
    shape = spec.outputs[0].shape
    if len(shape) != 2:
        raise _fail(spec, f"input of rank {len(shape)}")
    rows, cols = shape
    k = int(spec.attr("k", 0))
    dt = np.dtype(spec.outputs[0].dtype)
    start, count = (k, min(rows, cols - k)) if k >= 0 else (-k * cols, min(rows + k, cols))
    count = max(0, count)
    one = dt.type(1)

    def make(ins: list[Any], outs: list[Any], _s: list[Any]) -> Launch:
        y = outs[0]
        diag = flat(y)[start:start + count * (cols + 1):cols + 1]  # (i, i + k): a stride of cols + 1

        def run() -> None:
            y.fill(0)
            diag.fill(one)
        return run
    return BoundKernel(make)


def reverse_sequence(spec: NodeSpec) -> Kernel:
    """Each batch entry's first sequence_lens[b] steps along time_axis reversed, the rest copied. The lengths
    are read at each run (0 leaves the entry as it is); one outside [0, steps] is an error."""
    shape = spec.inputs[0].shape
    rank = len(shape)
    batch_axis, time_axis = int(spec.attr("batch_axis", 1)), int(spec.attr("time_axis", 0))
    if rank < 2 or {batch_axis, time_axis} != {0, 1}:
        raise _fail(spec, f"batch_axis {batch_axis} and time_axis {time_axis} of an input of rank {rank}")
    steps = shape[time_axis]

    def make(ins: list[Any], outs: list[Any], _s: list[Any]) -> Launch:
        x = np.moveaxis(ins[0], (batch_axis, time_axis), (0, 1))  # views: [batch, time, ...]
        y = np.moveaxis(outs[0], (batch_axis, time_axis), (0, 1))
        lens = ins[1].reshape(-1)
        name = spec.name

        def run() -> None:
            if lens.shape[0] != x.shape[0]:
                raise InvalidInputError(f"ReverseSequence node {name!r}: {lens.shape[0]} sequence_lens for a "
                                        f"batch of {x.shape[0]}")
            got = lens.tolist()
            for b, n in enumerate(got):  # all checked before any is written (no half-written output)
                if not 0 <= n <= steps:
                    raise InvalidInputError(f"ReverseSequence node {name!r}: sequence_lens[{b}] = {n} is "
                                            f"outside [0, {steps}]")
            for b, n in enumerate(got):
                np.copyto(y[b, :n], x[b, n - 1::-1] if n else x[b, :0])
                np.copyto(y[b, n:], x[b, n:])
        return run
    return BoundKernel(make)


KERNELS = {
    **{op: copy for op in ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity")},
    "Expand": expand, "Transpose": transpose, "Slice": slice_, "Split": split, "Concat": concat,
    "Gather": gather, "GatherElements": gather_elements, "GatherND": gather_nd, "Tile": tile, "Pad": pad,
    "DepthToSpace": depth_space, "SpaceToDepth": depth_space, "Range": range_,
    "ConstantOfShape": constant_of_shape, "EyeLike": eye_like, "ReverseSequence": reverse_sequence,
    "CenterCropPad": center_crop_pad,
}
