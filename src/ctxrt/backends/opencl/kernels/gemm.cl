/* Batched GEMM for Gemm and MatMul: Y[b] = act(alpha * A[b] @ B[b] + beta * C + R[b]).
 *
 * Register-tiled: a work-group computes a TM x TN tile of Y, each work-item WM x WN outputs of it, at rows
 * ly + i * RM and columns lx + j * RN (RM = TM / WM and RN = TN / WN work-items per dim), so neighbouring
 * work-items touch neighbouring columns (coalesced on GPUs, vectorised across work-items by PoCL).
 * LOCAL=1 stages TM x TK of A and TK x TN of B in local memory per step of K (GPUs); LOCAL=0 reads A and B
 * from global memory and relies on caches (CPUs). Odd sizes: rows and columns past M and N are clamped on
 * load and never stored; K is bound-checked.
 *
 * KV > 1 (with LOCAL=0, A [M, K] and B [N, K]: NT GEMMs, GEMVs against stored weights) accumulates dot
 * products of KV-wide vectors along K instead, both operands read contiguously by each work-item.
 * VN > 1 (with LOCAL=0, B [K, N]: NN GEMMs, attention's batched products; the CPU's micro-kernel) makes each
 * work-item's WN columns WN vectors of VN adjacent columns: per step of K, WN vector loads of B, WM scalars of
 * A broadcast, WM x WN vector FMAs (RN = TN / (WN * VN) work-items per row of the tile). A vector that would
 * cross column N is loaded from N - VN instead (N >= VN) and stores only the columns it owns.
 *
 * Build options: T (float or double), TM TN TK WM WN LOCAL KV VN (tunable), A_T (A stored [K, M]), B_T (B stored
 * [N, K]), HAS_C (add beta * C, C read with strides scm, scn: 0 where it broadcasts; a MatMul's folded bias),
 * HAS_R (add R, a residual of Y's shape), ACT (fused activation: 0 none, 1 Relu, 2 Gelu, 3 Gelu's tanh form),
 * FP64, WTYPE (B stored as T, float16 or bfloat16: halfload.clh; a float16 model's weights, read as float).
 * Batches: get_global_id(2) over up to 4 dims (int4 bdims, s0 innermost) with the
 * element strides of A and B per batch dim (0 where they broadcast); Y is contiguous.
 */
#ifdef FP64
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
#endif

#ifndef VN
#define VN 1
#endif
#include "halfload.clh"
#define RM (TM / WM)
#define RN (TN / (WN * VN))
#if A_T
#define A_AT(m, k) A[(k) * lda + (m)]
#else
#define A_AT(m, k) A[(m) * lda + (k)]
#endif
#if B_T
#define B_AT(k, n) WLOAD(B, (n) * ldb + (k))
#else
#define B_AT(k, n) WLOAD(B, (k) * ldb + (n))
#endif
#define CAT(a, b) a##b
#define VEC(t, n) CAT(t, n)
#define VLOAD(n) CAT(vload, n)
#define VSTORE(n) CAT(vstore, n)
#if KV == 4
#define HSUM(v) dot(v, (VEC(T, 4))(1))
#elif KV == 8
#define HSUM(v) dot((v).lo + (v).hi, (VEC(T, 4))(1))
#elif KV == 16
#define HSUM(v) dot((v).lo.lo + (v).lo.hi + (v).hi.lo + (v).hi.hi, (VEC(T, 4))(1))
#endif
/* The epilogue works on EW-wide vectors (the VN columns of a vector accumulator, or a work-item's WN scalar
 * columns gathered), so its activation is vectorised like any arithmetic: act(alpha * v + beta * C + R). */
#if VN > 1
#define EW VN
#else
#define EW WN
#endif
#if EW == 1
#define TE T
#define TOV(arr) (arr)[0]
#define FROMV(v, arr) (arr)[0] = (v)
#else
#define TE VEC(T, EW)
#define TOV(arr) VLOAD(EW)(0, arr)
#define FROMV(v, arr) VSTORE(EW)(v, 0, arr)
#endif

/* Gelu: float32 as elementwise.cl's (a branch-free erfc, relative error < 1.2e-7: PoCL's erfc is a scalar call
 * 30x slower than exp; keep the two copies equal), float64 from the builtin; tanh form as x * sigmoid(2z) */
