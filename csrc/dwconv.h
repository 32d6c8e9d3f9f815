/* The argument struct of csrc/dwconv.c (mirrored by ctxrt.backends.cpu.native.DwArgs). */
#ifndef CTXRT_DWCONV_H
#define CTXRT_DWCONV_H
#include <stdint.h>

typedef struct {
    int64_t n, h, w, c;         /* images, rows, columns, channels of x (channels last) */
    int64_t oh, ow, kh, kw;     /* y's rows and columns, the window */
    int64_t sh, sw, ph, pw;     /* strides, pads before */
    int64_t dh, dw;             /* dilations */
    const float *x;             /* [n, h, w, c] */
    const float *wt;            /* [kh, kw, c] */
    const float *bias;          /* [c] or NULL */
    const float *residual;      /* [n, oh, ow, c] or NULL */
    float *y;                   /* [n, oh, ow, c] */
    int64_t act;                /* csrc/gemv.h's activation codes (gemv_args.act) */
    float alpha, beta;
    int64_t threads;            /* OpenMP's team (0 or less: its count for the calling thread) */
} dw_args;

#endif
