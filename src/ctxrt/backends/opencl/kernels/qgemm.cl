/* Integer matrix products (QLinearMatMul, QGemm, MatMulInteger, MatMulIntegerToFloat, DynamicQuantizeMatMul),
 * batched like gemm.cl:
 *   acc[m, n] = sum_k (A[m, k] - za) * (B[k, n] - zb[n])            exact (the host checks it fits int32)
 *   MODE 0: Y = acc                                                (int32)
 *   MODE 1: Y = saturate(rint(float(acc + C) * mult[n]) + yz)       (8-bit, onnxruntime's requantization)
 *   MODE 2: Y = float(acc + C) * mult[n] (+ bias[n])                (float32)
 * with mult[n] = (alpha * a_scale) * b_scale[n] (/ y_scale), all in float32 as the NumPy kernels compute it
 * (the division correctly rounded: through double where the device has it). FP_CONTRACT is off, so the
 * multiply and the bias's add round separately, as NumPy's do. Scales and zero points are read from their
 * tensors as the kernel runs (constants or computed ones alike).
 *
 * The products of the vector paths are summed in float32 (FMAs: twice the rate of int32 multiplies on CPUs'
 * vector units), exactly: K is cut into chunks of KC steps, so short that every partial sum is an integer below
 * 2^24 (KC * max |a - za| |b - zb| <= 2^24: the host sizes it, a multiple of 16), each chunk's sums converted and
 * added to int32 accumulators. One chunk covers K up to 1024 for u8 activations centred at 128 against s8
 * weights, 256 at the types' extremes.
 *
 * Register-tiled as gemm.cl's LOCAL=0 paths (CPUs): a work-group computes a TM x TN tile of Y, each work-item
 * WM x WN outputs at rows ly + i * RM and columns lx + j * RN.
 * KV > 1 (A [M, K], B stored [N, K]: weights prepacked so for a few rows of A, or QGemm's transB): WM x WN dot
 * products of KV-wide vectors along K (the 8-bit values converted and centred on their zero points), summed at
 * the end of each chunk.
 * VN > 1 (B [K, N]: run-time B, attention's products, weights for 32 rows and more): each work-item's WN columns
 * are WN vectors of VN adjacent columns; per step of K, WN vector loads of B, WM values of A broadcast (loaded,
 * converted and centred KU at a time along K). A vector that would cross column N is loaded from N - VN instead
 * (N >= VN) and stores only the columns it owns.
 * KV = VN = 1: scalars in int32, any layout (A_T, B_T).
 *
 * Build options: TA TB (char or uchar), TY (int, char, uchar or float), MODE, A_T, B_T, HAS_AZ, HAS_BZ, BZ_COL
 * (zb per column), BS_COL (b_scale per column), HAS_YS (divide by y_scale), HAS_C (int32 C with strides scm,
 * scn), HAS_FB (float bias [N], MODE 2), YLO YHI (MODE 1's range), KC, FP64, DQ and DQ_WGS (DynamicQuantizeMatMul's
 * kernels, at the end), TM TN WM WN KV VN (tunable).
 */
#pragma OPENCL FP_CONTRACT OFF
#ifdef FP64
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
#define DIV(x, y) ((float)((double)(x) / (double)(y)))
#else
#define DIV(x, y) ((x) / (y))
#endif

#ifndef KU
#define KU 8
#endif
#define RM (TM / WM)
#define RN (TN / (WN * VN))
#if A_T
#define A_AT(m, k) A[(k) * lda + (m)]
#else
#define A_AT(m, k) A[(m) * lda + (k)]
#endif
#if B_T
#define B_AT(k, n) B[(n) * ldb + (k)]
#else
#define B_AT(k, n) B[(k) * ldb + (n)]
#endif
#define CAT(a, b) a##b
#define VEC(t, n) CAT(t, n)
#define VLOAD(n) CAT(vload, n)
#define VSTORE(n) CAT(vstore, n)
#define CVT_F(n) CAT(convert_float, n)
#define CVT_I(n) CAT(convert_int, n)
#define CVT_(t) CAT(convert_, t)
#define CVT_Y CVT_(TY)

#if HAS_BZ
#if BZ_COL
#define ZB(n) ((int)BZ[n])
#else
#define ZB(n) zb0
#endif
#else
#define ZB(n) 0
#endif

