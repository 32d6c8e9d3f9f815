/* The argument struct of csrc/genai.c's kernel (mirrored by ctxrt.backends.cpu.native.GqaArgs). */
#ifndef CTXRT_GQA_H
#define CTXRT_GQA_H
#include <stdint.h>

typedef struct {
    int64_t s, n, kv, h, rows;   /* new tokens, heads, kv heads, head size, rows of the present buffers */
    int64_t start, total;        /* the first new token's position (the past's length); columns (keys) of the sequence */
    int64_t window;              /* local_window_size; <= 0: no window */
    int64_t half, interleaved;   /* rotary: the first 2 * half channels of q and k rotated (half 0: none) */
    const float *q;              /* query of new token r, head i at q + r * q_stride + i * h */
    int64_t q_stride;
    const float *k_new, *v_new;  /* new key / value of token r, kv head j at + r * kv_stride + j * h */
    int64_t kv_stride;
    const float *cos, *sin;      /* [positions, half] caches */
    const float *sinks;          /* [n] head sinks, or NULL; with `sink` set and sinks NULL: 0 (smooth softmax) */
    int64_t sink;
    float *present_k, *present_v; /* [kv, rows, h] of this sequence */
    float *out;                  /* [s, n, h] of this sequence, row stride out_stride */
    int64_t out_stride;
    float scale, softcap;
    float *work;                 /* per thread a row of scores and a rotated query: rows + h floats */
    int64_t threads;
} gqa_args;

#endif
