"""TopK: the k largest (smallest) elements along an axis and their int64 indices, sorted, ties to the lower index
(onnxruntime's order; with sorted=0 too), -0 and +0 equal, NaN of either sign above +inf (onnxruntime's order).
Nothing that scales with the input is allocated (a selection's index temporaries are a few times the output's).

Partial selection (32- and 64-bit types, k < n): the rows are copied (the axis last) and partitioned in place
around their k-th best value t (NumPy's introselect, O(n), in SIMD for these types); the elements at least as good
as t are then exactly the top k unless t has ties across the boundary. They are found with one comparison pass
over x in its own layout and read back through the mask's 64-bit words (only words with a hit are looked at), in
index order; only those k per row are then sorted (by value, then position). Ties at t keep the lowest indices
(a running count of the equal ones); rows that still do not come out at k (NaN) are done by the exact ordering.

Exact ordering (`_Order`: 8- and 16-bit types, k == n, the fallback, and the sort of the selected k): each element
becomes an unsigned key whose integer order is the wanted order (floats: half + |x|, half - |x| below 0; signed
ints with the sign bit flipped; complemented for largest). Key and position are packed into one uint32 where they
fit (16-bit types up to 65536 elements per row), else one uint64, so an in-place partition and a sort of the
first k order values and ties at once; 64-bit types sort (key, position) records (a generic compare: slow, used on
the k selected per row only, or when k == n)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ctxrt.backends.kernel import Kernel, Launch, NodeSpec, scratch_view
from ctxrt.errors import UnsupportedOpError

_UNSIGNED = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def _fail(spec: NodeSpec, what: str) -> UnsupportedOpError:
    return UnsupportedOpError(f"{spec.op} node {spec.name!r}: {what} is not supported")


def _steps(steps: list[tuple[Callable[..., Any], tuple[Any, ...], Any]]) -> Launch:
    """Run (f, args, out) steps: out None, an array (out=) or keyword arguments."""
    def run() -> None:
        for f, args, out in steps:
            if out is None:
                f(*args)
            elif isinstance(out, dict):
                f(*args, **out)
            else:
                f(*args, out=out)
    return run


class _Order:
    """Orders an array along its last axis (any strides; `shape`, of n along that axis) and writes the positions
    of the first k, in order, as uint64 into `pos` (the shape with k last). Scratch: buffers of `nbytes`."""

    def __init__(self, shape: tuple[int, ...], k: int, dt: np.dtype, largest: bool) -> None:
        self.shape, self.k, self.dt, self.largest = shape, k, dt, largest
        self.w, self.shift = dt.itemsize * 8, max(1, (shape[-1] - 1).bit_length())
        self.packed = self.w + self.shift <= 64
        self.kdt = np.dtype(np.uint32 if self.w + self.shift <= 32 else np.uint64)  # the key and the position
        m, kb = int(np.prod(shape, dtype=np.int64)), self.kdt.itemsize
        self.nbytes = (m * (kb if self.packed else 16), m * kb, m * kb + m)

    def bind(self, src: np.ndarray, pos: np.ndarray, scratch: list[np.ndarray]) -> Launch:
        shape, k, kdt = self.shape, self.k, self.kdt
        index = np.arange(shape[-1], dtype=kdt)
        if self.packed:
            keys = kv = scratch_view(scratch[0], shape, kdt)
            finish = [(np.left_shift, (keys, kdt.type(self.shift)), keys), (np.bitwise_or, (keys, index), keys)]
            extract = (np.bitwise_and, (keys[..., :k], kdt.type((1 << self.shift) - 1)), pos)
        else:
            keys = scratch_view(scratch[0], shape, np.dtype([("k", "<u8"), ("i", "<u8")]))
            kv = keys["k"]
            finish = [(np.copyto, (keys["i"], index), None)]
            extract = (np.copyto, (pos, keys["i"][..., :k]), None)
        keyed = _steps(self._keys(src, kv, scratch) + finish)
        top, partial, last = keys[..., :k], k < shape[-1], _steps([extract])

        def run() -> None:
            keyed()
            if partial:
                keys.partition(k - 1, axis=-1)
            top.sort(axis=-1)
            last()
        return run

    def _keys(self, src: np.ndarray, kv: np.ndarray, scratch: list[np.ndarray]) -> list:
        """Steps writing the order-preserving keys of src into kv (w bits wide): ascending in the wanted order.
        Floats are keyed in their own width, then widened: half + |x| for x >= 0 (NaN of either sign too: above
        +inf), half - |x| below 0, so -0 and +0 get one key."""
        dt, w, shape = self.dt, self.w, self.shape
        u = np.dtype(_UNSIGNED[dt.itemsize])
        bits = src.view(u)
        if dt.kind != "f":
            t = kv.dtype
            flip = t.type((1 << w) - 1) if self.largest else t.type(0)
            half = t.type(1 << (w - 1))
            steps: list = [(np.copyto, (kv, bits), None)]
            if dt.kind == "i":
                steps.append((np.bitwise_xor, (kv, half ^ flip), kv))
            elif self.largest:
                steps.append((np.bitwise_xor, (kv, flip), kv))
            return steps
        m = int(np.prod(shape, dtype=np.int64))
        a, neg = scratch_view(scratch[1], shape, u), scratch_view(scratch[2], shape, u)
        nan = scratch[2][m * u.itemsize:m * u.itemsize + m].view(np.bool_).reshape(shape)
        half, one = u.type(1 << (w - 1)), u.type(1)
        inf = u.type(np.array(np.inf, dt).view(u))
        steps = [(np.bitwise_and, (bits, half - one), a), (np.right_shift, (bits, u.type(w - 1)), neg),
                 (np.greater, (a, inf), nan), (np.copyto, (neg, u.type(0)), {"where": nan}),
                 (np.multiply, (a, neg), neg), (np.left_shift, (neg, one), neg), (np.add, (a, half), a),
                 (np.subtract, (a, neg), a)]
        if self.largest:
            steps.append((np.bitwise_xor, (a, u.type((1 << w) - 1)), a))
        return [*steps, (np.copyto, (kv, a), None)]


class TopK(Kernel):
    """TopK with K known at compile time (an attribute): selection or exact ordering, as the module says."""

    def __init__(self, spec: NodeSpec) -> None:
        shape = spec.inputs[0].shape
        self.dt = dt = np.dtype(spec.inputs[0].dtype)
        if dt.kind not in "biuf":
            raise _fail(spec, f"dtype {dt}")
        rank = len(shape)
        axis = int(spec.attr("axis", -1))
        if not -rank <= axis < rank:
            raise _fail(spec, f"attribute 'axis' value {axis} (input rank {rank})")
        axis %= rank
        k = spec.attr("k")
        if k is None:
            raise _fail(spec, "input K unknown at compile time")
        self.k = k = int(np.asarray(k).reshape(-1)[0])
        self.n = n = shape[axis]
        if not 0 <= k <= n:
            raise _fail(spec, f"K = {k} for an axis of {n}")
        self.largest = largest = bool(spec.attr("largest", 1))
        self.perm = tuple(d for d in range(rank) if d != axis) + (axis,)
        self.lead = lead = tuple(shape[d] for d in self.perm[:-1])  # the rows: the axis moved last
        self.rows = rows = int(np.prod(lead, dtype=np.int64))
        # Element (..., i) of the rows is x.flat[base[...] + i * stride].
        strides = np.array([int(np.prod(shape[d + 1:], dtype=np.int64)) for d in self.perm[:-1]], np.int64)
        grid = np.indices(lead, dtype=np.int64).reshape(rank - 1, rows)  # (0, 1) at rank 1
        self.base = (strides @ grid if grid.size else np.zeros(rows, np.int64)).reshape(*lead, 1)
        self.stride = int(np.prod(shape[axis + 1:], dtype=np.int64))
        self.full = _Order((*lead, n), k, dt, largest)  # k == n, and the fallback of a selection
        # Selection where NumPy partitions in SIMD (32- and 64-bit types); narrower types pack key and position
        # into 32 bits (up to 65536 16-bit elements per row), which partition as fast.
        self.select = 0 < k < n and dt.itemsize >= 4
        m, kk = rows * n, max(k, 1)
        sizes = [*self.full.nbytes, rows * kk * 8, rows * kk * 8]  # + positions, offsets into x
        if self.select:
            self.final = _Order((rows, k), k, dt, largest)
            mask = -(-m // 8) * 8
            sizes[0] = max(sizes[0], m * dt.itemsize)  # the rows to partition, then a mask
            sizes[1] = max(sizes[1], mask)  # the mask of the selected
            sizes[2] = max(sizes[2], m * 4 + m)  # ties: running counts (int32), the equal ones
            # thresholds and counts, the indices picked, their values, the indices in order; the final ordering
            sizes += [rows * 16, rows * k * 8, rows * k * dt.itemsize, rows * k * 8, *self.final.nbytes]
        self.scratch = tuple(sizes)

    def bind(self, ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        lead, k = self.lead, self.k
        if k == 0 or self.rows == 0:
            return lambda: None
        x = ins[0]
        src = x.transpose(self.perm)  # a view: a reshape could copy, detached from the arena
        xflat, base, stride = x.reshape(-1), self.base, self.stride
        vals, idx = outs[0].transpose(self.perm), outs[1].transpose(self.perm)
        pos = scratch_view(scratch[3], (*lead, k), np.uint64)
        off = scratch_view(scratch[4], (*lead, k), np.int64)
        order = self.full.bind(src, pos, scratch[:3])

        def gather(positions: np.ndarray) -> None:
            """vals and idx from the rows' positions (indices along the axis)."""
            np.copyto(idx, positions, casting="unsafe")
            np.multiply(idx, stride, out=off)
            np.add(off, base, out=off)
            np.take(xflat, off, out=vals, mode="clip")

        def exact() -> None:
            order()
            gather(pos)
        return self._selection(src, x, scratch, gather, exact) if self.select else exact

    def _selection(self, src: np.ndarray, x: np.ndarray, scratch: list[Any],
                   gather: Callable[[np.ndarray], None], exact: Launch) -> Launch:
        """Rows partitioned with the axis last (`src` copied into `work`); masks, counts and ties in x's own
        layout (contiguous passes over x, the thresholds as views with x's axes)."""
        lead, rows, n, k, dt = self.lead, self.rows, self.n, self.k, self.dt
        m, kth, axis = rows * n, (self.n - k if self.largest else k - 1), self.perm[-1]
        back = tuple(int(i) for i in np.argsort(self.perm))  # moved axes -> x's
        better = np.greater if self.largest else np.less
        at_least = np.greater_equal if self.largest else np.less_equal
        work = scratch_view(scratch[0], (*lead, n), dt)
        tmp = scratch_view(scratch[0], x.shape, np.bool_)  # free once the thresholds are copied out
        maskbuf = scratch_view(scratch[1], (-(-m // 8) * 8,), np.bool_)
        mask, words, octets, pad = maskbuf[:m].reshape(x.shape), maskbuf.view(np.uint64), maskbuf.reshape(-1, 8), \
            maskbuf[m:]
        cum = scratch_view(scratch[2], x.shape, np.int32)
        eq = scratch[2][m * 4:m * 5].view(np.bool_).reshape(x.shape)
        thr = scratch_view(scratch[5], (*lead, 1), dt)
        cnt = scratch[5][rows * 8:rows * 16].view(np.int64).reshape(*lead, 1).transpose(back)
        thr_x, inner, xflat = thr.transpose(back), self.stride, x.reshape(-1)
        chosen = scratch_view(scratch[6], (rows, k), np.int64)
        picked = scratch_view(scratch[7], (rows, k), dt)
        ordered = scratch_view(scratch[8], (rows, k), np.int64)
        pos = scratch_view(scratch[3], (rows, k), np.uint64)
        final = self.final.bind(picked, pos, scratch[9:12])
        rowstart = np.arange(rows, dtype=np.int64).reshape(rows, 1) * n
        prow = np.arange(rows, dtype=np.uint64).reshape(rows, 1) * np.uint64(k)
        base, stride = self.base.reshape(rows, 1), self.stride
        off = scratch_view(scratch[4], (rows, k), np.int64)
        in_order = ordered.reshape(*lead, k)

        def picked_k() -> bool:
            """The masked positions into `chosen` (indices along the axis, ascending), if exactly k per row."""
            if np.count_nonzero(mask) != rows * k:
                return False
            pad.fill(False)
            hits = np.flatnonzero(words)  # the 8-element words holding a selected element (at most k per row)
            inside = np.flatnonzero(octets[hits])
            flat = chosen.reshape(-1)
            np.copyto(flat, hits[inside >> 3])
            np.left_shift(flat, 3, out=flat)
            np.bitwise_or(flat, inside & 7, out=flat)  # positions in x, ascending
            if inner > 1:  # -> (row, index along the axis), row-major: the rows' order, then the indices'
                np.copyto(flat, (flat // (n * inner) * inner + flat % inner) * n + flat // inner % n)
                flat.sort()
            np.subtract(chosen, rowstart, out=chosen)
            return int(chosen.min()) >= 0 and int(chosen.max()) < n  # else a row has more, another fewer

        def run() -> None:
            np.copyto(work, src)
            work.partition(kth, axis=-1)
            np.copyto(thr, work[..., kth:kth + 1])
            at_least(x, thr_x, out=mask)
            if not picked_k():  # ties at t across the boundary (or NaN): the lowest indices of the equal ones
                better(x, thr_x, out=mask)
                np.sum(mask, axis=axis, keepdims=True, out=cnt)
                np.subtract(k, cnt, out=cnt)  # how many equal ones each row takes
                np.equal(x, thr_x, out=eq)
                np.copyto(cum, eq)  # a cumsum from bool to int32 would allocate its output
                np.cumsum(cum, axis=axis, out=cum)
                np.less_equal(cum, cnt, out=tmp)
                np.logical_and(eq, tmp, out=eq)
                np.logical_or(mask, eq, out=mask)
                if not picked_k():  # NaN: the exact order of every element
                    exact()
                    return
            np.multiply(chosen, stride, out=off)
            np.add(off, base, out=off)
            np.take(xflat, off, out=picked, mode="clip")
            final()  # pos: the order of the k picked ones (ties keep the lower, i.e. earlier, position)
            np.add(pos, prow, out=pos)
            np.take(chosen.reshape(-1), pos.view(np.int64), out=ordered, mode="clip")
            gather(in_order)
        return run


def topk(spec: NodeSpec) -> Kernel:
    return TopK(spec)
