/* Depthwise convolution of channels-last images (one input and one output channel per group), for a range
   program: the same code at every batch size (a oneDNN primitive per size brought its own JIT code, cold when a
   batch loop came back to it, and cost ~0.3 ms to make at each new size). y = act(conv(x, w) + bias (+ residual)),
   w stored [kh, kw, c].

   AVX-512, strides 1 or 2 by windows 3 or 5 wide, no dilation (MobileNets', EfficientNets'): per output row and
   block of 16 channels, groups of 8 output pixels (4 at a row's end) whose window row is loaded once into
   registers (positions outside the image loaded as zeros, masked) and read by every tap, the weights once per tap;
   accumulators start at the bias; the epilogue on the registers. MobileNetV3's five depthwise shapes at batch 12,
   one thread: 0.81x oneDNN's brdgmm_dw (0.69-0.94x each; 0.63x at batch 1). Other windows: one pixel at a time
   with the taps outside the image skipped; without AVX-512 a portable loop. Rows of the output are shared on
   OpenMP's team (csrc/gemv.c, ctxrt_team_run). */

#include "dwconv.h"

#include <math.h>
#include <stdint.h>
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

#include "act_param.h"
#include "gemv.h"

#define CONV_SHARED_WORK (1 << 17)  /* multiply-adds from which the rows are shared (~10 us on one core) */

/* the activations with a vector form here (csrc/gemv.h's codes); the others applied after, by ctxrt_act */
static int vector_act(int64_t act) { return act == 0 || act == 1 || (act >= 7 && act <= 10); }

/* output row r (image r / oh, row r % oh), portable */
static void dw_row_c(const dw_args *p, int64_t r) {
    const int64_t c = p->c, img = r / p->oh, oy = r % p->oh;
    const float *x = p->x + img * p->h * p->w * c;
    float *y = p->y + r * p->ow * c;
    const int act = (int)p->act;  /* (act_param1, act_param16: codes 2 .. 6 left to ctxrt_act) */
    for (int64_t ox = 0; ox < p->ow; ox++) {
        float *restrict acc = y + ox * c;
        for (int64_t j = 0; j < c; j++) acc[j] = p->bias ? p->bias[j] : 0.0f;
        for (int64_t ky = 0; ky < p->kh; ky++) {
            const int64_t iy = oy * p->sh - p->ph + ky * p->dh;
            if (iy < 0 || iy >= p->h) continue;
            for (int64_t kx = 0; kx < p->kw; kx++) {
                const int64_t ix = ox * p->sw - p->pw + kx * p->dw;
                if (ix < 0 || ix >= p->w) continue;
                const float *restrict xp = x + (iy * p->w + ix) * c, *restrict wp = p->wt + (ky * p->kw + kx) * c;
#pragma omp simd
                for (int64_t j = 0; j < c; j++) acc[j] += xp[j] * wp[j];
            }
        }
        const float *res = p->residual ? p->residual + (r * p->ow + ox) * c : 0;
        for (int64_t j = 0; j < c; j++) acc[j] = act_param1(acc[j] + (res ? res[j] : 0.0f), act, p->alpha, p->beta);
    }
}

#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx512f,avx2,fma")
/* the epilogue of pixel q of a group: the residual, the activation, the store (mask m) */
static inline void dw_store(const dw_args *p, float *y, const float *res, int64_t at, __mmask16 m, __m512 v, int act) {
    if (res) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, res + at));
    _mm512_mask_storeu_ps(y + at, m, act_param16(v, act, _mm512_set1_ps(p->alpha), _mm512_set1_ps(p->beta)));
}

/* P output pixels from ox0 (np of them stored) of one row, channels c0 .. c0 + 15 (mask m): the window row's
   (P - 1) SW + KW positions loaded once per kernel row, outside the image as zeros */
