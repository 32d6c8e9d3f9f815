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
