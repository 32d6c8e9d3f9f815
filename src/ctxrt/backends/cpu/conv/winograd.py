"""Winograd F(m x m, 3 x 3) convolution (Lavin & Gray, 2015) for 3x3, stride 1, dilation 1, ungrouped convs
with constant weights: m = 2 (4x4 input tiles, 2.25x fewer multiplications than im2col) or m = 4 (6x6 tiles,
4x fewer); `choose` picks m, or im2col, from the shapes.

Every step is a BLAS call or a copy into planned scratch; nothing is allocated per run. Per image, per band
of tile rows (bands bound the scratch on large images):

1. the band's input rows to channels last (transposing copies in L1-sized chunks of pixels), then padded
   with its columns expanded per tile: P[y, kk, tx, c] = xpad[c, y, m*tx + kk] (alpha / m times the rows;
   the zero border is rewritten every run, the arena being shared);
2. rows of B^T: one small GEMM per tile row over a window of alpha rows of P: R[ty, xi, kk, tx, c];
3. columns of B^T: one small GEMM per (tile row, xi): V[xi, nu, ty, tx, c];
4. the product, alpha^2 GEMMs with U = G w G^T (made at compile time, stored in the context binary in place
   of w): M[xi, nu] = U (K x C) @ V^T (C x tiles), or with `tn` V (tiles x C) @ U (C x K), channels last;
   a bias is added to M[1, 1] alone, since A^T e1 = (1, ..., 1) carries it to every output of a tile;
5. rows of A^T: one GEMM over all of M: S[i, nu, ...];
6. columns of A^T: one GEMM per i: Y[i, j, ...];
7. to the output: each phase (i, j) copied to out[:, i::m, j::m], or with `tn` Y interleaved channels last
   and copied back to channels first in chunks; cropped where m does not divide the output. Then the
   residual and the Relu on the band's output rows.

The transforms as GEMMs with alpha x alpha matrices run 2-4x faster than one NumPy pass per term (measured on
64-256 channels), and BLAS spreads them over the cores.
"""

from __future__ import annotations

import functools

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ctxrt.backends.cpu.shared import relu_zeros
from ctxrt.backends.kernel import Kernel, NodeSpec, scratch_view

# Lavin & Gray (arXiv:1509.09308): y = A^T [(G g G^T) * (B^T d B)] A.
_G = {2: np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]]),
      4: np.array([[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6],
                   [1 / 24, 1 / 12, 1 / 6], [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]])}
_BT = {2: np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]]),
       4: np.array([[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0],
                    [0, -2, -1, 2, 1, 0], [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]])}
_AT = {2: np.array([[1, 1, 1, 0], [0, 1, -1, -1]]),
       4: np.array([[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0], [0, 1, -1, 8, -8, 1]])}


