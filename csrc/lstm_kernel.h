/* One direction of an ONNX LSTM with the default activations (sigmoid, tanh, tanh), no clip, no input_forget, for
   a few batch rows (csrc/genai.c includes it once per instruction set): per step the recurrent GEMV R h, eight rows
   of R at a time sharing the loads of h, then the gates in one pass, it = s(i + Pi c), ft = s(f + Pf c),
   c = ft c + it tanh(g), ot = s(o + Po c), h = ot tanh(c); tanh(x) = 2 s(2x) - 1, s(x) = 1 / (1 + e^-x).
   The AVX-512 copy (LSTM_AVX512) runs the gates and the one-row GEMV 16 lanes at a time: a step of hidden 128 on
   one AVX-512 core 3.07 -> 2.84 us (the GEMV streams R's 256 KiB from L2: ~2.4 us of it). */

#ifdef GQA_AVX2
/* 1 / (1 + e^-x), e^-x by Cephes' expf with its argument held to [-87, 88] (sigmoid(-88) ~ 6e-39 for 0) */
static inline __m256 NAME(sigmoid8)(__m256 x) {
    const __m256 one = _mm256_set1_ps(1.0f);
    const __m256 t = _mm256_min_ps(_mm256_set1_ps(88.0f), _mm256_sub_ps(_mm256_setzero_ps(), x));  /* NaN kept */
    return _mm256_div_ps(one, _mm256_add_ps(one, NAME(exp8)(t)));
}

static inline __m256 NAME(tanh8)(__m256 x) {
    const __m256 one = _mm256_set1_ps(1.0f), two = _mm256_set1_ps(2.0f);
    return _mm256_sub_ps(_mm256_mul_ps(two, NAME(sigmoid8)(_mm256_mul_ps(two, x))), one);
}
#endif

#ifdef LSTM_AVX512
/* 16 lanes of exp8 (csrc/vmath.h): Cephes' expf, x held to [-87, 88] by the callers below */
static inline __m512 NAME(exp16)(__m512 x) {
    x = _mm512_max_ps(_mm512_set1_ps(-87.0f), x);
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    x = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    x = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), x);
    __m512 y = _mm512_set1_ps(1.9875691500e-4f);
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.3981999507e-3f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(8.3334519073e-3f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(4.1665795894e-2f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.6666665459e-1f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(5.0000001201e-1f));
    y = _mm512_fmadd_ps(y, _mm512_mul_ps(x, x), _mm512_add_ps(x, _mm512_set1_ps(1.0f)));
    const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(y, _mm512_castsi512_ps(e));
}

static inline __m512 NAME(sigmoid16)(__m512 x) {
    const __m512 one = _mm512_set1_ps(1.0f);
    const __m512 t = _mm512_min_ps(_mm512_set1_ps(88.0f), _mm512_sub_ps(_mm512_setzero_ps(), x));
    return _mm512_div_ps(one, _mm512_add_ps(one, NAME(exp16)(t)));
}

static inline __m512 NAME(tanh16)(__m512 x) {
    const __m512 one = _mm512_set1_ps(1.0f), two = _mm512_set1_ps(2.0f);
    return _mm512_sub_ps(_mm512_mul_ps(two, NAME(sigmoid16)(_mm512_mul_ps(two, x))), one);
}
#endif

static inline float NAME(sigmoid1)(float x) { return 1.0f / (1.0f + expf(-x)); }

/* g[j] += R[j] . h for the `rows` rows of R (an LSTM's 4 * hidden, a GRU's 3 * hidden) */
static void NAME(lstm_recur)(const float *r, const float *h, int64_t hidden, int64_t rows, float *g) {
    int64_t j = 0;
#ifdef LSTM_AVX512  /* the same, 16 lanes of h a load; each row's two halves added before the sums */
    if (hidden % 16 == 0) {
        for (; j + 8 <= rows; j += 8) {
            const float *r0 = r + j * hidden;
            __m512 s[8];
            for (int i = 0; i < 8; i++) s[i] = _mm512_setzero_ps();
            for (int64_t k = 0; k < hidden; k += 16) {
                const __m512 hv = _mm512_loadu_ps(h + k);
                for (int i = 0; i < 8; i++) s[i] = _mm512_fmadd_ps(hv, _mm512_loadu_ps(r0 + i * hidden + k), s[i]);
            }
            __m256 q[8];
            for (int i = 0; i < 8; i++)
                q[i] = _mm256_add_ps(_mm512_castps512_ps256(s[i]), _mm512_extractf32x8_ps(s[i], 1));
            _mm256_storeu_ps(g + j, _mm256_add_ps(_mm256_loadu_ps(g + j), NAME(hsum8x8_ps)(q)));
        }
    }
#endif
#ifdef GQA_AVX2
    if (hidden % 8 == 0) {  /* eight rows at a time sharing the loads of h, their sums in one vector */
        for (; j + 8 <= rows; j += 8) {
            const float *r0 = r + j * hidden;
            __m256 s[8];
            for (int i = 0; i < 8; i++) s[i] = _mm256_setzero_ps();
            for (int64_t k = 0; k < hidden; k += 8) {
                const __m256 hv = _mm256_loadu_ps(h + k);
                for (int i = 0; i < 8; i++) s[i] = _mm256_fmadd_ps(hv, _mm256_loadu_ps(r0 + i * hidden + k), s[i]);
            }
            _mm256_storeu_ps(g + j, _mm256_add_ps(_mm256_loadu_ps(g + j), NAME(hsum8x8_ps)(s)));
        }
    }
#endif
    for (; j < rows; j++) {
        const float *rj = r + j * hidden;
        float s = 0.0f;
        for (int64_t k = 0; k < hidden; k++) s += rj[k] * h[k];
        g[j] += s;
    }
}

