/* The kernel of csrc/nbits.c, included there once per instruction set: NAME(x) names this copy's functions.
   With NBITS_AVX2 defined the copy is compiled for AVX2 and FMA (#pragma GCC target around the #include) and
   its dot products use them for blocks of 32 values or more; the other copy is portable C. Everything a call
   runs is in one copy: no code of another instruction set runs between its AVX2 instructions. */

#ifdef NBITS_AVX2
/* 8 floats: the evens of x and y, then ... (x0 x2 x4 x6 y0 y2 y4 y6), or their odds */
#define NBITS_EVENS(x, y) _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(x, y, 0x88)), 0xD8))
#define NBITS_ODDS(x, y) _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(x, y, 0xDD)), 0xD8))

/* one whole block of A quantized to int8 as prepare_row does (scale max|a| / 127, round half to even: the
   default rounding of cvtps), 32 values at a time reordered evens first, then odds */
static inline void NAME(quantize_block)(const float *src, int64_t block, int8_t *dst, float *scale, float *qsum) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 m = _mm256_setzero_ps();
    for (int64_t j = 0; j < block; j += 8) m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(src + j)));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float amax = _mm_cvtss_f32(m4);
    const __m256 iv = _mm256_set1_ps(amax != 0.0f ? 127.0f / amax : 0.0f);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    __m256i total = _mm256_setzero_si256();
    for (int64_t j0 = 0; j0 < block; j0 += 32) {
        const float *x = src + j0;
        __m256 x0 = _mm256_loadu_ps(x), x1 = _mm256_loadu_ps(x + 8), x2 = _mm256_loadu_ps(x + 16),
               x3 = _mm256_loadu_ps(x + 24);
        __m256i e0 = _mm256_cvtps_epi32(_mm256_mul_ps(NBITS_EVENS(x0, x1), iv));
        __m256i e1 = _mm256_cvtps_epi32(_mm256_mul_ps(NBITS_EVENS(x2, x3), iv));
        __m256i o0 = _mm256_cvtps_epi32(_mm256_mul_ps(NBITS_ODDS(x0, x1), iv));
        __m256i o1 = _mm256_cvtps_epi32(_mm256_mul_ps(NBITS_ODDS(x2, x3), iv));
        total = _mm256_add_epi32(total, _mm256_add_epi32(_mm256_add_epi32(e0, e1), _mm256_add_epi32(o0, o1)));
        __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(e0, e1), _mm256_packs_epi32(o0, o1));
        _mm256_storeu_si256((__m256i *)(dst + j0), _mm256_permutevar8x32_epi32(bytes, order));
    }
    __m128i t = _mm_add_epi32(_mm256_castsi256_si128(total), _mm256_extracti128_si256(total, 1));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4E));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xB1));
    *scale = amax / 127.0f;
    *qsum = (float)_mm_cvtsi128_si32(t);
}
#undef NBITS_EVENS
#undef NBITS_ODDS
#endif

static void NAME(prepare_row)(const nbits_args *p, int64_t r) {
    int64_t k = p->k, block = p->block, kb = blocks_of(k, block), g = group_of(block), h = g / 2;
    const float *a = p->a + r * k;
    row_work w = row_of(p, r);
    float pad[32];
    for (int64_t b = 0; b < kb; b++) {
        int64_t k0 = b * block, valid = k - k0 < block ? k - k0 : block;
        if (!p->int8) {
            float s = 0.0f;
            for (int64_t j0 = 0; j0 < block; j0 += g) {
                const float *src = a + k0 + j0;
                if (valid - j0 < g) {  /* past K: zeros */
                    for (int64_t i = 0; i < g; i++) pad[i] = i < valid - j0 ? src[i] : 0.0f;
                    src = pad;
                }
                float *dst = w.af + k0 + j0;
                for (int64_t i = 0; i < h; i++) {
                    dst[i] = src[2 * i];
                    dst[h + i] = src[2 * i + 1];
                    s += src[2 * i] + src[2 * i + 1];
                }
            }
            w.asum[b] = s;
        } else {
#ifdef NBITS_AVX2
            if (g == 32 && valid == block) {
                NAME(quantize_block)(a + k0, block, w.aq + k0, &w.ascale[b], &w.qsum[b]);
                continue;
            }
#endif
            float amax = 0.0f;
            for (int64_t j = 0; j < valid; j++) {
                float v = fabsf(a[k0 + j]);
                amax = v > amax ? v : amax;
            }
            float inv = amax != 0.0f ? 127.0f / amax : 0.0f;
            int32_t s = 0;
            for (int64_t j0 = 0; j0 < block; j0 += g) {
                const float *src = a + k0 + j0;
                if (valid - j0 < g) {
                    for (int64_t i = 0; i < g; i++) pad[i] = i < valid - j0 ? src[i] : 0.0f;
                    src = pad;
                }
                int8_t *dst = w.aq + k0 + j0;
                for (int64_t i = 0; i < g; i++) {
                    /* round half to even (the default rounding mode); |a * inv| <= 127 */
                    int32_t q = (int32_t)nearbyintf(src[i] * inv);
                    dst[i % 2 ? h + i / 2 : i / 2] = (int8_t)q;
                    s += q;
                }
            }
            w.ascale[b] = amax / 127.0f;
            w.qsum[b] = (float)s;
        }
    }
}

