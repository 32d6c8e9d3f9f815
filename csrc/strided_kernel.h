/* The inner loops of csrc/strided.c, compiled once per instruction set (NAME(x) gives each its own name). One row:
   n elements along the innermost dim, each operand at its own stride. Contiguous and broadcast operands get loops
   the compiler vectorizes; ISO C's float arithmetic (no contraction) gives NumPy's bytes. */

#define ARITH_ROW(OPNAME, EXPR)                                                                                  \
    static void NAME(OPNAME)(float *y, const float *a, const float *b, int64_t n, int64_t ys, int64_t as,       \
                             int64_t bs) {                                                                      \
        if (ys == 1 && as == 1 && bs == 1) {                                                                    \
            _Pragma("omp simd") for (int64_t i = 0; i < n; i++) { float x = a[i], z = b[i]; y[i] = EXPR; }      \
        } else if (ys == 1 && as == 1 && bs == 0) {                                                             \
            const float z = b[0];                                                                               \
            _Pragma("omp simd") for (int64_t i = 0; i < n; i++) { float x = a[i]; y[i] = EXPR; }                \
        } else if (ys == 1 && as == 0 && bs == 1) {                                                             \
            const float x = a[0];                                                                               \
            _Pragma("omp simd") for (int64_t i = 0; i < n; i++) { float z = b[i]; y[i] = EXPR; }                \
        } else {                                                                                                \
            for (int64_t i = 0; i < n; i++) { float x = a[i * as], z = b[i * bs]; y[i * ys] = EXPR; }           \
        }                                                                                                       \
    }

ARITH_ROW(add_row, x + z)
ARITH_ROW(sub_row, x - z)
ARITH_ROW(mul_row, x * z)
ARITH_ROW(div_row, x / z)
#undef ARITH_ROW

static void NAME(neg_row)(float *y, const float *a, int64_t n, int64_t ys, int64_t as) {
    if (ys == 1 && as == 1) {
        _Pragma("omp simd") for (int64_t i = 0; i < n; i++) y[i] = -a[i];
    } else {
        for (int64_t i = 0; i < n; i++) y[i * ys] = -a[i * as];
    }
}

/* y[j] = sum_p a[p] b[p, j] over a row of n outputs, b's rows `bk` apart and contiguous (attention's weights
   times V): n-wide multiply-adds the compiler vectorizes, in p order (as a GEMM's k loop). */
static void NAME(bmm_axpy_row)(float *y, const float *a, int64_t ak, const float *b, int64_t bk, int64_t n,
                              int64_t k) {
    for (int64_t j = 0; j < n; j++) y[j] = 0.0f;
    for (int64_t p = 0; p < k; p++) {
        const float x = a[p * ak];
        const float *row = b + p * bk;
        _Pragma("omp simd") for (int64_t j = 0; j < n; j++) y[j] += x * row[j];
    }
}

/* y[j * yn] = dot(a, b's row j) for n rows `bn` apart, a and each row contiguous over k (Q times K^T). */
static void NAME(bmm_dot_row)(float *y, int64_t yn, const float *a, const float *b, int64_t bn, int64_t n,
                             int64_t k) {
    for (int64_t j = 0; j < n; j++) {
        const float *row = b + j * bn;
        float acc = 0.0f;
        _Pragma("omp simd reduction(+:acc)") for (int64_t p = 0; p < k; p++) acc += a[p] * row[p];
        y[j * yn] = acc;
    }
}
