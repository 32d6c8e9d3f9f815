/* float32 GEMV with its epilogue, for a GEMM of a few rows (a decoder's token): Y = A W (+ bias) (+ residual),
   then the fused Relu or GELU, W constant and stored [K, N] or [N, K]. Memory-bound: it reads W once, so on a
   machine with idle cores it is shared among the pool's threads (csrc/pool.c; the caller chooses how many, see
   src/ctxrt/backends/cpu/gemv.py). Each kernel is compiled for AVX2+FMA and in portable C. */

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

#include "act_param.h"
#include "gemv.h"
#include "pool.h"

/* How a GEMV is shared among the pool's threads (csrc/pool.c: the caller never waits for a thread that has not
   begun): in chunks of about GEMV_CHUNK_BYTES of W, each one contiguous range of it. W^T [n, k]: ranges of its
   rows (columns of Y). W [k, n]: ranges of its rows, each chunk summing into a part of its own (at most
   GEMV_PARTS_MAX, and GEMV_PARTS_BYTES of parts), added at the end. (Ranges of a wide W's columns, each a run of
   a few hundred bytes a row 4n bytes apart, streamed at half the speed: an LM head of 768 x 32000 took 6.4 ms on
   two threads, by rows 3.4.) */
#define GEMV_CHUNK_BYTES (64 << 10)
#define GEMV_CHUNKS_MAX 256
#define GEMV_PARTS_MAX 16
#define GEMV_PARTS_BYTES (1 << 20)
/* the parts' sum and the epilogue of a GEMV_ROWS_KN job are shared too from this many values (or columns of
   GELU, whose erf or tanh costs ~10 ns a value) */
#define GEMV_FINISH_SHARED 8192

/* A GEMM of 2 .. GEMM_ROWS_MAX rows by W [k, n] (a prompt's few tokens, a small batch) runs on register blocks
   (gemv_kernel.h, gemm_rows: W read once for every 6 rows, where the GEMV's loop reads it once a row), shared by
   blocks of 16 columns from GEMM_SHARED_WORK multiply-adds (~30 us on one core: a shared job waits for a chunk
   a worker claimed, which a busy core can hold for a scheduler slice; a small decoder's 8 x 128 x 352 GEMMs
   shared at 2^18 ran 2-3x slower beside another process's spinning threads) */
#define GEMM_ROWS_MAX 16
#define GEMM_SHARED_WORK (1 << 21)

enum { GEMV_COLUMNS_NK, GEMV_ROWS_KN, GEMV_FINISH, GEMM_COLUMNS };

typedef struct {
    const gemv_args *p;
    int64_t chunks;
    int64_t count;  /* GEMV_ROWS_KN's chunks, y and the parts (GEMV_FINISH reads them) */
    float *parts;   /* GEMV_ROWS_KN: (count - 1) * m * n floats */
    int kind;
} gemv_job;

/* the fused activation (gemv_args.act) of one value, as onnxruntime's Relu, Gelu and SiLU compute it */
static inline float gemv_act(float v, int act, float alpha, float beta) {
    switch (act) {
    case 2: return 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
    case 3: return 0.5f * v * (1.0f + tanhf(0.79788456080286536f * (v + 0.044715f * v * v * v)));
    case 4: return v / (1.0f + expf(-v));
    case 5: {
        const float c = erfcf(v * -0.70710678118654752f);
        return c == 0.0f ? 0.0f : 0.5f * v * c;  /* v -> -inf: 0, not -inf x 0 */
    }
    case 6: return erff(v);
    case 11: return 1.0f / (1.0f + expf(-v));
    case 12: return tanhf(v);
    default: return act_param1(v, act, alpha, beta);  /* Relu, the parameterized ones */
    }
}

#define NAME(x) x##_c
#include "gemv_kernel.h"
#undef NAME

#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#define GEMV_AVX2 1
#define NAME(x) x##_avx2
#include "gemv_kernel.h"
#undef NAME
#undef GEMV_AVX2
#pragma GCC pop_options

static int avx2(void) { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }

/* ---- many rows by W [k, n] (a 1x1 convolution's pixels in a range program: the same code for every batch) ----
   AVX-512: register blocks of up to 12 rows by 32 columns (24 accumulators; the columns past the last whole
   block masked, no scalar tail), W's row of the block loaded once for the 12 rows, A's values broadcast from
   memory into the multiply-adds; the epilogue on the registers. Blocks of ROWS_BLOCK rows are shared among the
   pool's threads. Without AVX-512: gemm_rows' AVX2 blocks of 6 rows by 16 columns. */