#ifdef GQA_AVX2
/* g0[j] += R[j] . h0 and g1[j] += R[j] . h1 (two batch rows): four rows of R at a time, each load of R serving
   both rows, the eight sums in one vector; R is read once for the two rows (hidden a multiple of 8) */
static void NAME(lstm_recur2)(const float *r, const float *h0, const float *h1, int64_t hidden, float *g0,
                              float *g1) {
    const int64_t rows = 4 * hidden;
    for (int64_t j = 0; j < rows; j += 4) {
        const float *r0 = r + j * hidden;
        __m256 s[8];
        for (int i = 0; i < 8; i++) s[i] = _mm256_setzero_ps();
        for (int64_t k = 0; k < hidden; k += 8) {
            const __m256 a = _mm256_loadu_ps(h0 + k), b = _mm256_loadu_ps(h1 + k);
            for (int i = 0; i < 4; i++) {
                const __m256 w = _mm256_loadu_ps(r0 + i * hidden + k);
                s[i] = _mm256_fmadd_ps(a, w, s[i]);
                s[4 + i] = _mm256_fmadd_ps(b, w, s[4 + i]);
            }
        }
        const __m256 t = NAME(hsum8x8_ps)(s);  /* [h0 . R[j..j+3], h1 . R[j..j+3]] */
        _mm_storeu_ps(g0 + j, _mm_add_ps(_mm_loadu_ps(g0 + j), _mm256_castps256_ps128(t)));
        _mm_storeu_ps(g1 + j, _mm_add_ps(_mm_loadu_ps(g1 + j), _mm256_extractf128_ps(t, 1)));
    }
}

/* the same for four batch rows: two rows of R at a time, each load of R serving the four rows (R read once for
   four rows: a step of batch 8 streams R from L2 twice, not four or eight times) */
static void NAME(lstm_recur4)(const float *r, const float *const h[4], int64_t hidden, float *const g[4]) {
    const int64_t rows = 4 * hidden;
    for (int64_t j = 0; j < rows; j += 2) {
        const float *r0 = r + j * hidden, *r1 = r0 + hidden;
        __m256 s[8];
        for (int i = 0; i < 8; i++) s[i] = _mm256_setzero_ps();
        for (int64_t k = 0; k < hidden; k += 8) {
            const __m256 w0 = _mm256_loadu_ps(r0 + k), w1 = _mm256_loadu_ps(r1 + k);
            for (int b = 0; b < 4; b++) {
                const __m256 x = _mm256_loadu_ps(h[b] + k);
                s[2 * b] = _mm256_fmadd_ps(x, w0, s[2 * b]);
                s[2 * b + 1] = _mm256_fmadd_ps(x, w1, s[2 * b + 1]);
            }
        }
        float t[8];
        _mm256_storeu_ps(t, NAME(hsum8x8_ps)(s));  /* [b0: R[j], R[j+1], b1: ..., b3: ...] */
        for (int b = 0; b < 4; b++) g[b][j] += t[2 * b], g[b][j + 1] += t[2 * b + 1];
    }
}
#endif

