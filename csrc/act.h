/* The argument struct of csrc/genai.c's Swish (mirrored by ctxrt.backends.cpu.native.SwishArgs). */
#ifndef CTXRT_ACT_H
#define CTXRT_ACT_H
#include <stdint.h>

typedef struct {
    int64_t n;
    const float *x;  /* [n] */
    float *y;        /* [n], may be x */
    float alpha;
} swish_args;

#endif
