/* The kernel of csrc/gemv.c, included there once per instruction set (NAME(x): this copy's names; GEMV_AVX2
   defined in the AVX2+FMA copy). Each thread streams one contiguous range of W: memory-bound loops are fastest
   when the hardware prefetcher sees one long stream. */

#ifdef GEMV_AVX2
#include "hsum.h"
#endif

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
                p->y[r * p->ldy + c] = p->act ? gemv_act(x, (int)p->act) : x;
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
            p->y[r * p->ldy + c] = p->act ? gemv_act(v, (int)p->act) : v;
        }
    }
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
        if (act == 1) {
#pragma omp simd
            for (int64_t j = c0; j < c1; j++) y[j] = y[j] > 0.0f ? y[j] : 0.0f;
        } else if (act) {
            for (int64_t j = c0; j < c1; j++) y[j] = gemv_act(y[j], act);
        }
    }
}

/* one chunk of a job shared among the pool's threads (gemv_job: its kind says which) */
static void NAME(gemv_chunk)(const void *arg, int64_t c) {
    const gemv_job *j = (const gemv_job *)arg;
    const gemv_args *p = j->p;
    const int64_t n = p->n, k = p->k, chunks = j->chunks;
    if (j->kind == GEMV_COLUMNS_NK) {
        NAME(gemv_nk)(p, n * c / chunks, n * (c + 1) / chunks);
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