#if MODE > 0
#if BS_COL
#define SCALE(n) (sa * BS[n])
#else
#define SCALE(n) (sa * BS[0])
#endif
#if HAS_YS
#define MULT(n) DIV(SCALE(n), sy)
#else
#define MULT(n) SCALE(n)
#endif
#endif

#if HAS_C
#define ACC_F(m, n, acc) convert_float((long)(acc) + (long)C[(m) * scm + (n) * scn])
#else
#define ACC_F(m, n, acc) convert_float(acc)
#endif
#if HAS_FB
#define ADD_FB(t, n) t = t + FB[n];
#else
#define ADD_FB(t, n)
#endif
/* Y[m, n] from the accumulator and the column's multiplier */
#if MODE == 0
#define STORE(m, n, acc, mul) Y[(m) * N + (n)] = (acc);
#elif MODE == 1
#define STORE(m, n, acc, mul) { float t_ = rint(ACC_F(m, n, acc) * (mul)); t_ = t_ + yz;                    \
                                Y[(m) * N + (n)] = CVT_Y(fmin(fmax(t_, (float)YLO), (float)YHI)); }
#else
#define STORE(m, n, acc, mul) { float t_ = ACC_F(m, n, acc) * (mul); ADD_FB(t_, n) Y[(m) * N + (n)] = t_; }
#endif
#if MODE > 0
#define MUL_OF(n) MULT(n)
#else
#define MUL_OF(n) 0.0f
#endif

#define BATCH(c) { const int q = r / bdims.c; const int x = r - q * bdims.c; r = q; \
                   ba += (long)x * bsa.c; bb += (long)x * bsb.c; }