/* the gates of batch row b at step t: c and h updated in place (g holds the step's pre-activations), h copied to Y */
static void NAME(lstm_gates)(const lstm_args *p, int64_t b, int64_t t) {
    const int64_t H = p->hidden;
    float *g = p->work + b * 7 * H, *h = g + 4 * H, *c = h + H;
    const float *gi = g, *go = g + H, *gf = g + 2 * H, *gc = g + 3 * H;
    const float *pi = p->peep, *po = p->peep ? p->peep + H : 0, *pf = p->peep ? p->peep + 2 * H : 0;
    int64_t k = 0;
#ifdef LSTM_AVX512
    for (; k + 16 <= H; k += 16) {
        const __m512 cp = _mm512_loadu_ps(c + k);
        __m512 vi = _mm512_loadu_ps(gi + k), vf = _mm512_loadu_ps(gf + k), vo = _mm512_loadu_ps(go + k);
        if (pi) {
            vi = _mm512_fmadd_ps(_mm512_loadu_ps(pi + k), cp, vi);
            vf = _mm512_fmadd_ps(_mm512_loadu_ps(pf + k), cp, vf);
        }
        const __m512 cn = _mm512_add_ps(_mm512_mul_ps(NAME(sigmoid16)(vf), cp),
                                        _mm512_mul_ps(NAME(sigmoid16)(vi), NAME(tanh16)(_mm512_loadu_ps(gc + k))));
        if (po) vo = _mm512_fmadd_ps(_mm512_loadu_ps(po + k), cn, vo);
        _mm512_storeu_ps(c + k, cn);
        _mm512_storeu_ps(h + k, _mm512_mul_ps(NAME(sigmoid16)(vo), NAME(tanh16)(cn)));
    }
#endif
#ifdef GQA_AVX2
    for (; k + 8 <= H; k += 8) {
        const __m256 cp = _mm256_loadu_ps(c + k);
        __m256 vi = _mm256_loadu_ps(gi + k), vf = _mm256_loadu_ps(gf + k), vo = _mm256_loadu_ps(go + k);
        if (pi) {
            vi = _mm256_fmadd_ps(_mm256_loadu_ps(pi + k), cp, vi);
            vf = _mm256_fmadd_ps(_mm256_loadu_ps(pf + k), cp, vf);
        }
        const __m256 cn = _mm256_add_ps(_mm256_mul_ps(NAME(sigmoid8)(vf), cp),
                                        _mm256_mul_ps(NAME(sigmoid8)(vi), NAME(tanh8)(_mm256_loadu_ps(gc + k))));
        if (po) vo = _mm256_fmadd_ps(_mm256_loadu_ps(po + k), cn, vo);
        _mm256_storeu_ps(c + k, cn);
        _mm256_storeu_ps(h + k, _mm256_mul_ps(NAME(sigmoid8)(vo), NAME(tanh8)(cn)));
    }
#endif
    for (; k < H; k++) {
        const float cp = c[k];
        const float it = NAME(sigmoid1)(gi[k] + (pi ? pi[k] * cp : 0.0f));
        const float ft = NAME(sigmoid1)(gf[k] + (pf ? pf[k] * cp : 0.0f));
        const float cn = ft * cp + it * tanhf(gc[k]);
        const float ot = NAME(sigmoid1)(go[k] + (po ? po[k] * cn : 0.0f));
        c[k] = cn;
        h[k] = ot * tanhf(cn);
    }
    if (p->y) memcpy(p->y + t * p->y_t + b * p->y_b, h, (size_t)H * sizeof(float));
}

static void NAME(lstm)(const lstm_args *p) {
    const int64_t H = p->hidden, N = p->batch;
    for (int64_t b = 0; b < N; b++) {
        float *g = p->work + b * 7 * H, *h = g + 4 * H, *c = h + H;
        for (int64_t k = 0; k < H; k++) {
            h[k] = p->h0 ? p->h0[b * p->s0_b + k] : 0.0f;
            c[k] = p->c0 ? p->c0[b * p->s0_b + k] : 0.0f;
        }
    }
    for (int64_t s = 0; s < p->steps; s++) {
        const int64_t t = p->reverse ? p->steps - 1 - s : s;
        for (int64_t b = 0; b < N;) {  /* rows b .. b + took - 1: the step's input projection, R h (each row's own
                                          h, before its gates), then their gates */
            int64_t took = 1;
#ifdef GQA_AVX2
            if (H % 8 == 0 && b + 2 <= N) took = b + 4 <= N ? 4 : 2;
#endif
            float *g[4];
            const float *h[4];
            for (int64_t i = 0; i < took; i++) {
                g[i] = p->work + (b + i) * 7 * H, h[i] = g[i] + 4 * H;
                memcpy(g[i], p->xp + t * p->xp_t + (b + i) * p->xp_b, (size_t)(4 * H) * sizeof(float));
            }
#ifdef GQA_AVX2
            if (took == 4) NAME(lstm_recur4)(p->r, h, H, g);
            else if (took == 2) NAME(lstm_recur2)(p->r, h[0], h[1], H, g[0], g[1]);
            else
#endif
                NAME(lstm_recur)(p->r, h[0], H, 4 * H, g[0]);
            for (int64_t i = 0; i < took; i++) NAME(lstm_gates)(p, b + i, t);
            b += took;
        }
    }
    for (int64_t b = 0; b < N; b++) {
        const float *h = p->work + b * 7 * H + 4 * H, *c = h + H;
        if (p->yh) memcpy(p->yh + b * p->s_b, h, (size_t)H * sizeof(float));
        if (p->yc) memcpy(p->yc + b * p->s_b, c, (size_t)H * sizeof(float));
    }
}

