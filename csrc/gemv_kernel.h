/* The kernel of csrc/gemv.c, included there once per instruction set (NAME(x): this copy's names; GEMV_AVX2
   defined in the AVX2+FMA copy). Each thread streams one contiguous range of W: memory-bound loops are fastest
   when the hardware prefetcher sees one long stream. */

#ifdef GEMV_AVX2
#include "hsum.h"
#include "vmath.h"
#endif

/* y[c0 .. c1 - 1] = act(y[c0 .. c1 - 1]): 8 lanes at a time in the AVX2 copy (GELU's erf: ~10 ns a value
   scalar, a 1024-wide layer's 10 us) */
#ifdef GEMV_AVX2
/* act8's codes, and gemv_args' codes 7 .. 10 with their parameters alpha and beta (as gemv_act) */
static inline __m256 NAME(act8p)(__m256 v, int act, float alpha, float beta) {
    const __m256 a = _mm256_set1_ps(alpha), b = _mm256_set1_ps(beta), zero = _mm256_setzero_ps();
    switch (act) {
    case 7: return _mm256_mul_ps(v, _mm256_min_ps(_mm256_max_ps(_mm256_fmadd_ps(a, v, b), zero), _mm256_set1_ps(1.0f)));
    case 8: return _mm256_min_ps(_mm256_max_ps(v, a), b);
    case 9: return _mm256_blendv_ps(_mm256_mul_ps(a, v), v, _mm256_cmp_ps(v, zero, _CMP_GE_OQ));
    case 10: return _mm256_min_ps(_mm256_max_ps(_mm256_fmadd_ps(a, v, b), zero), _mm256_set1_ps(1.0f));
    default: return NAME(act8)(v, act);
    }
}
#endif

static void NAME(act_row)(float *y, int64_t c0, int64_t c1, int act, float alpha, float beta) {
    if (!act) return;
    int64_t j = c0;
#ifdef GEMV_AVX2
    for (; j + 8 <= c1; j += 8) _mm256_storeu_ps(y + j, NAME(act8p)(_mm256_loadu_ps(y + j), act, alpha, beta));
#endif
    for (; j < c1; j++) y[j] = gemv_act(y[j], act, alpha, beta);
}

static inline float NAME(dot)(const float *restrict a, const float *restrict w, int64_t k) {
    int64_t i = 0;
#ifdef GEMV_AVX2
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    for (; i + 32 <= k; i += 32) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(w + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(w + i + 8), s1);
        s2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(w + i + 16), s2);
        s3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(w + i + 24), s3);
    }
    for (; i + 8 <= k; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(w + i), s0);
    float total = NAME(hsum8)(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
#else
    float total = 0.0f;
#endif
    float tail = 0.0f;
#pragma omp simd reduction(+ : tail)
    for (int64_t j = i; j < k; j++) tail += a[j] * w[j];
    return total + tail;
}

#ifdef GEMV_AVX2
/* four dot products of a with consecutive rows w, w + k, w + 2k, w + 3k: each load of a serves four FMAs */
static inline void NAME(dot4)(const float *restrict a, const float *restrict w, int64_t k, float *out) {
    const float *w1 = w + k, *w2 = w1 + k, *w3 = w2 + k;
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    int64_t i = 0;
    for (; i + 8 <= k; i += 8) {
        const __m256 x = _mm256_loadu_ps(a + i);
        s0 = _mm256_fmadd_ps(x, _mm256_loadu_ps(w + i), s0);
        s1 = _mm256_fmadd_ps(x, _mm256_loadu_ps(w1 + i), s1);
        s2 = _mm256_fmadd_ps(x, _mm256_loadu_ps(w2 + i), s2);
        s3 = _mm256_fmadd_ps(x, _mm256_loadu_ps(w3 + i), s3);
    }
    out[0] = NAME(hsum8)(s0), out[1] = NAME(hsum8)(s1), out[2] = NAME(hsum8)(s2), out[3] = NAME(hsum8)(s3);
    for (; i < k; i++) {
        out[0] += a[i] * w[i], out[1] += a[i] * w1[i], out[2] += a[i] * w2[i], out[3] += a[i] * w3[i];
    }
}
#endif

