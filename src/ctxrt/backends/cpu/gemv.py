"""A GEMM of a few rows (a decoder's token, a classifier at batch 1) on the native GEMV (csrc/gemv.c): Y = A W
(+ bias) (+ residual), then a fused Relu or GELU, W float32 constant stored [K, N] or [N, K], in one call. And
many rows by W [K, N] (`launch(many=True)`: a range program's 1x1 convolutions, onednn.kernels.AnyRows) on
register blocks shared among OpenMP's team, the same code for every number of rows.

A GEMV reads each weight once: it is bound by memory, not by arithmetic, and two cores stream nearly twice the
bytes of one. So once its weights reach `THREADED_BYTES` its launch shares them among the run's threads
(`threads.idle_now`) on ctxrt's own pool (csrc/pool.c), where the caller never waits for a thread that has not
begun: no barrier, so a GEMV takes the idle cores even in a program held to one thread because its kernels are
small (docs/cpu.md, "Threads"). A fused GELU saves oneDNN's call. Where the extension is not built, `launch`
returns None and the caller keeps NumPy's GEMV.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ctxrt.backends.cpu import native

ROWS = 8  # rows of A under which a GEMM runs here (more: a GEMM, oneDNN's or BLAS's)
# ...and up to which it does where W is stored [K, N]: csrc/gemv.c's register blocks of 6 rows by 16 columns (8
# x 128 x 352: ~10 us on one core, oneDNN's primitive 15-18 in a decoder's run)
GEMM_ROWS = 16
# weights from which a launch shares its columns among the idle cores: 1 x 256 by 256 x 1024 (1 MiB) takes
# ~80 us on one thread of a 2-core AVX2 VM and ~45 on two; at 64 KiB a fork/join costs what a second core saves
THREADED_BYTES = 256 << 10

# fused after the bias and the residual (csrc/gemv.h); Swish: x sigmoid(x), alpha 1
ACTIVATIONS = {None: 0, "Relu": 1, "Gelu": 2, "Gelu_tanh": 3, "Swish": 4}
# ...and a Conv's fused activations with parameters (`launch`'s alpha and beta: onednn.kernels' activation_alpha
# and activation_beta): x clamp(alpha x + beta, 0, 1), clip to [alpha, beta], slope alpha below 0, clamp(alpha x
# + beta, 0, 1)
PARAMETERIZED = {"HardSwish": 7, "Clip": 8, "LeakyRelu": 9, "HardSigmoid": 10}
F32 = np.dtype(np.float32)
SHARED_WORK = 1 << 21  # multiply-adds from which a few rows' GEMM shares its columns (csrc/gemv.c, GEMM_SHARED_WORK)
MANY_SHARED_WORK = 1 << 19  # ...and many rows' GEMM its blocks of rows (csrc/gemv.c, ROWS_SHARED_WORK)


def _fits(x: np.ndarray | None, size: int) -> bool:
    return x is None or x.dtype == F32 and x.size == size and x.flags.c_contiguous


def _overlap(p: int, n: int, q: int, m: int) -> bool:
    """Whether bytes [p, p + n) and [q, q + m) meet."""
    return p < q + m and q < p + n


def activation(act: str | None, approximate: str = "none", alpha: float = 1.0) -> str | None:
    """The ACTIVATIONS key of a GEMM node's fused activation (its `activation`, `approximate` and `alpha`
    attributes); a name not in ACTIVATIONS where this kernel has none (a Swish of alpha other than 1)."""
    if act == "Gelu" and approximate == "tanh":
        return "Gelu_tanh"
    if act == "Swish" and float(alpha) != 1.0:
        return "Swish (alpha)"
    return act


def act_code(act: str | None) -> int | None:
    """csrc/gemv.h's code of an ACTIVATIONS or PARAMETERIZED key (0: none), None where the kernels have none."""
    return ACTIVATIONS.get(act, PARAMETERIZED.get(act)) if act is not None else 0


def conv_activation(attrs: dict) -> tuple[str | None, float, float] | None:
    """A Conv's fused activation (its `activation`, `activation_alpha`, `activation_beta` attributes) as this
    kernel's epilogue computes it, (ACTIVATIONS or PARAMETERIZED key, alpha, beta), or None where it has none
    (Tanh, Sigmoid, Elu, a Swish of alpha other than 1)."""
    act = attrs.get("activation")
    alpha, beta = float(attrs.get("activation_alpha", 0.0)), float(attrs.get("activation_beta", 0.0))
    if act == "Swish" and alpha != 1.0 or act not in ACTIVATIONS and act not in PARAMETERIZED:
        return None
    return act, alpha, beta


