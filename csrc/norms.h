/* The argument structs of csrc/genai.c's row kernels (mirrored by ctxrt.backends.cpu.native's RmsArgs, LnArgs and
   SoftmaxArgs). */
#ifndef CTXRT_NORMS_H
#define CTXRT_NORMS_H
#include <stdint.h>

typedef struct {
    int64_t rows, n;
    const float *x;      /* [rows, n] */
    const float *skip;   /* rows of n at skip_stride floats apart (0: one row for all), or NULL */
    int64_t skip_stride;
    const float *bias;   /* [n] or NULL */
    const float *gamma;  /* [n] */
    float *sum;          /* [rows, n]: x + skip + bias, or NULL (then y holds it before it is normalized) */
    float *y;            /* [rows, n] */
    float eps;
} rms_args;

/* LayerNormalization of rows: y = (x - mean) / sqrt(var + eps) * gamma (+ beta) */
typedef struct {
    int64_t rows, n;
    const float *x;      /* [rows, n] */
    const float *gamma;  /* [n] */
    const float *beta;   /* [n] or NULL */
    float *y;            /* [rows, n], may be x */
    float eps;
} ln_args;

/* Softmax of rows: y = e^(x - max) / sum */
typedef struct {
    int64_t rows, n;
    const float *x;  /* [rows, n] */
    float *y;        /* [rows, n], may be x */
} softmax_args;

#endif
