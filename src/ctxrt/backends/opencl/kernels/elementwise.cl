/* Element-wise ops with broadcasting, all from ONE table (below). ctxrt's elementwise.py reads the table's
 * lines to learn each op's arity and the dtype kinds of its inputs, and builds one program per op, dtypes,
 * input read modes and tunable parameters.
 *
 * Build options:
 *   OP          the table entry, e.g. OP_Add
 *   NIN         number of inputs (1..3); T0, T1, T2 their OpenCL types; TO the output's
 *   M0, M1, M2  how input k is read: 0 at the output's index, 1 its only element, 2 through strides
 *   RANK        dims of the (collapsed) output shape, for inputs read through strides (1..8)
 *   VW          elements per work-item, a grid-stride apart: neighbouring work-items touch neighbouring
 *               elements (coalesced on GPUs, vectorised across work-items by PoCL)
 *   WGS         work-group size
 *   FP64        set when a type is double
 *   FAST_ERF    float32 erf and exact Gelu from erfc_pos below (vectorisable; PoCL's erf/erfc are scalar
 *               calls, 30x slower than exp), else the builtins (float64)
 *   H0 H1 H2 HO how input k and the output are stored: 0 as their type, 1 float16, 2 bfloat16. A half tensor is
 *               computed as float (its T is float): loaded with vload_half (core OpenCL: no cl_khr_fp16 needed)
 *               or as a float's high 16 bits, stored with vstore_half_rte or rounded to nearest even (NaN stays
 *               NaN) into a bfloat16. So Cast between float16, bfloat16 and the other types, and element-wise
 *               ops on a float16 model's half tensors and weights, run here.
 * Arguments: each input as (buffer, byte offset), the output too, the element count, two scalar parameters
 * p0 and p1 of the output type (Clip bounds, LeakyRelu alpha, HardSigmoid's and HardSwish's alpha and beta), the collapsed
 * dims and each input's element strides (int8 vectors; component s0 is the innermost dim).
 */
#ifdef FP64
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
#endif

/* ---- the table: `#define OP_<name>(inputs) expression  // kinds: <per input>` -------------------------
 * Inputs arrive in their own types; the result is converted to TO. Kinds: f float, i signed int,
 * u unsigned int, b bool, * any; one group applies to every input, else one comma-separated group each.
 * NaN propagates as NumPy's does: comparisons with NaN are false, so ternaries (not OpenCL's min/max, whose
 * result for NaN is undefined) pass it through; x != x is true only for NaN. Tails are exact: Gelu's tanh form
 * as x * sigmoid(2z), so that it is -0 (not 1 - tanh's rounding) far left. */
