/* The argument structs of csrc/qelem.c (mirrored by ctxrt.backends.cpu.native's *Args classes). */
#ifndef CTXRT_QELEM_H
#define CTXRT_QELEM_H
#include <stdint.h>

typedef struct {            /* where a launch's scales and zero points are at run time (they may be computed
                               tensors): each NULL (the struct's float field is used as set) or a tensor's one value,
                               read as each launch starts */
    const void *at[6];
    int64_t kinds;          /* 4 bits per entry (entry i at bit 4i): 0 float32, 1 int8, 2 uint8 */
} qsrc;

/* dst[i] = the value at src->at[i], as float, for each entry given */
static inline void qsrc_read(const qsrc *src, float *dst, int count) {
    for (int i = 0; i < count; i++) {
        const void *at = src->at[i];
        if (!at) continue;
        switch ((src->kinds >> (4 * i)) & 15) {
        case 1: dst[i] = (float)*(const int8_t *)at; break;
        case 2: dst[i] = (float)*(const uint8_t *)at; break;
        default: dst[i] = *(const float *)at;
        }
    }
}

typedef struct {
    int64_t n;              /* elements (a, b, y all of y's shape, contiguous) */
    const void *a, *b;      /* 8-bit integers (int8 or uint8, `is_signed`); b NULL: `fixed` instead */
    const float *fixed;     /* B_scale (B - B_zp) computed once ([n], or [period] repeated along y), or NULL */
    int64_t period;         /* fixed's (or QLinearMul's b's) length where it repeats (1: one value; a bias along
                               the last axis, or QLinearMul's b of one value per channel of a channels-last
                               tensor), else 0 */
    void *y;
    float sa, za, sb, zb, sc, zc;  /* scales and zero points (0 where absent) */
    int64_t is_signed;
    int64_t mul;            /* 1: QLinearMul, C = (A - A_zp)(B - B_zp) (A_scale B_scale / C_scale) + C_zp; B
                               of y's shape, or one value (period 1) */
    qsrc src;               /* sa, za, sb, zb, sc, zc read at run time */
} qadd_args;

typedef struct {            /* QuantizeLinear (x float32, y 8 bits) and DequantizeLinear (x 8 bits, y float32) */
    int64_t n;
    const void *x;
    void *y;
    float scale, zp;        /* per tensor (zp 0 where absent) */
    int64_t is_signed;      /* the 8-bit side: int8 (1) or uint8 (0) */
    qsrc src;               /* scale, zp read at run time */
} linear8_args;

typedef struct {            /* DynamicQuantizeLinear: y = uint8 quantization of x over [min(x, 0), max(x, 0)] */
    int64_t n;
    const float *x;
    uint8_t *y;
    float *scale;           /* out: the scale (1 where the range is 0) */
    uint8_t *zp;            /* out: the zero point */
} dynquant_args;

typedef struct {
    int64_t batch, m, k, n;   /* batch matrices of A [m, k] and B [k, n], contiguous, the same count */
    const void *a, *b;        /* 8-bit integers; a_signed / b_signed say which */
    void *y;                  /* [batch, m, n] 8-bit integers (y_signed) */
    float za, zb, zc, mult;   /* zero points (0 where absent), a_scale * b_scale / y_scale */
    int64_t a_signed, b_signed, y_signed;
    float *bf, *acc, *arow;   /* work: k * n floats (B - zb), n (a row's sums), k (A's row - za) */
} qmatmul_args;

typedef struct {            /* MatMulInteger: Y = (A - za) (B - zb) exactly, in int32 */
    int64_t m, k, n;        /* A [m, k], B [k, n], Y [m, n], contiguous */
    const void *a, *b;      /* 8-bit integers; a_signed / b_signed say which */
    int32_t *y;
    const void *za;         /* NULL or A's one zero point (A's type) */
    const void *zb;         /* NULL, B's one zero point or one per column (B's type): zb_count 0, 1 or n */
    int64_t zb_count;
    int64_t a_signed, b_signed;
    int16_t *a16, *b16;     /* work: m * kp and kp * n int16 (kp: k rounded up to even) */
} igemm_args;

typedef struct {            /* y rows = lut[x rows]: an 8-bit function of an 8-bit tensor (a QDQ unit's element-wise
                               ops, QLinearConcat's parts) */
    int64_t rows, cols;     /* rows of `cols` bytes, `ldx` and `ldy` bytes apart */
    const uint8_t *x;
    int64_t ldx;
    uint8_t *y;
    int64_t ldy;
    const uint8_t *lut;     /* 256 bytes, indexed by x's byte (int8 values as their two's complement) */
} lut8_args;

typedef struct {            /* y = saturate(round_half_even(x a[ch] + b[ch])): 8 bits to 8 bits, an affine map per
                               channel (a QDQ unit's BatchNormalization, requantization folded into a and b) */
    int64_t rows, cols;     /* rows of `cols` values, `ldx` and `ldy` apart */
    const void *x;
    int64_t ldx;
    void *y;
    int64_t ldy;
    const float *a, *b;     /* per channel */
    int64_t channels;
    int64_t per;            /* 1: row r is channel r % channels; 2: column c is channel c (cols == channels) */
    int64_t x_signed, y_signed;
} affine8_args;

typedef struct {            /* y[o, i] = sum over c of x[o, c, i]: 8-bit values summed exactly in int32 (a global
                               average pool's sums, channels first: inner 1; channels last: inner C) */
    int64_t outer, count, inner;
    const void *x;
    int32_t *y;
    int64_t is_signed;
    void *q;                /* NULL, or QLinearGlobalAveragePool's output [outer, inner]: saturate(round((y - count
                               xz) xs / (ys count)) + yz), as backends/cpu/quant/pool.py computes it */
    float xs, xz, ys, yz;
    int64_t q_signed;
    qsrc src;               /* xs, xz, ys, yz read at run time */
} sum8_args;

#endif
