/* Swish y = x / (1 + e^(-alpha x)) over n floats (y may be x), as NumPy computes it in float32 (an argument of
   the exponential past 88.72 gives inf, then y = -0); included by csrc/genai.c once per instruction set. */

#ifdef GQA_AVX2
/* e^t for 8 lanes, as float32 expf gives it: Cephes' expf (exp8) up to 88, e^88 * e^(t - 88) up to 88.72, inf
   above; below -87 e^-87 (~1e-38 beside 1); NaN kept (minps and maxps return their second operand on a NaN) */
static inline __m256 NAME(exp8_full)(__m256 t) {
    const __m256 cap = _mm256_set1_ps(88.0f);
    const __m256 over = _mm256_cmp_ps(t, _mm256_set1_ps(88.72283935546875f), _CMP_GT_OQ);
    __m256 e = NAME(exp8)(_mm256_min_ps(cap, t));
    e = _mm256_mul_ps(e, NAME(exp8)(_mm256_max_ps(_mm256_sub_ps(t, cap), _mm256_setzero_ps())));
    return _mm256_blendv_ps(e, _mm256_set1_ps(INFINITY), over);
}
#endif

static void NAME(swish)(const swish_args *p) {
    const float *x = p->x;
    float *y = p->y;
    const float na = -p->alpha;
    int64_t i = 0;
#ifdef GQA_AVX2
    const __m256 nav = _mm256_set1_ps(na), one = _mm256_set1_ps(1.0f);
    for (; i + 8 <= p->n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        const __m256 t = NAME(exp8_full)(_mm256_mul_ps(v, nav));
        _mm256_storeu_ps(y + i, _mm256_div_ps(v, _mm256_add_ps(t, one)));
    }
#endif
    for (; i < p->n; i++) y[i] = x[i] / (1.0f + expf(na * x[i]));
}