@functools.cache
def _matrices(m: int, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """B^T and A^T in `dtype`, read-only, shared by every kernel of the process."""
    bt, at = _BT[m].astype(dtype), _AT[m].astype(dtype)
    bt.flags.writeable = at.flags.writeable = False
    return bt, at


def prepack(w: np.ndarray, m: int, dtype: np.dtype, tn: bool) -> np.ndarray:
    """The weights as the kernel reads them: U, or U transposed per tap with `tn` (done at compile time)."""
    u = transform_weights(w, m, dtype)
    return np.ascontiguousarray(u.transpose(0, 2, 1)) if tn else u


def build(spec: NodeSpec, pads: tuple[int, int], tile: int | None = None) -> WinogradConv:
    """The Winograd kernel of a Conv node: with `tile` (at compile time) from the ONNX weights, recording the
    choice and the transformed weights that replace them; without, from a node compiled so."""
    n, c, h, w = spec.inputs[0].shape
    k, oh, ow = spec.outputs[0].shape[1:]
    dt = np.dtype(spec.outputs[0].dtype)
    bias = spec.consts[2] if len(spec.consts) > 2 else None
    has_bias = len(spec.inputs) > 2 and spec.inputs[2] is not None
    relu = spec.attr("activation") == "Relu"
    residual = bool(spec.attr("residual", 0))
    if tile is None:
        tile, tn, u = int(spec.attr("tile")), bool(spec.attr("tn")), spec.consts[1]
    else:
        tn = prefer_tn(c, k)
        u = prepack(spec.consts[1], tile, dt, tn)
    kernel = WinogradConv(tile, n, c, h, w, k, oh, ow, pads, u, bias, has_bias, residual, relu, dt, tn=tn)
    if spec.attr("kernel") is None:
        kernel.attrs = {"kernel": "winograd", "tile": tile, "tn": int(tn), "weight_shape": list(spec.inputs[1].shape)}
        kernel.constants = {1: u}
    return kernel


def transform_weights(w: np.ndarray, m: int, dtype: np.dtype) -> np.ndarray:
    """U[xi * alpha + nu] = (G w G^T)[xi, nu] as a (K, C) matrix: (alpha^2, K, C), in float64, rounded once."""
    g = _G[m]
    u = (g @ w.astype(np.float64) @ g.T).transpose(2, 3, 0, 1)  # (alpha, alpha, K, C); 3x faster than einsum
    a = m + 2
    return np.ascontiguousarray(u.reshape(a * a, w.shape[0], w.shape[1]).astype(dtype))


class WinogradConv(Kernel):
    """y = conv3x3(x, w) (+ bias) (+ residual) (Relu), stride 1, dilation 1, group 1, with constant w.

    Processed in bands of tile rows, so that scratch stays within `budget` bytes per buffer whatever the
    image size (VGG's 224x224x64 whole would need 30 MB). `tn` computes the product as V (tiles x C) @
    U (C x K) rather than U (K x C) @ V^T: channels-last M, then one interleaving copy and a transposing copy
    to the output instead of the phase copies; faster where the tiles outnumber the channels (OpenBLAS).
    """

    def __init__(self, m: int, n: int, c: int, h: int, w: int, k: int, oh: int, ow: int, pads: tuple[int, int],
                 u: np.ndarray, bias: np.ndarray | None, has_bias: bool, residual: bool, relu: bool,
                 dtype: np.dtype, tn: bool = False, budget: int = 2 << 20) -> None:
        a = m + 2
        self.m, self.a = m, a
        self.n, self.c, self.h, self.w, self.k, self.oh, self.ow = n, c, h, w, k, oh, ow
        self.top, self.left = pads
        self.bias, self.has_bias, self.residual, self.relu, self.tn = bias, has_bias, residual, relu, tn
        self.dt = dt = np.dtype(dtype)
        self.u = u  # (alpha^2, K, C), or (alpha^2, C, K) with tn: made at compile time (`prepack`)
        self.bt, self.at = _matrices(m, dt)
        self.th, self.tw = th, tw = -(-oh // m), -(-ow // m)
        # Tile rows per band: within the budget, but at least 64 tiles, else U is streamed for too few columns.
        self.band = tb = min(th, max(budget // (a * a * tw * max(c, k) * dt.itemsize), -(-64 // tw), 1))
        bt = tb * tw
        rows = m * tb + 2  # padded input rows a band reads
        sizes = (max(rows * a * tw * c, a * a * bt * c, m * a * bt * k, m * m * bt * k),  # P -> V -> S (-> Z)
                 max(rows * w * c, a * a * bt * c, a * a * bt * k, m * m * bt * k))    # xt -> R -> M -> Y
        self.scratch = tuple(s * dt.itemsize for s in sizes)
        self.algorithm = f"winograd_f{m}x{m}_3x3"

    def _band(self, ty0: int, tb: int, scratch) -> dict:
        """The views and index lists of the band of tile rows [ty0, ty0 + tb), shared by every image."""
        m, a, c, k, tw, dt, isz = self.m, self.a, self.c, self.k, self.tw, self.dt, self.dt.itemsize
        bt, rows = tb * tw, m * tb + 2
        # x rows [r0, r1) land on the band's padded rows [y0, y0 + r1 - r0); P[y, kk, tx] = xpad[:, y, m*tx + kk]
        r0, r1 = max(0, m * ty0 - self.top), min(self.h, m * ty0 + rows - self.top)
        y0 = r0 + self.top - m * ty0
        p = scratch_view(scratch[0], (rows, a, tw, c), dt)
        xt = scratch_view(scratch[1], (max(r1 - r0, 0), self.w, c), dt)
        borders, fills = [], []
        if y0 > 0:
            borders.append(p[:y0])
        if y0 + r1 - r0 < rows:
            borders.append(p[max(y0, y0 + r1 - r0):])
        if r1 > r0:
            inner = p[y0:y0 + r1 - r0]
            for kk in range(a):
                inside = [tx for tx in range(tw) if 0 <= m * tx + kk - self.left < self.w]
                t0, t1 = (inside[0], inside[-1] + 1) if inside else (tw, tw)
                if t0 > 0:
                    borders.append(inner[:, kk, :t0])
                if t1 < tw:
                    borders.append(inner[:, kk, t1:])
                if inside:
                    x0 = m * t0 + kk - self.left
                    fills.append((inner[:, kk, t0:t1], xt[:, x0:x0 + m * (t1 - t0 - 1) + 1:m]))
        row = a * tw * c * isz
        r = scratch_view(scratch[1], (tb, a, a, tw * c), dt)
        v = scratch_view(scratch[0], (a, a, tb, tw * c), dt)
        s = scratch_view(scratch[0], (m, a, k * bt), dt)
        if self.tn:
            mm = scratch_view(scratch[1], (a * a, bt, k), dt)
            vg = v.reshape(a * a, bt, c)
        else:
            mm = scratch_view(scratch[1], (a * a, k, bt), dt)
            vg = v.reshape(a * a, bt, c).transpose(0, 2, 1)
        return dict(
            rows=(r0, r1), borders=borders, fills=fills, xt=xt,
            pwin=as_strided(p, (tb, a, a * tw * c), (m * row, row, isz), writeable=False),  # alpha rows per tile row
            r3=r.reshape(tb, a, a * tw * c), r=r, vt=v.transpose(2, 0, 1, 3), vg=vg, mm=mm, mb=mm[a + 1],
            mflat=mm.reshape(a, a * k * bt), s=s, sflat=s.reshape(m, a * k * bt),
            yflat=scratch_view(scratch[1], (m, m, k * bt), dt),
            y=scratch_view(scratch[1], (m, m, tb, tw, k) if self.tn else (m, m, k, tb, tw), dt),
            z=scratch_view(scratch[0], (tb, m, tw, m, k), dt) if self.tn else None)

    def bind(self, ins, outs, scratch):
        m, c, k, th, tw, oh, ow = self.m, self.c, self.k, self.th, self.tw, self.oh, self.ow
        dt, isz, tn = self.dt, self.dt.itemsize, self.tn
        bt_, at_, u, relu = self.bt, self.at, self.u, self.relu
        bias = None
        if self.has_bias:
            bias = (self.bias if self.bias is not None else ins[2]).reshape((1, k) if tn else (k, 1))
        # Transposing copies in chunks of pixels that fit in L1: a whole transposing copy walks the source
        # across the cache (2.5x slower measured).
        nbi = max(16, min(128, (32 << 10) // (c * isz)))
        nbo = max(16, min(128, (32 << 10) // (k * isz)))
        steps = []
        for b in range(self.n):
            x, out = ins[0][b], outs[0][b]
            res = ins[3][b] if self.residual else None
            for ty0 in range(0, th, self.band):
                tb = min(self.band, th - ty0)
                d = self._band(ty0, tb, scratch)
                r0, r1 = d["rows"]
                xsrc, xdst = x[:, r0:r1].reshape(c, -1), d["xt"].reshape(-1, c)
                tin = [(xdst[j:j + nbi], xsrc[:, j:j + nbi].T) for j in range(0, xsrc.shape[1], nbi)]
                o0, o1 = ty0 * m, min(oh, (ty0 + tb) * m)  # the output rows of this band
                orows = out[:, o0:o1]
                if tn:  # Y[i, j, ty, tx, :] -> Z[ty, i, tx, j, :] (runs of K), then Z (pixels, K) to out
                    zsrc = d["z"].reshape(tb * m, tw * m, k)[:o1 - o0, :ow]
                    pairs = [(orows.reshape(k, -1), zsrc.reshape(-1, k))] if ow == tw * m else \
                        [(orows[:, i], zsrc[i]) for i in range(o1 - o0)]
                    tout = [(dst[:, j:j + nbo], src[j:j + nbo].T) for dst, src in pairs
                            for j in range(0, src.shape[0], nbo)]
                    inter = (d["z"].transpose(1, 3, 0, 2, 4), d["y"])
                else:
                    y = d["y"]
                    tout = [(orows[:, i::m, j::m], y[i, j, :, :len(range(i, o1 - o0, m)), :len(range(j, ow, m))])
                            for i in range(m) for j in range(m)]
                    inter = None
                flat = orows.reshape(k, -1)
                steps.append((tin, d["borders"], d["fills"], d["pwin"], d["r3"], d["r"], d["vt"], d["vg"],
                              d["mm"], d["mb"], d["mflat"], d["s"], d["sflat"], d["yflat"], inter, tout, flat,
                              res[:, o0:o1].reshape(k, -1) if res is not None else None,
                              relu_zeros(flat.shape, dt) if relu else None))

        def run():
            for (tin, borders, fills, pwin, r3, r, vt, vg, mm, mb, mflat, s, sflat, yflat, inter, tout, flat,
                 res, zeros) in steps:
                for dst, src in tin:
                    np.copyto(dst, src)
                for dst in borders:
                    dst.fill(0)
                for dst, src in fills:
                    np.copyto(dst, src)
                np.matmul(bt_, pwin, out=r3)  # rows of B^T
                np.matmul(bt_, r, out=vt)     # columns of B^T
                if tn:
                    np.matmul(vg, u, out=mm)
                else:
                    np.matmul(u, vg, out=mm)
                if bias is not None:
                    np.add(mb, bias, out=mb)  # A^T e1 = (1, ..., 1): on M[1, 1], it reaches every output
                np.matmul(at_, mflat, out=sflat)  # rows of A^T
                np.matmul(at_, s, out=yflat)      # columns of A^T
                if inter is not None:
                    np.copyto(*inter)
                for dst, src in tout:
                    np.copyto(dst, src)
                if res is not None:
                    np.add(flat, res, out=flat)
                if zeros is not None:
                    np.maximum(flat, zeros, out=flat)
        return run


# Tile choice, from the shapes alone (a context binary must rebuild the same kernels at load).
OVERRIDE: dict[tuple[int, int, int, int], int | None] = {}  # (c, k, oh, ow) -> m or None: for experiments
_SMALL_U = 1 << 20  # bytes of transformed weights that stay cheap to stream when there are few tiles


def choose(c: int, k: int, oh: int, ow: int, dtype: np.dtype) -> int | None:
    """The output tile m for a 3x3 stride-1 conv of c -> k channels to oh x ow, or None to keep im2col.

    Measured against im2col (2 cores, OpenBLAS, in the model, where the weights come from memory): the
    alpha^2 products are GEMMs with one column (or row) per tile, so U = alpha^2 K C weights are streamed
    once per image; with fewer than 32 tiles that traffic outweighs the saved FLOPs unless U is small
    (ResNet-50's 256-channel 14x14 convs: F(4x4) 1.51 ms, F(2x2) 1.28, im2col 1.43; its 512-channel 7x7:
    F(2x2) 2.2 ms, im2col 1.8). Under 32 channels the transforms cost more than the GEMM saves.
    """
    key = (c, k, oh, ow)
    if key in OVERRIDE:
        return OVERRIDE[key]
    dt = np.dtype(dtype)
    if dt not in (np.float32, np.float64) or min(c, k) < 32:
        return None
    for m in (4, 2):
        tiles = -(-oh // m) * -(-ow // m)
        if tiles >= 32 or (tiles >= 16 and (m + 2) ** 2 * c * k * dt.itemsize <= _SMALL_U):
            return m
    return None


def prefer_tn(c: int, k: int) -> bool:
    """Whether the product runs as V @ U (channels-last M) rather than U @ V^T: measured faster up to 128
    output channels, slower (or even) above."""
    return k <= 128