#define ATLEAST(x, lo)          ((x) < (lo) ? (lo) : (x))
#define CLIP(x, lo, hi)         (ATLEAST(x, lo) > (hi) ? (hi) : ATLEAST(x, lo))  /* min(max(x, lo), hi) */
#define OP_Relu(a)              ((a) < (T0)0 ? (T0)0 : (a))                            // kinds: fi
#define OP_Sigmoid(a)           ((T0)1 / ((T0)1 + exp(-(a))))                          // kinds: f
#define OP_Tanh(a)              tanh(a)                                                // kinds: f
#define OP_Exp(a)               exp(a)                                                 // kinds: f
#define OP_Log(a)               log(a)                                                 // kinds: f
#define OP_Sqrt(a)              sqrt(a)                                                // kinds: f
#define OP_Sin(a)               sin(a)                                                 // kinds: f
#define OP_Cos(a)               cos(a)                                                 // kinds: f
#define OP_Tan(a)               tan(a)                                                 // kinds: f
#define OP_Asin(a)              asin(a)                                                // kinds: f
#define OP_Acos(a)              acos(a)                                                // kinds: f
#define OP_Atan(a)              atan(a)                                                // kinds: f
#define OP_Sinh(a)              sinh(a)                                                // kinds: f
#define OP_Cosh(a)              cosh(a)                                                // kinds: f
#define OP_Asinh(a)             asinh(a)                                               // kinds: f
#define OP_Acosh(a)             acosh(a)                                               // kinds: f
#define OP_Atanh(a)             atanh(a)                                               // kinds: f
#define OP_Neg(a)               (-(a))                                                 // kinds: fi
#define OP_Abs(a)               ((a) < (T0)0 ? -(a) : (a))                             // kinds: fi
#define OP_Reciprocal(a)        ((T0)1 / (a))                                          // kinds: f
#define OP_Floor(a)             floor(a)                                               // kinds: f
#define OP_Ceil(a)              ceil(a)                                                // kinds: f
#define OP_Round(a)             rint(a)                                                // kinds: f
#define OP_Sign(a)              ((a) > (T0)0 ? (T0)1 : (a) < (T0)0 ? (T0)-1 : (a))     // kinds: fi
#define OP_Erf(a)               ERF(a)                                                 // kinds: f
#define OP_Gelu(a)              GELU(a)                                                // kinds: f
#define OP_GeluTanh(a)          ((a) / ((T0)1 + exp((T0)-1.5957691216057307118 * ((a) + (T0)0.044715 * (a) * (a) * (a)))))  // kinds: f
#define OP_Softplus(a)          (((a) > (T0)0 ? (a) : (T0)0) + log1p(exp(-fabs(a))))   // kinds: f
#define OP_LeakyRelu(a)         ((a) >= (T0)0 ? (a) : (a) * p0)                        // kinds: f
#define OP_HardSigmoid(a)       CLIP((a) * p0 + p1, (T0)0, (T0)1)                      // kinds: f
#define OP_HardSwish(a)         ((a) * CLIP((a) * p0 + p1, (T0)0, (T0)1))              // kinds: f
#define OP_Clip(a)              CLIP(a, p0, p1)                                        // kinds: fiu
#define OP_Not(a)               (!(a))                                                 // kinds: b
#define OP_IsNaN(a)             isnan(a)                                               // kinds: f
#define OP_Cast(a)              (a)                                                    // kinds: fiub
#define OP_CastBool(a)          ((a) != (T0)0)                                         // kinds: fiub
#define OP_Add(a, b)            ((a) + (b))                                            // kinds: fiu
#define OP_Sub(a, b)            ((a) - (b))                                            // kinds: fiu
#define OP_Mul(a, b)            ((a) * (b))                                            // kinds: fiu
#define OP_Div(a, b)            ((a) / (b))                                            // kinds: f
#define OP_Pow(a, b)            pow(a, (T0)(b))                                        // kinds: f,fi
#define OP_Max(a, b)            ((a) >= (b) || (a) != (a) ? (a) : (b))                 // kinds: fiu
#define OP_Min(a, b)            ((a) <= (b) || (a) != (a) ? (a) : (b))                 // kinds: fiu
#define OP_Equal(a, b)          ((a) == (b))                                           // kinds: fiub
#define OP_Less(a, b)           ((a) < (b))                                            // kinds: fiu
#define OP_Greater(a, b)        ((a) > (b))                                            // kinds: fiu
#define OP_LessOrEqual(a, b)    ((a) <= (b))                                           // kinds: fiu
#define OP_GreaterOrEqual(a, b) ((a) >= (b))                                           // kinds: fiu
#define OP_And(a, b)            ((a) && (b))                                           // kinds: b
#define OP_Or(a, b)             ((a) || (b))                                           // kinds: b
#define OP_Xor(a, b)            ((a) != (b))                                           // kinds: b
#define OP_BitwiseAnd(a, b)     ((a) & (b))                                            // kinds: iu
#define OP_BitwiseOr(a, b)      ((a) | (b))                                            // kinds: iu
#define OP_BitwiseXor(a, b)     ((a) ^ (b))                                            // kinds: iu
#define OP_Where(c, a, b)       ((c) ? (a) : (b))                                      // kinds: b,*,*
/* ---- end of the table -------------------------------------------------------------------------------- */

#if FAST_ERF
/* erfc(z) for z >= 0 with a fractional error below 1.2e-7 everywhere (Numerical Recipes' erfcc, Chebyshev
 * fitted): exp and a polynomial, no branch, so PoCL vectorises it like any arithmetic. */
inline float erfc_pos(const float z)
{
    const float t = 1.0f / (1.0f + 0.5f * z);
    const float p = -1.26551223f + t * (1.00002368f + t * (0.37409196f + t * (0.09678418f + t * (-0.18628806f
                    + t * (0.27886807f + t * (-1.13520398f + t * (1.48851587f + t * (-0.82215223f
                    + t * 0.17087277f))))))));
    return t * exp(p - z * z);
}
/* erf: its Taylor series below 0.5 (relative accuracy near 0), 1 - erfc above */
inline float fast_erf(const float x)
{
    const float a = fabs(x), x2 = x * x;
    const float small = x * (1.12837917f + x2 * (-0.37612639f + x2 * (0.11283792f + x2 * (-0.02686617f
                        + x2 * (0.00522398f + x2 * -0.00085483f)))));
    const float big = copysign(1.0f - erfc_pos(a), x);
    return a < 0.5f ? small : big;
}
/* x * Phi(x) = x * erfc(-x / sqrt2) / 2: the tail of each side without cancellation */
inline float fast_gelu(const float x)
{
    const float e = 0.5f * erfc_pos(fabs(x) * 0.70710678f);
    return x * (x < 0.0f ? e : 1.0f - e);
}
#define ERF(x) fast_erf(x)
#define GELU(x) fast_gelu(x)
#else
#define ERF(x) erf(x)
#define GELU(x) ((x) * (T0)0.5 * erfc((x) * (T0)-0.70710678118654752440))
#endif

