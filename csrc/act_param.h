/* The activations a Conv fuses with its parameters (csrc/gemv.h's codes: 1 Relu, 7 HardSwish x clamp(alpha x +
   beta, 0, 1), 8 Clip to [alpha, beta], 9 LeakyRelu of slope alpha, 10 HardSigmoid clamp(alpha x + beta, 0, 1)),
   of one value and, on AVX-512, of 16 lanes: csrc/gemv.c's and csrc/dwconv.c's epilogues. Any other code: the
   value as it is (the caller applies codes 2 .. 6, GELU, SiLU and erf, its own way). */
#ifndef CTXRT_ACT_PARAM_H
#define CTXRT_ACT_PARAM_H
#include <math.h>

static inline float act_param1(float v, int act, float alpha, float beta) {
    switch (act) {
    case 1: return v > 0.0f ? v : 0.0f;
    case 7: return v * fminf(fmaxf(alpha * v + beta, 0.0f), 1.0f);
    case 8: return fminf(fmaxf(v, alpha), beta);
    case 9: return v >= 0.0f ? v : alpha * v;
    case 10: return fminf(fmaxf(alpha * v + beta, 0.0f), 1.0f);
    default: return v;
    }
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

__attribute__((target("avx512f,avx2,fma")))
static inline __m512 act_param16(__m512 v, int act, __m512 a, __m512 b) {
    const __m512 zero = _mm512_setzero_ps(), one = _mm512_set1_ps(1.0f);
    switch (act) {
    case 1: return _mm512_max_ps(v, zero);
    case 7: return _mm512_mul_ps(v, _mm512_min_ps(_mm512_max_ps(_mm512_fmadd_ps(a, v, b), zero), one));
    case 8: return _mm512_min_ps(_mm512_max_ps(v, a), b);
    case 9: return _mm512_mask_mul_ps(v, _mm512_cmp_ps_mask(v, zero, _CMP_LT_OQ), v, a);
    case 10: return _mm512_min_ps(_mm512_max_ps(_mm512_fmadd_ps(a, v, b), zero), one);
    default: return v;
    }
}
#endif

#endif
