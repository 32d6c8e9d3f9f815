/* The row kernels of csrc/genai.c, included there once per instruction set (NAME(x): this copy's names), after
   gqa_kernel.h (whose exp8 the AVX2 softmax uses). */

static void NAME(rms_rows)(const rms_args *p) {
    const int64_t n = p->n;
    for (int64_t r = 0; r < p->rows; r++) {
        const float *x = p->x + r * n, *skip = p->skip ? p->skip + r * p->skip_stride : 0, *bias = p->bias;
        float *s = p->sum ? p->sum + r * n : p->y + r * n, *y = p->y + r * n;
        float sq = 0.0f;
#pragma omp simd reduction(+ : sq)
        for (int64_t i = 0; i < n; i++) {
            float v = x[i];
            if (skip) v += skip[i];
            if (bias) v += bias[i];
            s[i] = v;
            sq += v * v;
        }
        const float inv = 1.0f / sqrtf(sq / (float)n + p->eps);
#pragma omp simd
        for (int64_t i = 0; i < n; i++) y[i] = s[i] * inv * p->gamma[i];
    }
}

/* LayerNormalization, the statistics in float32 in two passes (the mean, then the mean square of x - mean: no
   cancellation where the mean is large beside the spread) */
static void NAME(ln_rows)(const ln_args *p) {
    const int64_t n = p->n;
    const float *g = p->gamma, *b = p->beta;
    for (int64_t r = 0; r < p->rows; r++) {
        const float *x = p->x + r * n;
        float *y = p->y + r * n;
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int64_t i = 0; i < n; i++) sum += x[i];
        const float mean = sum / (float)n;
        float sq = 0.0f;
#pragma omp simd reduction(+ : sq)
        for (int64_t i = 0; i < n; i++) {
            const float d = x[i] - mean;
            sq += d * d;
        }
        const float inv = 1.0f / sqrtf(sq / (float)n + p->eps);
        if (b) {
#pragma omp simd
            for (int64_t i = 0; i < n; i++) y[i] = (x[i] - mean) * inv * g[i] + b[i];
        } else {
#pragma omp simd
            for (int64_t i = 0; i < n; i++) y[i] = (x[i] - mean) * inv * g[i];
        }
    }
}

/* Softmax: the row's largest subtracted (e^ never overflows), e^ (AVX2: exp8, whose arguments below -87 give
   e^-87 ~ 1.6e-38, flushed to 0 here as expf's denormals are by the sum beside the max's 1), then divided by the
   sum. A NaN makes its row NaN (through the sum), as NumPy's kernel; a row of -inf gives NaN (-inf - -inf). */
static void NAME(softmax_rows)(const softmax_args *p) {
    const int64_t n = p->n;
    for (int64_t r = 0; r < p->rows; r++) {
        const float *x = p->x + r * n;
        float *y = p->y + r * n;
        float m = -INFINITY;
        int64_t i = 0;
#ifdef GQA_AVX2
        if (n >= 8) {
            __m256 mx = _mm256_loadu_ps(x);
            for (i = 8; i + 8 <= n; i += 8) mx = _mm256_max_ps(mx, _mm256_loadu_ps(x + i));
            __m128 h = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
            h = _mm_max_ps(h, _mm_movehl_ps(h, h));
            m = _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
        }
#endif
        for (; i < n; i++) m = x[i] > m ? x[i] : m;
        float sum = 0.0f;
        i = 0;
#ifdef GQA_AVX2
        const __m256 mv = _mm256_set1_ps(m), low = _mm256_set1_ps(-87.0f);
        __m256 acc = _mm256_setzero_ps();
        for (; i + 8 <= n; i += 8) {
            const __m256 t = _mm256_sub_ps(_mm256_loadu_ps(x + i), mv);
            __m256 e = NAME(exp8)(t);
            e = _mm256_andnot_ps(_mm256_cmp_ps(t, low, _CMP_LT_OQ), e);  /* below -87: 0 */
            _mm256_storeu_ps(y + i, e);
            acc = _mm256_add_ps(acc, e);
        }
        sum = NAME(hsum8)(acc);
#endif
        for (; i < n; i++) {
            const float e = expf(x[i] - m);
            y[i] = e;
            sum += e;
        }
        const float inv = 1.0f / sum;
#pragma omp simd
        for (int64_t j = 0; j < n; j++) y[j] *= inv;
    }
}