__kernel __attribute__((reqd_work_group_size(RN, RM, 1)))
void qgemm(const int M, const int N, const int K,
           __global const char* a_, const ulong oa, const int lda,
           __global const char* b_, const ulong ob, const int ldb,
           __global const char* az_, const ulong oaz, __global const char* bz_, const ulong obz,
           __global const char* as_, const ulong oas, __global const char* bs_, const ulong obs,
           __global const char* ys_, const ulong oys, __global const char* yz_, const ulong oyz,
           __global const char* c_, const ulong oc, const int scm, const int scn,
           __global const char* fb_, const ulong ofb,
           __global char* y_, const ulong oy, const float alpha,
           const int4 bdims, const int4 bsa, const int4 bsb)
{
    const int lx = get_local_id(0), ly = get_local_id(1);
    const int n0 = get_group_id(0) * TN, m0 = get_group_id(1) * TM;
    int r = get_global_id(2);
    long ba = 0, bb = 0;
    BATCH(s0) BATCH(s1) BATCH(s2) BATCH(s3)
    __global const TA* A = (__global const TA*)(a_ + oa) + ba;
    __global const TB* B = (__global const TB*)(b_ + ob) + bb;
    __global TY* Y = (__global TY*)(y_ + oy) + (long)get_global_id(2) * M * N;
#if HAS_AZ
    const int za = *(__global const TA*)(az_ + oaz);
#else
    const int za = 0;
#endif
#if HAS_BZ
    __global const TB* BZ = (__global const TB*)(bz_ + obz);
    const int zb0 = BZ[0];
#endif
#if MODE > 0
    __global const float* BS = (__global const float*)(bs_ + obs);
    const float sa = alpha * *(__global const float*)(as_ + oas);
#if HAS_YS
    const float sy = *(__global const float*)(ys_ + oys);
#endif
#endif
#if MODE == 1
    const float yz = (float)*(__global const TY*)(yz_ + oyz);
#endif
#if HAS_C
    __global const int* C = (__global const int*)(c_ + oc);
#endif
#if HAS_FB
    __global const float* FB = (__global const float*)(fb_ + ofb);
#endif

#if VN > 1
    /* B [K, N]: WN vectors of VN columns per work-item, starting at cols[j] (shifted back to stay inside N) */
    int rows[WM], cols[WN], own[WN];
#pragma unroll
    for (int i = 0; i < WM; i++) rows[i] = min(m0 + ly + i * RM, M - 1);
#pragma unroll
    for (int j = 0; j < WN; j++) { own[j] = n0 + (lx + j * RN) * VN; cols[j] = min(own[j], N - VN); }
    VEC(float, VN) zbv[WN];
    VEC(int, VN) iacc[WM][WN];
#pragma unroll
    for (int j = 0; j < WN; j++) {
#if HAS_BZ && BZ_COL
        zbv[j] = CVT_F(VN)(VLOAD(VN)(0, BZ + cols[j]));
#else
        zbv[j] = (VEC(float, VN))(ZB(0));
#endif
    }
#pragma unroll
    for (int i = 0; i < WM; i++)
#pragma unroll
        for (int j = 0; j < WN; j++)
            iacc[i][j] = (VEC(int, VN))(0);
    for (int kc = 0; kc < K; kc += KC) {
        const int ke = min(K, kc + KC);
        VEC(float, VN) vacc[WM][WN];
#pragma unroll
        for (int i = 0; i < WM; i++)
#pragma unroll
            for (int j = 0; j < WN; j++)
                vacc[i][j] = (VEC(float, VN))(0);
        int k = kc;
#if !A_T
        /* A's rows are contiguous along K: KU values of each loaded, converted and centred at once */
        for (; k + KU <= ke; k += KU) {
            float a_[WM][KU];
#pragma unroll
            for (int i = 0; i < WM; i++)
                VSTORE(KU)(CVT_F(KU)(VLOAD(KU)(0, A + rows[i] * lda + k)) - (float)za, 0, a_[i]);
#pragma unroll
            for (int kk = 0; kk < KU; kk++) {
                VEC(float, VN) bv[WN];
#pragma unroll
                for (int j = 0; j < WN; j++)
                    bv[j] = CVT_F(VN)(VLOAD(VN)(0, B + (k + kk) * ldb + cols[j])) - zbv[j];
#pragma unroll
                for (int i = 0; i < WM; i++) {
                    const VEC(float, VN) av = (VEC(float, VN))(a_[i][kk]);
#pragma unroll
                    for (int j = 0; j < WN; j++)
                        vacc[i][j] = fma(av, bv[j], vacc[i][j]);
                }
            }
        }
#endif
        for (; k < ke; k++) {
            VEC(float, VN) bv[WN];
#pragma unroll
            for (int j = 0; j < WN; j++) bv[j] = CVT_F(VN)(VLOAD(VN)(0, B + k * ldb + cols[j])) - zbv[j];
#pragma unroll
            for (int i = 0; i < WM; i++) {
                const VEC(float, VN) av = (VEC(float, VN))((float)((int)A_AT(rows[i], k) - za));
#pragma unroll
                for (int j = 0; j < WN; j++)
                    vacc[i][j] = fma(av, bv[j], vacc[i][j]);
            }
        }
#pragma unroll
        for (int i = 0; i < WM; i++)
#pragma unroll
            for (int j = 0; j < WN; j++)
                iacc[i][j] += CVT_I(VN)(vacc[i][j]);
    }
    for (int j = 0; j < WN; j++) {
        float mul[VN];
        for (int e = 0; e < VN; e++) mul[e] = MUL_OF(cols[j] + e);
        for (int i = 0; i < WM; i++) {
            const int m = m0 + ly + i * RM;
            if (m >= M) break;
            int t[VN];
            VSTORE(VN)(iacc[i][j], 0, t);
            for (int e = 0; e < VN; e++) {
                const int n = cols[j] + e;
                if (n >= own[j]) STORE(m, n, t[e], mul[e])
            }
        }
    }
#else
    int rows[WM], cols[WN];
    int acc[WM][WN];
#pragma unroll
    for (int i = 0; i < WM; i++) rows[i] = min(m0 + ly + i * RM, M - 1);
#pragma unroll
    for (int j = 0; j < WN; j++) cols[j] = min(n0 + lx + j * RN, N - 1);
    int zbs[WN];
#pragma unroll
    for (int j = 0; j < WN; j++) zbs[j] = ZB(cols[j]);
#pragma unroll
    for (int i = 0; i < WM; i++)
#pragma unroll
        for (int j = 0; j < WN; j++)
            acc[i][j] = 0;
    int k = 0;
#if KV > 1
    /* A [M, K] and B [N, K]: dot products of KV-wide vectors (row pointers hoisted, loops unrolled), per chunk of
     * K summed to ints */
    {
        __global const TA* ap[WM];
        __global const TB* bp[WN];
#pragma unroll
        for (int i = 0; i < WM; i++) ap[i] = A + rows[i] * lda;
#pragma unroll
        for (int j = 0; j < WN; j++) bp[j] = B + cols[j] * ldb;
        for (int kc = 0; kc + KV <= K; kc += KC) {
            const int ke = min(K, kc + KC);
            VEC(float, KV) vacc[WM][WN];
#pragma unroll
            for (int i = 0; i < WM; i++)
#pragma unroll
                for (int j = 0; j < WN; j++)
                    vacc[i][j] = (VEC(float, KV))(0);
            for (k = kc; k + KV <= ke; k += KV) {
                VEC(float, KV) av[WM], bv[WN];
#pragma unroll
                for (int i = 0; i < WM; i++) av[i] = CVT_F(KV)(VLOAD(KV)(0, ap[i] + k)) - (float)za;
#pragma unroll
                for (int j = 0; j < WN; j++) bv[j] = CVT_F(KV)(VLOAD(KV)(0, bp[j] + k)) - (float)zbs[j];
#pragma unroll
                for (int i = 0; i < WM; i++)
#pragma unroll
                    for (int j = 0; j < WN; j++)
                        vacc[i][j] = fma(av[i], bv[j], vacc[i][j]);
            }
#pragma unroll
            for (int i = 0; i < WM; i++)
#pragma unroll
                for (int j = 0; j < WN; j++) {
                    float t[KV];
                    VSTORE(KV)(vacc[i][j], 0, t);
                    float s = 0;
                    for (int e = 0; e < KV; e++) s += t[e];
                    acc[i][j] += convert_int(s);
                }
        }
    }
#endif
    for (; k < K; k++) {
        int av[WM], bv[WN];
        for (int i = 0; i < WM; i++) av[i] = (int)A_AT(rows[i], k) - za;
        for (int j = 0; j < WN; j++) bv[j] = (int)B_AT(k, cols[j]) - zbs[j];
        for (int i = 0; i < WM; i++)
            for (int j = 0; j < WN; j++)
                acc[i][j] += av[i] * bv[j];
    }
    float mul[WN];
    for (int j = 0; j < WN; j++) mul[j] = MUL_OF(cols[j]);
    for (int i = 0; i < WM; i++) {
        const int m = m0 + ly + i * RM;
        if (m >= M) break;
        for (int j = 0; j < WN; j++) {
            const int n = n0 + lx + j * RN;
            if (n < N) STORE(m, n, acc[i][j], mul[j])
        }
    }
#endif
}