#define DW_GROUP(SW, KW, P)                                                                                      \
    static inline void dw_group_##SW##_##KW##_##P(const dw_args *p, const float *x, float *y, const float *res,  \
                                                  int64_t oy, int64_t c0, __mmask16 m, __m512 bias, int64_t ox0,  \
                                                  int64_t np, int act) {                                          \
        enum { J = (P - 1) * SW + KW };                                                                           \
        const int64_t c = p->c, w = p->w, ixs = ox0 * SW - p->pw;                                                 \
        __m512 acc[P];                                                                                            \
        _Pragma("GCC unroll 8") for (int q = 0; q < P; q++) acc[q] = bias;                                        \
        for (int64_t ky = 0; ky < p->kh; ky++) {                                                                  \
            const int64_t iy = oy * p->sh - p->ph + ky;                                                           \
            if (iy < 0 || iy >= p->h) continue;                                                                   \
            const float *row = x + iy * w * c + c0, *wr = p->wt + ky * KW * c + c0;                               \
            __m512 xv[J];                                                                                         \
            _Pragma("GCC unroll 32") for (int j = 0; j < J; j++) {                                                \
                const int64_t ix = ixs + j;                                                                       \
                xv[j] = _mm512_maskz_loadu_ps((uint64_t)ix < (uint64_t)w ? m : 0, row + ix * c);                  \
            }                                                                                                     \
            _Pragma("GCC unroll 8") for (int kx = 0; kx < KW; kx++) {                                             \
                const __m512 wv = _mm512_maskz_loadu_ps(m, wr + kx * c);                                          \
                _Pragma("GCC unroll 8") for (int q = 0; q < P; q++)                                               \
                    acc[q] = _mm512_fmadd_ps(xv[q * SW + kx], wv, acc[q]);                                        \
            }                                                                                                     \
        }                                                                                                         \
        _Pragma("GCC unroll 8") for (int q = 0; q < P; q++) {                                                     \
            if (q >= np) break;                                                                                   \
            dw_store(p, y, res, (ox0 + q) * c + c0, m, acc[q], act);                                              \
        }                                                                                                         \
    }
#define DW_ROW(SW, KW)                                                                                           \
    DW_GROUP(SW, KW, 8)                                                                                          \
    DW_GROUP(SW, KW, 4)                                                                                          \
    static void dw_row_##SW##_##KW(const dw_args *p, int64_t r) {                                                 \
        const int64_t c = p->c, img = r / p->oh, oy = r % p->oh;                                                  \
        const float *x = p->x + img * p->h * p->w * c, *res = p->residual ? p->residual + r * p->ow * c : 0;      \
        float *y = p->y + r * p->ow * c;                                                                          \
        const int act = (int)p->act;                                                                              \
        for (int64_t c0 = 0; c0 < c; c0 += 16) {                                                                  \
            const int64_t left = c - c0;                                                                          \
            const __mmask16 m = left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);                  \
            const __m512 bias = p->bias ? _mm512_maskz_loadu_ps(m, p->bias + c0) : _mm512_setzero_ps();          \
            for (int64_t ox0 = 0; ox0 < p->ow; ox0 += 8) {                                                        \
                const int64_t np = p->ow - ox0 < 8 ? p->ow - ox0 : 8;                                             \
                if (np > 4) dw_group_##SW##_##KW##_8(p, x, y, res, oy, c0, m, bias, ox0, np, act);                \
                else dw_group_##SW##_##KW##_4(p, x, y, res, oy, c0, m, bias, ox0, np, act);                       \
            }                                                                                                     \
        }                                                                                                         \
    }
DW_ROW(1, 3)
DW_ROW(2, 3)
DW_ROW(1, 5)
DW_ROW(2, 5)
#undef DW_ROW
#undef DW_GROUP

/* any other window: one output pixel at a time, the taps outside the image skipped */
static void dw_row512(const dw_args *p, int64_t r) {
    const int64_t c = p->c, w = p->w, img = r / p->oh, oy = r % p->oh;
    const float *x = p->x + img * p->h * w * c, *res = p->residual ? p->residual + r * p->ow * c : 0;
    float *y = p->y + r * p->ow * c;
    const int act = (int)p->act;
    for (int64_t c0 = 0; c0 < c; c0 += 16) {
        const int64_t left = c - c0;
        const __mmask16 m = left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
        const __m512 bias = p->bias ? _mm512_maskz_loadu_ps(m, p->bias + c0) : _mm512_setzero_ps();
        for (int64_t ox = 0; ox < p->ow; ox++) {
            __m512 acc = bias;
            for (int64_t ky = 0; ky < p->kh; ky++) {
                const int64_t iy = oy * p->sh - p->ph + ky * p->dh;
                if (iy < 0 || iy >= p->h) continue;
                for (int64_t kx = 0; kx < p->kw; kx++) {
                    const int64_t ix = ox * p->sw - p->pw + kx * p->dw;
                    if (ix < 0 || ix >= w) continue;
                    acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, x + (iy * w + ix) * c + c0),
                                          _mm512_maskz_loadu_ps(m, p->wt + (ky * p->kw + kx) * c + c0), acc);
                }
            }
            dw_store(p, y, res, ox * c + c0, m, acc, act);
        }
    }
}
#pragma GCC pop_options

typedef void (*dw_row_fn)(const dw_args *, int64_t);

static dw_row_fn dw_row(const dw_args *p) {
    if (!__builtin_cpu_supports("avx512f") || !ctxrt_gemm_allows_avx512()) return dw_row_c;
    if (p->dh != 1 || p->dw != 1 || (p->sw != 1 && p->sw != 2) || (p->kw != 3 && p->kw != 5)) return dw_row512;
    if (p->sw == 1) return p->kw == 3 ? dw_row_1_3 : dw_row_1_5;
    return p->kw == 3 ? dw_row_2_3 : dw_row_2_5;
}
#else
typedef void (*dw_row_fn)(const dw_args *, int64_t);
static dw_row_fn dw_row(const dw_args *p) { (void)p; return dw_row_c; }
#endif

