/* The kernel of csrc/genai.c, included there once per instruction set (NAME(x): this copy's names). */

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
