/* QuantizeLinear and DequantizeLinear per tensor between float32 and 8 bits, and onnxruntime's QLinearAdd and
   QLinearMul (com.microsoft) on 8-bit tensors of one shape, each in one pass. QLinearAdd: C = saturate(round_half_even(
   (A_scale (A - A_zp) + B_scale (B - B_zp)) / C_scale) + C_zp), the float32 operations in the order of ctxrt's
   NumPy kernel (backends/cpu/quant/elementwise.py), so both give the same bytes (ISO C: no contraction into
   FMAs). A transformer's residual adds in a QDQ model: ~30 us in NumPy's eight passes at 64 x 512. */

#include <math.h>
#include <stdint.h>
#include <string.h>
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

#include "qelem.h"

#define NAME(x) x##_c
#include "qelem_kernel.h"
#undef NAME

#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#define QELEM_AVX2 1
#define NAME(x) x##_avx2
#include "qelem_kernel.h"
#undef NAME
#undef QELEM_AVX2
#pragma GCC pop_options

static int avx2(void) { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }
#else
static int avx2(void) { return 0; }
#define qadd_avx2 qadd_c
#define quantize_avx2 quantize_c
#define dequantize_avx2 dequantize_c
#define qmul_avx2 qmul_c
#define qmatmul_avx2 qmatmul_c
#define igemm_avx2 igemm_c
#define minmax_avx2 minmax_c
#define affine8_avx2 affine8_c
#endif

/* the arguments with their run-time scale and zero point read (qsrc) */
static linear8_args linear8_resolved(const linear8_args *args) {
    linear8_args q = *args;
    float v[2] = {q.scale, q.zp};
    qsrc_read(&args->src, v, 2);
    q.scale = v[0], q.zp = v[1];
    return q;
}

/* QuantizeLinear per tensor, float32 to 8 bits: saturate(round_half_even(x / scale) + zero_point), as
   backends/cpu/quant/linear.py computes it */
int ctxrt_quantize(const linear8_args *args) {
    const linear8_args q = linear8_resolved(args), *p = &q;
    if (avx2()) quantize_avx2(p);
    else quantize_c(p);
    return 0;
}

/* QLinearMatMul per tensor on 8 bits where float32 sums are exact (an attention's activation x activation
   products): the same values as backends/cpu/quant/gemm.py's float32 GEMM and requantization */
int ctxrt_qmatmul(const qmatmul_args *p) {
    if (avx2()) qmatmul_avx2(p);
    else qmatmul_c(p);
    return 0;
}

/* MatMulInteger of 8-bit A and B (zero points per tensor, B's also per column): the int32 products exact, from
   int16 pairs (vpmaddwd): both operands widened and centred once into the work buffers, 4 rows by 16 columns at a
   time (backends/cpu/quant/gemm.py) */
int ctxrt_igemm(const igemm_args *p) {
    if (avx2()) igemm_avx2(p);
    else igemm_c(p);
    return 0;
}

/* the smallest and the largest of n >= 1 floats (DynamicQuantizeLinear's range), NaN where one is NaN */
int ctxrt_minmax(const float *x, int64_t n, float *out) {
    if (avx2()) minmax_avx2(x, n, out);
    else minmax_c(x, n, out);
    return 0;
}

/* DynamicQuantizeLinear in one call: the range, the scale and zero point as backends/cpu/quant/linear.py computes
   them in float32 (a NaN in x leaves the range's ends at 0, as Python's min and max there), then the quantization */
int ctxrt_dynquant(const dynquant_args *p) {
    float span[2] = {0.0f, 0.0f};
    if (p->n > 0) ctxrt_minmax(p->x, p->n, span);
    const float lo = span[0] < 0.0f ? span[0] : 0.0f, hi = span[1] > 0.0f ? span[1] : 0.0f;
    const float scale = hi == lo ? 1.0f : (hi - lo) / 255.0f;
    float z = 0.0f - lo / scale;
    z = z > 0.0f ? z : 0.0f;
    z = nearbyintf(z < 255.0f ? z : 255.0f);
    *p->scale = scale;
    *p->zp = (uint8_t)z;
    linear8_args q;
    memset(&q, 0, sizeof q);
    q.n = p->n, q.x = p->x, q.y = p->y, q.scale = scale, q.zp = z, q.is_signed = 0;
    return ctxrt_quantize(&q);
}