/* y rows = epilogue(A rows . W^T rows c0 .. c1 - 1), W^T [n, k]: each row of W^T read once, for every row of A */
static void NAME(gemv_nk)(const gemv_args *p, int64_t c0, int64_t c1) {
    const int64_t c0_all = c0;
#ifdef GEMV_AVX2
    for (; c0 + 4 <= c1; c0 += 4) {
        const float *w = p->w + c0 * p->k;
        for (int64_t r = 0; r < p->m; r++) {
            float v[4];
            NAME(dot4)(p->a + r * p->lda, w, p->k, v);
            for (int j = 0; j < 4; j++) {
                const int64_t c = c0 + j;
                float x = v[j];
                if (p->bias) x += p->bias[c];
                if (p->residual) x += p->residual[r * p->ldr + c];
                if (p->accumulate) x += p->y[r * p->ldy + c];
                p->y[r * p->ldy + c] = x;
            }
        }
    }
#endif
    for (int64_t c = c0; c < c1; c++) {
        const float *w = p->w + c * p->k;
        for (int64_t r = 0; r < p->m; r++) {
            float v = NAME(dot)(p->a + r * p->lda, w, p->k);
            if (p->bias) v += p->bias[c];
            if (p->residual) v += p->residual[r * p->ldr + c];
            if (p->accumulate) v += p->y[r * p->ldy + c];
            p->y[r * p->ldy + c] = v;
        }
    }
    for (int64_t r = 0; r < p->m; r++) NAME(act_row)(p->y + r * p->ldy, c0_all, c1, (int)p->act, p->alpha, p->beta);
}

/* out[r, c - c0] (rows ldo apart) = sum over rows i0 .. i1 - 1 of W [k, n] of A[r, i] W[i, c], for columns
   c0 .. c1 - 1: eight rows of W at a time; into y itself (out = y + c0) with `accumulate`, added to what it holds */
static void NAME(gemv_kn)(const gemv_args *p, int64_t i0, int64_t i1, int64_t c0, int64_t c1, float *out,
                          int64_t ldo) {
    const int64_t n = p->n, width = c1 - c0;
    if (!(p->accumulate && out == p->y + c0))  /* into y holding the residual: added to it */
        for (int64_t r = 0; r < p->m; r++)
            for (int64_t j = 0; j < width; j++) out[r * ldo + j] = 0.0f;
    int64_t i = i0;
    for (; i + 8 <= i1; i += 8) {
        const float *restrict w0 = p->w + i * n + c0, *restrict w1 = w0 + n, *restrict w2 = w1 + n,
                    *restrict w3 = w2 + n, *restrict w4 = w3 + n, *restrict w5 = w4 + n, *restrict w6 = w5 + n,
                    *restrict w7 = w6 + n;
        for (int64_t r = 0; r < p->m; r++) {
            const float *a = p->a + r * p->lda + i;
            const float a0 = a[0], a1 = a[1], a2 = a[2], a3 = a[3], a4 = a[4], a5 = a[5], a6 = a[6], a7 = a[7];
            float *restrict o = out + r * ldo;
#pragma omp simd
            for (int64_t j = 0; j < width; j++)
                o[j] += (a0 * w0[j] + a1 * w1[j] + a2 * w2[j] + a3 * w3[j]) +
                        (a4 * w4[j] + a5 * w5[j] + a6 * w6[j] + a7 * w7[j]);
        }
    }
    for (; i + 4 <= i1; i += 4) {
        const float *restrict w0 = p->w + i * n + c0, *restrict w1 = w0 + n, *restrict w2 = w1 + n,
                    *restrict w3 = w2 + n;
        for (int64_t r = 0; r < p->m; r++) {
            const float *a = p->a + r * p->lda + i;
            const float a0 = a[0], a1 = a[1], a2 = a[2], a3 = a[3];
            float *restrict o = out + r * ldo;
#pragma omp simd
            for (int64_t j = 0; j < width; j++) o[j] += a0 * w0[j] + a1 * w1[j] + a2 * w2[j] + a3 * w3[j];
        }
    }
    for (; i < i1; i++) {
        const float *restrict w0 = p->w + i * n + c0;
        for (int64_t r = 0; r < p->m; r++) {
            const float a0 = p->a[r * p->lda + i];
            float *restrict o = out + r * ldo;
#pragma omp simd
            for (int64_t j = 0; j < width; j++) o[j] += a0 * w0[j];
        }
    }
}

