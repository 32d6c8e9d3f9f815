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
        } else if (p->period == 1) {                                                                         \
            const float b0 = ((float)b[0] - zb) * sb;                                                        \
            QADD_LOOP(T, 0, p->n, b0)                                                                        \
        } else if (p->period) { /* B along the last axis (an attention mask over heads and rows) */          \
            const int64_t m = p->period;                                                                     \
            for (int64_t r0 = 0; r0 < p->n; r0 += m) QADD_LOOP(T, r0, m, ((float)b[i - r0] - zb) * sb)      \
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
        } else if (p->period > 1) { /* B repeated along the last axis (a squeeze-and-excitation scale, NHWC) */ \
            for (int64_t r = 0; r < p->n; r += p->period) {                                                  \
                const T *restrict ar = a + r;                                                                \
                T *restrict yr = y + r;                                                                      \
                _Pragma("omp simd") for (int64_t j = 0; j < p->period; j++) {                               \
                    float t = nearbyintf((((float)ar[j] - za) * ((float)b[j] - zb)) * m) + zc;               \
                    t = t > lo ? t : lo;                                                                     \
                    t = t < hi ? t : hi;                                                                     \
                    yr[j] = (T)t;                                                                            \
                }                                                                                            \
            }                                                                                                \
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

/* the 8-bit value x[i] (signed or not) as an int */
static inline int NAME(int8_at)(const void *x, int is_signed, int64_t i) {
    return is_signed ? (int)((const int8_t *)x)[i] : (int)((const uint8_t *)x)[i];
}

/* MatMulInteger: A - za as int16 rows of kp values (a zero pad), B - zb as int16 pairs of rows interleaved per
   column ([kp / 2][n][2]), then every Y[i][j] = sum of the pairs' products, exact in int32 (the caller checks
   k |A - za| |B - zb| < 2^31): AVX2 takes 4 rows by 16 columns a step, vpmaddwd summing each pair */
static void NAME(igemm)(const igemm_args *p) {
    const int64_t m = p->m, k = p->k, n = p->n, kp = (k + 1) & ~(int64_t)1;
    const int as = (int)p->a_signed, bs = (int)p->b_signed;
    const int za = p->za ? NAME(int8_at)(p->za, as, 0) : 0;
    int16_t *restrict a16 = p->a16, *restrict b16 = p->b16;
    for (int64_t i = 0; i < m; i++) {  /* the type's branch outside the loops: each one vectorizes */
        int16_t *restrict dst = a16 + i * kp;
        if (as) {
            const int8_t *restrict src = (const int8_t *)p->a + i * k;
#pragma omp simd
            for (int64_t c = 0; c < k; c++) dst[c] = (int16_t)(src[c] - za);
        } else {
            const uint8_t *restrict src = (const uint8_t *)p->a + i * k;
#pragma omp simd
            for (int64_t c = 0; c < k; c++) dst[c] = (int16_t)(src[c] - za);
        }
        if (kp > k) dst[k] = 0;
    }
    const int zb0 = p->zb_count == 1 ? NAME(int8_at)(p->zb, bs, 0) : 0;
    const int8_t *zs = p->zb_count > 1 && bs ? (const int8_t *)p->zb : 0;
    const uint8_t *zu = p->zb_count > 1 && !bs ? (const uint8_t *)p->zb : 0;
    int64_t c0 = 0;
#ifdef QELEM_AVX2
    /* two rows of B at a time, 16 columns a step: widened, centred, interleaved into pairs with unpacks */
    for (; c0 + 2 <= k; c0 += 2) {
        const char *r0 = (const char *)p->b + c0 * n, *r1 = r0 + n;
        int16_t *dst = b16 + (c0 >> 1) * n * 2;
        int64_t j = 0;
        for (; j + 16 <= n; j += 16) {
            const __m128i x0 = _mm_loadu_si128((const __m128i *)(r0 + j));
            const __m128i x1 = _mm_loadu_si128((const __m128i *)(r1 + j));
            __m256i w0 = bs ? _mm256_cvtepi8_epi16(x0) : _mm256_cvtepu8_epi16(x0);
            __m256i w1 = bs ? _mm256_cvtepi8_epi16(x1) : _mm256_cvtepu8_epi16(x1);
            __m256i z = _mm256_set1_epi16((short)zb0);
            if (p->zb_count > 1) {
                const __m128i zx = _mm_loadu_si128((const __m128i *)((const char *)p->zb + j));
                z = bs ? _mm256_cvtepi8_epi16(zx) : _mm256_cvtepu8_epi16(zx);
            }
            w0 = _mm256_sub_epi16(w0, z), w1 = _mm256_sub_epi16(w1, z);
            const __m256i lo = _mm256_unpacklo_epi16(w0, w1), hi = _mm256_unpackhi_epi16(w0, w1);
            _mm256_storeu_si256((__m256i *)(dst + 2 * j), _mm256_permute2x128_si256(lo, hi, 0x20));
            _mm256_storeu_si256((__m256i *)(dst + 2 * j + 16), _mm256_permute2x128_si256(lo, hi, 0x31));
        }
        for (; j < n; j++) {
            const int zb = p->zb_count > 1 ? NAME(int8_at)(p->zb, bs, j) : zb0;
            dst[2 * j] = (int16_t)(NAME(int8_at)(r0, bs, j) - zb);
            dst[2 * j + 1] = (int16_t)(NAME(int8_at)(r1, bs, j) - zb);
        }
    }
#endif
    for (int64_t c = c0; c < kp; c++) {
        int16_t *restrict dst = b16 + (c >> 1) * n * 2 + (c & 1);
        if (c >= k) {
            for (int64_t j = 0; j < n; j++) dst[2 * j] = 0;
        } else if (bs) {
            const int8_t *restrict src = (const int8_t *)p->b + c * n;
            if (zs) {
#pragma omp simd
                for (int64_t j = 0; j < n; j++) dst[2 * j] = (int16_t)(src[j] - zs[j]);
            } else {
#pragma omp simd
                for (int64_t j = 0; j < n; j++) dst[2 * j] = (int16_t)(src[j] - zb0);
            }
        } else {
            const uint8_t *restrict src = (const uint8_t *)p->b + c * n;
            if (zu) {
#pragma omp simd
                for (int64_t j = 0; j < n; j++) dst[2 * j] = (int16_t)(src[j] - zu[j]);
            } else {
#pragma omp simd
                for (int64_t j = 0; j < n; j++) dst[2 * j] = (int16_t)(src[j] - zb0);
            }
        }
    }
    const int64_t pairs = kp / 2;
    for (int64_t i0 = 0; i0 < m; i0 += 4) {
        const int64_t rows = m - i0 < 4 ? m - i0 : 4;
        int64_t j0 = 0;
#ifdef QELEM_AVX2
        if (rows == 4) {
            const int16_t *r0 = a16 + i0 * kp, *r1 = r0 + kp, *r2 = r1 + kp, *r3 = r2 + kp;
            for (; j0 + 16 <= n; j0 += 16) {
                __m256i c00 = _mm256_setzero_si256(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00,
                        c30 = c00, c31 = c00;
                const int16_t *bp = b16 + j0 * 2;
                for (int64_t q = 0; q < pairs; q++, bp += n * 2) {
                    const __m256i b0 = _mm256_loadu_si256((const __m256i *)bp);
                    const __m256i b1 = _mm256_loadu_si256((const __m256i *)(bp + 16));
                    int32_t w0, w1, w2, w3;
                    memcpy(&w0, r0 + 2 * q, 4), memcpy(&w1, r1 + 2 * q, 4);
                    memcpy(&w2, r2 + 2 * q, 4), memcpy(&w3, r3 + 2 * q, 4);
                    const __m256i a0 = _mm256_set1_epi32(w0), a1 = _mm256_set1_epi32(w1);
                    const __m256i a2 = _mm256_set1_epi32(w2), a3 = _mm256_set1_epi32(w3);
                    c00 = _mm256_add_epi32(c00, _mm256_madd_epi16(a0, b0));
                    c01 = _mm256_add_epi32(c01, _mm256_madd_epi16(a0, b1));
                    c10 = _mm256_add_epi32(c10, _mm256_madd_epi16(a1, b0));
                    c11 = _mm256_add_epi32(c11, _mm256_madd_epi16(a1, b1));
                    c20 = _mm256_add_epi32(c20, _mm256_madd_epi16(a2, b0));
                    c21 = _mm256_add_epi32(c21, _mm256_madd_epi16(a2, b1));
                    c30 = _mm256_add_epi32(c30, _mm256_madd_epi16(a3, b0));
                    c31 = _mm256_add_epi32(c31, _mm256_madd_epi16(a3, b1));
                }
                int32_t *y = p->y + i0 * n + j0;
                _mm256_storeu_si256((__m256i *)y, c00), _mm256_storeu_si256((__m256i *)(y + 8), c01);
                _mm256_storeu_si256((__m256i *)(y + n), c10), _mm256_storeu_si256((__m256i *)(y + n + 8), c11);
                _mm256_storeu_si256((__m256i *)(y + 2 * n), c20);
                _mm256_storeu_si256((__m256i *)(y + 2 * n + 8), c21);
                _mm256_storeu_si256((__m256i *)(y + 3 * n), c30);
                _mm256_storeu_si256((__m256i *)(y + 3 * n + 8), c31);
            }
        }
#endif
        for (int64_t r = 0; r < rows; r++) {
            const int16_t *ar = a16 + (i0 + r) * kp;
            for (int64_t j = j0; j < n; j++) {
                int32_t acc = 0;
                for (int64_t q = 0; q < pairs; q++) {
                    const int16_t *bq = b16 + (q * n + j) * 2;
                    acc += (int32_t)ar[2 * q] * bq[0] + (int32_t)ar[2 * q + 1] * bq[1];
                }
                p->y[(i0 + r) * n + j] = acc;
            }
        }
    }
}

/* out[0] = min(x), out[1] = max(x) over n floats (n >= 1); both NaN where x holds a NaN, as NumPy's reductions */
static void NAME(minmax)(const float *restrict x, int64_t n, float *out) {
    float lo = x[0], hi = x[0];
    int nan = 0;
#pragma omp simd reduction(min : lo) reduction(max : hi) reduction(| : nan)
    for (int64_t i = 0; i < n; i++) {
        const float v = x[i];
        lo = v < lo ? v : lo;
        hi = v > hi ? v : hi;
        nan |= v != v;
    }
    out[0] = nan ? NAN : lo;
    out[1] = nan ? NAN : hi;
}

#define AFFINE_LOOP(TX, TY, A, B)                                                                           \
    _Pragma("omp simd") for (int64_t c = 0; c < p->cols; c++) {                                             \
        float t = nearbyintf((float)x[c] * (A) + (B));                                                       \
        t = t > lo ? t : lo;                                                                                 \
        t = t < hi ? t : hi;                                                                                 \
        y[c] = (TY)t;                                                                                        \
    }

#define AFFINE_BODY(TX, TY)                                                                                 \
    {                                                                                                        \
        const float lo = p->y_signed ? -128.0f : 0.0f, hi = p->y_signed ? 127.0f : 255.0f;                 \
        for (int64_t r = 0; r < p->rows; r++) {                                                              \
            const TX *restrict x = (const TX *)p->x + r * p->ldx;                                           \
            TY *restrict y = (TY *)p->y + r * p->ldy;                                                        \
            if (p->per == 2) {                                                                               \
                const float *restrict a = p->a, *restrict b = p->b;                                          \
                AFFINE_LOOP(TX, TY, a[c], b[c])                                                              \
            } else {                                                                                         \
                const float a = p->a[r % p->channels], b = p->b[r % p->channels];                           \
                AFFINE_LOOP(TX, TY, a, b)                                                                    \
            }                                                                                                \
        }                                                                                                    \
    }

/* y = saturate(round_half_even(x a + b)) per channel, the multiply and the add rounded apart (NumPy's order) */
static void NAME(affine8)(const affine8_args *p) {
    if (p->x_signed && p->y_signed) AFFINE_BODY(int8_t, int8_t)
    else if (p->x_signed) AFFINE_BODY(int8_t, uint8_t)
    else if (p->y_signed) AFFINE_BODY(uint8_t, int8_t)
    else AFFINE_BODY(uint8_t, uint8_t)
}

#undef AFFINE_BODY
#undef AFFINE_LOOP