/* a conv's output rows (depthwise or planar: the one given) shared on OpenMP's team: each row by its kernel, then
   through ctxrt_act where the activation has no vector form here (GELU, SiLU, erf) */
typedef struct {
    const dw_args *dw;
    dw_row_fn dw_row;
    const planar_args *pl;
    void (*pl_row)(const planar_args *, int64_t);
    int64_t rows, row_floats;
    float *y;
    int64_t act;
    float alpha, beta;
} conv_job;

static void conv_share(void *arg, int64_t t, int64_t count) {
    const conv_job *j = (const conv_job *)arg;
    const int64_t r0 = j->rows * t / count, r1 = j->rows * (t + 1) / count;
    for (int64_t r = r0; r < r1; r++) {
        if (j->dw) j->dw_row(j->dw, r);
        else j->pl_row(j->pl, r);
        if (!vector_act(j->act)) {
            float *y = j->y + r * j->row_floats;
            const act_args a = {j->row_floats, y, y, j->act, j->alpha, j->beta};
            ctxrt_act(&a);
        }
    }
}

static void conv_run(conv_job *j, int64_t work, int64_t threads) {
    if (work < CONV_SHARED_WORK) conv_share(j, 0, 1);
    else ctxrt_team_run(conv_share, j, threads);
}

/* y = act(depthwise conv(x) + bias (+ residual)) for *p. Returns 0. */
int ctxrt_dwconv(const dw_args *p) {
    conv_job j = {p, dw_row(p), 0, 0, p->n * p->oh, p->ow * p->c, p->y, p->act, p->alpha, p->beta};
    conv_run(&j, p->n * p->oh * p->ow * p->c * p->kh * p->kw, p->threads);
    return 0;
}

/* -- depthwise convolution of planar images ---------------------------------------------------------------------
   NCHW in and out (a depthwise conv between layout-sensitive ops, which the layout pass leaves planar: SegFormer's
   Mix-FFN between Reshapes, ConvNeXt's first stage; oneDNN has only its GEMM-based kernel for planar depthwise, as
   slow as NumPy's im2col: 1.3-1.5 ms for 128 channels of 64 x 64 by 3 x 3). Per output row: the bias, then each
   tap a multiply-add of a contiguous run of the input row (stride 1) over the output positions whose tap lies
   inside the image, vectorized by the compiler; rows shared on OpenMP's team. */
#define DWP_ROW(NAME)                                                                                              \
    static void NAME(const dwp_args *p, int64_t r) {                                                               \
        const int64_t plane = r / p->oh, oy = r % p->oh, ch = plane % p->c, ow = p->ow, w = p->w, sw = p->sw;      \
        const float *x = p->x + plane * p->h * w, *wt = p->wt + ch * p->kh * p->kw;                                 \
        float *restrict yr = p->y + r * ow;                                                                         \
        const float b = p->bias ? p->bias[ch] : 0.0f;                                                               \
        for (int64_t o = 0; o < ow; o++) yr[o] = b;                                                                 \
        for (int64_t ky = 0; ky < p->kh; ky++) {                                                                    \
            const int64_t iy = oy * p->sh - p->ph + ky * p->dh;                                                     \
            if (iy < 0 || iy >= p->h) continue;                                                                     \
            const float *xr = x + iy * w;                                                                           \
            for (int64_t kx = 0; kx < p->kw; kx++) {                                                                \
                const float v = wt[ky * p->kw + kx];                                                                \
                const int64_t off = kx * p->dw - p->pw; /* input column of output column o: o sw + off */          \
                const int64_t lo = off >= 0 ? 0 : (-off + sw - 1) / sw;                                             \
                int64_t hi = w - 1 - off >= 0 ? (w - 1 - off) / sw + 1 : 0;                                         \
                if (hi > ow) hi = ow;                                                                               \
                if (lo >= hi) continue;                                                                             \
                const float *restrict xs = xr + lo * sw + off;                                                      \
                float *restrict yo = yr + lo;                                                                       \
                const int64_t n = hi - lo;                                                                          \
                if (sw == 1)                                                                                        \
                    for (int64_t o = 0; o < n; o++) yo[o] += v * xs[o];                                             \
                else                                                                                                \
                    for (int64_t o = 0; o < n; o++) yo[o] += v * xs[o * sw];                                        \
            }                                                                                                       \
        }                                                                                                           \
        if (p->act == 1)                                                                                            \
            for (int64_t o = 0; o < ow; o++) yr[o] = yr[o] > 0.0f ? yr[o] : 0.0f;                                  \
    }

