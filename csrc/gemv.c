/* float32 GEMV with its epilogue, for a GEMM of a few rows (a decoder's token): Y = A W (+ bias) (+ residual),
   then the fused Relu or GELU, W constant and stored [K, N] or [N, K]. Memory-bound: it reads W once, so on a
   machine with idle cores its columns are shared among OpenMP threads (the caller chooses how many; see
   src/ctxrt/backends/cpu/gemv.py). Each kernel is compiled for AVX2+FMA and in portable C. */

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#ifdef _OPENMP
#include <omp.h>
#else
static int omp_get_thread_num(void) { return 0; }
static int omp_get_num_threads(void) { return 1; }
#endif
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

#include "gemv.h"

/* from this many columns a [k, n] W's columns are shared among threads (each one's part of a row >= 8 KiB);
   narrower ones share rows of W, each thread summing into a part of its own */
#define GEMV_SPLIT_COLUMNS 4096

/* the fused activation (gemv_args.act) of one value, as onnxruntime's Relu and Gelu compute it */
static inline float gemv_act(float v, int act) {
    switch (act) {
    case 1: return v > 0.0f ? v : 0.0f;
    case 2: return 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
    case 3: return 0.5f * v * (1.0f + tanhf(0.79788456080286536f * (v + 0.044715f * v * v * v)));
    default: return v;
    }
}

#define NAME(x) x##_c
#include "gemv_kernel.h"
#undef NAME

#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#define GEMV_AVX2 1
#define NAME(x) x##_avx2
#include "gemv_kernel.h"
#undef NAME
#undef GEMV_AVX2
#pragma GCC pop_options

static int avx2(void) { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }
#else
static int avx2(void) { return 0; }
#define gemv_avx2 gemv_c
#endif

/* Y = act(A W (+ bias) (+ residual)) for *p. `work`: (p->threads - 1) * m * n floats, the other threads'
   partial sums where W is [k, n] and narrower than GEMV_SPLIT_COLUMNS, or NULL (then columns are shared). */
int ctxrt_gemv(const gemv_args *p, float *work) {
    if (avx2()) gemv_avx2(p, work);
    else gemv_c(p, work);
    return 0;
}
