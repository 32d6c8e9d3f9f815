/* Vector math for the AVX2 copy of a kernel header (included inside its #pragma GCC target region, once per
   translation unit: by gqa_kernel.h in csrc/genai.c, by gemv_kernel.h in csrc/gemv.c; NAME(x) names this copy's
   functions): e^x, erf and the activations a GEMM's epilogue fuses, 8 lanes at a time. */

/* e^x for 8 lanes of x <= 0 (a softmax's x - max): Cephes' expf, x = n ln2 + r, a degree-5 polynomial in r, then
   2^n in the exponent bits; within 2 ulp of expf, x below -87 taken as -87 (e^-87 ~ 1.6e-38, beside the max's 1) */
static inline __m256 NAME(exp8)(__m256 x) {
    x = _mm256_max_ps(_mm256_set1_ps(-87.0f), x);  /* a NaN stays NaN (maxps returns its second operand) */
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    x = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    x = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), x);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

/* e^t for 8 lanes, as float32 expf gives it: Cephes' expf (exp8) up to 88, e^88 * e^(t - 88) up to 88.72, inf
   above; below -87 e^-87 (~1e-38 beside 1); NaN kept (minps and maxps return their second operand on a NaN) */
static inline __m256 NAME(exp8_full)(__m256 t) {
    const __m256 cap = _mm256_set1_ps(88.0f);
    const __m256 over = _mm256_cmp_ps(t, _mm256_set1_ps(88.72283935546875f), _CMP_GT_OQ);
    __m256 e = NAME(exp8)(_mm256_min_ps(cap, t));
    e = _mm256_mul_ps(e, NAME(exp8)(_mm256_max_ps(_mm256_sub_ps(t, cap), _mm256_setzero_ps())));
    return _mm256_blendv_ps(e, _mm256_set1_ps(INFINITY), over);
}

/* e^t for 8 lanes held to [e^-87, e^88] (an activation's 1 / (1 + e^t) or 2 / (e^t + 1), within 1e-38 of its limit
   past those either way): one exp8, not exp8_full's two */
static inline __m256 NAME(exp8_held)(__m256 t) { return NAME(exp8)(_mm256_min_ps(_mm256_set1_ps(88.0f), t)); }

/* erf for 8 lanes: the faithfully rounded float approximation of N. Juffa (max error ~1 ulp), a polynomial in x^2
   up to |x| 0.927734375 and 1 - e^(polynomial in |x|) above, the sign copied back; NaN gives NaN */
static inline __m256 NAME(erf8)(__m256 a) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256 t = _mm256_andnot_ps(sign, a), s = _mm256_mul_ps(a, a);
    __m256 r = _mm256_set1_ps(-5.96761703e-4f);  /* |a| <= 0.927734375 */
    r = _mm256_fmadd_ps(r, s, _mm256_set1_ps(4.99119423e-3f));
    r = _mm256_fmadd_ps(r, s, _mm256_set1_ps(-2.67681349e-2f));
    r = _mm256_fmadd_ps(r, s, _mm256_set1_ps(1.12819925e-1f));
    r = _mm256_fmadd_ps(r, s, _mm256_set1_ps(-3.76125336e-1f));
    r = _mm256_fmadd_ps(r, s, _mm256_set1_ps(1.28379166e-1f));
    const __m256 small = _mm256_fmadd_ps(r, a, a);
    __m256 b = _mm256_fmadd_ps(_mm256_set1_ps(-1.72853470e-5f), t, _mm256_set1_ps(3.83197126e-4f));
    const __m256 u = _mm256_fmadd_ps(_mm256_set1_ps(-3.88396438e-3f), t, _mm256_set1_ps(2.42546219e-2f));
    b = _mm256_fmadd_ps(b, s, u);
    b = _mm256_fmadd_ps(b, t, _mm256_set1_ps(-1.06777877e-1f));
    b = _mm256_fmadd_ps(b, t, _mm256_set1_ps(-6.34846687e-1f));
    b = _mm256_fmadd_ps(b, t, _mm256_set1_ps(-1.28717512e-1f));
    b = _mm256_fmadd_ps(b, t, _mm256_sub_ps(_mm256_setzero_ps(), t));
    b = _mm256_sub_ps(_mm256_set1_ps(1.0f), NAME(exp8)(b));  /* exp8 holds its argument to >= -87: 1 - ~0 */
    b = _mm256_or_ps(b, _mm256_and_ps(sign, a));
    return _mm256_blendv_ps(small, b, _mm256_cmp_ps(t, _mm256_set1_ps(0.927734375f), _CMP_GT_OQ));
}