DWP_ROW(dwp_row_c)
#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx2,fma")
DWP_ROW(dwp_row_avx2)
#pragma GCC pop_options
#pragma GCC push_options
#pragma GCC target("avx512f,avx2,fma")
DWP_ROW(dwp_row_avx512)
#pragma GCC pop_options
static void (*dwp_row(void))(const dwp_args *, int64_t) {
    if (__builtin_cpu_supports("avx512f") && ctxrt_gemm_allows_avx512()) return dwp_row_avx512;
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? dwp_row_avx2 : dwp_row_c;
}
#else
static void (*dwp_row(void))(const dwp_args *, int64_t) { return dwp_row_c; }
#endif

typedef struct {
    const dwp_args *p;
    void (*row)(const dwp_args *, int64_t);
} dwp_job;

static void dwp_share(void *arg, int64_t t, int64_t count) {
    const dwp_job *j = (const dwp_job *)arg;
    const dwp_args *p = j->p;
    const int64_t rows = p->planes * p->oh, r0 = rows * t / count, r1 = rows * (t + 1) / count;
    for (int64_t r = r0; r < r1; r++) {
        j->row(p, r);
        if (p->act != 0 && p->act != 1) {
            float *y = p->y + r * p->ow;
            const act_args a = {p->ow, y, y, p->act, p->alpha, p->beta};
            ctxrt_act(&a);
        }
    }
}

/* y = act(depthwise conv(x) + bias) of planar images for *p. Returns 0. */
int ctxrt_dwconv_planar(const dwp_args *p) {
    dwp_job j = {p, dwp_row()};
    if (p->planes * p->oh * p->ow * p->kh * p->kw < CONV_SHARED_WORK) dwp_share(&j, 0, 1);
    else ctxrt_team_run(dwp_share, &j, p->threads);
    return 0;
}

/* -- a first convolution: few planar input channels into channels-last output --------------------------------
   A network's first conv reads the graph's NCHW input (3 channels) and writes channels last: one group, any
   window, stride, padding and dilation, y = act(conv(x, w) + bias), w stored [c, kh, kw, m] (a tap's output
   channels contiguous). Reading the planar input directly spares the NCHW -> NHWC reorder before it (oneDNN has
   only its reference kernel for a planar source into a channels-last output), and the same code serves every
   batch size. AVX-512: per output row and block of 16 output channels, groups of 8 output pixels whose every
   tap lies inside the image (each tap: its weights loaded once, each pixel's input broadcast into the FMA), the
   pixels at the borders one at a time with the taps outside skipped; without AVX-512 a portable loop. */


/* output row r (image r / oh, row r % oh), portable */
static void pl_row_c(const planar_args *p, int64_t r) {
    const int64_t m = p->m, img = r / p->oh, oy = r % p->oh, plane = p->h * p->w;
    const float *x = p->x + img * p->c * plane;
    float *y = p->y + r * p->ow * m;
    const int act = (int)p->act;
    for (int64_t ox = 0; ox < p->ow; ox++) {
        float *restrict acc = y + ox * m;
        for (int64_t j = 0; j < m; j++) acc[j] = p->bias ? p->bias[j] : 0.0f;
        for (int64_t ci = 0; ci < p->c; ci++)
            for (int64_t ky = 0; ky < p->kh; ky++) {
                const int64_t iy = oy * p->sh - p->ph + ky * p->dh;
                if (iy < 0 || iy >= p->h) continue;
                for (int64_t kx = 0; kx < p->kw; kx++) {
                    const int64_t ix = ox * p->sw - p->pw + kx * p->dw;
                    if (ix < 0 || ix >= p->w) continue;
                    const float xv = x[ci * plane + iy * p->w + ix];
                    const float *restrict wp = p->wt + ((ci * p->kh + ky) * p->kw + kx) * m;
#pragma omp simd
                    for (int64_t j = 0; j < m; j++) acc[j] += xv * wp[j];
                }
            }
        for (int64_t j = 0; j < m; j++) acc[j] = act_param1(acc[j], act, p->alpha, p->beta);
    }
}

#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx512f,avx2,fma")
/* one output pixel, channels m0 .. m0 + 15 (mask k), the taps outside the image skipped */
static inline __m512 pl_pixel(const planar_args *p, const float *x, int64_t oy, int64_t ox, int64_t m0, __mmask16 k,
                              __m512 acc) {
    const int64_t m = p->m, plane = p->h * p->w;
    for (int64_t ci = 0; ci < p->c; ci++)
        for (int64_t ky = 0; ky < p->kh; ky++) {
            const int64_t iy = oy * p->sh - p->ph + ky * p->dh;
            if (iy < 0 || iy >= p->h) continue;
            for (int64_t kx = 0; kx < p->kw; kx++) {
                const int64_t ix = ox * p->sw - p->pw + kx * p->dw;
                if (ix < 0 || ix >= p->w) continue;
                acc = _mm512_fmadd_ps(_mm512_set1_ps(x[ci * plane + iy * p->w + ix]),
                                      _mm512_maskz_loadu_ps(k, p->wt + ((ci * p->kh + ky) * p->kw + kx) * m + m0), acc);
            }
        }
    return acc;
}