/* DequantizeLinear per tensor, 8 bits to float32: (x - zero_point) * scale */
int ctxrt_dequantize(const linear8_args *args) {
    const linear8_args q = linear8_resolved(args), *p = &q;
    if (avx2()) dequantize_avx2(p);
    else dequantize_c(p);
    return 0;
}

int ctxrt_qadd(const qadd_args *args) {
    qadd_args q = *args;
    const qadd_args *p = &q;
    float v[6] = {q.sa, q.za, q.sb, q.zb, q.sc, q.zc};
    qsrc_read(&args->src, v, 6);
    q.sa = v[0], q.za = v[1], q.sb = v[2], q.zb = v[3], q.sc = v[4], q.zc = v[5];
    if (p->mul) {
        if (avx2()) qmul_avx2(p);
        else qmul_c(p);
    } else if (avx2()) {
        qadd_avx2(p);
    } else {
        qadd_c(p);
    }
    return 0;
}

/* y rows = lut[x rows]: a requantization (or any function) of 8-bit values as a 256-byte table, computed by the
   caller; a copy where the table is the identity (QLinearConcat's part whose parameters are the output's) */
int ctxrt_lut8(const lut8_args *p) {
    int identity = 1;
    for (int v = 0; v < 256 && identity; v++) identity = p->lut[v] == v;
    for (int64_t r = 0; r < p->rows; r++) {
        const uint8_t *x = p->x + r * p->ldx;
        uint8_t *y = p->y + r * p->ldy;
        if (identity) {
            memcpy(y, x, (size_t)p->cols);
            continue;
        }
        for (int64_t c = 0; c < p->cols; c++) y[c] = p->lut[x[c]];
    }
    return 0;
}

/* y = saturate(round_half_even(x a[ch] + b[ch])) over 8-bit x and y (a QDQ unit's BatchNormalization) */
int ctxrt_affine8(const affine8_args *p) {
    if (avx2()) affine8_avx2(p);
    else affine8_c(p);
    return 0;
}

#define SUM8_BODY(T)                                                                                        \
    for (int64_t o = 0; o < p->outer; o++) {                                                                 \
        const T *x = (const T *)p->x + o * p->count * p->inner;                                             \
        int32_t *y = p->y + o * p->inner;                                                                    \
        if (p->inner == 1) {                                                                                 \
            int32_t t = 0;                                                                                   \
            for (int64_t c = 0; c < p->count; c++) t += x[c];                                                \
            y[0] = t;                                                                                        \
            continue;                                                                                        \
        }                                                                                                    \
        for (int64_t i = 0; i < p->inner; i++) y[i] = 0;                                                     \
        for (int64_t c = 0; c < p->count; c++)                                                               \
            for (int64_t i = 0; i < p->inner; i++) y[i] += x[c * p->inner + i];                              \
    }

/* y[o, i] = sum over c of x[o, c, i], 8-bit x summed exactly in int32 (count < 2^31 / 255); then, q given, the
   global average pool's requantization: the float64 difference (exact) rounded to float32, times xs / (ys count)
   in float32, rounded half to even, offset, saturated */
int ctxrt_sum8(const sum8_args *args) {
    sum8_args q = *args;
    const sum8_args *p = &q;
    float v[4] = {q.xs, q.xz, q.ys, q.yz};
    qsrc_read(&args->src, v, 4);
    q.xs = v[0], q.xz = v[1], q.ys = v[2], q.yz = v[3];
    if (p->is_signed) { SUM8_BODY(int8_t) }
    else { SUM8_BODY(uint8_t) }
    if (!p->q) return 0;
    const float mult = p->xs / (p->ys * (float)p->count);
    const float lo = p->q_signed ? -128.0f : 0.0f, hi = p->q_signed ? 127.0f : 255.0f;
    const double shift = (double)p->xz * (double)p->count;
    for (int64_t j = 0; j < p->outer * p->inner; j++) {
        float t = nearbyintf((float)((double)p->y[j] - shift) * mult) + p->yz;
        t = t > lo ? t : lo;
        t = t < hi ? t : hi;
        if (p->q_signed) ((int8_t *)p->q)[j] = (int8_t)t;
        else ((uint8_t *)p->q)[j] = (uint8_t)t;
    }
    return 0;
}