# [N, K] weights up to which a range program's GEMM of up to GEMM_ROWS rows runs here too (`wide`): the same code
# for every row count, where oneDNN made a primitive per count (a classifier in a batch cycle: ~0.5 ms each)
WIDE_BYTES = 256 << 10


def one_thread(m: int, k: int, n: int) -> bool:
    """Whether `launch` runs a GEMM of m rows by float32 W [K, N] (or [N, K]) on the caller's thread alone: its
    launch is then one struct (batched, and copied into a range program's shared lists)."""
    return k * n * 4 < THREADED_BYTES and m * k * n < SHARED_WORK


def takes(rows: int, trans: bool, wide: bool = False) -> bool:
    """Whether a GEMM of `rows` rows by W stored [N, K] (`trans`) or [K, N] runs here (where the extension is);
    `wide`: [N, K] weights of a range program, at most WIDE_BYTES, up to GEMM_ROWS rows too."""
    return 0 < rows < ROWS or (not trans or wide) and 0 < rows <= GEMM_ROWS


def launch(a: np.ndarray, w: np.ndarray, trans: bool, y: np.ndarray, bias: np.ndarray | None = None,
           residual: np.ndarray | None = None, act: str | None = None, alpha: float = 0.0, beta: float = 0.0,
           many: bool = False, wide: bool = False) -> Callable[[], None] | None:
    """The launch of y = act(a @ W (+ bias) (+ residual)), W = w ([K, N]) or w.T (`trans`: w is [N, K]), `act`
    one of ACTIVATIONS or PARAMETERIZED (its parameters `alpha`, `beta`), a and y (and the residual) C-contiguous
    rows; rows of a = its size / K (`takes`, `wide` its argument; `many`: any number of rows by W [K, N], register
    blocks shared by blocks of rows: a 1x1 convolution's pixels). None where the native library is not there or the
    arrays do not fit it (the caller then runs NumPy's or oneDNN's GEMM)."""
    lib = native.library()
    code = act_code(act)
    if lib is None or code is None or w.ndim != 2 or not _fits(w, w.size):
        return None
    n, k = w.shape if trans else w.shape[::-1]
    m = a.size // k if k else 0
    fits = m > 0 and not trans if many else takes(m, trans, wide and w.nbytes <= WIDE_BYTES)
    if not fits or n == 0 or not (_fits(a, m * k) and _fits(y, m * n) and _fits(residual, m * n)
                                  and _fits(bias, n)):
        return None
    # addresses in one C call (C-contiguous, as checked): overlaps are of address ranges
    pa, pw, py, pb, pr = native.array_addresses([a, w, y, bias, residual], False)
    if pa is None or pw is None or py is None or bias is not None and pb is None or \
            residual is not None and pr is None:
        return None
    accumulate = pr == py
    if accumulate:  # the residual updated in place: y holds it, the products are added to it
        residual, pr = None, None
    elif pr is not None and _overlap(pr, residual.nbytes, py, y.nbytes) or _overlap(pa, a.nbytes, py, y.nbytes):
        return None
    args = native.GemvArgs(m=m, k=k, n=n, a=pa, lda=k, w=pw, trans=int(trans), bias=pb, residual=pr, ldr=n, y=py,
                           ldy=n, accumulate=int(accumulate), act=code, threads=1, alpha=alpha, beta=beta)
    keep = (a, w, y, bias, residual)
    if many and m > GEMM_ROWS:  # shared on OpenMP's team where oneDNN loaded it (csrc/gemv.c, gemm_many): of the
        if native.openmp_team():  # run's OpenMP count, read in C from MANY_SHARED_WORK on (one struct for every run:
            args.threads = 0  # batched, and in a shared list's slots, its fields linear in the rows)
            return native.launch("ctxrt_gemv", args, keep)
        if m * k * n < MANY_SHARED_WORK:
            return native.launch("ctxrt_gemv", args, keep)
        return native.threaded_launch("ctxrt_gemv", args, keep)
    if one_thread(m, k, n):
        return native.launch("ctxrt_gemv", args, keep)
    return native.threaded_launch("ctxrt_gemv", args, keep)
