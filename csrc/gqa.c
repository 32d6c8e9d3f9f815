/* com.microsoft GroupQueryAttention for a few new tokens of one sequence (a generation step), as onnxruntime's CPU
   kernel computes it: the new keys (rotated) and values written into the present buffers at the sequence's
   position (in place when past and present are one buffer), then each head's query row (rotated) attends to
   the columns it sees (causal, local window), scaled, soft-capped, softmaxed with an optional head sink. Heads
   and rows are shared among OpenMP threads. The caller (src/ctxrt/backends/cpu/genai/gqa.py) checks the lengths
   and copies a separate past's rows. */

#include <math.h>
#include <stdint.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "gqa.h"

/* floats of work for `threads` threads: each a row of scores and a rotated query */
int64_t ctxrt_gqa_work_floats(int64_t rows, int64_t h, int64_t threads) { return threads * (rows + h); }

#define NAME(x) x##_c
#include "gqa_kernel.h"
#undef NAME

#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#define NAME(x) x##_avx2
#include "gqa_kernel.h"
#undef NAME
#pragma GCC pop_options
#define GQA_X86 1
#endif

int ctxrt_gqa(const gqa_args *p) {
#ifdef GQA_X86
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        gqa_avx2(p);
        return 0;
    }
#endif
    gqa_c(p);
    return 0;
}