#if DQ
/* DynamicQuantizeMatMul's A quantized to uint8 as DynamicQuantizeLinear does (backends/cpu/quant/gemm.py `_dynamic`):
 * dq_range, one work-group, writes P = [scale (float), zero point (uchar at byte 4)] over [min(x, 0), max(x, 0)];
 * dq_quantize writes Q = saturate(rint(x / scale) + zero point), read by qgemm as A with those parameters. */
__kernel __attribute__((reqd_work_group_size(DQ_WGS, 1, 1)))
void dq_range(const int n, __global const char* x_, const ulong ox, __global char* p_, const ulong op)
{
    __global const float* X = (__global const float*)(x_ + ox);
    __local float lo_[DQ_WGS], hi_[DQ_WGS];
    const int l = get_local_id(0);
    float lo = 0.0f, hi = 0.0f;
    for (int i = l; i < n; i += DQ_WGS) { lo = fmin(lo, X[i]); hi = fmax(hi, X[i]); }
    lo_[l] = lo;
    hi_[l] = hi;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = DQ_WGS / 2; s > 0; s >>= 1) {
        if (l < s) { lo_[l] = fmin(lo_[l], lo_[l + s]); hi_[l] = fmax(hi_[l], hi_[l + s]); }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (l == 0) {
        lo = lo_[0];
        hi = hi_[0];
        const float scale = hi == lo ? 1.0f : DIV(hi - lo, 255.0f);
        const float zp = rint(fmin(255.0f, fmax(0.0f, 0.0f - DIV(lo, scale))));
        *(__global float*)(p_ + op) = scale;
        *(__global uchar*)(p_ + op + 4) = convert_uchar(zp);
    }
}

__kernel void dq_quantize(const int n, __global const char* x_, const ulong ox, __global const char* p_,
                          const ulong op, __global char* q_, const ulong oq)
{
    const int i = get_global_id(0);
    if (i >= n) return;
    const float scale = *(__global const float*)(p_ + op);
    const float zp = (float)*(__global const uchar*)(p_ + op + 4);
    const float t = rint(DIV(((__global const float*)(x_ + ox))[i], scale)) + zp;
    ((__global uchar*)(q_ + oq))[i] = convert_uchar(fmin(fmax(t, 0.0f), 255.0f));
}
#endif