/* y[:, c0 .. c1 - 1] = epilogue(y + the other threads' parts ([count - 1, m, n] floats)), y holding the first */
static void NAME(gemv_finish)(const gemv_args *p, int64_t c0, int64_t c1, const float *parts, int64_t count) {
    const int64_t n = p->n, size = p->m * n;
    const int act = (int)p->act;
    for (int64_t r = 0; r < p->m; r++) {
        float *restrict y = p->y + r * p->ldy;
        const float *b = p->bias, *res = p->residual ? p->residual + r * p->ldr : 0;
        for (int64_t t = 0; t + 1 < count; t++) {
            const float *restrict q = parts + t * size + r * n;
#pragma omp simd
            for (int64_t j = c0; j < c1; j++) y[j] += q[j];
        }
        if (b || res) {
#pragma omp simd
            for (int64_t j = c0; j < c1; j++) y[j] += (b ? b[j] : 0.0f) + (res ? res[j] : 0.0f);
        }
        NAME(act_row)(y, c0, c1, act, p->alpha, p->beta);
    }
}


#ifdef GEMV_AVX2
/* Y rows r0 .. r0 + RB - 1, columns c0 .. c1 - 1 (c1 - c0 a multiple of 8) = epilogue(A W), W [k, n]: RB rows by
   16 columns of accumulators in registers, each row of W's block loaded once for the RB rows (a GEMV's kernel
   reads W once per row of A). The epilogue on the registers: bias, residual (or y, accumulate), activation. */
/* y[r, col .. col + 7] = act(v + bias + residual (or y itself, accumulate)) */
static inline void NAME(gemm_store)(const gemv_args *p, int64_t r, int64_t col, __m256 v) {
    if (p->bias) v = _mm256_add_ps(v, _mm256_loadu_ps(p->bias + col));
    if (p->residual) v = _mm256_add_ps(v, _mm256_loadu_ps(p->residual + r * p->ldr + col));
    if (p->accumulate) v = _mm256_add_ps(v, _mm256_loadu_ps(p->y + r * p->ldy + col));
    _mm256_storeu_ps(p->y + r * p->ldy + col, NAME(act8p)(v, (int)p->act, p->alpha, p->beta));
}

#define GEMM_BLOCK(RB)                                                                                            \
    static void NAME(gemm_rows##RB)(const gemv_args *p, int64_t r0, int64_t c0, int64_t c1) {                    \
        const int64_t k = p->k, n = p->n;                                                                       \
        const float *a[RB];                                                                                     \
        _Pragma("GCC unroll 8") for (int i = 0; i < RB; i++) a[i] = p->a + (r0 + i) * p->lda;                                           \
        for (int64_t c = c0; c < c1; c += 16) {                                                                 \
            const int two = c + 16 <= c1; /* else one vector of 8 */                                            \
            __m256 acc[RB][2];                                                                                  \
            _Pragma("GCC unroll 8") for (int i = 0; i < RB; i++) acc[i][0] = acc[i][1] = _mm256_setzero_ps();                           \
            const float *w = p->w + c;                                                                          \
            if (two) {                                                                                          \
                for (int64_t kk = 0; kk < k; kk++, w += n) {                                                    \
                    const __m256 b0 = _mm256_loadu_ps(w), b1 = _mm256_loadu_ps(w + 8);                         \
                    _Pragma("GCC unroll 8") for (int i = 0; i < RB; i++) {                                                              \
                        const __m256 x = _mm256_broadcast_ss(a[i] + kk);                                        \
                        acc[i][0] = _mm256_fmadd_ps(x, b0, acc[i][0]);                                          \
                        acc[i][1] = _mm256_fmadd_ps(x, b1, acc[i][1]);                                          \
                    }                                                                                           \
                }                                                                                               \
            } else {                                                                                            \
                for (int64_t kk = 0; kk < k; kk++, w += n) {                                                    \
                    const __m256 b0 = _mm256_loadu_ps(w);                                                       \
                    _Pragma("GCC unroll 8") for (int i = 0; i < RB; i++)                                                                \
                        acc[i][0] = _mm256_fmadd_ps(_mm256_broadcast_ss(a[i] + kk), b0, acc[i][0]);             \
                }                                                                                               \
            }                                                                                                   \
            _Pragma("GCC unroll 8") for (int i = 0; i < RB; i++) {                                                                      \
                NAME(gemm_store)(p, r0 + i, c, acc[i][0]);                                                      \
                if (two) NAME(gemm_store)(p, r0 + i, c + 8, acc[i][1]);                                         \
            }                                                                                                   \
        }                                                                                                       \
    }
