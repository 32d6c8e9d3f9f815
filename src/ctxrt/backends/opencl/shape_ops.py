"""Data movement on OpenCL (kernels/copy.cl): Transpose (tiled through local memory where the innermost dim
moves), Slice (any steps), Expand, Tile, DepthToSpace / SpaceToDepth, the copies of Reshape & co. that could not
be aliases, and Pad (every mode).

Each op is a strided view of its input (a base offset and per-dim element strides over the output's dims,
0 where it broadcasts, negative where a slice runs backwards), collapsed (size-1 dims dropped, neighbours merged
where the view is contiguous across them) and copied by one kernel.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from ctxrt.backends.cpu.shape import _axis, depth_space_split
from ctxrt.backends.kernel import Launch, NodeSpec
from ctxrt.backends.opencl.kernel import ClKernel, Space
from ctxrt.errors import UnsupportedOpError

MAX_RANK = 8  # dims of an int8 kernel argument
LIMIT = 1 << 31  # int element offsets
UINT = {1: "uchar", 2: "ushort", 4: "uint", 8: "ulong"}  # copies move bits: one type per element size

View = tuple[int, list[int], list[int]]  # base offset, output dims, input strides (elements)

# Kernels that move one element per work-item over a 2- or 3-D launch: the work-group size (its shape follows
# the tensor: local_3d). Large groups on PoCL (it vectorises across work-items) and on GPUs.
MOVE_SPACE = Space(params={"WGS": (32, 64, 128, 256)}, defaults={"default": {"WGS": 256}},
                   work_group=lambda p: (p["WGS"],))


def _fail(spec: NodeSpec, what: str) -> UnsupportedOpError:
    return UnsupportedOpError(f"{spec.op} node {spec.name!r}: no OpenCL kernel for {what}")


def strides_of(shape: tuple[int, ...]) -> list[int]:
    st, acc = [0] * len(shape), 1
    for d in range(len(shape) - 1, -1, -1):
        st[d] = acc
        acc *= shape[d]
    return st


def collapse(dims: list[int], strides: list[int]) -> tuple[list[int], list[int]]:
    """Size-1 dims dropped and adjacent dims merged where the view is contiguous across them."""
    keep = [(n, s) for n, s in zip(dims, strides, strict=True) if n != 1]
    out: list[list[int]] = []
    for n, s in keep:
        if out and out[-1][1] == s * n:
            out[-1] = [out[-1][0] * n, s]
        else:
            out.append([n, s])
    return [n for n, _ in out] or [1], [s for _, s in out] or [0]


def local_3d(d0: int, d1: int, wgs: int) -> tuple[int, int, int]:
    """A work-group for a (d0, d1, rest) launch: powers of 2 covering d0 first, at most `wgs` work-items."""
    l0 = min(1 << max(d0 - 1, 0).bit_length(), wgs)
    return l0, min(1 << max(d1 - 1, 0).bit_length(), wgs // l0), 1


def _int8(cl: Any, values: list[int], fill: int) -> Any:
    return cl.cltypes.make_int8(*values, *[fill] * (MAX_RANK - len(values)))


# ---- the views ---------------------------------------------------------------------------------------------

def _transpose(spec: NodeSpec) -> View:
    shape = spec.inputs[0].shape
    rank = len(shape)
    perm = [_axis(spec, int(p), rank) for p in spec.attr("perm") or range(rank - 1, -1, -1)]
    if sorted(perm) != list(range(rank)):
        raise UnsupportedOpError(f"Transpose node {spec.name!r}: perm {perm} is not a permutation")
    st = strides_of(shape)
    return 0, [shape[p] for p in perm], [st[p] for p in perm]


def _slice(spec: NodeSpec) -> View:
    shape = spec.inputs[0].shape
    starts, ends = list(spec.attr("starts")), list(spec.attr("ends"))
    axes = list(spec.attr("axes") or range(len(starts)))
    steps = list(spec.attr("steps") or [1] * len(starts))
    st = strides_of(shape)
    dims, strides, base = list(shape), list(st), 0
    for start, end, axis, step in zip(starts, ends, axes, steps, strict=True):
        if int(step) == 0:
            raise _fail(spec, "step 0")
        a = _axis(spec, int(axis), len(shape))
        lo, stop, s = slice(int(start), int(end), int(step)).indices(shape[a])  # clamps like ONNX
        dims[a] = len(range(lo, stop, s))
        base += lo * st[a] if dims[a] else 0
        strides[a] = st[a] * s
    return base, dims, strides


def _expand(spec: NodeSpec) -> View:
    out = spec.outputs[0].shape
    shape = (1,) * (len(out) - len(spec.inputs[0].shape)) + tuple(spec.inputs[0].shape)
    st = strides_of(shape)
    return 0, list(out), [0 if n == 1 else s for n, s in zip(shape, st, strict=True)]


def _tile(spec: NodeSpec) -> View:
    shape = spec.inputs[0].shape
    reps = [int(r) for r in spec.attr("repeats")]
    st = strides_of(shape)
    return (0, [v for r, n in zip(reps, shape, strict=True) for v in (r, n)],
            [v for s in st for v in (0, s)])


def _depth_space(spec: NodeSpec) -> View:
    split, perm = depth_space_split(spec)
    st = strides_of(split)
    return 0, [split[p] for p in perm], [st[p] for p in perm]


def _copy(spec: NodeSpec) -> View:
    return 0, [math.prod(spec.outputs[0].shape)], [1]


VIEWS: dict[str, Callable[[NodeSpec], View]] = {
    "Transpose": _transpose, "Slice": _slice, "Expand": _expand, "Tile": _tile, "DepthToSpace": _depth_space,
    "SpaceToDepth": _depth_space, **{op: _copy for op in ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity")},
}


class StridedCopy(ClKernel):
    """Y = a strided view of X. ALG 0: copy_nd, one element per work-item (WGS per work-group); ALG 1
    (views whose innermost output dim is strided in X, while another output dim is X's contiguous one: most
    transposes): transpose_tiled, TILE x TILE tiles through local memory, TILE x ROWS work-items."""

    source = "copy.cl"
    # Unused parameters are pinned to one value so no two candidates are the same launch.
    # PoCL: ALG 0 with large groups everywhere, transposes too (it vectorises the reads or the writes across
    # work-items either way; attention's K^T [12,128,32] -> [12,32,128]: 34 us vs 79 us tiled 16x4, 47 us 32x1;
    # NCHW -> NHWC of 64x56x56: 0.14 vs 0.31 ms). GPUs: 32x32 tiles of 8 rows where the innermost dim moves
    # (the classic coalesced transpose), 256 work-items otherwise.
    space = Space(
        params={"ALG": (0, 1), "WGS": (32, 64, 128, 256), "TILE": (8, 16, 32), "ROWS": (1, 2, 4, 8)},
        defaults={"cpu": {"ALG": 0, "WGS": 256, "TILE": 16, "ROWS": 4},
                  "gpu": {"ALG": 0, "WGS": 256, "TILE": 16, "ROWS": 4},
                  "gpu:tiled": {"ALG": 1, "WGS": 256, "TILE": 32, "ROWS": 8},
                  "default": {"ALG": 0, "WGS": 64, "TILE": 16, "ROWS": 4}},
        constraints=(lambda p, s: p["ALG"] == 0 or s["tiled"] == 1,
                     lambda p, s: (p["ALG"] == 0 and (p["TILE"], p["ROWS"]) == (16, 4))
                     or (p["ALG"] == 1 and p["WGS"] == 256 and p["ROWS"] <= p["TILE"])),
        work_group=lambda p: (p["WGS"],) if p["ALG"] == 0 else (p["TILE"], p["ROWS"]),
        local_memory=lambda p, s: p["ALG"] * p["TILE"] * (p["TILE"] + 1) * s["itemsize"])

    def __init__(self, spec: NodeSpec, backend: Any, params: Any = None) -> None:
        self.base, dims, strides = VIEWS[spec.op](spec)
        if math.prod(dims) != math.prod(spec.outputs[0].shape):
            raise _fail(spec, f"output shape {list(spec.outputs[0].shape)} (the view has dims {dims})")
        merged, mstr = collapse(dims, strides)
        self.dims, self.strides = merged[::-1], mstr[::-1]  # innermost first, as the kernel reads them
        self.itemsize = np.dtype(spec.outputs[0].dtype).itemsize
        # the tiled kernel: X's contiguous dim (P) is an output dim, but not the innermost one (L)
        self.p = next((k for k in range(1, len(self.dims)) if self.strides[k] == 1), None)
        super().__init__(spec, backend, params)
        if len(self.dims) > MAX_RANK:
            raise _fail(spec, f"{len(self.dims)} dims after collapsing")
        if max(math.prod(spec.inputs[0].shape), math.prod(dims)) >= LIMIT:
            raise _fail(spec, "tensors past 2^31 elements")
        if self.itemsize not in UINT:
            raise _fail(spec, f"elements of {self.itemsize} bytes")

    def problem(self) -> dict[str, int]:
        return {"tiled": int(self.p is not None), "itemsize": self.itemsize, "n": math.prod(self.dims)}

    def variant(self) -> str:
        return "tiled" if self.p is not None else ""

    def defines(self) -> dict[str, Any]:
        d: dict[str, Any] = {"T": UINT[self.itemsize]}
        if self.params["ALG"] == 1:
            return {**d, "BRANK": len(self.dims) - 2, "TILE": self.params["TILE"], "ROWS": self.params["ROWS"]}
        return {**d, "RANK": len(self.dims)}

    def bind(self, ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        x, y = ins[0], outs[0]
        if math.prod(self.dims) == 0:
            return lambda: None
        cl, p = self.backend.cl, self.params
        if p["ALG"] == 1:
            return self._tiled(x, y)
        d0, d1 = self.dims[0], (self.dims[1] if len(self.dims) > 1 else 1)
        rest = math.prod(self.dims[2:])
        args = [x.mem, np.uint64(x.offset), np.int32(self.base), y.mem, np.uint64(y.offset),
                _int8(cl, self.dims, 1), _int8(cl, self.strides, 0), np.int32(rest)]
        return self.launch(self.kernel("copy_nd", *args), (d0, d1, rest), local_3d(d0, d1, p["WGS"]))

    def _tiled(self, x: Any, y: Any) -> Launch:
        cl, t, rows = self.backend.cl, self.params["TILE"], self.params["ROWS"]
        pk = self.p
        ystr = strides_of(tuple(self.dims[::-1]))[::-1]  # Y's strides, innermost first
        batch = [k for k in range(1, len(self.dims)) if k != pk]
        bdims = [self.dims[k] for k in batch]
        args = [x.mem, np.uint64(x.offset + self.base * self.itemsize), y.mem, np.uint64(y.offset),
                np.int32(self.dims[pk]), np.int32(self.dims[0]), np.int32(self.strides[0]), np.int32(ystr[pk]),
                _int8(cl, bdims, 1), _int8(cl, [self.strides[k] for k in batch], 0),
                _int8(cl, [ystr[k] for k in batch], 0)]
        gsize = (-(-self.dims[pk] // t) * t, -(-self.dims[0] // t) * rows, math.prod(bdims))
        return self.launch(self.kernel("transpose_tiled", *args), gsize, (t, rows, 1))


class Pad(ClKernel):
    """Pad in every mode (constant, edge, reflect, wrap), negative pads cropping first (the padding then reads
    the cropped range only, as onnxruntime and the NumPy backend)."""

    source = "copy.cl"
    space = MOVE_SPACE
    MODES = {"constant": 0, "edge": 1, "wrap": 2, "reflect": 3}

    def __init__(self, spec: NodeSpec, backend: Any, params: Any = None) -> None:
        super().__init__(spec, backend, params)
        shape, out = spec.inputs[0].shape, spec.outputs[0].shape
        rank = len(shape)
        axes = [_axis(spec, int(a), rank) for a in spec.attr("axes") or range(rank)]
        pads = [int(p) for p in spec.attr("pads")]
        before, after = [0] * rank, [0] * rank
        for j, a in enumerate(axes):
            before[a], after[a] = pads[j], pads[j + len(axes)]
        mode = spec.attr("mode", "constant")
        if mode not in self.MODES:
            raise _fail(spec, f"mode {mode!r}")
        self.mode = self.MODES[mode]
        lo = [max(-b, 0) for b in before]
        hi = [n - max(-e, 0) for n, e in zip(shape, after, strict=True)]
        padded = [b != 0 or e != 0 for b, e in zip(before, after, strict=True)]
        if mode != "constant" and any(p and h - lo_ < (2 if mode == "reflect" else 1)
                                      for p, lo_, h in zip(padded, lo, hi, strict=True)):
            raise _fail(spec, f"{mode} padding of an axis of {min(h - lo_ for lo_, h in zip(lo, hi, strict=True))} "
                              "element(s)")
        dt = np.dtype(spec.outputs[0].dtype)
        self.itemsize = dt.itemsize
        if self.itemsize not in UINT:
            raise _fail(spec, f"elements of {self.itemsize} bytes")
        if max(math.prod(shape), math.prod(out)) >= LIMIT:
            raise _fail(spec, "tensors past 2^31 elements")
        value = np.asarray(spec.attr("constant_value", spec.attr("value", 0))).reshape(-1)[0]
        self.value = np.array(value).astype(dt).view(f"u{self.itemsize}")[()]
        # dims, innermost first: [out dim, X stride, before, lo, hi]; unpadded neighbours merge
        rows: list[list[int]] = []
        for n, st, b, lo_, h, p in zip(out, strides_of(shape), before, lo, hi, padded, strict=True):
            if n == 1 and not p:
                continue
            if rows and not p and not rows[-1][5] and rows[-1][1] == st * n:
                rows[-1] = [rows[-1][0] * n, st, 0, 0, rows[-1][0] * n, False]
            else:
                rows.append([n, st, b, lo_, h, p])
        rows = rows[::-1] or [[1, 0, 0, 0, 1, False]]
        if len(rows) > MAX_RANK:
            raise _fail(spec, f"{len(rows)} dims after collapsing")
        self.geom = [[r[k] for r in rows] for k in range(5)]
        self.count = math.prod(out)

    def defines(self) -> dict[str, Any]:
        return {"T": UINT[self.itemsize], "RANK": len(self.geom[0]), "MODE": self.mode}

    def bind(self, ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        if self.count == 0:
            return lambda: None
        x, y = ins[0], outs[0]
        cl = self.backend.cl
        dims, st, before, lo, hi = self.geom
        d0, d1, rest = dims[0], (dims[1] if len(dims) > 1 else 1), math.prod(dims[2:])
        args = [x.mem, np.uint64(x.offset), y.mem, np.uint64(y.offset), _int8(cl, dims, 1), _int8(cl, st, 0),
                _int8(cl, before, 0), _int8(cl, lo, 0), _int8(cl, hi, 1), np.int32(rest), self.value]
        return self.launch(self.kernel("pad", *args), (d0, d1, rest), local_3d(d0, d1, self.params["WGS"]))


def _copy_factory(spec: NodeSpec, backend: Any) -> StridedCopy:
    return StridedCopy(spec, backend)


def _pad_factory(spec: NodeSpec, backend: Any) -> Pad:
    if len(spec.inputs) > 2 and spec.inputs[2] is not None:
        raise _fail(spec, "a constant_value computed at run time")  # the NumPy kernel reads it
    return Pad(spec, backend)


KERNELS = {**{op: _copy_factory for op in VIEWS}, "Pad": _pad_factory}