#ifndef T1
#define T1 T0
#endif
#ifndef T2
#define T2 T0
#endif
#ifndef M1
#define M1 0
#endif
#ifndef M2
#define M2 0
#endif

/* input k stored as S_k, read as T_k by LD_k; the output stored as SO by ST */
#if H0 == 1
#define S0 half
#define LD0(p, i) vload_half(i, p)
#elif H0 == 2
#define S0 ushort
#define LD0(p, i) as_float((uint)(p)[i] << 16)
#else
#define S0 T0
#define LD0(p, i) (p)[i]
#endif
#if H1 == 1
#define S1 half
#define LD1(p, i) vload_half(i, p)
#elif H1 == 2
#define S1 ushort
#define LD1(p, i) as_float((uint)(p)[i] << 16)
#else
#define S1 T1
#define LD1(p, i) (p)[i]
#endif
#if H2 == 1
#define S2 half
#define LD2(p, i) vload_half(i, p)
#elif H2 == 2
#define S2 ushort
#define LD2(p, i) as_float((uint)(p)[i] << 16)
#else
#define S2 T2
#define LD2(p, i) (p)[i]
#endif
#if HO == 1
#define SO half
#define ST(p, i, v) vstore_half_rte(v, i, p)
#elif HO == 2
#define SO ushort
#define ST(p, i, v) ((p)[i] = to_bfloat16(v))
/* float -> bfloat16 rounded to nearest even, as NumPy's (ml_dtypes) astype: overflow to inf, NaN kept NaN */
inline ushort to_bfloat16(const float f)
{
    const uint u = as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (ushort)((u >> 16) | 0x40u);
    return (ushort)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
#else
#define SO TO
#define ST(p, i, v) ((p)[i] = (v))
#endif

#define IN(T, p, o) ((__global const T*)((__global const char*)(p) + (o)))
#define PICK(m, i, k) ((m) == 0 ? (i) : (m) == 1 ? 0u : (k))
#define ND (M0 == 2 || M1 == 2 || M2 == 2)
/* input positions of output element r, from the innermost dim out: dims and strides are int8 components */
#define DIM(d, c) if (RANK > d) { uint q = r / (uint)dims.c; uint x = r - q * (uint)dims.c; r = q; \
                                  k0 += x * (uint)st0.c; k1 += x * (uint)st1.c; k2 += x * (uint)st2.c; }

__kernel __attribute__((reqd_work_group_size(WGS, 1, 1)))
void elementwise(__global const char* x0, const ulong o0,
                 __global const char* x1, const ulong o1,
                 __global const char* x2, const ulong o2,
                 __global char* y, const ulong oy, const uint n, const TO p0, const TO p1,
                 const int8 dims, const int8 st0, const int8 st1, const int8 st2)
{
    __global const S0* a = IN(S0, x0, o0);
    __global const S1* b = IN(S1, x1, o1);
    __global const S2* c = IN(S2, x2, o2);
    __global SO* out = (__global SO*)(y + oy);
    const uint stride = (uint)get_global_size(0);
    for (uint v = 0; v < VW; v++) {
        const uint i = (uint)get_global_id(0) + v * stride;
        if (i >= n) return;
        uint k0 = 0, k1 = 0, k2 = 0;
#if ND
        uint r = i;
        DIM(0, s0) DIM(1, s1) DIM(2, s2) DIM(3, s3) DIM(4, s4) DIM(5, s5) DIM(6, s6) DIM(7, s7)
#endif
#if NIN == 1
        ST(out, i, (TO)(OP(LD0(a, PICK(M0, i, k0)))));
#elif NIN == 2
        ST(out, i, (TO)(OP(LD0(a, PICK(M0, i, k0)), LD1(b, PICK(M1, i, k1)))));
#else
        ST(out, i, (TO)(OP(LD0(a, PICK(M0, i, k0)), LD1(b, PICK(M1, i, k1)), LD2(c, PICK(M2, i, k2)))));
#endif
    }
}
