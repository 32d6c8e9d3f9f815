/* The argument struct of csrc/nbits.c's kernel (mirrored by ctxrt.backends.cpu.native.NBitsArgs). */
#ifndef CTXRT_NBITS_H
#define CTXRT_NBITS_H
#include <stdint.h>

typedef struct {
    int64_t m, k, n, block;  /* A [m, k]; W [n, k] in blocks of `block` (a power of two >= 16) along K */
    const float *a;          /* A, rows of k floats */
    const uint8_t *b;        /* [n, kb, block / 2] */
    const float *scales;     /* [n, kb] */
    const uint8_t *zp;       /* packed 4-bit zero points [n, (kb + 1) / 2], or NULL */
    const float *zpf;        /* float zero points [n, kb], or NULL */
    const float *bias;       /* [n], or NULL */
    float *y;                /* [m, n] */
    void *work;              /* native.nbits4_work_bytes(m, k, block, int8) bytes (row_of's layout) */
    int64_t int8;            /* 1: int8 A (accuracy_level 4); 0: float32 */
    int64_t threads;         /* OpenMP threads; 0: OpenMP's current limit */
} nbits_args;

#endif