/* P = 8 output pixels from ox whose every tap lies inside the row, NB blocks of 16 output channels from m0 (the
   last one's mask kl), stride SW (0: p->sw) */
#define PL_GROUP(SW, NB)                                                                                         \
    static inline void pl_group_##SW##_##NB(const planar_args *p, const float *x, float *y, int64_t oy,          \
                                            int64_t ox, int64_t m0, __mmask16 kl, const __m512 *bias, int act,    \
                                            __m512 alpha, __m512 beta) {                                          \
        enum { P = 8 };                                                                                           \
        const int64_t m = p->m, plane = p->h * p->w, sw = SW ? SW : p->sw, dw = p->dw;                            \
        __m512 acc[NB][P];                                                                                        \
        _Pragma("GCC unroll 2") for (int b = 0; b < NB; b++)                                                      \
            _Pragma("GCC unroll 8") for (int q = 0; q < P; q++) acc[b][q] = bias[b];                              \
        for (int64_t ci = 0; ci < p->c; ci++)                                                                     \
            for (int64_t ky = 0; ky < p->kh; ky++) {                                                              \
                const int64_t iy = oy * p->sh - p->ph + ky * p->dh;                                               \
                if (iy < 0 || iy >= p->h) continue;                                                               \
                const float *row = x + ci * plane + iy * p->w + ox * sw - p->pw;                                  \
                const float *wr = p->wt + (ci * p->kh + ky) * p->kw * m + m0;                                     \
                for (int64_t kx = 0; kx < p->kw; kx++) {                                                          \
                    const float *xp = row + kx * dw, *wp = wr + kx * m;                                           \
                    __m512 wv[NB];                                                                                \
                    _Pragma("GCC unroll 2") for (int b = 0; b < NB; b++)                                          \
                        wv[b] = b == NB - 1 ? _mm512_maskz_loadu_ps(kl, wp + 16 * b) : _mm512_loadu_ps(wp + 16 * b); \
                    _Pragma("GCC unroll 8") for (int q = 0; q < P; q++) {                                         \
                        const __m512 xv = _mm512_set1_ps(xp[q * sw]);                                             \
                        _Pragma("GCC unroll 2") for (int b = 0; b < NB; b++)                                      \
                            acc[b][q] = _mm512_fmadd_ps(xv, wv[b], acc[b][q]);                                    \
                    }                                                                                             \
                }                                                                                                 \
            }                                                                                                     \
        _Pragma("GCC unroll 2") for (int b = 0; b < NB; b++)                                                      \
            _Pragma("GCC unroll 8") for (int q = 0; q < P; q++)                                                   \
                _mm512_mask_storeu_ps(y + (ox + q) * m + m0 + 16 * b, b == NB - 1 ? kl : (__mmask16)0xFFFF,         \
                                      act_param16(acc[b][q], act, alpha, beta));                                  \
    }
PL_GROUP(1, 1)
PL_GROUP(1, 2)
PL_GROUP(2, 1)
PL_GROUP(2, 2)
PL_GROUP(0, 1)
PL_GROUP(0, 2)
#undef PL_GROUP

typedef void (*pl_group_fn)(const planar_args *, const float *, float *, int64_t, int64_t, int64_t, __mmask16,
                            const __m512 *, int, __m512, __m512);

