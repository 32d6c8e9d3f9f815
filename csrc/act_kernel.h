/* Swish y = x / (1 + e^(-alpha x)) over n floats (y may be x), as NumPy computes it in float32 (an argument of
   the exponential past 88.72 gives inf, then y = -0, exp8_full of csrc/vmath.h); included by csrc/genai.c once per
   instruction set. */


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
