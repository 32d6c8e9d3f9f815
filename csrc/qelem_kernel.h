/* The kernel of csrc/qelem.c, included there once per instruction set (NAME(x): this copy's names). */

#define QADD_LOOP(T, START, COUNT, ADDEND)                                                                  \
    _Pragma("omp simd") for (int64_t i = START; i < START + COUNT; i++) {                                   \
        float t = nearbyintf((((float)a[i] - za) * sa + (ADDEND)) / sc) + zc;                               \
        t = t > lo ? t : lo;                                                                                 \
        t = t < hi ? t : hi;                                                                                 \
        y[i] = (T)t;                                                                                         \
    }

#define QADD_BODY(T)                                                                                        \
    {                                                                                                        \
        const T *restrict a = (const T *)p->a, *restrict b = (const T *)p->b;                              \
        const float *restrict fixed = p->fixed;                                                              \
        T *restrict y = (T *)p->y;                                                                           \
        const float sa = p->sa, za = p->za, sb = p->sb, zb = p->zb, sc = p->sc, zc = p->zc;              \
        const float lo = p->is_signed ? -128.0f : 0.0f, hi = p->is_signed ? 127.0f : 255.0f;              \
        if (fixed && p->period == 1) {                                                                       \
            const float f0 = fixed[0];                                                                       \
            QADD_LOOP(T, 0, p->n, f0)                                                                        \
        } else if (fixed && p->period) {                                                                     \
            const int64_t m = p->period;                                                                     \
            for (int64_t r0 = 0; r0 < p->n; r0 += m) QADD_LOOP(T, r0, m, fixed[i - r0])                      \
        } else if (fixed) {                                                                                  \
            QADD_LOOP(T, 0, p->n, fixed[i])                                                                  \
        } else {                                                                                             \
            QADD_LOOP(T, 0, p->n, ((float)b[i] - zb) * sb)                                                   \
        }                                                                                                    \
    }

#define QUANTIZE_BODY(T)                                                                                    \
    {                                                                                                        \
        T *restrict y = (T *)p->y;                                                                           \
        const float *restrict x = (const float *)p->x;                                                                      \
        const float s = p->scale, zp = p->zp;                                                                \
        const float lo = p->is_signed ? -128.0f : 0.0f, hi = p->is_signed ? 127.0f : 255.0f;              \
        _Pragma("omp simd") for (int64_t i = 0; i < p->n; i++) {                                            \
            float t = nearbyintf(x[i] / s) + zp;                                                             \
            t = t > lo ? t : lo;                                                                             \
            t = t < hi ? t : hi;                                                                             \
            y[i] = (T)t;                                                                                     \
        }                                                                                                    \
    }

static void NAME(quantize)(const linear8_args *p) {
    if (p->is_signed) QUANTIZE_BODY(int8_t)
    else QUANTIZE_BODY(uint8_t)
}

#undef QUANTIZE_BODY

#define DEQUANTIZE_BODY(T)                                                                                  \
    {                                                                                                        \
        const T *restrict x = (const T *)p->x;                                                              \
        float *restrict y = (float *)p->y;                                                                            \
        const float s = p->scale, zp = p->zp;                                                                \
        _Pragma("omp simd") for (int64_t i = 0; i < p->n; i++) y[i] = ((float)x[i] - zp) * s;             \
    }

static void NAME(dequantize)(const linear8_args *p) {
    if (p->is_signed) DEQUANTIZE_BODY(int8_t)
    else DEQUANTIZE_BODY(uint8_t)
}

#undef DEQUANTIZE_BODY

#define QMUL_LOOP(T, FACTOR)                                                                                \
    _Pragma("omp simd") for (int64_t i = 0; i < p->n; i++) {                                                \
        float t = nearbyintf((((float)a[i] - za) * (FACTOR)) * m) + zc;                                     \
        t = t > lo ? t : lo;                                                                                 \
        t = t < hi ? t : hi;                                                                                 \
        y[i] = (T)t;                                                                                         \
    }

#define QMUL_BODY(T)                                                                                        \
    {                                                                                                        \
        const T *restrict a = (const T *)p->a, *restrict b = (const T *)p->b;                              \
        T *restrict y = (T *)p->y;                                                                           \
        const float za = p->za, zb = p->zb, zc = p->zc, m = (p->sa * p->sb) / p->sc;                     \
        const float lo = p->is_signed ? -128.0f : 0.0f, hi = p->is_signed ? 127.0f : 255.0f;              \
        if (p->period == 1) {                                                                                \
            const float bb = (float)b[0] - zb;                                                               \
            QMUL_LOOP(T, bb)                                                                                 \
        } else {                                                                                             \
            QMUL_LOOP(T, ((float)b[i] - zb))                                                                 \
        }                                                                                                    \
    }