static void pl_row512(const planar_args *p, int64_t r) {
    enum { P = 8 };
    const int64_t m = p->m, img = r / p->oh, oy = r % p->oh, plane = p->h * p->w, sw = p->sw, dw = p->dw;
    const float *x = p->x + img * p->c * plane;
    float *y = p->y + r * p->ow * m;
    const int act = (int)p->act;
    const __m512 alpha = _mm512_set1_ps(p->alpha), beta = _mm512_set1_ps(p->beta);
    /* the output columns whose every tap lies inside the row: [lo, hi) */
    int64_t lo = (p->pw + sw - 1) / sw, hi = (p->w - 1 + p->pw - (p->kw - 1) * dw) / sw + 1;
    if (p->w - 1 + p->pw - (p->kw - 1) * dw < 0) hi = 0;
    if (hi > p->ow) hi = p->ow;
    if (lo > hi) lo = hi;
    const pl_group_fn one = sw == 1 ? pl_group_1_1 : sw == 2 ? pl_group_2_1 : pl_group_0_1;
    const pl_group_fn two = sw == 1 ? pl_group_1_2 : sw == 2 ? pl_group_2_2 : pl_group_0_2;
    for (int64_t m0 = 0; m0 < m; ) {
        const int64_t left = m - m0, nb = left > 16 ? 2 : 1, last = left - 16 * (nb - 1);
        const __mmask16 kl = last >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << last) - 1);
        __m512 bias[2];
        for (int b = 0; b < nb; b++) {
            const __mmask16 k = b == nb - 1 ? kl : (__mmask16)0xFFFF;
            bias[b] = p->bias ? _mm512_maskz_loadu_ps(k, p->bias + m0 + 16 * b) : _mm512_setzero_ps();
        }
        const pl_group_fn group = nb == 2 ? two : one;
        int64_t ox = 0, done = hi;  /* the pixels from `done` on are left to the one-pixel loop */
        for (; ox < lo; ox++)
            for (int b = 0; b < nb; b++) {
                const __mmask16 k = b == nb - 1 ? kl : (__mmask16)0xFFFF;
                _mm512_mask_storeu_ps(y + ox * m + m0 + 16 * b, k,
                                      act_param16(pl_pixel(p, x, oy, ox, m0 + 16 * b, k, bias[b]), act, alpha, beta));
            }
        if (hi - lo >= P) {
            for (; ox + P <= hi; ox += P) group(p, x, y, oy, ox, m0, kl, bias, act, alpha, beta);
            if (ox < hi) group(p, x, y, oy, hi - P, m0, kl, bias, act, alpha, beta);  /* overlapping the last */
        } else {
            done = lo;
        }
        for (ox = done; ox < p->ow; ox++)
            for (int b = 0; b < nb; b++) {
                const __mmask16 k = b == nb - 1 ? kl : (__mmask16)0xFFFF;
                _mm512_mask_storeu_ps(y + ox * m + m0 + 16 * b, k,
                                      act_param16(pl_pixel(p, x, oy, ox, m0 + 16 * b, k, bias[b]), act, alpha, beta));
            }
        m0 += 16 * nb;
    }
}
#pragma GCC pop_options

typedef void (*pl_row_fn)(const planar_args *, int64_t);
static pl_row_fn pl_row(void) {
    return __builtin_cpu_supports("avx512f") && ctxrt_gemm_allows_avx512() ? pl_row512 : pl_row_c;
}
#else
typedef void (*pl_row_fn)(const planar_args *, int64_t);
static pl_row_fn pl_row(void) { return pl_row_c; }
#endif

/* y = act(conv(x, w) + bias) for *p (x planar, y channels last). Returns 0. */
int ctxrt_planar_conv(const planar_args *p) {
    conv_job j = {0, 0, p, pl_row(), p->n * p->oh, p->ow * p->m, p->y, p->act, p->alpha, p->beta};
    conv_run(&j, p->n * p->oh * p->ow * p->m * p->c * p->kh * p->kw, p->threads);
    return 0;
}


/* -- 1-D convolutions of planar signals ---------------------------------------------------------------------
   y[i, j, o] = act(bias[j] + sum over channels c of j's group and taps t of w[j, c, t] x[i, c, o s + t d - p]),
   x, y planar ([n, c, l], [n, m, ol]: an audio front end's or a VAD's convs between their pools), any stride,
   dilation, padding and groups, w stored [g, c / g, k, m / g]. The input is first copied into a zero-padded
   scratch (no bounds in the loops); then, with AVX2 and FMA, per block of 16 (or 8) output channels and 4 output
   positions, 8 (or 4) vector accumulators start at the bias, and each (channel, tap) loads the weights once and
   broadcasts the 4 input values into the FMAs; the results stored transposed into y's rows. A group's last
   channels (fewer than 8), and every block without AVX2, run a portable loop. Work is shared on OpenMP's team by blocks of positions. NumPy's im2col and GEMM took 4-7
   calls a conv: 8-30 us for convs of 0.1-0.6 M multiply-adds (the exported audio net's, silero VAD's). */

#define C1_POS 4           /* output positions per block */
#define C1_CHUNK 64        /* output positions per unit of shared work */

typedef struct {
    const conv1d_args *a;
    int64_t blocks;        /* per (image, group): blocks of 16 channels (the last one partial) */
    int64_t chunks;        /* per (image, group, block of channels): chunks of C1_CHUNK positions */
} c1_job;