#if ACT == 2 && !defined(FP64)
inline TE gelu(const TE x)
{
    const TE z = fabs(x) * 0.70710678f;
    const TE t = 1.0f / (1.0f + 0.5f * z);
    const TE p = -1.26551223f + t * (1.00002368f + t * (0.37409196f + t * (0.09678418f + t * (-0.18628806f
                 + t * (0.27886807f + t * (-1.13520398f + t * (1.48851587f + t * (-0.82215223f
                 + t * 0.17087277f))))))));
    const TE e = 0.5f * t * exp(p - z * z);
    return x * (x < (TE)0 ? e : (TE)1 - e);
}
#define ACT_E(v) gelu(v)
#elif ACT == 2
#define ACT_E(v) ((v) * (T)0.5 * erfc((v) * (T)-0.70710678118654752440))
#elif ACT == 3
#define ACT_E(v) ((v) / ((T)1 + exp((T)-1.5957691216057307118 * ((v) + (T)0.044715 * (v) * (v) * (v)))))
#elif ACT == 1
#define ACT_E(v) max(v, (TE)0)
#else
#define ACT_E(v) (v)
#endif
#if HAS_C
#define ADD_C(m, COL) { for (int e = 0; e < EW; e++) t_[e] = C[(m) * scm + COL(e) * scn]; v += beta * TOV(t_); }
#else
#define ADD_C(m, COL)
#endif
#if HAS_R
#define ADD_R(m, COL) { for (int e = 0; e < EW; e++) t_[e] = R[(m) * N + COL(e)]; v += TOV(t_); }
#else
#define ADD_R(m, COL)
#endif
/* row m's EW values: Y[m, COL(e)] for e < EW where KEEP(e) (COL(e) is inside N even where not kept) */
#define EPILOGUE(m, VALUE, COL, KEEP) {                                                                   \
    T t_[EW];                                                                                             \
    TE v = alpha * (VALUE);                                                                               \
    ADD_C(m, COL) ADD_R(m, COL)                                                                           \
    v = ACT_E(v);                                                                                         \
    FROMV(v, t_);                                                                                         \
    for (int e = 0; e < EW; e++) if (KEEP(e)) Y[(m) * N + COL(e)] = t_[e]; }
#define BATCH(c) { const int q = r / bdims.c; const int x = r - q * bdims.c; r = q; \
                   ba += (long)x * bsa.c; bb += (long)x * bsb.c; }