#define ROWS_BLOCK 12
#define ROWS_SHARED_WORK (1 << 19)  /* multiply-adds from which many rows are shared (~10 us on one core) */
#define ROWS_TEAM_WORK (1 << 18)  /* the same on OpenMP's team, already awake between oneDNN's primitives */

#pragma GCC push_options
#pragma GCC target("avx512f,avx2,fma")
/* the activation of 16 values (gemv_args' codes; act, alpha and beta read once per block) */
static inline __m512 act16(__m512 v, int act, float alpha, float beta) {
    if (act < 2 || (act > 6 && act < 11)) return act_param16(v, act, _mm512_set1_ps(alpha), _mm512_set1_ps(beta));
    /* GELU, SiLU, erf: vmath.h's 8 lanes twice */
    const __m256 lo = act8p_avx2(_mm512_castps512_ps256(v), act, alpha, beta);
    const __m256 hi = act8p_avx2(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)), act, alpha, beta);
    return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(lo)), _mm256_castps_pd(hi), 1));
}

/* The accumulators start at the bias; the epilogue adds the residual (or y, accumulate) and applies the activation,
   its common cases (none, Relu, HardSwish with no residual) in loops of their own. */
#define ROWS512_STORE(RB, NV, EXPR)                                                                              \
    _Pragma("GCC unroll 12") for (int i = 0; i < RB; i++) {                                                     \
        float *y = p->y + (r0 + i) * ldy + col;                                                                 \
        { const __m512 v = acc[i][0]; _mm512_mask_storeu_ps(y, m0, EXPR); }                                     \
        if (NV > 1) { const __m512 v = acc[i][NV - 1]; _mm512_mask_storeu_ps(y + 16, m1, EXPR); }               \
    }
#define ROWS512(RB, NV)                                                                                          \
    static void rows512_##RB##_##NV(const gemv_args *p, int64_t r0, int64_t col, __mmask16 m0, __mmask16 m1) {   \
        const int64_t k = p->k, n = p->n, lda = p->lda, ldy = p->ldy;                                           \
        const int act = (int)p->act;                                                                            \
        const float alpha = p->alpha, beta = p->beta;                                                           \
        const float *a = p->a + r0 * lda, *w = p->w + col;                                                      \
        const __m512 bias0 = p->bias ? _mm512_maskz_loadu_ps(m0, p->bias + col) : _mm512_setzero_ps();          \
        const __m512 bias1 = p->bias && NV > 1 ? _mm512_maskz_loadu_ps(m1, p->bias + col + 16) : bias0;         \
        __m512 acc[RB][NV];                                                                                     \
        _Pragma("GCC unroll 12") for (int i = 0; i < RB; i++) {                                                 \
            acc[i][0] = bias0;                                                                                  \
            if (NV > 1) acc[i][NV - 1] = bias1;                                                                 \
        }                                                                                                       \
        for (int64_t kk = 0; kk < k; kk++, w += n) {                                                            \
            const __m512 b0 = _mm512_maskz_loadu_ps(m0, w);                                                     \
            const __m512 b1 = NV > 1 ? _mm512_maskz_loadu_ps(m1, w + 16) : b0;                                  \
            _Pragma("GCC unroll 12") for (int i = 0; i < RB; i++) {                                             \
                const __m512 x = _mm512_set1_ps(a[i * lda + kk]);                                               \
                acc[i][0] = _mm512_fmadd_ps(x, b0, acc[i][0]);                                                  \
                if (NV > 1) acc[i][NV - 1] = _mm512_fmadd_ps(x, b1, acc[i][NV - 1]);                            \
            }                                                                                                   \
        }                                                                                                       \
        if (p->residual || p->accumulate) {                                                                     \
            const float *res = p->residual ? p->residual + r0 * p->ldr + col : p->y + r0 * ldy + col;           \
            const int64_t ldr = p->residual ? p->ldr : ldy;                                                     \
            _Pragma("GCC unroll 12") for (int i = 0; i < RB; i++) {                                             \
                acc[i][0] = _mm512_add_ps(acc[i][0], _mm512_maskz_loadu_ps(m0, res + i * ldr));                 \
                if (NV > 1) acc[i][NV - 1] = _mm512_add_ps(acc[i][NV - 1], _mm512_maskz_loadu_ps(m1, res + i * ldr + 16)); \
            }                                                                                                   \
        }                                                                                                       \
        if (act == 0) {                                                                                         \
            ROWS512_STORE(RB, NV, v)                                                                            \
        } else if (act == 1) {                                                                                  \
            ROWS512_STORE(RB, NV, _mm512_max_ps(v, _mm512_setzero_ps()))                                         \
        } else {                                                                                                \
            ROWS512_STORE(RB, NV, act16(v, act, alpha, beta))                                                   \
        }                                                                                                       \
    }