/* blocks b0 .. b1 - 1 of one output value, in plain C */
static float NAME(dot_blocks)(const nbits_args *p, const row_work *w, int64_t col, int64_t b0, int64_t b1) {
    int64_t block = p->block, kb = blocks_of(p->k, block), g = group_of(block), half = block / 2;
    const uint8_t *bq = p->b + col * kb * half;
    const float *sc = p->scales + col * kb;
    float acc = 0.0f;
    for (int64_t b = b0; b < b1; b++) {
        const uint8_t *src = bq + b * half;
        float z = zero_point(p, col, b, kb);
        if (!p->int8) {
            const float *av = w->af + b * block;
            float s = 0.0f;
            for (int64_t j0 = 0; j0 < block; j0 += g) {
                const uint8_t *bytes = src + j0 / 2;
                for (int64_t i = 0; i < g / 2; i++) {
                    s += (float)(bytes[i] & 15) * av[j0 + i] + (float)(bytes[i] >> 4) * av[j0 + g / 2 + i];
                }
            }
            acc += sc[b] * (s - z * w->asum[b]);
        } else {
            const int8_t *av = w->aq + b * block;
            int32_t s = 0;
            for (int64_t j0 = 0; j0 < block; j0 += g) {
                const uint8_t *bytes = src + j0 / 2;
                for (int64_t i = 0; i < g / 2; i++) {
                    s += (int32_t)(bytes[i] & 15) * av[j0 + i] + (int32_t)(bytes[i] >> 4) * av[j0 + g / 2 + i];
                }
            }
            acc += (w->ascale[b] * sc[b]) * ((float)s - z * w->qsum[b]);
        }
    }
    return acc;
}

#ifdef NBITS_AVX2
#include "hsum.h"

/* 32 4-bit values from 16 bytes: the low halves in the low 128 bits, the high halves in the high 128 bits */
static inline __m256i NAME(nibbles32)(const uint8_t *src) {
    __m128i bytes = _mm_loadu_si128((const __m128i *)src);
    __m256i both = _mm256_set_m128i(_mm_srli_epi16(bytes, 4), bytes);
    return _mm256_and_si256(both, _mm256_set1_epi8(15));
}

/* [sum(v[0]), ..., sum(v[7])]: the 8 lanes of each of 8 vectors added up */
static inline __m256i NAME(hsum8x8_epi32)(const __m256i *v) {
    __m256i t0 = _mm256_hadd_epi32(v[0], v[1]), t1 = _mm256_hadd_epi32(v[2], v[3]);
    __m256i t2 = _mm256_hadd_epi32(v[4], v[5]), t3 = _mm256_hadd_epi32(v[6], v[7]);
    __m256i u0 = _mm256_hadd_epi32(t0, t1), u1 = _mm256_hadd_epi32(t2, t3);
    return _mm256_add_epi32(_mm256_permute2x128_si256(u0, u1, 0x20), _mm256_permute2x128_si256(u0, u1, 0x31));
}


/* the zero points of blocks b .. b + 7 of a column (b even): packed ones are the 4 bytes at b / 2 of the
   column's ceil(kb / 2), their nibbles low half first, widened in one shift each */
static inline __m256 NAME(zero_points8)(const nbits_args *p, int64_t col, int64_t b, int64_t kb) {
    if (p->zpf) return _mm256_loadu_ps(p->zpf + col * kb + b);
    if (!p->zp) return _mm256_set1_ps(8.0f);
    int32_t word;
    memcpy(&word, p->zp + col * ((kb + 1) / 2) + b / 2, 4);
    const __m256i shifts = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
    return _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(word), shifts),
                                               _mm256_set1_epi32(15)));
}