/* channels j0 .. j0 + jn - 1 of group gi of image i, positions o0 .. o1 - 1: a portable loop */
static void c1_narrow(const conv1d_args *a, int64_t i, int64_t gi, int64_t j0, int64_t jn, int64_t o0, int64_t o1) {
    const int64_t cg = a->c / a->g, mg = a->m / a->g, act = a->act;
    const float *xg = a->pad + (i * a->c + gi * cg) * a->lp;
    const float *wg = a->wt + gi * cg * a->k * mg;
    float *yg = a->y + (i * a->m + gi * mg) * a->ol;
    float acc[16];
    for (int64_t o = o0; o < o1; o++) {
        for (int64_t j = 0; j < jn; j++) acc[j] = a->bias ? a->bias[gi * mg + j0 + j] : 0.0f;
        for (int64_t ci = 0; ci < cg; ci++)
            for (int64_t t = 0; t < a->k; t++) {
                const float xv = xg[ci * a->lp + o * a->s + t * a->d];
                const float *wp = wg + (ci * a->k + t) * mg + j0;
                for (int64_t j = 0; j < jn; j++) acc[j] += xv * wp[j];
            }
        for (int64_t j = 0; j < jn; j++) yg[(j0 + j) * a->ol + o] = act_param1(acc[j], (int)act, a->alpha, a->beta);
    }
}

#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx2,fma")
/* the store of 4 positions' accumulators (8 channels each) into y's rows, transposed, with the activation */
static inline void c1_store8(const conv1d_args *a, float *yg, int64_t o, int64_t nb, __m256 v0, __m256 v1, __m256 v2,
                             __m256 v3) {
    float out[C1_POS][8];
    _mm256_storeu_ps(out[0], v0); _mm256_storeu_ps(out[1], v1); _mm256_storeu_ps(out[2], v2);
    _mm256_storeu_ps(out[3], v3);
    for (int64_t j = 0; j < 8; j++)
        for (int64_t b = 0; b < nb; b++) yg[j * a->ol + o + b] = act_param1(out[b][j], (int)a->act, a->alpha, a->beta);
}

/* AVX2 and FMA: 16 channels (`wide`) or 8, 4 positions at a time */
static void c1_avx2(const conv1d_args *a, int64_t i, int64_t gi, int64_t j0, int wide, int64_t o0, int64_t o1) {
    const int64_t cg = a->c / a->g, mg = a->m / a->g, k = a->k, s = a->s, d = a->d, lp = a->lp;
    const float *xg = a->pad + (i * a->c + gi * cg) * lp;
    const float *wg = a->wt + gi * cg * k * mg + j0;
    float *yg = a->y + (i * a->m + gi * mg + j0) * a->ol;
    const __m256 b0 = a->bias ? _mm256_loadu_ps(a->bias + gi * mg + j0) : _mm256_setzero_ps();
    const __m256 b1 = a->bias && wide ? _mm256_loadu_ps(a->bias + gi * mg + j0 + 8) : _mm256_setzero_ps();
    for (int64_t o = o0; o < o1; o += C1_POS) {
        __m256 a00 = b0, a01 = b1, a10 = b0, a11 = b1, a20 = b0, a21 = b1, a30 = b0, a31 = b1;
        for (int64_t ci = 0; ci < cg; ci++) {
            const float *xc = xg + ci * lp + o * s;
            const float *wc = wg + ci * k * mg;
            if (wide) {
                for (int64_t t = 0; t < k; t++) {
                    const __m256 w0 = _mm256_loadu_ps(wc + t * mg), w1 = _mm256_loadu_ps(wc + t * mg + 8);
                    const float *xt = xc + t * d;
                    __m256 x = _mm256_broadcast_ss(xt);
                    a00 = _mm256_fmadd_ps(w0, x, a00); a01 = _mm256_fmadd_ps(w1, x, a01);
                    x = _mm256_broadcast_ss(xt + s);
                    a10 = _mm256_fmadd_ps(w0, x, a10); a11 = _mm256_fmadd_ps(w1, x, a11);
                    x = _mm256_broadcast_ss(xt + 2 * s);
                    a20 = _mm256_fmadd_ps(w0, x, a20); a21 = _mm256_fmadd_ps(w1, x, a21);
                    x = _mm256_broadcast_ss(xt + 3 * s);
                    a30 = _mm256_fmadd_ps(w0, x, a30); a31 = _mm256_fmadd_ps(w1, x, a31);
                }
            } else {
                for (int64_t t = 0; t < k; t++) {
                    const __m256 w0 = _mm256_loadu_ps(wc + t * mg);
                    const float *xt = xc + t * d;
                    a00 = _mm256_fmadd_ps(w0, _mm256_broadcast_ss(xt), a00);
                    a10 = _mm256_fmadd_ps(w0, _mm256_broadcast_ss(xt + s), a10);
                    a20 = _mm256_fmadd_ps(w0, _mm256_broadcast_ss(xt + 2 * s), a20);
                    a30 = _mm256_fmadd_ps(w0, _mm256_broadcast_ss(xt + 3 * s), a30);
                }
            }
        }
        const int64_t nb = o1 - o < C1_POS ? o1 - o : C1_POS;
        c1_store8(a, yg, o, nb, a00, a10, a20, a30);
        if (wide) c1_store8(a, yg + 8 * a->ol, o, nb, a01, a11, a21, a31);
    }
}
#pragma GCC pop_options
static int c1_has_avx2(void) { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }
#else
static void c1_avx2(const conv1d_args *a, int64_t i, int64_t gi, int64_t j0, int wide, int64_t o0, int64_t o1) {
    (void)a; (void)i; (void)gi; (void)j0; (void)wide; (void)o0; (void)o1;
}
static int c1_has_avx2(void) { return 0; }
#endif