#define ROWS512_BOTH(RB) ROWS512(RB, 1) ROWS512(RB, 2)
ROWS512_BOTH(1) ROWS512_BOTH(2) ROWS512_BOTH(3) ROWS512_BOTH(4) ROWS512_BOTH(5) ROWS512_BOTH(6)
ROWS512_BOTH(7) ROWS512_BOTH(8) ROWS512_BOTH(9) ROWS512_BOTH(10) ROWS512_BOTH(11) ROWS512_BOTH(12)
#undef ROWS512_BOTH
#undef ROWS512
#undef ROWS512_STORE

typedef void (*rows512_fn)(const gemv_args *, int64_t, int64_t, __mmask16, __mmask16);
static const rows512_fn ROWS512_FNS[ROWS_BLOCK][2] = {
    {rows512_1_1, rows512_1_2}, {rows512_2_1, rows512_2_2}, {rows512_3_1, rows512_3_2}, {rows512_4_1, rows512_4_2},
    {rows512_5_1, rows512_5_2}, {rows512_6_1, rows512_6_2}, {rows512_7_1, rows512_7_2}, {rows512_8_1, rows512_8_2},
    {rows512_9_1, rows512_9_2}, {rows512_10_1, rows512_10_2}, {rows512_11_1, rows512_11_2},
    {rows512_12_1, rows512_12_2}};

/* Y rows r0 .. r1 - 1, every column */
static void rows_avx512(const gemv_args *p, int64_t r0, int64_t r1) {
    const int64_t n = p->n;
    for (int64_t r = r0; r < r1; r += ROWS_BLOCK) {
        const int64_t rb = r1 - r < ROWS_BLOCK ? r1 - r : ROWS_BLOCK;
        for (int64_t c = 0; c < n; c += 32) {
            const int64_t left = n - c;
            const __mmask16 m0 = left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
            const __mmask16 m1 = left >= 32 ? (__mmask16)0xFFFF : left > 16 ? (__mmask16)((1u << (left - 16)) - 1) : 0;
            ROWS512_FNS[rb - 1][left > 16](p, r, c, m0, m1);
        }
    }
}
#pragma GCC pop_options

static void rows_avx2(const gemv_args *p, int64_t r0, int64_t r1) { gemm_rows_avx2(p, r0, r1, 0, p->n); }

static int rows_avx512_allowed = 1;  /* ctxrt_gemm_avx512(0): the AVX2 blocks on an AVX-512 machine too (tests) */

/* Whether many rows may run on AVX-512 where the CPU has it (1, the default) or on AVX2 only (0). Returns 0. */
int ctxrt_gemm_avx512(int64_t allowed) {
    rows_avx512_allowed = allowed != 0;
    return 0;
}

static int avx512(void) { return rows_avx512_allowed && __builtin_cpu_supports("avx512f"); }

int ctxrt_gemm_allows_avx512(void) { return rows_avx512_allowed; }

typedef void (*rows_fn)(const gemv_args *p, int64_t r0, int64_t r1);
typedef struct { const gemv_args *p; int64_t chunks; rows_fn fn; } rows_job;

static void rows_chunk(const void *arg, int64_t c) {
    const rows_job *j = (const rows_job *)arg;
    const int64_t m = j->p->m, blocks = (m + ROWS_BLOCK - 1) / ROWS_BLOCK;
    const int64_t b0 = blocks * c / j->chunks, b1 = blocks * (c + 1) / j->chunks;
    j->fn(j->p, b0 * ROWS_BLOCK, b1 * ROWS_BLOCK < m ? b1 * ROWS_BLOCK : m);
}

/* OpenMP's team, where ctxrt_openmp was given libgomp's entry points (the runtime oneDNN's primitives run on): many
   rows shared on the same threads as the primitives before and after them. On ctxrt's own pool instead, its
   workers and OpenMP's spin at once between a CNN's kernels, three threads on two cores: MobileNetV3's batch of 8
   took 0.6-2.0 ms instead of 0.4. */
