/* The argument structs of csrc/strided.c (mirrored by ctxrt.backends.cpu.native's EwArgs, BatchArgs, DnnlArgs). */
#ifndef CTXRT_STRIDED_H
#define CTXRT_STRIDED_H
#include <stdint.h>

#define EW_RANK 6

enum { EW_COPY = 0, EW_ADD = 1, EW_SUB = 2, EW_MUL = 3, EW_DIV = 4, EW_NEG = 5, EW_WHERE = 6 };

typedef struct {            /* y = op(a, b) element by element over `shape`, every operand by its own strides */
    int64_t op;             /* EW_*: COPY and WHERE move elements of `size` bytes; the arithmetic is float32 */
    int64_t rank;           /* 1..EW_RANK (dims of size 1 dropped and contiguous runs merged by the caller) */
    int64_t size;           /* element bytes: 1, 2, 4 or 8 */
    int64_t shape[EW_RANK];
    void *y;
    const void *a, *b;      /* b: the second operand (ADD..DIV), WHERE's false branch; else NULL */
    const uint8_t *c;       /* WHERE's condition (bool bytes), else NULL */
    int64_t ys[EW_RANK], as[EW_RANK], bs[EW_RANK], cs[EW_RANK];  /* strides in elements (0: broadcast) */
} ew_args;

#define BMM_RANK 4

typedef struct {            /* y = a @ b (or a @ b^T) per batch index, float32, every operand by its strides */
    int64_t rank;           /* batch dims, 0..BMM_RANK */
    int64_t m, n, k;
    int64_t batch[BMM_RANK];
    const float *a, *b;
    float *y;
    int64_t as[BMM_RANK], bs[BMM_RANK], ys[BMM_RANK];  /* batch strides in elements (0: broadcast) */
    int64_t am, ak, bk, bn, ym, yn;  /* a[i am + p ak], b[p bk + j bn], y[i ym + j yn], in elements */
} bmm_args;

typedef struct {            /* ONNX Trilu over the last two dims: y = x, zeroed where j - i < k (upper) or > k */
    int64_t batch, rows, cols;
    int64_t size;           /* element bytes: 1, 2, 4 or 8 */
    int64_t upper;
    const int64_t *k;       /* the diagonal (an int64 scalar read at run time), or NULL: k_value */
    int64_t k_value;
    const void *x;
    void *y;                /* may be x itself (element for element) */
    int64_t xb, xr, xc, yb, yr, yc;  /* strides in elements: batch, row, column */
} trilu_args;

enum { RANGE_I64 = 0, RANGE_I32 = 1, RANGE_F32 = 2, RANGE_F64 = 3 };

typedef struct {            /* ONNX Range: y[i] = start + i delta, i < n */
    int64_t n, type;        /* RANGE_*: the type of start, delta and y */
    const void *start, *delta;  /* scalars read at run time, or NULL: the value below */
    void *y;
    int64_t start_i, delta_i;   /* the values of integer types (a launch's own constants: words of its struct) */
    double start_f, delta_f;    /* ... of float types */
} range_args;

typedef int (*native_fn)(const void *args);

typedef struct {            /* a run of native launches, one after another in one call */
    int64_t n;
    const native_fn *fns;
    const void *const *args;
    int64_t failed;         /* set to the index of the launch that returned non-zero (its status returned) */
} batch_args;

typedef int (*dnnl_execute_fn)(void *primitive, void *stream, int nargs, const void *args);

typedef struct {            /* dnnl_primitive_execute(primitive, stream, nargs, args) as a native launch */
    dnnl_execute_fn execute;
    void *primitive, *stream;
    int64_t nargs;
    const void *args;
} dnnl_args;

#endif
