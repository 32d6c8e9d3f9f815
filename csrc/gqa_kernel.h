/* The kernel of csrc/genai.c, included there once per instruction set (NAME(x): this copy's names; the AVX2 copy
   is compiled under #pragma GCC target, its loops vectorized by `omp simd`). */

static void NAME(rotate)(const float *x, float *y, const float *c, const float *s, int64_t half, int64_t h,
                         int64_t interleaved) {
    int64_t span = 2 * half;
    if (interleaved) {
        for (int64_t i = 0; i < half; i++) {
            float a = x[2 * i], b = x[2 * i + 1];
            y[2 * i] = a * c[i] - b * s[i];
            y[2 * i + 1] = a * s[i] + b * c[i];
        }
    } else {
#pragma omp simd
        for (int64_t i = 0; i < half; i++) {
            float a = x[i], b = x[half + i];
            y[i] = a * c[i] - b * s[i];
            y[half + i] = a * s[i] + b * c[i];
        }
    }
    for (int64_t i = span; i < h; i++) y[i] = x[i];
}

static inline float NAME(dot)(const float *a, const float *b, int64_t h) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < h; i++) s += a[i] * b[i];
    return s;
}

#ifdef GQA_AVX2
#include "hsum.h"

#include "vmath.h"

/* scores[c] = (q . keys[c]) * scale for c in beg .. end - 1, four keys at a time sharing q's loads (h a multiple
   of 8); returns their largest */
static float NAME(scores4)(const float *q, const float *keys, int64_t h, int64_t beg, int64_t end, float scale,
                           float *scores) {
    float mx = -INFINITY;
    int64_t c = beg;
    for (; c + 4 <= end; c += 4) {
        const float *k0 = keys + c * h, *k1 = k0 + h, *k2 = k1 + h, *k3 = k2 + h;
        __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
        for (int64_t d = 0; d < h; d += 8) {
            const __m256 qv = _mm256_loadu_ps(q + d);
            s0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + d), s0);
            s1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k1 + d), s1);
            s2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k2 + d), s2);
            s3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k3 + d), s3);
        }
        const float x0 = NAME(hsum8)(s0) * scale, x1 = NAME(hsum8)(s1) * scale, x2 = NAME(hsum8)(s2) * scale,
                    x3 = NAME(hsum8)(s3) * scale;
        scores[c] = x0, scores[c + 1] = x1, scores[c + 2] = x2, scores[c + 3] = x3;
        mx = x0 > mx ? x0 : mx, mx = x1 > mx ? x1 : mx, mx = x2 > mx ? x2 : mx, mx = x3 > mx ? x3 : mx;
    }
    for (; c < end; c++) {
        const float x = NAME(dot)(q, keys + c * h, h) * scale;
        scores[c] = x;
        mx = x > mx ? x : mx;
    }
    return mx;
}

/* scores[c] = e^(scores[c] - mx) for c in beg .. end - 1; returns their sum */
static float NAME(exp_scores)(float *scores, int64_t beg, int64_t end, float mx) {
    const __m256 m = _mm256_set1_ps(mx);
    __m256 sum = _mm256_setzero_ps();
    int64_t c = beg;
    for (; c + 8 <= end; c += 8) {
        const __m256 e = NAME(exp8)(_mm256_sub_ps(_mm256_loadu_ps(scores + c), m));
        _mm256_storeu_ps(scores + c, e);
        sum = _mm256_add_ps(sum, e);
    }
    float den = NAME(hsum8)(sum);
    for (; c < end; c++) {
        scores[c] = expf(scores[c] - mx);
        den += scores[c];
    }
    return den;
}
#endif