__kernel __attribute__((reqd_work_group_size(RN, RM, 1)))
void gemm(const int M, const int N, const int K,
          __global const char* a_, const ulong oa, const int lda,
          __global const char* b_, const ulong ob, const int ldb,
          __global const char* c_, const ulong oc, const int scm, const int scn,
          __global const char* r_, const ulong or_, __global char* y_, const ulong oy, const T alpha, const T beta,
          const int4 bdims, const int4 bsa, const int4 bsb)
{
    const int lx = get_local_id(0), ly = get_local_id(1);
    const int n0 = get_group_id(0) * TN, m0 = get_group_id(1) * TM;
    int r = get_global_id(2);
    long ba = 0, bb = 0;
    BATCH(s0) BATCH(s1) BATCH(s2) BATCH(s3)
    __global const T* A = (__global const T*)(a_ + oa) + ba;
    __global const WS* B = (__global const WS*)(b_ + ob) + bb;
    __global T* Y = (__global T*)(y_ + oy) + (long)get_global_id(2) * M * N;
#if HAS_C
    __global const T* C = (__global const T*)(c_ + oc);
#endif
#if HAS_R
    __global const T* R = (__global const T*)(r_ + or_) + (long)get_global_id(2) * M * N;
#endif

#if VN > 1
    /* B [K, N]: WN vectors of VN columns per work-item, starting at cols[j] (shifted back to stay inside N) */
    int rows[WM], cols[WN], own[WN];
#pragma unroll
    for (int i = 0; i < WM; i++) rows[i] = min(m0 + ly + i * RM, M - 1);
#pragma unroll
    for (int j = 0; j < WN; j++) { own[j] = n0 + (lx + j * RN) * VN; cols[j] = min(own[j], N - VN); }
    VEC(T, VN) vacc[WM][WN];
#pragma unroll
    for (int i = 0; i < WM; i++)
#pragma unroll
        for (int j = 0; j < WN; j++)
            vacc[i][j] = (VEC(T, VN))(0);
    for (int k = 0; k < K; k++) {
        VEC(T, VN) bv[WN];
#pragma unroll
        for (int j = 0; j < WN; j++) bv[j] = WLOADV(VN, B + k * ldb + cols[j]);
#pragma unroll
        for (int i = 0; i < WM; i++) {
            const VEC(T, VN) av = (VEC(T, VN))(A_AT(rows[i], k));
#pragma unroll
            for (int j = 0; j < WN; j++)
                vacc[i][j] = fma(av, bv[j], vacc[i][j]);
        }
    }
#define VCOL(e) (cols[j] + (e))
#define VKEEP(e) (cols[j] + (e) >= own[j])
    for (int i = 0; i < WM; i++) {
        const int m = m0 + ly + i * RM;
        if (m >= M) break;
        for (int j = 0; j < WN; j++)
            EPILOGUE(m, vacc[i][j], VCOL, VKEEP)
    }
#else
    T acc[WM][WN];
    for (int i = 0; i < WM; i++)
        for (int j = 0; j < WN; j++)
            acc[i][j] = (T)0;

#if LOCAL
    __local T As[TK][TM];
    __local T Bs[TK][TN];
    const int lid = ly * RN + lx;
    for (int k0 = 0; k0 < K; k0 += TK) {
        for (int t = lid; t < TM * TK; t += RM * RN) {
#if A_T
            const int mm = t % TM, kk = t / TM;  /* m fastest: contiguous in A[K, M] */
#else
            const int kk = t % TK, mm = t / TK;
#endif
            const int m = min(m0 + mm, M - 1), k = k0 + kk;
            As[kk][mm] = k < K ? A_AT(m, k) : (T)0;
        }
        for (int t = lid; t < TK * TN; t += RM * RN) {
#if B_T
            const int kk = t % TK, nn = t / TK;  /* k fastest: contiguous in B[N, K] */
#else
            const int nn = t % TN, kk = t / TN;
#endif
            const int n = min(n0 + nn, N - 1), k = k0 + kk;
            Bs[kk][nn] = k < K ? B_AT(k, n) : (T)0;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int kk = 0; kk < TK; kk++) {
            T av[WM], bv[WN];
            for (int i = 0; i < WM; i++) av[i] = As[kk][ly + i * RM];
            for (int j = 0; j < WN; j++) bv[j] = Bs[kk][lx + j * RN];
            for (int i = 0; i < WM; i++)
                for (int j = 0; j < WN; j++)
                    acc[i][j] = fma(av[i], bv[j], acc[i][j]);
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
#else
    int rows[WM], cols[WN];
    for (int i = 0; i < WM; i++) rows[i] = min(m0 + ly + i * RM, M - 1);
    for (int j = 0; j < WN; j++) cols[j] = min(n0 + lx + j * RN, N - 1);
    int k = 0;
#if KV > 1
    /* A [M, K] and B [N, K] are both contiguous along K: dot products of KV-wide vectors, WM x WN of them per
     * work-item (row pointers hoisted, loops unrolled: PoCL keeps the accumulators in registers) */
    {
        __global const T* ap[WM];
        __global const WS* bp[WN];
        VEC(T, KV) vacc[WM][WN];
#pragma unroll
        for (int i = 0; i < WM; i++) ap[i] = A + rows[i] * lda;
#pragma unroll
        for (int j = 0; j < WN; j++) bp[j] = B + cols[j] * ldb;
#pragma unroll
        for (int i = 0; i < WM; i++)
#pragma unroll
            for (int j = 0; j < WN; j++)
                vacc[i][j] = (VEC(T, KV))(0);
        for (; k + KV <= K; k += KV) {
            VEC(T, KV) av[WM], bv[WN];
#pragma unroll
            for (int i = 0; i < WM; i++) av[i] = VLOAD(KV)(0, ap[i] + k);
#pragma unroll
            for (int j = 0; j < WN; j++) bv[j] = WLOADV(KV, bp[j] + k);
#pragma unroll
            for (int i = 0; i < WM; i++)
#pragma unroll
                for (int j = 0; j < WN; j++)
                    vacc[i][j] = fma(av[i], bv[j], vacc[i][j]);
        }
#pragma unroll
        for (int i = 0; i < WM; i++)
#pragma unroll
            for (int j = 0; j < WN; j++)
                acc[i][j] = HSUM(vacc[i][j]);
    }
#endif
    for (; k < K; k++) {
        T av[WM], bv[WN];
        for (int i = 0; i < WM; i++) av[i] = A_AT(rows[i], k);
        for (int j = 0; j < WN; j++) bv[j] = B_AT(k, cols[j]);
        for (int i = 0; i < WM; i++)
            for (int j = 0; j < WN; j++)
                acc[i][j] = fma(av[i], bv[j], acc[i][j]);
    }
#endif

#define SCOL(e) min(n0 + lx + (e) * RN, N - 1)
#define SKEEP(e) (n0 + lx + (e) * RN < N)
    for (int i = 0; i < WM; i++) {
        const int m = m0 + ly + i * RM;
        if (m >= M) break;
        EPILOGUE(m, TOV(acc[i]), SCOL, SKEEP)
    }
#endif
}