typedef void (*gomp_parallel_fn)(void (*)(void *), void *, unsigned, unsigned);
typedef int (*omp_int_fn)(void);
static gomp_parallel_fn omp_parallel;
static omp_int_fn omp_thread_num, omp_num_threads, omp_max_threads;

/* libgomp's GOMP_parallel, omp_get_thread_num, omp_get_num_threads and omp_get_max_threads (all four, or none).
   Returns 0. */
int ctxrt_openmp(void *parallel, void *thread_num, void *num_threads, void *max_threads) {
    if (!parallel || !thread_num || !num_threads || !max_threads) parallel = thread_num = num_threads = max_threads = 0;
    omp_thread_num = (omp_int_fn)thread_num;
    omp_num_threads = (omp_int_fn)num_threads;
    omp_max_threads = (omp_int_fn)max_threads;
    omp_parallel = (gomp_parallel_fn)parallel;
    return 0;
}

typedef struct { void (*fn)(void *, int64_t, int64_t); void *arg; } team_job;

static void team_thread(void *arg) {
    const team_job *j = (const team_job *)arg;
    j->fn(j->arg, omp_thread_num(), omp_num_threads());
}

void ctxrt_team_run(void (*fn)(void *arg, int64_t t, int64_t count), void *arg, int64_t threads) {
    const int64_t team = omp_parallel ? (threads > 0 ? threads : omp_max_threads()) : 1;
    if (team <= 1) {
        fn(arg, 0, 1);
        return;
    }
    team_job j = {fn, arg};
    omp_parallel(team_thread, &j, (unsigned)team, 0);
}

static void rows_team(void *arg, int64_t t, int64_t count) {  /* one team thread's share: blocks of rows */
    rows_job j = *(const rows_job *)arg;
    j.chunks = count;
    rows_chunk(&j, t);
}

/* many rows (more than GEMM_ROWS_MAX) by W [k, n]: on OpenMP's team where it was given (of p->threads, or where
   that is 0 or less of OpenMP's own count for the calling thread: the run's, which ctxrt sets before each run, so
   that one struct serves every run and a batch or a shared list calls it as it is), else on the pool; 0, or -1
   where this machine has no AVX2 (the caller's GEMV) */
static int gemm_many(const gemv_args *p) {
    const rows_fn fn = avx512() ? rows_avx512 : avx2() ? rows_avx2 : 0;
    if (!fn) return -1;
    const int64_t work = p->m * p->k * p->n;
    const int64_t team = omp_parallel ? (p->threads > 0 ? p->threads : omp_max_threads()) : 0;
    if (team > 1 && work >= ROWS_TEAM_WORK) {
        rows_job j = {p, 0, fn};
        ctxrt_team_run(rows_team, &j, team);
        return 0;
    }
    const int granted = p->threads > 1 && work >= ROWS_SHARED_WORK ? ctxrt_pool_begin(p->threads) : 0;
    if (granted < 2) {
        fn(p, 0, p->m);
        return 0;
    }
    const int64_t blocks = (p->m + ROWS_BLOCK - 1) / ROWS_BLOCK;
    int64_t chunks = work / (ROWS_SHARED_WORK / 2);
    if (chunks < granted) chunks = granted;
    if (chunks > GEMV_CHUNKS_MAX) chunks = GEMV_CHUNKS_MAX;
    if (chunks > blocks) chunks = blocks;
    rows_job j = {p, chunks, fn};
    if (chunks >= 2) ctxrt_pool_run(rows_chunk, &j, chunks);
    else fn(p, 0, p->m);
    ctxrt_pool_end();
    return 0;
}
#else
static int avx2(void) { return 0; }
static int gemm_many(const gemv_args *p) { (void)p; return -1; }
int ctxrt_gemm_avx512(int64_t allowed) {
    (void)allowed;
    return 0;
}
int ctxrt_openmp(void *parallel, void *thread_num, void *num_threads, void *max_threads) {
    (void)parallel, (void)thread_num, (void)num_threads, (void)max_threads;
    return 0;
}
void ctxrt_team_run(void (*fn)(void *arg, int64_t t, int64_t count), void *arg, int64_t threads) {
    (void)threads;
    fn(arg, 0, 1);
}
int ctxrt_gemm_allows_avx512(void) { return 0; }

#define gemv_avx2 gemv_c
#endif