static void NAME(qmul)(const qadd_args *p) {
    if (p->is_signed) QMUL_BODY(int8_t)
    else QMUL_BODY(uint8_t)
}

#undef QMUL_BODY
#undef QMUL_LOOP

static void NAME(qadd)(const qadd_args *p) {
    if (p->is_signed) QADD_BODY(int8_t)
    else QADD_BODY(uint8_t)
}

#undef QADD_BODY
#undef QADD_LOOP

/* floats out[j] = x[j] - z for j < count, x 8-bit integers (signed or not) */
static void NAME(centered)(const void *x, int is_signed, float z, int64_t count, float *restrict out) {
    if (is_signed) {
        const int8_t *restrict v = (const int8_t *)x;
#pragma omp simd
        for (int64_t j = 0; j < count; j++) out[j] = (float)v[j] - z;
    } else {
        const uint8_t *restrict v = (const uint8_t *)x;
#pragma omp simd
        for (int64_t j = 0; j < count; j++) out[j] = (float)v[j] - z;
    }
}

/* QLinearMatMul per tensor: each batch matrix's B - zb as floats, then per row of A (A's row - za as floats) the
   float32 sums (exact integers: the caller checks k |A - za| |B - zb| <= 2^24), then saturate(round(acc * mult) +
   zc). */
static void NAME(qmatmul)(const qmatmul_args *p) {
    const int64_t m = p->m, k = p->k, n = p->n;
    float *restrict bf = p->bf, *restrict acc = p->acc, *restrict arow = p->arow;
    const float lo = p->y_signed ? -128.0f : 0.0f, hi = p->y_signed ? 127.0f : 255.0f;
    const float mult = p->mult, zc = p->zc;
    for (int64_t t = 0; t < p->batch; t++) {
        NAME(centered)((const char *)p->b + t * k * n, (int)p->b_signed, p->zb, k * n, bf);
        for (int64_t i = 0; i < m; i++) {
            NAME(centered)((const char *)p->a + (t * m + i) * k, (int)p->a_signed, p->za, k, arow);
            int64_t j0 = 0;
#ifdef QELEM_AVX2
            for (; j0 + 32 <= n; j0 += 32) {  /* 32 columns summed in four registers (exact: integers < 2^24) */
                __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
                for (int64_t c = 0; c < k; c++) {
                    const __m256 av = _mm256_broadcast_ss(arow + c);
                    const float *row = bf + c * n + j0;
                    s0 = _mm256_fmadd_ps(av, _mm256_loadu_ps(row), s0);
                    s1 = _mm256_fmadd_ps(av, _mm256_loadu_ps(row + 8), s1);
                    s2 = _mm256_fmadd_ps(av, _mm256_loadu_ps(row + 16), s2);
                    s3 = _mm256_fmadd_ps(av, _mm256_loadu_ps(row + 24), s3);
                }
                _mm256_storeu_ps(acc + j0, s0);
                _mm256_storeu_ps(acc + j0 + 8, s1);
                _mm256_storeu_ps(acc + j0 + 16, s2);
                _mm256_storeu_ps(acc + j0 + 24, s3);
            }
#endif
            for (int64_t j = j0; j < n; j++) acc[j] = 0.0f;
            for (int64_t c = 0; c < k && j0 < n; c++) {
                const float av = arow[c];
                const float *restrict row = bf + c * n;
                for (int64_t j = j0; j < n; j++) acc[j] += av * row[j];
            }
            if (p->y_signed) {
                int8_t *restrict y = (int8_t *)p->y + (t * m + i) * n;
#pragma omp simd
                for (int64_t j = 0; j < n; j++) {
                    float v = nearbyintf(acc[j] * mult) + zc;
                    v = v > lo ? v : lo;
                    y[j] = (int8_t)(v < hi ? v : hi);
                }
            } else {
                uint8_t *restrict y = (uint8_t *)p->y + (t * m + i) * n;
#pragma omp simd
                for (int64_t j = 0; j < n; j++) {
                    float v = nearbyintf(acc[j] * mult) + zc;
                    v = v > lo ? v : lo;
                    y[j] = (uint8_t)(v < hi ? v : hi);
                }
            }
        }
    }
}