/* erfc(x + dx) for 8 lanes, relative accuracy kept in the tail (N. Juffa's erfcf, max error ~3 ulp): for a = |x|,
   (p(q) + 1) / (1 + 2a) approximates e^(a^2) erfc(a), q = (a - 2) / (a + 2), then times e^(-a^2) (its rounding
   error compensated); dx (the rounding error of an argument computed in float32, sign with |x|) corrects to
   first order, erfc'(a) / erfc(a) = -2 / sqrt(pi) / (e^(a^2) erfc(a)); 2 - erfc(|x|) for x < 0; past 10.0546875
   erfc is 0 in float32; NaN gives NaN */
static inline __m256 NAME(erfc8)(__m256 x, __m256 dx) {
    const __m256 one = _mm256_set1_ps(1.0f), two = _mm256_set1_ps(2.0f);
    const __m256 a = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x);
    const __m256 m = _mm256_sub_ps(a, two), pp = _mm256_add_ps(a, two);
    __m256 r = _mm256_div_ps(one, pp);
    __m256 q = _mm256_mul_ps(m, r);
    __m256 t = _mm256_fmadd_ps(_mm256_add_ps(q, one), _mm256_set1_ps(-2.0f), a);
    __m256 e = _mm256_fmadd_ps(q, _mm256_sub_ps(_mm256_setzero_ps(), a), t);
    q = _mm256_fmadd_ps(r, e, q);
    __m256 p = _mm256_set1_ps(-0x1.a4a000p-12f);
    p = _mm256_fmadd_ps(p, q, _mm256_set1_ps(-0x1.42a260p-10f));
    p = _mm256_fmadd_ps(p, q, _mm256_set1_ps(0x1.585714p-10f));
    p = _mm256_fmadd_ps(p, q, _mm256_set1_ps(0x1.1adcc4p-07f));
    p = _mm256_fmadd_ps(p, q, _mm256_set1_ps(-0x1.081b82p-07f));
    p = _mm256_fmadd_ps(p, q, _mm256_set1_ps(-0x1.bc0b6ap-05f));
    p = _mm256_fmadd_ps(p, q, _mm256_set1_ps(0x1.4ffc46p-03f));
    p = _mm256_fmadd_ps(p, q, _mm256_set1_ps(-0x1.540840p-03f));
    p = _mm256_fmadd_ps(p, q, _mm256_set1_ps(-0x1.7bf616p-04f));
    p = _mm256_fmadd_ps(p, q, _mm256_set1_ps(0x1.1ba03ap-02f));
    const __m256 d = _mm256_add_ps(a, _mm256_set1_ps(0.5f));
    r = _mm256_mul_ps(_mm256_div_ps(one, d), _mm256_set1_ps(0.5f));
    q = _mm256_fmadd_ps(p, r, r);
    t = _mm256_add_ps(q, q);
    e = _mm256_add_ps(_mm256_sub_ps(p, q), _mm256_fmadd_ps(t, _mm256_sub_ps(_mm256_setzero_ps(), a), one));
    r = _mm256_fmadd_ps(e, r, q);
    const __m256 corr = _mm256_fnmadd_ps(_mm256_div_ps(_mm256_set1_ps(1.12837916709551257f), r), dx, one);
    const __m256 s = _mm256_mul_ps(a, a);
    e = NAME(exp8_full)(_mm256_sub_ps(_mm256_setzero_ps(), s));
    t = _mm256_fmadd_ps(a, _mm256_sub_ps(_mm256_setzero_ps(), a), s);
    r = _mm256_mul_ps(r, e);
    r = _mm256_fmadd_ps(r, _mm256_sub_ps(_mm256_setzero_ps(), t), r);
    r = _mm256_mul_ps(r, corr);
    r = _mm256_andnot_ps(_mm256_cmp_ps(a, _mm256_set1_ps(10.0546875f), _CMP_GT_OQ), r);
    r = _mm256_blendv_ps(r, _mm256_sub_ps(two, r), _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_LT_OQ));
    return _mm256_blendv_ps(r, _mm256_add_ps(x, x), _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

/* a fused activation of 8 lanes, as gemv_args.act numbers them: 1 Relu, 2 GELU (erf), 3 GELU (tanh), 4 SiLU,
   5 GELU as x erfc(-x / sqrt 2) / 2 (the GELU op's: relative accuracy kept in the negative tail), 6 erf (the Erf
   op's), 11 Sigmoid, 12 Tanh (the ops'; 7 .. 10 are gemv_args' parameterized ones) */
static inline __m256 NAME(act8)(__m256 v, int act) {
    const __m256 one = _mm256_set1_ps(1.0f), half = _mm256_set1_ps(0.5f);
    switch (act) {
    case 1: return _mm256_max_ps(v, _mm256_setzero_ps());
    case 2: return _mm256_mul_ps(_mm256_mul_ps(half, v),
                                 _mm256_add_ps(one, NAME(erf8)(_mm256_mul_ps(v, _mm256_set1_ps(0.70710678118654752f)))));
    case 3: {  /* tanh(z) = 1 - 2 / (e^2z + 1); e^2z past 88.72 is inf, tanh 1 */
        const __m256 z = _mm256_mul_ps(_mm256_set1_ps(0.79788456080286536f),
                                       _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(0.044715f), v), _mm256_mul_ps(v, v), v));
        const __m256 e = NAME(exp8_held)(_mm256_add_ps(z, z));
        const __m256 th = _mm256_sub_ps(one, _mm256_div_ps(_mm256_set1_ps(2.0f), _mm256_add_ps(e, one)));
        return _mm256_mul_ps(_mm256_mul_ps(half, v), _mm256_add_ps(one, th));
    }
    case 4: {  /* past -v = 88, -0 (v / e^-v underflows; v / e^88 would not, for v as low as -1e30, or -inf) */
        const __m256 nv = _mm256_sub_ps(_mm256_setzero_ps(), v);
        const __m256 r = _mm256_div_ps(v, _mm256_add_ps(one, NAME(exp8_held)(nv)));
        return _mm256_blendv_ps(r, _mm256_set1_ps(-0.0f), _mm256_cmp_ps(nv, _mm256_set1_ps(88.0f), _CMP_GT_OQ));
    }
    case 5: {  /* z = -v / sqrt 2 and its rounding error (1 / sqrt 2 = c_hi + c_lo), the sign of |z| */
        const __m256 ch = _mm256_set1_ps(-0.707106769084930419921875f), cl = _mm256_set1_ps(-1.2101617e-8f);
        const __m256 z = _mm256_mul_ps(v, ch);
        const __m256 dz = _mm256_fmadd_ps(v, cl, _mm256_fmsub_ps(v, ch, z));
        const __m256 neg = _mm256_and_ps(z, _mm256_set1_ps(-0.0f));
        const __m256 c = NAME(erfc8)(z, _mm256_xor_ps(dz, neg));
        /* erfc 0 (v -> -inf): 0, not -inf x 0 */
        return _mm256_andnot_ps(_mm256_cmp_ps(c, _mm256_setzero_ps(), _CMP_EQ_OQ), _mm256_mul_ps(_mm256_mul_ps(half, v), c));
    }
    case 6: return NAME(erf8)(v);
    case 11: {  /* past -v = 88, 0 (as e^-v overflowing to inf gives it) */
        const __m256 nv = _mm256_sub_ps(_mm256_setzero_ps(), v);
        const __m256 r = _mm256_div_ps(one, _mm256_add_ps(one, NAME(exp8_held)(nv)));
        return _mm256_andnot_ps(_mm256_cmp_ps(nv, _mm256_set1_ps(88.0f), _CMP_GT_OQ), r);
    }
    case 12: {  /* tanh: |v| < 1/4 its series to v^9 (relative accuracy near 0), else 1 - 2 / (e^2|v| + 1), signed */
        const __m256 sign = _mm256_and_ps(v, _mm256_set1_ps(-0.0f)), a = _mm256_xor_ps(v, sign);
        const __m256 e = NAME(exp8_held)(_mm256_add_ps(a, a));
        const __m256 big = _mm256_or_ps(_mm256_sub_ps(one, _mm256_div_ps(_mm256_set1_ps(2.0f), _mm256_add_ps(e, one))), sign);
        const __m256 v2 = _mm256_mul_ps(v, v);
        __m256 q = _mm256_fmadd_ps(v2, _mm256_set1_ps(62.0f / 2835.0f), _mm256_set1_ps(-17.0f / 315.0f));
        q = _mm256_fmadd_ps(q, v2, _mm256_set1_ps(2.0f / 15.0f));
        q = _mm256_fmadd_ps(q, v2, _mm256_set1_ps(-1.0f / 3.0f));
        const __m256 small = _mm256_fmadd_ps(_mm256_mul_ps(q, v2), v, v);
        return _mm256_blendv_ps(big, small, _mm256_cmp_ps(a, _mm256_set1_ps(0.25f), _CMP_LT_OQ));
    }
    default: return v;
    }
}