/* GRU, linear_before_reset = 1, batch row b at step t: a holds R h (z r h rows), h is updated in place:
   z = s(xz + az), r = s(xr + ar), n = tanh(xh + r (ah + Rbh)), h = n + z (h - n); h copied to Y */
static void NAME(gru_gates)(const gru_args *p, const float *x, float *a, float *h, int64_t b, int64_t t) {
    const int64_t H = p->hidden;
    const float *xz = x, *xr = x + H, *xh = x + 2 * H, *az = a, *ar = a + H, *ah = a + 2 * H, *rb = p->rbh;
    int64_t k = 0;
#ifdef LSTM_AVX512
    for (; k + 16 <= H; k += 16) {
        const __m512 z = NAME(sigmoid16)(_mm512_add_ps(_mm512_loadu_ps(xz + k), _mm512_loadu_ps(az + k)));
        const __m512 r = NAME(sigmoid16)(_mm512_add_ps(_mm512_loadu_ps(xr + k), _mm512_loadu_ps(ar + k)));
        __m512 hr = _mm512_loadu_ps(ah + k);
        if (rb) hr = _mm512_add_ps(hr, _mm512_loadu_ps(rb + k));
        const __m512 n = NAME(tanh16)(_mm512_fmadd_ps(r, hr, _mm512_loadu_ps(xh + k)));
        _mm512_storeu_ps(h + k, _mm512_fmadd_ps(z, _mm512_sub_ps(_mm512_loadu_ps(h + k), n), n));
    }
#endif
#ifdef GQA_AVX2
    for (; k + 8 <= H; k += 8) {
        const __m256 z = NAME(sigmoid8)(_mm256_add_ps(_mm256_loadu_ps(xz + k), _mm256_loadu_ps(az + k)));
        const __m256 r = NAME(sigmoid8)(_mm256_add_ps(_mm256_loadu_ps(xr + k), _mm256_loadu_ps(ar + k)));
        __m256 hr = _mm256_loadu_ps(ah + k);
        if (rb) hr = _mm256_add_ps(hr, _mm256_loadu_ps(rb + k));
        const __m256 n = NAME(tanh8)(_mm256_fmadd_ps(r, hr, _mm256_loadu_ps(xh + k)));
        _mm256_storeu_ps(h + k, _mm256_fmadd_ps(z, _mm256_sub_ps(_mm256_loadu_ps(h + k), n), n));
    }
#endif
    for (; k < H; k++) {
        const float z = NAME(sigmoid1)(xz[k] + az[k]), r = NAME(sigmoid1)(xr[k] + ar[k]);
        const float n = tanhf(xh[k] + r * (ah[k] + (rb ? rb[k] : 0.0f)));
        h[k] = n + z * (h[k] - n);
    }
    if (p->y) memcpy(p->y + t * p->y_t + b * p->y_b, h, (size_t)H * sizeof(float));
}

static void NAME(gru)(const gru_args *p) {
    const int64_t H = p->hidden, N = p->batch;
    for (int64_t b = 0; b < N; b++) {
        float *h = p->work + b * 4 * H + 3 * H;
        for (int64_t k = 0; k < H; k++) h[k] = p->h0 ? p->h0[b * p->s0_b + k] : 0.0f;
    }
    for (int64_t s = 0; s < p->steps; s++) {
        const int64_t t = p->reverse ? p->steps - 1 - s : s;
        for (int64_t b = 0; b < N; b++) {  /* each row: R h (before its gates), then the gates */
            float *a = p->work + b * 4 * H, *h = a + 3 * H;
            memset(a, 0, (size_t)(3 * H) * sizeof(float));
            NAME(lstm_recur)(p->r, h, H, 3 * H, a);
            NAME(gru_gates)(p, p->xp + t * p->xp_t + b * p->xp_b, a, h, b, t);
        }
    }
    if (p->yh)
        for (int64_t b = 0; b < N; b++) memcpy(p->yh + b * p->s_b, p->work + b * 4 * H + 3 * H, (size_t)H * sizeof(float));
}
