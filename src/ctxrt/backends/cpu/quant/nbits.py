"""MatMulNBits (com.microsoft): Y = A W^T (+ bias), W [N, K] quantized to 2, 4 or 8 bits in blocks along K.

B stays packed as stored, [N, k_blocks, blob_size] uint8 (block_size values a blob, element j of a block in bits
(j % per_byte) * bits of byte j // per_byte, low bits first). The kernel dequantizes one tile of output features
at a time into float32 scratch ((q - zero_point) * scale per block; K need not fill the last block) and multiplies
it there: no float copy of the whole weight matrix exists, at load or at run time. Zero points are packed uint8
[N, ceil(k_blocks bits / 8)], or unpacked floats [N, k_blocks] (A's type), or absent (2^(bits-1)).

At `accuracy_level` 4 onnxruntime's CPU provider quantizes A to int8 per block for 4-bit weights; the tiles do
the same to A first (rounded to int8 and back, `_int8_rows`), so their sums are its int8 dot products in float32.
4-bit weights with float32 A at up to NATIVE_ROWS rows (a token's GEMVs) run the native kernel instead
(csrc/nbits.c, where it was built): it reads the 4-bit bytes directly, in int32 dot products of int8 A at
accuracy_level 4, else in float32.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from ctxrt.backends.cpu import native
from ctxrt.backends.cpu.quant.common import F32, Bound, dtype_of, fail, given, size
from ctxrt.backends.kernel import Kernel, Launch, NodeSpec, scratch_view

_TILE_BYTES = 1 << 20  # float32 bytes of one dequantized tile of W
NATIVE_ROWS = 8  # rows of float32 A up to which the native kernel runs (more: dequantized tiles and BLAS's GEMM)


def _unpack(src: np.ndarray, bits: int, out: np.ndarray, u8: np.ndarray) -> None:
    """out[..., j] = value j of the packed bytes src[..., j // per] (out's last axis per times src's)."""
    per, mask = 8 // bits, (1 << bits) - 1
    for j in range(per):
        np.right_shift(src, j * bits, out=u8)
        if bits < 8:
            np.bitwise_and(u8, mask, out=u8)
        np.copyto(out[..., j::per], u8, casting="unsafe")


def matmul_nbits(spec: NodeSpec) -> Kernel:
    k, n = int(spec.attr("K")), int(spec.attr("N"))
    bits, block = int(spec.attr("bits", 4)), int(spec.attr("block_size"))
    if bits not in (2, 4, 8):
        raise fail(spec, f"bits={bits} is not supported (2, 4 or 8)")
    if block < 16 or block & (block - 1):
        raise fail(spec, f"block_size={block} must be a power of two of at least 16")
    if given(spec, 4) and size(spec.inputs[4]):
        raise fail(spec, "g_idx (act-order) is not supported")
    if spec.attr("weight_prepacked", 0):
        raise fail(spec, "weight_prepacked B is not supported")
    at = dtype_of(spec, 0)
    if at not in (F32, np.dtype(np.float16)):
        raise fail(spec, f"A of type {at} is not supported")
    kb, blob = -(-k // block), block * bits // 8
    if tuple(spec.inputs[1].shape) != (n, kb, blob) or dtype_of(spec, 1) != np.uint8:
        raise fail(spec, f"B of shape {list(spec.inputs[1].shape)}: expected uint8 {[n, kb, blob]}")
    zp_mode = "default"
    if given(spec, 3):
        zp_mode = "packed" if dtype_of(spec, 3) == np.uint8 else "float"
        want = (n, -(-kb * bits // 8)) if zp_mode == "packed" else (n, kb)
        if size(spec.inputs[3]) != want[0] * want[1]:
            raise fail(spec, f"zero_points of shape {list(spec.inputs[3].shape)}: expected {list(want)}")
    a_shape = tuple(spec.inputs[0].shape)
    m = size(a_shape[:-1])
    lib = native.library()
    int8 = int8_compute(spec, zp_mode)
    use_native = bits == 4 and at == F32 and 0 < m <= NATIVE_ROWS and lib is not None and \
        (zp_mode != "float" or dtype_of(spec, 3) == F32) and dtype_of(spec, 2) == F32
    fake = int8 and bits == 4  # the tiles' A rounded to int8 per block first (onnxruntime's values, in float32)
    # 4-bit tiles dequantized by the native kernel in one pass (NumPy's takes six)
    native_tiles = bits == 4 and lib is not None and dtype_of(spec, 2) == F32 and \
        (zp_mode != "float" or dtype_of(spec, 3) == F32)
    tile = max(1, min(n, _TILE_BYTES // (4 * kb * block)))
    tiles = [(n0, min(n, n0 + tile)) for n0 in range(0, n, tile)]
    has_bias = given(spec, 5)
    convert = at != F32  # float16 A and Y go through float32 scratch
    zbytes = -(-kb * bits // 8)

    def make(ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        if use_native:
            launch = _native4(spec, lib, m, k, n, block, zp_mode, int8, ins, outs, scratch[-1])
            if launch is not None:
                return launch
        a = ins[0].reshape(m, k)
        y = outs[0].reshape(m, n)
        b = ins[1].reshape(n, kb, blob)
        scales = ins[2].reshape(n, kb)
        w = scratch_view(scratch[0], (tile, kb, block), F32)
        u8 = scratch_view(scratch[1], (tile, kb, blob), np.uint8)
        zf = scratch_view(scratch[2], (tile, kb), F32)
        zu8 = scratch_view(scratch[3], (tile, zbytes), np.uint8)
        zun = scratch_view(scratch[4], (tile, zbytes * (8 // bits)), F32)
        c = scratch_view(scratch[5], (m, tile), F32)
        a32 = scratch_view(scratch[6], (m, k), F32) if convert or fake else a
        amax, inv = (scratch_view(scratch[j], (m, kb, 1), F32) if fake else None for j in (8, 9))
        y32 = scratch_view(scratch[7], (m, n), F32) if convert else y
        zp = ins[3].reshape(n, -1) if zp_mode != "default" else None
        bias = ins[5].reshape(1, n) if has_bias else None
        plan, starts = [], [n0 for n0, _ in tiles]
        for n0, n1 in tiles:
            t = n1 - n0
            plan.append((b[n0:n1], scales[n0:n1, :, None], None if zp is None else zp[n0:n1], w[:t], u8[:t],
                         zf[:t], zu8[:t], zun[:t], w[:t].reshape(t, kb * block)[:, :k].T, c[:, :t],
                         y32[:, n0:n1], None if bias is None else bias[:, n0:n1]))
        default = float(1 << (bits - 1))
        dequantize = _native_tiles(lib, k, block, ins, zp_mode) if native_tiles else None

        def run() -> None:
            if convert:
                np.copyto(a32, a, casting="unsafe")
            if fake:
                _int8_rows(a32 if convert else a, a32, amax, inv, block)
            for n0, (bt, st, zt, wt, ut, zft, zut, zunt, wmat, ct, yt, bt_bias) in zip(starts, plan, strict=True):
                if dequantize is not None:
                    dequantize(n0, n0 + len(wt), wt)
                    np.matmul(a32, wmat, out=ct)
                    if bt_bias is not None:
                        np.add(ct, bt_bias, out=ct)
                    np.copyto(yt, ct, casting="unsafe")
                    continue
                _unpack(bt, bits, wt, ut)
                if zp_mode == "default":
                    np.subtract(wt, default, out=wt)
                else:
                    if zp_mode == "packed":
                        _unpack(zt, bits, zunt, zut)
                        np.copyto(zft, zunt[:, :kb])
                    else:
                        np.copyto(zft, zt, casting="unsafe")
                    np.subtract(wt, zft[:, :, None], out=wt)
                np.multiply(wt, st, out=wt)
                np.matmul(a32, wmat, out=ct)
                if bt_bias is not None:
                    np.add(ct, bt_bias, out=ct)
                np.copyto(yt, ct, casting="unsafe")
            if convert:
                np.copyto(y, y32, casting="unsafe")
        return run

    # the tiles' scratch, then the native kernel's work: both whichever runs, so that a binary compiled where the
    # extension is built loads where it is not, and the other way round
    scratch = (tile * kb * block * 4, tile * kb * blob, tile * kb * 4, tile * zbytes, tile * zbytes * (8 // bits) * 4,
               m * tile * 4, m * k * 4 if convert or fake else 0, m * n * 4 if convert else 0,
               m * kb * 4 if fake else 0, m * kb * 4 if fake else 0,
               native.nbits4_work_bytes(m, k, block, int8) if bits == 4 else 0)
    name = f"native_4bit_{'int8' if int8 else 'f32'}" if use_native else f"dequantize_tiles_{bits}bit"
    kernel = Bound(make, scratch, name)
    kernel.blas = not use_native  # the tiles' work is BLAS's GEMM: a prompt of them gives BLAS the threads
    return kernel


_SMALLEST_MAX = np.float32(np.finfo(np.float32).tiny * 128)  # 127 / this stays finite


def _int8_rows(a: np.ndarray, out: np.ndarray, amax: np.ndarray, inv: np.ndarray, block: int) -> None:
    """out = A with each block of `block` values of a row rounded to int8 and back, as onnxruntime quantizes A at
    accuracy_level 4: q = round_half_even(a * 127 / max|a|), value q * max|a| / 127 (all in float32; a block of
    zeros stays zeros). The products with the dequantized weights then sum what its int8 dot products do, in
    float32 (the prompt's rows: BLAS's GEMM stays; the native kernel does the same in int32 at a token's rows)."""
    m, k = a.shape
    full = k // block
    parts = [(a[:, :full * block].reshape(m, full, block), out[:, :full * block].reshape(m, full, block),
              amax[:, :full], inv[:, :full])]
    if full * block < k:
        parts.append((a[:, full * block:].reshape(m, 1, k - full * block),
                      out[:, full * block:].reshape(m, 1, k - full * block), amax[:, full:], inv[:, full:]))
    for x, o, mx, iv in parts:
        np.abs(x, out=o)
        np.max(o, axis=2, keepdims=True, out=mx)
        np.maximum(mx, _SMALLEST_MAX, out=iv)
        np.divide(np.float32(127), iv, out=iv)
        np.multiply(x, iv, out=o)
        np.rint(o, out=o)
        np.divide(mx, np.float32(127), out=mx)
        np.multiply(o, mx, out=o)


def int8_compute(spec: NodeSpec, zp_mode: str) -> bool:
    """A quantized to int8 per block, as onnxruntime's CPU provider does at accuracy_level 4 -- not with float zero
    points (it computes those in float32)."""
    return int(spec.attr("accuracy_level", 0)) == 4 and zp_mode != "float"


def _native_tiles(lib: Any, k: int, block: int, ins: list[Any], zp_mode: str) -> Any:
    """dequantize(n0, n1, out): csrc/nbits.c's one-pass dequantization of columns n0 .. n1 - 1 into a tile (None
    where B, its scales or zero points are not contiguous: NumPy's unpacking runs then)."""
    if not all(t.flags.c_contiguous for t in ins[1:3] + ([ins[3]] if zp_mode != "default" else [])):
        return None
    args = native.NBitsArgs(k=k, block=block, b=ins[1].ctypes.data, scales=ins[2].ctypes.data)
    if zp_mode == "packed":
        args.zp = ins[3].ctypes.data
    elif zp_mode == "float":
        args.zpf = ins[3].ctypes.data
    # on one thread (the kernel's): BLAS's threads run the GEMM between two tiles, and OpenMP's beside them would
    # wait on them (measured, the 768 x 32000 lm_head at 128 rows on 2 cores: 10 ms dequantizing on one, 420 on two)
    ref, fn = ctypes.byref(args), lib.ctxrt_nbits4_dequantize
    keep = (ins[1], ins[2], ins[3] if zp_mode != "default" else None)

    def dequantize(n0: int, n1: int, out: np.ndarray, _keep: Any = keep) -> None:
        fn(ref, n0, n1, out.ctypes.data)
    return dequantize


def _native4(spec: NodeSpec, lib: Any, m: int, k: int, n: int, block: int, zp_mode: str, int8: bool,
             ins: list[Any], outs: list[Any], work: np.ndarray) -> Launch | None:
    """4-bit weights, float32 A of m rows: the launch of csrc/nbits.c's kernel, its arguments one struct made here
    (None where a tensor is not contiguous: the tiles run then)."""
    views = [ins[0], ins[1], ins[2], outs[0], work] + [ins[i] for i in (3, 5) if i < len(ins) and ins[i] is not None]
    if not all(v.flags.c_contiguous for v in views):
        return None
    args = native.NBitsArgs(m=m, k=k, n=n, block=block, a=ins[0].ctypes.data, b=ins[1].ctypes.data,
                            scales=ins[2].ctypes.data, y=outs[0].ctypes.data, work=work.ctypes.data,
                            int8=int(int8), threads=1)
    if zp_mode == "packed":
        args.zp = ins[3].ctypes.data
    elif zp_mode == "float":
        args.zpf = ins[3].ctypes.data
    if given(spec, 5):
        args.bias = ins[5].ctypes.data
    return native.threaded_launch("ctxrt_nbits4_matmul", args, tuple(views))


def gather_block_quantized(spec: NodeSpec) -> Kernel:
    """com.microsoft GatherBlockQuantized as onnxruntime's CPU kernel computes it, for the uint8 form its model
    builder writes (a tied embedding quantized with the LM head): rows of `data` [N, ..., K * bits / 8] picked by
    the indices along axis 0, each dequantized (q - zero_point) * scale per block of `block_size` values along the
    last axis (2, 4 or 8 bits a value, low bits first; zero points packed the same, default 2^(bits-1)). An index
    outside [-N, N) gives a row of zeros (onnxruntime's). Only the gathered rows are unpacked."""
    bits, block = int(spec.attr("bits", 4)), int(spec.attr("block_size", 128))
    shape = tuple(spec.inputs[0].shape)
    rank = len(shape)
    if dtype_of(spec, 0) != np.uint8:
        raise fail(spec, f"data of type {dtype_of(spec, 0)} is not supported (uint8 only)")
    if bits not in (2, 4, 8):
        raise fail(spec, f"bits={bits} is not supported (2, 4 or 8)")
    if block < 16 or block & (block - 1):
        raise fail(spec, f"block_size={block} must be a power of two of at least 16")
    if rank < 2 or int(spec.attr("gather_axis", 0)) % rank or int(spec.attr("quantize_axis", 1)) % rank != rank - 1:
        raise fail(spec, "uint8 data needs gather_axis 0 and quantize_axis the last axis")
    out_dt = dtype_of(spec, 2)
    if out_dt not in (F32, np.dtype(np.float16)):
        raise fail(spec, f"scales of type {out_dt} are not supported")
    rows, mid, k = shape[0], size(shape[1:-1]), shape[-1] * (8 // bits)
    nb = -(-k // block)
    if size(spec.inputs[2]) != rows * mid * nb:
        raise fail(spec, f"scales of shape {list(spec.inputs[2].shape)}: expected {[rows, *shape[1:-1], nb]}")
    zb = -(-nb * bits // 8)
    if given(spec, 3) and (dtype_of(spec, 3) != np.uint8 or size(spec.inputs[3]) != rows * mid * zb):
        raise fail(spec, f"zero_points of shape {list(spec.inputs[3].shape)}: expected uint8 "
                         f"{[rows, *shape[1:-1], zb]}")
    n = size(spec.inputs[1])
    default_zp = np.float32(1 << (bits - 1))

    def make(ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        data = ins[0].reshape(rows, mid, shape[-1])
        scales = ins[2].reshape(rows, mid, nb)
        zps = ins[3].reshape(rows, mid, zb) if given(spec, 3) else None
        y = outs[0].reshape(n, mid, k)
        idx = scratch_view(scratch[0], (n,), np.int64)
        bad = scratch_view(scratch[1], (2, n), np.bool_)
        bad, bad2 = bad[0], bad[1]
        packed = scratch_view(scratch[2], (n, mid, shape[-1]), np.uint8)
        u8 = scratch_view(scratch[3], (n, mid, max(shape[-1], zb)), np.uint8)
        q = scratch_view(scratch[4], (n, mid, nb * block), np.float32)
        sc = scratch_view(scratch[5], (n, mid, nb), out_dt)
        zq = scratch_view(scratch[6], (n, mid, -(-zb * 8 // bits)), np.float32)
        zt = scratch_view(scratch[7], (n, mid, zb), np.uint8)  # the gathered rows' packed zero points
        f = q.reshape(n, mid, nb, block)

        def run() -> None:
            np.copyto(idx, ins[1].reshape(-1), casting="unsafe")
            np.add(idx, rows, out=idx)  # [-N, N) -> [0, 2N); the rest are rows of zeros
            np.greater_equal(idx, 2 * rows, out=bad)
            np.logical_or(bad, np.less(idx, 0, out=bad2), out=bad)
            np.copyto(idx, 0, where=bad)
            np.take(data, idx, axis=0, out=packed, mode="wrap")  # wrap: negative indices from the end
            _unpack(packed, bits, q[..., :k], u8[..., :shape[-1]])
            np.take(scales, idx, axis=0, out=sc, mode="wrap")
            if zps is None:
                np.subtract(f, default_zp, out=f)
            else:
                np.take(zps, idx, axis=0, out=zt, mode="wrap")
                _unpack(zt, bits, zq, u8[..., :zb])
                np.subtract(f, zq[..., :nb, None], out=f)
            np.multiply(f, sc[..., None], out=f)
            np.copyto(y, q[..., :k], casting="same_kind")
            if bad.any():
                y[bad] = 0
        return run
    scratch = (n * 8, 2 * n, n * mid * shape[-1], n * mid * max(shape[-1], zb), n * mid * nb * block * 4,
               n * mid * nb * 4, n * mid * -(-zb * 8 // bits) * 4, n * mid * zb)
    return Bound(make, scratch)


KERNELS = {"MatMulNBits": matmul_nbits, "GatherBlockQuantized": gather_block_quantized}
