/* The argument structs of csrc/dwconv.c (mirrored by ctxrt.backends.cpu.native.DwArgs and PlanarArgs). */
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

typedef struct {
    int64_t n, c, h, w;         /* images, channels, rows, columns of x (planar: a graph's NCHW input) */
    int64_t m, oh, ow, kh, kw;  /* y's channels, rows, columns (channels last); the window */
    int64_t sh, sw, ph, pw;     /* strides, pads before */
    int64_t dh, dw;             /* dilations */
    const float *x;             /* [n, c, h, w] */
    const float *wt;            /* [c, kh, kw, m] */
    const float *bias;          /* [m] or NULL */
    float *y;                   /* [n, oh, ow, m] */
    int64_t act;                /* csrc/gemv.h's activation codes */
    float alpha, beta;
    int64_t threads;            /* OpenMP's team (0 or less: its count for the calling thread) */
} planar_args;

typedef struct {
    int64_t n, c, l;            /* images, channels, length of x (planar 1-D signals) */
    int64_t m, ol, k, g;        /* y's channels and length, taps, groups */
    int64_t s, p, d;            /* stride, pad before, dilation */
    int64_t lp;                 /* floats per channel of `pad`: >= max(p + l, (round_up(ol, 4) - 1) s + (k - 1) d + 1) */
    const float *x;             /* [n, c, l] */
    const float *wt;            /* [g, c / g, k, m / g]: a tap's output channels contiguous */
    const float *bias;          /* [m] or NULL */
    float *y;                   /* [n, m, ol] */
    float *pad;                 /* scratch [n, c, lp]: x with p zeros before it and zeros after */
    int64_t act;                /* csrc/gemv.h's activation codes */
    float alpha, beta;
    int64_t threads;            /* OpenMP's team (0 or less: its count for the calling thread) */
} conv1d_args;

typedef struct {
    int64_t rows, l, ol;        /* signals (images x channels), their length, the output's */
    int64_t k, s, p, d;         /* window, stride, pad before, dilation */
    int64_t max;                /* 1: MaxPool (positions outside and NaN skipped), 0: AveragePool */
    const float *x;             /* [rows, l] */
    const float *inv;           /* [ol]: 1 / the divisor of each output position (AveragePool) */
    float *y;                   /* [rows, ol] */
} pool1d_args;

typedef struct {
    int64_t planes, c, h, w;    /* images x channels, channels, rows, columns of x (planar: NCHW) */
    int64_t oh, ow, kh, kw;     /* y's rows and columns (planar), the window */
    int64_t sh, sw, ph, pw;     /* strides, pads before */
    int64_t dh, dw;             /* dilations */
    const float *x;             /* [planes, h, w] */
    const float *wt;            /* [c, kh, kw]: ONNX's depthwise weights */
    const float *bias;          /* [c] or NULL */
    float *y;                   /* [planes, oh, ow] */
    int64_t act;                /* csrc/gemv.h's activation codes (applied by ctxrt_act but Relu) */
    float alpha, beta;
    int64_t threads;            /* OpenMP's team (0 or less: its count for the calling thread) */
} dwp_args;

#endif
