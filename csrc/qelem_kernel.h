/* The kernel of csrc/qelem.c, included there once per instruction set (NAME(x): this copy's names). */

#define QADD_LOOP(T, START, COUNT, ADDEND)                                                                  \
    _Pragma("omp simd") for (int64_t i = START; i < START + COUNT; i++) {                                   \
        float t = nearbyintf((((float)a[i] - za) * sa + (ADDEND)) / sc) + zc;                               \
        t = t > lo ? t : lo;                                                                                 \
        t = t < hi ? t : hi;                                                                                 \
        y[i] = (T)t;                                                                                         \
    }

#define QADD_BODY(T)                                                                                        \
    {                                                                                                        \
        const T *restrict a = (const T *)p->a, *restrict b = (const T *)p->b;                              \
        const float *restrict fixed = p->fixed;                                                              \
        T *restrict y = (T *)p->y;                                                                           \
        const float sa = p->sa, za = p->za, sb = p->sb, zb = p->zb, sc = p->sc, zc = p->zc;              \
        const float lo = p->is_signed ? -128.0f : 0.0f, hi = p->is_signed ? 127.0f : 255.0f;              \
        if (fixed && p->period == 1) {                                                                       \
            const float f0 = fixed[0];                                                                       \
            QADD_LOOP(T, 0, p->n, f0)                                                                        \
        } else if (fixed && p->period) {                                                                     \
            const int64_t m = p->period;                                                                     \
            for (int64_t r0 = 0; r0 < p->n; r0 += m) QADD_LOOP(T, r0, m, fixed[i - r0])                      \
        } else if (fixed) {                                                                                  \
            QADD_LOOP(T, 0, p->n, fixed[i])                                                                  \
        } else {                                                                                             \
            QADD_LOOP(T, 0, p->n, ((float)b[i] - zb) * sb)                                                   \
        }                                                                                                    \
    }

#define QUANTIZE_BODY(T)                                                                                    \
    {                                                                                                        \
        T *restrict y = (T *)p->y;                                                                           \
        const float *restrict x = p->x;                                                                      \
        const float s = p->scale, zp = p->zp;                                                                \
        const float lo = p->is_signed ? -128.0f : 0.0f, hi = p->is_signed ? 127.0f : 255.0f;              \
        _Pragma("omp simd") for (int64_t i = 0; i < p->n; i++) {                                            \
            float t = nearbyintf(x[i] / s) + zp;                                                             \
            t = t > lo ? t : lo;                                                                             \
            t = t < hi ? t : hi;                                                                             \
            y[i] = (T)t;                                                                                     \
        }                                                                                                    \
    }

static void NAME(quantize)(const quantize_args *p) {
    if (p->is_signed) QUANTIZE_BODY(int8_t)
    else QUANTIZE_BODY(uint8_t)
}

#undef QUANTIZE_BODY

#define DEQUANTIZE_BODY(T)                                                                                  \
    {                                                                                                        \
        const T *restrict x = (const T *)p->x;                                                              \
        float *restrict y = p->y;                                                                            \
        const float s = p->scale, zp = p->zp;                                                                \
        _Pragma("omp simd") for (int64_t i = 0; i < p->n; i++) y[i] = ((float)x[i] - zp) * s;             \
    }

static void NAME(dequantize)(const dequantize_args *p) {
    if (p->is_signed) DEQUANTIZE_BODY(int8_t)
    else DEQUANTIZE_BODY(uint8_t)
}

#undef DEQUANTIZE_BODY

#define QMUL_LOOP(T, FACTOR)                                                                                \
    _Pragma("omp simd") for (int64_t i = 0; i < p->n; i++) {                                                \
        float t = nearbyintf((((float)a[i] - za) * (FACTOR)) * m) + zc;                                     \
        t = t > lo ? t : lo;                                                                                 \
        t = t < hi ? t : hi;                                                                                 \
        y[i] = (T)t;                                                                                         \
    }

#define QMUL_BODY(T)                                                                                        \
    {                                                                                                        \
        const T *restrict a = (const T *)p->a, *restrict b = (const T *)p->b;                              \
        T *restrict y = (T *)p->y;                                                                           \
        const float za = p->za, zb = p->zb, zc = p->zc, m = (p->sa * p->sb) / p->sc;                     \
        const float lo = p->is_signed ? -128.0f : 0.0f, hi = p->is_signed ? 127.0f : 255.0f;              \
        if (p->period == 1) {                                                                                \
            const float bb = (float)b[0] - zb;                                                               \
            QMUL_LOOP(T, bb)                                                                                 \
        } else {                                                                                             \
            QMUL_LOOP(T, ((float)b[i] - zb))                                                                 \
        }                                                                                                    \
    }

static void NAME(qmul)(const qadd_args *p) {
    if (p->is_signed) QMUL_BODY(int8_t)
    else QMUL_BODY(uint8_t)
}

#undef QMUL_BODY
#undef QMUL_LOOP

static void NAME(qadd)(const qadd_args *p) {
    if (p->is_signed) QADD_BODY(int8_t)
    else QADD_BODY(uint8_t)
}

#undef QADD_BODY
#undef QADD_LOOP
