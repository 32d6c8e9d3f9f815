/* The decoder kernels of onnxruntime-genai's models, for a generation's steps; called through ctypes
   (src/ctxrt/backends/cpu/native.py), each `*_kernel.h` compiled twice: for AVX2+FMA and in portable C (and
   lstm_kernel.h a third time for AVX-512, where its gates and its one-row GEMV take 16 lanes).

   - com.microsoft GroupQueryAttention for a few new tokens of one sequence (gqa_kernel.h), as onnxruntime's CPU
     kernel computes it: the new keys (rotated) and values written into the present buffers at the sequence's
     position (in place when past and present are one buffer), then each head's query row (rotated) attends to
     the columns it sees (causal, local window), scaled, soft-capped, softmaxed with an optional head sink. Heads
     and rows are shared among the threads of ctxrt's pool (csrc/pool.c: no barrier). The caller (backends/cpu/genai/gqa.py) checks the lengths and
     copies a separate past's rows.
   - RMS normalization of rows (norms_kernel.h: SimplifiedLayerNormalization, RMSNormalization, com.microsoft
     SkipSimplifiedLayerNormalization), float32: s = x (+ skip) (+ bias), stored as the sum output where asked,
     y = s / sqrt(mean(s^2) + epsilon) * gamma, one pass a row (backends/cpu/genai/norms.py).
   - LayerNormalization and Softmax of float32 rows (norms_kernel.h): a range program's steps at run-time extents
     (backends/cpu/extents.py), one call instead of NumPy's five to ten.
   - Swish x / (1 + e^(-alpha x)) (act_kernel.h): the SiLU of a decoder's MLP, one pass instead of NumPy's four
     (backends/cpu/activations.py).
   - One direction of an LSTM at a few batch rows (lstm_kernel.h): every step's recurrent GEMV and gates in one
     call, after one GEMM of the input projections (oneDNN's, or NumPy's; backends/cpu/rnn_native.py); a GRU's
     with linear_before_reset the same way. */

#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

#include "act.h"
#include "gqa.h"
#include "lstm.h"
#include "norms.h"
#include "pool.h"

#define GQA_CHUNKS_MAX 16  /* chunks of a GroupQueryAttention's heads: its work holds 16 threads' rows (gqa.py) */
#define GQA_SHARED_WORK (1 << 17)  /* multiply-adds (heads x rows x positions x head size) worth a second thread */

typedef struct {
    const gqa_args *p;
    int64_t tasks, chunks;
} gqa_job;

#define NAME(x) x##_c
#include "gqa_kernel.h"
#include "norms_kernel.h"
#include "act_kernel.h"
#include "lstm_kernel.h"
#undef NAME

#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#define GQA_AVX2 1
#define NAME(x) x##_avx2
#include "gqa_kernel.h"
#include "norms_kernel.h"
#include "act_kernel.h"
#include "lstm_kernel.h"
#undef NAME
#undef GQA_AVX2
#pragma GCC pop_options

/* lstm_kernel.h once more, 16 lanes (AVX-512F and DQ): the LSTM's and GRU's one-row GEMV and gates; the LSTM's
   two- and four-row GEMVs stay the AVX2 copy's (an AVX-512 copy of them measured slower than oneDNN's primitive) */
#pragma GCC push_options
#pragma GCC target("avx512f,avx512dq,avx2,fma")
#define GQA_AVX2 1
#define LSTM_AVX512 1
#define NAME(x) x##_avx512
#include "hsum.h"
#include "vmath.h"
#include "lstm_kernel.h"
#undef NAME
#undef LSTM_AVX512
#undef GQA_AVX2
#pragma GCC pop_options

static int avx512(void) { return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq"); }

static int avx2(void) { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }
#else
static int avx2(void) { return 0; }
#define gqa_avx2 gqa_c
#define rms_rows_avx2 rms_rows_c
#define ln_rows_avx2 ln_rows_c
#define softmax_rows_avx2 softmax_rows_c
#define swish_avx2 swish_c
#define lstm_avx2 lstm_c
static int avx512(void) { return 0; }
#define lstm_avx512 lstm_c
#define gru_avx2 gru_c
#define gru_avx512 gru_c
#endif

int ctxrt_gqa(const gqa_args *p) {
    if (avx2()) gqa_avx2(p);
    else gqa_c(p);
    return 0;
}

int ctxrt_rms_rows(const rms_args *p) {
    if (avx2()) rms_rows_avx2(p);
    else rms_rows_c(p);
    return 0;
}

int ctxrt_ln_rows(const ln_args *p) {
    if (avx2()) ln_rows_avx2(p);
    else ln_rows_c(p);
    return 0;
}

int ctxrt_softmax_rows(const softmax_args *p) {
    if (avx2()) softmax_rows_avx2(p);
    else softmax_rows_c(p);
    return 0;
}

int ctxrt_swish(const swish_args *p) {
    if (avx2()) swish_avx2(p);
    else swish_c(p);
    return 0;
}

int ctxrt_gru(const gru_args *p) {
    if (avx512()) gru_avx512(p);
    else if (avx2()) gru_avx2(p);
    else gru_c(p);
    return 0;
}

int ctxrt_lstm(const lstm_args *p) {
    if (avx512()) lstm_avx512(p);
    else if (avx2()) lstm_avx2(p);
    else lstm_c(p);
    return 0;
}