/* output row r of head i: softmax(q K^T * scale) V over the columns the row sees */
static void NAME(attend)(const gqa_args *p, int64_t i, int64_t r, float *scores, float *q) {
    int64_t h = p->h, g = p->n / p->kv, j = i / g;
    const float *qi = p->q + r * p->q_stride + i * h;
    float *o = p->out + r * p->out_stride + i * h;
    if (p->half) {
        const int64_t pos = p->start + r;
        NAME(rotate)(qi, q, p->cos + pos * p->half, p->sin + pos * p->half, p->half, h, p->interleaved);
        qi = q;
    }
    int64_t end = p->start + r + 1, beg = 0;
    if (p->window > 0) beg = end - p->window > 0 ? end - p->window : 0;
    if (end > p->total) end = p->total;
    for (int64_t d = 0; d < h; d++) o[d] = 0.0f;
    if (beg >= end) return;  /* a padding row past its window sees no key: zeros */
    const float *keys = p->present_k + j * p->rows * h, *values = p->present_v + j * p->rows * h;
    float mx = -INFINITY, den = 0.0f;
#ifdef GQA_AVX2
    if (p->softcap <= 0.0f && h % 8 == 0) {
        mx = NAME(scores4)(qi, keys, h, beg, end, p->scale, scores);
        den = mx == -INFINITY || mx != mx ? NAN : NAME(exp_scores)(scores, beg, end, mx);
    } else
#endif
    {
        for (int64_t c = beg; c < end; c++) {
            float x = NAME(dot)(qi, keys + c * h, h) * p->scale;
            if (p->softcap > 0.0f) x = tanhf(x * (1.0f / p->softcap)) * p->softcap;
            scores[c] = x;
            mx = x > mx ? x : mx;
        }
        for (int64_t c = beg; c < end; c++) {
            scores[c] = expf(scores[c] - mx);
            den += scores[c];
        }
    }
    if (p->sink) den += expf((p->sinks ? p->sinks[i] : 0.0f) - mx);
#ifdef GQA_AVX2
    if (h % 64 == 0) {  /* 64 columns of the output in eight registers over every key, not loaded and stored a key */
        for (int64_t d0 = 0; d0 < h; d0 += 64) {
            __m256 a[8];
            for (int t = 0; t < 8; t++) a[t] = _mm256_setzero_ps();
            for (int64_t c = beg; c < end; c++) {
                const __m256 w = _mm256_set1_ps(scores[c] / den);
                const float *v = values + c * h + d0;
                for (int t = 0; t < 8; t++) a[t] = _mm256_fmadd_ps(w, _mm256_loadu_ps(v + 8 * t), a[t]);
            }
            for (int t = 0; t < 8; t++) _mm256_storeu_ps(o + d0 + 8 * t, a[t]);
        }
        return;
    }
#endif
    for (int64_t c = beg; c < end; c++) {
        const float w = scores[c] / den, *v = values + c * h;
#pragma omp simd
        for (int64_t d = 0; d < h; d++) o[d] += w * v[d];
    }
}

/* tasks (head, row) of chunk c, with chunk c's work (a row of scores and a rotated query) */
static void NAME(gqa_chunk)(const void *arg, int64_t c) {
    const gqa_job *j = (const gqa_job *)arg;
    const gqa_args *p = j->p;
    float *scores = p->work + c * (p->rows + p->h), *q = scores + p->rows;
    for (int64_t task = j->tasks * c / j->chunks; task < j->tasks * (c + 1) / j->chunks; task++)
        NAME(attend)(p, task % p->n, task / p->n, scores, q);
}

static void NAME(gqa)(const gqa_args *p) {
    int64_t h = p->h;
    for (int64_t r = 0; r < p->s; r++) {  /* the new keys (rotated) and values into the present buffers */
        const int64_t pos = p->start + r;
        for (int64_t j = 0; j < p->kv; j++) {
            const float *k = p->k_new + r * p->kv_stride + j * h, *v = p->v_new + r * p->kv_stride + j * h;
            float *kd = p->present_k + (j * p->rows + pos) * h, *vd = p->present_v + (j * p->rows + pos) * h;
            if (p->half) {
                NAME(rotate)(k, kd, p->cos + pos * p->half, p->sin + pos * p->half, p->half, h, p->interleaved);
            } else {
                memcpy(kd, k, (size_t)h * sizeof(float));
            }
            memcpy(vd, v, (size_t)h * sizeof(float));
        }
    }
    gqa_job j = {p, p->n * p->s, 1};
    const int shared = j.tasks > 1 && j.tasks * p->total * p->h >= GQA_SHARED_WORK;
    const int granted = p->threads > 1 && shared ? ctxrt_pool_begin(p->threads) : 0;
    if (granted >= 2) {  /* heads shared among the pool's threads (csrc/pool.c), in at most MAX_THREADS chunks */
        j.chunks = j.tasks < GQA_CHUNKS_MAX ? j.tasks : GQA_CHUNKS_MAX;
        ctxrt_pool_run(NAME(gqa_chunk), &j, j.chunks);
        ctxrt_pool_end();
        return;
    }
    NAME(gqa_chunk)(&j, 0);
}
