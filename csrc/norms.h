/* The argument struct of csrc/genai.c's RMS rows (mirrored by ctxrt.backends.cpu.native.RmsArgs). */
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

#endif
