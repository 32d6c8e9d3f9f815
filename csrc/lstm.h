/* The argument struct of csrc/genai.c's LSTM direction (mirrored by ctxrt.backends.cpu.native.LstmArgs). */
#ifndef CTXRT_LSTM_H
#define CTXRT_LSTM_H
#include <stdint.h>

typedef struct {
    int64_t steps, batch, hidden, reverse;
    const float *xp;             /* input projections + both biases, gates i o f c: row (t, b) at t * xp_t + b * xp_b */
    int64_t xp_t, xp_b;
    const float *r;              /* [4 * hidden, hidden]: ONNX R of this direction */
    const float *peep;           /* [3 * hidden] (i o f) or NULL */
    const float *h0, *c0;        /* rows of hidden at b * s0_b, or NULL (zeros) */
    int64_t s0_b;
    float *y;                    /* h of (t, b) at t * y_t + b * y_b, or NULL */
    int64_t y_t, y_b;
    float *yh, *yc;              /* the last h and c of row b at b * s_b, or NULL */
    int64_t s_b;
    float *work;                 /* batch * 7 * hidden floats: gates, h, c */
} lstm_args;

/* One direction of an ONNX GRU with linear_before_reset = 1 and the default activations (sigmoid, tanh), mirrored
   by ctxrt.backends.cpu.native.GruArgs. */
typedef struct {
    int64_t steps, batch, hidden, reverse;
    const float *xp;             /* input projections + Wb (+ Rb for z and r), gates z r h: row (t, b) at
                                    t * xp_t + b * xp_b */
    int64_t xp_t, xp_b;
    const float *r;              /* [3 * hidden, hidden]: ONNX R of this direction */
    const float *rbh;            /* [hidden]: Rbh, added to Rh h before the reset gate scales it, or NULL */
    const float *h0;             /* rows of hidden at b * s0_b, or NULL (zeros) */
    int64_t s0_b;
    float *y;                    /* h of (t, b) at t * y_t + b * y_b, or NULL */
    int64_t y_t, y_b;
    float *yh;                   /* the last h of row b at b * s_b, or NULL */
    int64_t s_b;
    float *work;                 /* batch * 4 * hidden floats: R h, h */
} gru_args;

#endif