static void c1_share(void *arg, int64_t t, int64_t count) {
    const c1_job *j = (const c1_job *)arg;
    const conv1d_args *a = j->a;
    const int64_t mg = a->m / a->g, units = a->n * a->g * j->blocks * j->chunks;
    const int64_t u0 = units * t / count, u1 = units * (t + 1) / count;
    const int avx2 = c1_has_avx2();
    for (int64_t u = u0; u < u1; u++) {
        const int64_t chunk = u % j->chunks, blk = u / j->chunks % j->blocks, gi = u / j->chunks / j->blocks % a->g;
        const int64_t i = u / j->chunks / j->blocks / a->g;
        const int64_t o0 = chunk * C1_CHUNK, o1 = o0 + C1_CHUNK < a->ol ? o0 + C1_CHUNK : a->ol;
        const int64_t j0 = blk * 16, jn = mg - j0 < 16 ? mg - j0 : 16;
        if (avx2 && jn >= 8) {  /* 16 channels, or 8 and the rest (fewer than 8) the portable way */
            c1_avx2(a, i, gi, j0, jn == 16, o0, o1);
            if (jn > 8 && jn < 16) c1_narrow(a, i, gi, j0 + 8, jn - 8, o0, o1);
        } else {
            c1_narrow(a, i, gi, j0, jn, o0, o1);
        }
    }
}

/* y = act(conv1d(x, w) + bias) for *p. Returns 0. */
int ctxrt_conv1d(const conv1d_args *p) {
    const int64_t rows = p->n * p->c, tail = p->lp - p->p - p->l;
    for (int64_t r = 0; r < rows; r++) {  /* the padded input: zeros, the signal, zeros */
        float *dst = p->pad + r * p->lp;
        for (int64_t q = 0; q < p->p; q++) dst[q] = 0.0f;
        __builtin_memcpy(dst + p->p, p->x + r * p->l, (size_t)p->l * sizeof(float));
        for (int64_t q = 0; q < tail; q++) dst[p->p + p->l + q] = 0.0f;
    }
    const int64_t mg = p->m / p->g;
    c1_job j = {p, (mg + 15) / 16, (p->ol + C1_CHUNK - 1) / C1_CHUNK};
    const int64_t work = p->n * p->m * p->ol * (p->c / p->g) * p->k;
    if (work < CONV_SHARED_WORK) c1_share(&j, 0, 1);
    else ctxrt_team_run(c1_share, &j, p->threads);
    if (!vector_act(p->act)) {
        const act_args a = {p->n * p->m * p->ol, p->y, p->y, p->act, p->alpha, p->beta};
        ctxrt_act(&a);
    }
    return 0;
}


/* -- 1-D pools of planar signals: y[r, o] = max (NaN skipped), or the sum times inv[o], of x[r, o s + t d - p] over
   the taps t that fall inside the signal (an audio net's MaxPool1d and AvgPool1d between its convs: NumPy's separable passes
   took 4-6 calls, 6-10 us at 16-32 channels by 125-500 samples). Returns 0. */
int ctxrt_pool1d(const pool1d_args *a) {
    const int64_t rows = a->rows, l = a->l, ol = a->ol, k = a->k, s = a->s, p = a->p, d = a->d;
    const float *inv = a->inv;
    for (int64_t r = 0; r < rows; r++) {
        const float *restrict x = a->x + r * l;
        float *restrict y = a->y + r * ol;
        for (int64_t o = 0; o < ol; o++) {
            const int64_t start = o * s - p;
            const int inside = start >= 0 && start + (k - 1) * d < l;
            if (a->max) {
                float acc = -INFINITY;
                for (int64_t t = 0; t < k; t++) {
                    const int64_t q = start + t * d;
                    if (!inside && (q < 0 || q >= l)) continue;
                    const float v = x[q];
                    acc = v > acc ? v : acc;  /* a NaN skipped, as onnxruntime's MLAS skips it */
                }
                y[o] = acc;
            } else {
                float acc = 0.0f;
                for (int64_t t = 0; t < k; t++) {
                    const int64_t q = start + t * d;
                    if (!inside && (q < 0 || q >= l)) continue;
                    acc += x[q];
                }
                y[o] = acc * inv[o];
            }
        }
    }
    return 0;
}