/* d[0:n] = the sum over taps a of w[a] * base[idx[a] * stride + 0:n] (inlined where it is used) */
static inline __attribute__((always_inline)) void blend(float *restrict d, const float *base, const int64_t *idx,
                                                         const float *w, int64_t taps, int64_t stride, int64_t n) {
    const float *s = base + idx[0] * stride;
    const float w0 = w[0];
#pragma omp simd
    for (int64_t j = 0; j < n; j++) d[j] = w0 * s[j];
    for (int64_t a = 1; a < taps; a++) {
        const float *sa = base + idx[a] * stride;
        const float wa = w[a];
#pragma omp simd
        for (int64_t j = 0; j < n; j++) d[j] += wa * sa[j];
    }
}

/* A separable resize of two adjacent axes (resize_args), an output row at a time: the input rows it reads blended
   into tmp (ty passes over w * c contiguous values), then each output pixel's c values blended from tx of tmp's
   pixels. Inlined into a generic and an AVX2 copy. */
static inline __attribute__((always_inline)) void resize_body(const resize_args *p) {
    const int64_t c = p->c, ty = p->ty, tx = p->tx, row = p->w * c, orow = p->ow * c;
    for (int64_t i = 0; i < p->n; i++) {
        const float *x = p->x + i * p->h * row;
        float *y = p->y + i * p->oh * orow;
        for (int64_t oy = 0; oy < p->oh; oy++, y += orow) {
            blend(p->tmp, x, p->iy + oy * ty, p->wy + oy * ty, ty, row, row);
            for (int64_t ox = 0; ox < p->ow; ox++)
                blend(y + ox * c, p->tmp, p->ix + ox * tx, p->wx + ox * tx, tx, c, c);
        }
    }
}

static void resize_c(const resize_args *p) { resize_body(p); }
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx2,fma"))) static void resize_avx2(const resize_args *p) { resize_body(p); }
#else
#define resize_avx2 resize_c
#endif

int ctxrt_resize2d(const resize_args *p) {
    if (avx2()) resize_avx2(p);
    else resize_c(p);
    return 0;
}

/* Y = act(A W (+ bias) (+ residual)) for *p, shared among up to p->threads threads. Returns 0. */
int ctxrt_gemv(const gemv_args *p) {
    if (!p->trans && p->m > GEMM_ROWS_MAX && gemm_many(p) == 0) return 0;
    if (avx2()) gemv_avx2(p);
    else gemv_c(p);
    return 0;
}

/* A GlobalAveragePool of channels-last images (gap_args), the channels' sums in y, in pixel order. Returns 0. */
int ctxrt_gap(const gap_args *p) {
    const int64_t c = p->c;
    for (int64_t i = 0; i < p->n; i++) {
        float *restrict y = p->y + i * c;
        const float *x = p->x + i * p->p * c;
#pragma omp simd
        for (int64_t j = 0; j < c; j++) y[j] = 0.0f;
        for (int64_t q = 0; q < p->p; q++, x += c) {
#pragma omp simd
            for (int64_t j = 0; j < c; j++) y[j] += x[j];
        }
#pragma omp simd
        for (int64_t j = 0; j < c; j++) y[j] *= p->scale;
    }
    return 0;
}

/* one thread's share of ctxrt_act: elements [a, b) of t of count equal parts (whole 16-float lines) */
static void act_share(void *arg, int64_t t, int64_t count) {
    const act_args *p = (const act_args *)arg;
    const int64_t lines = (p->n + 15) / 16, a = lines * t / count * 16, e = lines * (t + 1) / count * 16;
    const int64_t b = e < p->n ? e : p->n;
    if (a >= b) return;
    if (p->y != p->x) memmove(p->y + a, p->x + a, (size_t)(b - a) * sizeof(float));
    if (avx2()) act_row_avx2(p->y, a, b, (int)p->act, p->alpha, p->beta);
    else act_row_c(p->y, a, b, (int)p->act, p->alpha, p->beta);
}

/* elements from which an activation runs on OpenMP's team (where it was given: the run's thread count, which
   ctxrt sets before each run): a GELU of ~2 ns an element on one core; Wav2Vec2's feature extractor's GELUs over
   256 x 8000 took 5 ms on one thread beside onnxruntime's 1.4 ms for all of them */
#define ACT_TEAM_MIN (1 << 15)

/* y = act(x) over n floats, 8 lanes at a time in the AVX2 copy (erf, erfc: N. Juffa's, csrc/vmath.h). Returns 0. */
int ctxrt_act(const act_args *p) {
    if (p->n >= ACT_TEAM_MIN) ctxrt_team_run(act_share, (void *)p, 0);
    else act_share((void *)p, 0, 1);
    return 0;
}
