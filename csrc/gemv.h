/* The argument structs of csrc/gemv.c (mirrored by ctxrt.backends.cpu.native.GemvArgs, ActArgs). */
#ifndef CTXRT_GEMV_H
#define CTXRT_GEMV_H
#include <stdint.h>

typedef struct {
    int64_t m, k, n;        /* rows of A, K, N */
    const float *a;         /* [m, k], rows lda floats apart */
    int64_t lda;
    const float *w;         /* trans 0: [k, n] (W as MatMul reads it); trans 1: [n, k] (W^T, rows of K) */
    int64_t trans;
    const float *bias;      /* [n] or NULL */
    const float *residual;  /* [m, n], rows ldr floats apart, or NULL */
    int64_t ldr;
    float *y;               /* [m, n], rows ldy floats apart */
    int64_t ldy;
    int64_t accumulate;     /* 1: y holds the residual on entry (the residual's own buffer, updated in place) */
    int64_t act;            /* after the bias and the residual: 0 none, 1 Relu, 2 GELU (erf), 3 GELU (tanh), 4 SiLU,
                               7 HardSwish x clamp(alpha x + beta, 0, 1), 8 Clip to [alpha, beta], 9 LeakyRelu (slope
                               alpha), 10 HardSigmoid clamp(alpha x + beta, 0, 1) */
    int64_t threads;        /* threads sharing the work, the caller's included (1: the caller's only; many rows on
                               OpenMP's team: 0 or less, OpenMP's count for the calling thread) */
    float alpha, beta;      /* the activation's parameters (7 .. 10) */
} gemv_args;

typedef struct {            /* y = act(x) over n floats (y may be x): an activation op on its own (Gelu, Erf) */
    int64_t n;
    const float *x;
    float *y;
    int64_t act;            /* csrc/vmath.h act8's codes: gemv_args.act's, 5 GELU by erfc, 6 erf, 11 Sigmoid, 12 Tanh;
                               7 .. 10 gemv_args' */
    float alpha, beta;      /* the parameters of codes 7 .. 10 */
} act_args;

typedef struct {            /* y[i, :] = scale * sum over q of x[i, q, :]: a GlobalAveragePool of channels-last images */
    int64_t n, p, c;        /* images, pixels, channels */
    const float *x;         /* [n, p, c] */
    float *y;               /* [n, c] */
    float scale;            /* 1 / p */
} gap_args;

/* A separable resize of two adjacent axes (Resize's linear, cubic or nearest): x [n, h, w, c] -> y [n, oh, ow, c],
   output row oy reading input rows iy[oy * ty + a] with weights wy[oy * ty + a] (a < ty), columns likewise. */
typedef struct {
    int64_t n, h, w, c, oh, ow, ty, tx;
    const int64_t *iy, *ix; /* [oh, ty], [ow, tx] */
    const float *wy, *wx;   /* [oh, ty], [ow, tx] */
    const float *x;         /* [n, h, w, c] */
    float *y;               /* [n, oh, ow, c] */
    float *tmp;             /* [w, c]: an output row's input rows blended */
} resize_args;

int ctxrt_openmp(void *parallel, void *thread_num, void *num_threads, void *max_threads);
int ctxrt_gemm_avx512(int64_t allowed);
int ctxrt_gemm_allows_avx512(void);  /* what ctxrt_gemm_avx512 last set (1 by default; also csrc/dwconv.c's) */
int ctxrt_act(const act_args *p);
int ctxrt_resize2d(const resize_args *p);

/* fn(arg, t, count) for each thread t of OpenMP's team of `threads` (0 or less: OpenMP's count for the calling
   thread) where ctxrt_openmp was given libgomp's entry points, else fn(arg, 0, 1) on the calling thread */
void ctxrt_team_run(void (*fn)(void *arg, int64_t t, int64_t count), void *arg, int64_t threads);

#endif