/* the float32 sum of 32 values of A (reordered) times 32 4-bit values (16 bytes of B), added to t */
static inline __m256 NAME(fma32)(const uint8_t *src, const float *av, __m256 t) {
    __m128i bytes = _mm_loadu_si128((const __m128i *)src), low4 = _mm_set1_epi8(15);
    __m128i lo = _mm_and_si128(bytes, low4), hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), low4);
    t = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo)), _mm256_loadu_ps(av), t);
    t = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8))), _mm256_loadu_ps(av + 8), t);
    t = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi)), _mm256_loadu_ps(av + 16), t);
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8))), _mm256_loadu_ps(av + 24),
                           t);
}

/* eight blocks' int32 sums of `sub` 32-value steps each (sub a constant where inlined), as one vector */
static inline __m256i NAME(sums8_i8)(const uint8_t *bq, const int8_t *av, const int sub) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i s[8];
    for (int i = 0; i < 8; i++) {
        s[i] = _mm256_setzero_si256();
        for (int j = 0; j < sub; j++) {
            const int at = i * sub + j;
            __m256i prod = _mm256_maddubs_epi16(NAME(nibbles32)(bq + 16 * at),
                                                _mm256_loadu_si256((const __m256i *)(av + 32 * at)));
            s[i] = _mm256_add_epi32(s[i], _mm256_madd_epi16(prod, ones));
        }
    }
    return NAME(hsum8x8_epi32)(s);
}

/* one output value, int8 A, blocks of 32 * sub values: eight blocks a step, fully unrolled */
static inline float NAME(dot_i8_unrolled)(const nbits_args *p, const row_work *w, int64_t col, const int sub) {
    int64_t kb = blocks_of(p->k, p->block), b = 0;
    const uint8_t *bq = p->b + col * kb * 16 * sub;
    const int8_t *av = w->aq;
    const float *sc = p->scales + col * kb;
    __m256 acc = _mm256_setzero_ps();
    for (; b + 8 <= kb; b += 8, bq += 128 * sub, av += 256 * sub) {
        __m256 d = _mm256_cvtepi32_ps(NAME(sums8_i8)(bq, av, sub));
        d = _mm256_fnmadd_ps(NAME(zero_points8)(p, col, b, kb), _mm256_loadu_ps(w->qsum + b), d);
        acc = _mm256_fmadd_ps(d, _mm256_mul_ps(_mm256_loadu_ps(w->ascale + b), _mm256_loadu_ps(sc + b)), acc);
    }
    return NAME(hsum8)(acc) + NAME(dot_blocks)(p, w, col, b, kb);
}

/* eight blocks' float32 sums of `sub` 32-value steps each (sub a constant where inlined), as one vector */
static inline __m256 NAME(sums8_f32)(const uint8_t *bq, const float *av, const int sub) {
    __m256 s[8];
    for (int i = 0; i < 8; i++) {
        s[i] = _mm256_setzero_ps();
        for (int j = 0; j < sub; j++) s[i] = NAME(fma32)(bq + 16 * (i * sub + j), av + 32 * (i * sub + j), s[i]);
    }
    return NAME(hsum8x8_ps)(s);
}

/* one output value, float32 A, blocks of 32 * sub values: eight blocks a step */
static inline float NAME(dot_f32_unrolled)(const nbits_args *p, const row_work *w, int64_t col, const int sub) {
    int64_t kb = blocks_of(p->k, p->block), b = 0;
    const uint8_t *bq = p->b + col * kb * 16 * sub;
    const float *av = w->af;
    const float *sc = p->scales + col * kb;
    __m256 acc = _mm256_setzero_ps();
    for (; b + 8 <= kb; b += 8, bq += 128 * sub, av += 256 * sub) {
        __m256 d = _mm256_fnmadd_ps(NAME(zero_points8)(p, col, b, kb), _mm256_loadu_ps(w->asum + b),
                                    NAME(sums8_f32)(bq, av, sub));
        acc = _mm256_fmadd_ps(d, _mm256_loadu_ps(sc + b), acc);
    }
    return NAME(hsum8)(acc) + NAME(dot_blocks)(p, w, col, b, kb);
}

/* one output value: eight blocks at a time, each block's sum in its own vector, then the eight sums offset by
   their zero points and scaled together; the last kb % 8 blocks in plain C. Blocks of 32, 64 and 128 values
   get loops unrolled for their size. */
