/* ctxrt's native kernels: MatMulNBits (com.microsoft) with 4-bit weights, for a few rows of A (a token's GEMVs).

   Y[m, n] = sum_k A[m, k] * W[n, k] (+ bias[n]), W quantized in blocks of `block` values along K:
   W[n, k] = (q - zero_point) * scale, q the 4-bit value j = k % block of block b = k / block, stored as the
   low (j even) or high (j odd) half of byte j / 2 of B[n, b, :] -- exactly as stored in the model, never
   unpacked to a float copy. Zero points: packed 4-bit [n, ceil(kb / 2)], floats [n, kb], or 8 when absent.

   Two ways to compute, as onnxruntime's CPU provider does:
   - float32 (accuracy_level 0-3): A's values times the dequantized weights, summed in float32;
   - int8 (accuracy_level 4): each block of A's row quantized to int8 (scale = max|a| / 127, round half to
     even), dot products of int8 A and the 4-bit q in int32, scaled per block in float32.

   A's row is first copied into a work buffer, zero-padded to whole blocks and reordered within each group of
   32 values (16 bytes of B) so that the group's even values come first, then its odd ones: the low and high
   halves of 16 bytes of B then line up with 16 consecutive values of A each. Columns are shared among the
   threads of ctxrt's pool (csrc/pool.c: no barrier). A prompt's rows (more than a few) run BLAS's GEMM on tiles
   of dequantized weights instead, which ctxrt_nbits4_dequantize writes in one pass. Called through ctypes with one struct
   (src/ctxrt/backends/cpu/native.py); built by setup.py as the optional extension ctxrt._native (where it is not
   built, ctxrt's NumPy kernels run). */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define CTXRT_X86 1
#endif

#include "nbits.h"
#include "pool.h"

static inline int64_t blocks_of(int64_t k, int64_t block) { return (k + block - 1) / block; }

static inline int64_t group_of(int64_t block) { return block % 32 == 0 ? 32 : 16; }

static inline float zero_point(const nbits_args *p, int64_t col, int64_t blk, int64_t kb) {
    if (p->zpf) return p->zpf[col * kb + blk];
    if (p->zp) {
        uint8_t byte = p->zp[col * ((kb + 1) / 2) + blk / 2];
        return (float)((blk % 2) ? byte >> 4 : byte & 15);
    }
    return 8.0f;
}

/* Per row r: float32 mode: af[kb * block] (reordered A), asum[kb]; int8 mode: aq[kb * block] int8, ascale[kb],
   qsum[kb]. */
typedef struct {
    float *af, *asum, *ascale;
    int8_t *aq;
    float *qsum;  /* int8 mode: the sum of each block's int8 values (exact in float32) */
} row_work;

static inline row_work row_of(const nbits_args *p, int64_t r) {
    int64_t kb = blocks_of(p->k, p->block), len = kb * p->block * (p->int8 ? 1 : 4);
    char *base = (char *)p->work + r * (len + kb * 8);
    row_work w;
    w.af = (float *)base;
    w.aq = (int8_t *)base;
    w.asum = (float *)(base + len);
    w.ascale = w.asum;
    w.qsum = (float *)(base + len + kb * 4);
    return w;
}

/* a token's GEMV is shared among the pool's threads in chunks of about this many bytes of packed weights */
#define NBITS_CHUNK_BYTES (64 << 10)
#define NBITS_CHUNKS_MAX 256

typedef struct {
    const nbits_args *p;
    int64_t chunks;
} nbits_job;

#define NAME(x) x##_c
#include "nbits_kernel.h"
#undef NAME

#ifdef CTXRT_X86
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#define NBITS_AVX2 1
#define NAME(x) x##_avx2
#include "nbits_kernel.h"
#undef NAME
#undef NBITS_AVX2
#pragma GCC pop_options

static int has_avx2(void) { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }
#endif

/* Y = A W^T (+ bias) for the rows and columns of *p; returns 0 */
int ctxrt_nbits4_matmul(const nbits_args *p) {
#ifdef CTXRT_X86
    if (has_avx2()) {
        matmul_avx2(p);
        return 0;
    }
#endif
    matmul_c(p);
    return 0;
}

/* the dequantized 4-bit values of columns n0 .. n1 - 1 into out ([n1 - n0, kb * block] floats); returns 0 */
int ctxrt_nbits4_dequantize(const nbits_args *p, int64_t n0, int64_t n1, float *out) {
#ifdef CTXRT_X86
    if (has_avx2()) {
        dequantize_avx2(p, n0, n1, out);
        return 0;
    }
#endif
    dequantize_c(p, n0, n1, out);
    return 0;
}

/* the instruction set the kernels run on this CPU: "avx2" or "c" (ctxrt devices) */
const char *ctxrt_isa(void) {
#ifdef CTXRT_X86
    if (has_avx2()) return "avx2";
#endif
    return "c";
}

extern PyMethodDef ctxrt_strided_methods[];  /* csrc/strided.c: helpers Python calls directly */

static struct PyModuleDef native_module = {
    PyModuleDef_HEAD_INIT, "_native",
    "ctxrt's native kernels, called through ctypes (ctxrt.backends.cpu.native)", -1, ctxrt_strided_methods, NULL,
    NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__native(void) { return PyModule_Create(&native_module); }
