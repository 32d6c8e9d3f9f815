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
    float mx = -INFINITY;
    for (int64_t c = beg; c < end; c++) {
        float x = NAME(dot)(qi, keys + c * h, h) * p->scale;
        if (p->softcap > 0.0f) x = tanhf(x * (1.0f / p->softcap)) * p->softcap;
        scores[c] = x;
        mx = x > mx ? x : mx;
    }
    float den = 0.0f;
    for (int64_t c = beg; c < end; c++) {
        scores[c] = expf(scores[c] - mx);
        den += scores[c];
    }
    if (p->sink) den += expf((p->sinks ? p->sinks[i] : 0.0f) - mx);
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
