/* RMS normalization of rows (SimplifiedLayerNormalization, RMSNormalization, com.microsoft
   SkipSimplifiedLayerNormalization), float32: s = x (+ skip) (+ bias), stored as the sum output where asked,
   y = s / sqrt(mean(s^2) + epsilon) * gamma. One pass per row, vectorized by `omp simd`; called through ctypes
   (src/ctxrt/backends/cpu/genai/norms.py). */

#include <math.h>
#include <stdint.h>

typedef struct {
    int64_t rows, n;
    const float *x;      /* [rows, n] */
    const float *skip;   /* rows of n at skip_stride floats apart (0: one row for all), or NULL */
    int64_t skip_stride;
    const float *bias;   /* [n] or NULL */
    const float *gamma;  /* [n] */
    float *sum;          /* [rows, n]: x + skip + bias, or NULL (then y holds it before it is normalized) */
    float *y;            /* [rows, n] */
    float eps;
} rms_args;

#define NAME(x) x##_c
#include "norms_kernel.h"
#undef NAME

#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#define NAME(x) x##_avx2
#include "norms_kernel.h"
#undef NAME
#pragma GCC pop_options
#define NORMS_X86 1
#endif

int ctxrt_rms_rows(const rms_args *p) {
#ifdef NORMS_X86
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        rms_rows_avx2(p);
        return 0;
    }
#endif
    rms_rows_c(p);
    return 0;
}