static float NAME(dot)(const nbits_args *p, const row_work *w, int64_t col) {
    const int64_t block = p->block;
    if (block % 32) return NAME(dot_blocks)(p, w, col, 0, blocks_of(p->k, block));
    if (p->int8) {
        if (block == 32) return NAME(dot_i8_unrolled)(p, w, col, 1);
        if (block == 64) return NAME(dot_i8_unrolled)(p, w, col, 2);
        if (block == 128) return NAME(dot_i8_unrolled)(p, w, col, 4);
        return NAME(dot_i8_unrolled)(p, w, col, (int)(block / 32));
    }
    if (block == 32) return NAME(dot_f32_unrolled)(p, w, col, 1);
    if (block == 64) return NAME(dot_f32_unrolled)(p, w, col, 2);
    if (block == 128) return NAME(dot_f32_unrolled)(p, w, col, 4);
    return NAME(dot_f32_unrolled)(p, w, col, (int)(block / 32));
}
#else
static float NAME(dot)(const nbits_args *p, const row_work *w, int64_t col) {
    return NAME(dot_blocks)(p, w, col, 0, blocks_of(p->k, p->block));
}
#endif

/* out[c - n0, :] = the dequantized values (q - zero_point) * scale of columns n0 .. n1 - 1, kb * block floats a
   column (values past K from the last block's padding), for a prompt's GEMM */
static void NAME(dequantize)(const nbits_args *p, int64_t n0, int64_t n1, float *out) {
    int64_t block = p->block, kb = blocks_of(p->k, block), half = block / 2, len = kb * block;
    for (int64_t c = n0; c < n1; c++) {  /* one thread: BLAS's run the GEMM between two tiles */
        const uint8_t *bq = p->b + c * kb * half;
        const float *sc = p->scales + c * kb;
        float *o = out + (c - n0) * len;
        for (int64_t b = 0; b < kb; b++, bq += half, o += block) {
            const float z = zero_point(p, c, b, kb), s = sc[b];
#ifdef NBITS_AVX2
            if (block % 32 == 0) {
                const __m256 zv = _mm256_set1_ps(z), sv = _mm256_set1_ps(s);
                const __m128i low4 = _mm_set1_epi8(15);
                for (int64_t j = 0; j < half; j += 16) {
                    __m128i bytes = _mm_loadu_si128((const __m128i *)(bq + j));
                    __m128i lo = _mm_and_si128(bytes, low4), hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), low4);
                    __m128i v[2] = {_mm_unpacklo_epi8(lo, hi), _mm_unpackhi_epi8(lo, hi)};
                    for (int h = 0; h < 2; h++) {
                        __m256 f0 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v[h]));
                        __m256 f1 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(v[h], 8)));
                        _mm256_storeu_ps(o + 2 * j + 16 * h, _mm256_mul_ps(_mm256_sub_ps(f0, zv), sv));
                        _mm256_storeu_ps(o + 2 * j + 16 * h + 8, _mm256_mul_ps(_mm256_sub_ps(f1, zv), sv));
                    }
                }
                continue;
            }
#endif
            for (int64_t j = 0; j < half; j++) {
                o[2 * j] = ((float)(bq[j] & 15) - z) * s;
                o[2 * j + 1] = ((float)(bq[j] >> 4) - z) * s;
            }
        }
    }
}

/* columns c0 .. c1 - 1 of Y = A W^T (+ bias), A's rows prepared */
static void NAME(columns)(const nbits_args *p, int64_t c0, int64_t c1) {
    for (int64_t r = 0; r < p->m; r++) {
        row_work w = row_of(p, r);
        float *yr = p->y + r * p->n;
        for (int64_t c = c0; c < c1; c++) yr[c] = NAME(dot)(p, &w, c) + (p->bias ? p->bias[c] : 0.0f);
    }
}

static void NAME(chunk)(const void *arg, int64_t c) {
    const nbits_job *j = (const nbits_job *)arg;
    NAME(columns)(j->p, j->p->n * c / j->chunks, j->p->n * (c + 1) / j->chunks);
}

/* Y = A W^T (+ bias) for the rows and columns of *p: columns shared among the pool's threads (csrc/pool.c) */
static void NAME(matmul)(const nbits_args *p) {
    for (int64_t r = 0; r < p->m; r++) NAME(prepare_row)(p, r);
    const int64_t bytes = p->n * (p->k / 2);  /* small weights: a chunk each is not worth a second thread */
    const int granted = p->threads > 1 && bytes >= 2 * NBITS_CHUNK_BYTES ? ctxrt_pool_begin(p->threads) : 0;
    if (granted >= 2) {
        int64_t chunks = bytes / NBITS_CHUNK_BYTES, most = (p->n + 15) / 16;
        if (chunks > NBITS_CHUNKS_MAX) chunks = NBITS_CHUNKS_MAX;
        if (chunks > most) chunks = most;
        if (chunks < granted) chunks = granted <= most ? granted : most;
        if (chunks >= 2) {
            nbits_job j = {p, chunks};
            ctxrt_pool_run(NAME(chunk), &j, chunks);
            ctxrt_pool_end();
            return;
        }
        ctxrt_pool_end();
    }
    NAME(columns)(p, 0, p->n);
}