GEMM_BLOCK(1)
GEMM_BLOCK(2)
GEMM_BLOCK(3)
GEMM_BLOCK(4)
GEMM_BLOCK(5)
GEMM_BLOCK(6)
#undef GEMM_BLOCK

/* Y[r0 .. r1 - 1, c0 .. c1 - 1], W [k, n]: blocks of 6 rows, the columns past the last multiple of 8 by the
   GEMV's scalar loop */
static void NAME(gemm_rows)(const gemv_args *p, int64_t rb, int64_t re, int64_t c0, int64_t c1) {
    const int64_t vec = c0 + (c1 - c0) / 8 * 8;
    for (int64_t r0 = rb; r0 < re; r0 += 6) {
        switch (re - r0 < 6 ? re - r0 : 6) {
        case 1: NAME(gemm_rows1)(p, r0, c0, vec); break;
        case 2: NAME(gemm_rows2)(p, r0, c0, vec); break;
        case 3: NAME(gemm_rows3)(p, r0, c0, vec); break;
        case 4: NAME(gemm_rows4)(p, r0, c0, vec); break;
        case 5: NAME(gemm_rows5)(p, r0, c0, vec); break;
        default: NAME(gemm_rows6)(p, r0, c0, vec); break;
        }
    }
    for (int64_t r = rb; r < re; r++)  /* the last columns: dot products down W's columns */
        for (int64_t c = vec; c < c1; c++) {
            const float *x = p->a + r * p->lda;
            float v = 0.0f;
            for (int64_t i = 0; i < p->k; i++) v += x[i] * p->w[i * p->n + c];
            if (p->bias) v += p->bias[c];
            if (p->residual) v += p->residual[r * p->ldr + c];
            if (p->accumulate) v += p->y[r * p->ldy + c];
            p->y[r * p->ldy + c] = gemv_act(v, (int)p->act, p->alpha, p->beta);
        }
}
#endif

/* one chunk of a job shared among the pool's threads (gemv_job: its kind says which) */
static void NAME(gemv_chunk)(const void *arg, int64_t c) {
    const gemv_job *j = (const gemv_job *)arg;
    const gemv_args *p = j->p;
    const int64_t n = p->n, k = p->k, chunks = j->chunks;
    if (j->kind == GEMV_COLUMNS_NK) {
        NAME(gemv_nk)(p, n * c / chunks, n * (c + 1) / chunks);
#ifdef GEMV_AVX2
    } else if (j->kind == GEMM_COLUMNS) {  /* whole blocks of 16 columns each, the last chunk the rest */
        const int64_t blocks = (n + 15) / 16, b0 = blocks * c / chunks, b1 = blocks * (c + 1) / chunks;
        NAME(gemm_rows)(p, 0, p->m, 16 * b0, 16 * b1 < n ? 16 * b1 : n);
#endif
    } else if (j->kind == GEMV_FINISH) {  /* the parts of a GEMV_ROWS_KN job added, the epilogue: by columns */
        NAME(gemv_finish)(p, n * c / chunks, n * (c + 1) / chunks, j->parts, j->count);
    } else {  /* rows of W: the first range sums into y, the others into parts, added at the end */
        const int64_t i0 = k * c / chunks, i1 = k * (c + 1) / chunks;
        if (c == 0) NAME(gemv_kn)(p, i0, i1, 0, n, p->y, p->ldy);
        else NAME(gemv_kn)(p, i0, i1, 0, n, j->parts + (c - 1) * p->m * n, n);
    }
}

static void NAME(gemv)(const gemv_args *p) {
    const int64_t n = p->n, k = p->k;
#ifdef GEMV_AVX2
    if (!p->trans && p->m >= 2 && p->m <= GEMM_ROWS_MAX) {  /* a few rows: register blocks (gemm_rows) */
        const int granted = p->threads > 1 && p->m * k * n >= GEMM_SHARED_WORK ? ctxrt_pool_begin(p->threads) : 0;
        if (granted >= 2) {
            const int64_t blocks = (n + 15) / 16, most = blocks < GEMV_CHUNKS_MAX ? blocks : GEMV_CHUNKS_MAX;
            int64_t chunks = p->m * k * n / (GEMM_SHARED_WORK / 2);
            if (chunks < granted) chunks = granted;
            if (chunks > most) chunks = most;
            gemv_job j = {p, chunks, chunks, 0, GEMM_COLUMNS};
            if (chunks >= 2) ctxrt_pool_run(NAME(gemv_chunk), &j, chunks);
            else NAME(gemm_rows)(p, 0, p->m, 0, n);
            ctxrt_pool_end();
        } else {
            NAME(gemm_rows)(p, 0, p->m, 0, n);
        }
        return;
    }
#endif
    const int granted = p->threads > 1 ? ctxrt_pool_begin(p->threads) : 0;
    if (granted >= 2) {
        gemv_job j = {p, 0, 0, 0, GEMV_COLUMNS_NK};
        int64_t chunks = k * n * 4 / GEMV_CHUNK_BYTES, most;
        if (p->trans) {
            most = n / 16;
        } else {
            const int64_t parts = 1 + GEMV_PARTS_BYTES / (p->m * n * (int64_t)sizeof(float));
            j.kind = GEMV_ROWS_KN, most = k / 8 < GEMV_PARTS_MAX ? k / 8 : GEMV_PARTS_MAX;
            if (most > parts) most = parts;
        }
        if (chunks > most) chunks = most;
        if (chunks > GEMV_CHUNKS_MAX) chunks = GEMV_CHUNKS_MAX;
        if (chunks < granted) chunks = granted <= most ? granted : most;
        if (j.kind == GEMV_ROWS_KN && chunks > 1) {
            j.parts = (float *)ctxrt_pool_scratch((size_t)(chunks - 1) * p->m * n * sizeof(float));
            if (!j.parts) chunks = 1;
        }
        if (chunks >= 2) {
            j.chunks = j.count = chunks;
            ctxrt_pool_run(NAME(gemv_chunk), &j, chunks);
            if (j.kind == GEMV_ROWS_KN && (p->act > 1 ? 8 * n : p->m * n * chunks) >= GEMV_FINISH_SHARED) {
                j.kind = GEMV_FINISH, j.chunks = granted;  /* GELU's erf, or many parts to add: shared too */
                ctxrt_pool_run(NAME(gemv_chunk), &j, granted);
            } else if (j.kind == GEMV_ROWS_KN) {
                NAME(gemv_finish)(p, 0, n, j.parts, chunks);
            }
            ctxrt_pool_end();
            return;
        }
        ctxrt_pool_end();
    }
    if (p->trans) {
        NAME(gemv_nk)(p, 0, n);
    } else {
        NAME(gemv_kn)(p, 0, k, 0, n, p->y, p->ldy);
        NAME(gemv_finish)(p, 0, n, 0, 1);
    }
}
