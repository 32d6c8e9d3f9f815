/* Conv (2-D; 1-D as H = 1) as an implicit GEMM: per image and group, Y[m, p] = sum_k W[k, m] * X[k, p] over
 * the output channels m of the group, the output pixels p = oy * OW + ox and k = (ky * KW + kx) * C + c, where
 * X[k, p] is the input at (c, oy * sh - ph + ky * dh, ox * sw - pw + kx * dw), 0 in the padding. No im2col
 * matrix exists: each work-item computes the addresses of its pixels once per tap.
 *
 * Weights are prepacked at compile time to [G][KH * KW][C][M] (conv.py), so output channels are contiguous:
 * a work-item holds WM vectors of VW output channels times WN pixels in registers and, per k, loads WM weight
 * vectors and WN input values (one broadcast into each vector): WM * WN vector FMAs per step. On a CPU
 * (PoCL) the vectors are the SIMD lanes and each work-item is a strip of the GEMM; on a GPU lanes are
 * registers and the work-group's tiles are staged in local memory (LOCAL=1).
 *
 * A work-group computes TM = RM * WM * VW channels x TN = RN * WN pixels: RM work-items along channels, RN
 * along pixels, pixel j of work-item lx being p0 + lx + j * RN (neighbouring work-items touch neighbouring
 * pixels). Odd sizes: pixels past P are clamped on load and never stored; a channel vector past M starts at
 * M - VW instead (LOCAL=0: recomputed channels are stored twice with the same value) or its lanes past M are
 * not stored (LOCAL=1).
 *
 * Build options: T (float, double), KH KW (the window), PADDED (0: every tap of every window is inside the
 * input, so no masks), HAS_BIAS, RESIDUAL (add a tensor shaped like Y), RELU, FP64, WTYPE (the weights stored
 * as T, float16 or bfloat16: halfload.clh; a float16 model's, read as float); tunable RM RN WM WN VW LOCAL TK.
 * get_global_id(2) is image * G + group.
 */
#ifdef FP64
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
#endif

#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#include "halfload.clh"
#define TM (RM * WM * VW)
#define TN (RN * WN)
#define UNROLL _Pragma("unroll")  /* PoCL does not unroll these by itself: the accumulators would live in memory */
#define KHW (KH * KW)
#if VW == 1
#define VT T
#define VLOADW(p) (*(p))
#define WLOADW(p) WLOAD(p, 0)
#define LANE(v, l) (v)
#else
#define VT CAT(T, VW)
#define VLOADW(p) CAT(vload, VW)(0, p)
#define WLOADW(p) WLOADV(VW, p)
#define LANE(v, l) (((T*)&(v))[l])
#endif

/* one tap over the C channels: per channel WM weight vectors times WN input values (LOAD(j): pixel j's) */
#define CHANNELS(LOAD)                                                      \
    for (int c = 0; c < C; c++) {                                           \
        VT wv[WM];                                                          \
        UNROLL                                                              \
        for (int i = 0; i < WM; i++) wv[i] = WLOADW(wk + (long)c * M + mb[i]); \
        UNROLL                                                              \
        for (int i = 0; i < WM; i++)                                        \
            UNROLL                                                          \
            for (int j = 0; j < WN; j++)                                    \
                acc[i][j] = fma(wv[i], (VT)(LOAD(j)), acc[i][j]);           \
    }
#define LOAD(j) X[(long)c * HW + off[j]]
#define LOAD_MASKED(j) (X[(long)c * HW + off[j]] * mk[j])

__kernel __attribute__((reqd_work_group_size(RN, RM, 1)))
void conv(const int C, const int H, const int W, const int OH, const int OW, const int M, const int G,
          const int sh, const int sw, const int ph, const int pw, const int dh, const int dw,
          __global const char* x_, const ulong ox_, __global const char* w_, const ulong ow_,
          __global const char* b_, const ulong ob_, __global const char* r_, const ulong or_,
          __global char* y_, const ulong oy_)
{
    const int lx = get_local_id(0), ly = get_local_id(1);
    const int p0 = get_group_id(0) * TN, m0 = get_group_id(1) * TM;
    const int z = get_global_id(2), g = z % G;
    const int HW = H * W, P = OH * OW, K = KHW * C;
    __global const T* X = (__global const T*)(x_ + ox_) + (long)z * C * HW;
    __global const WS* Wt = (__global const WS*)(w_ + ow_) + (long)g * K * M;
    __global T* Y = (__global T*)(y_ + oy_) + (long)z * M * P;

    /* where each pixel's window starts in the input */
    int iy0[WN], ix0[WN];
    UNROLL
    for (int j = 0; j < WN; j++) {
        const int p = min(p0 + lx + j * RN, P - 1);
        const int oy = p / OW;
        iy0[j] = oy * sh - ph;
        ix0[j] = (p - oy * OW) * sw - pw;
    }
    int mb[WM];  /* first channel of each vector */
    UNROLL
    for (int i = 0; i < WM; i++) {
        mb[i] = m0 + (ly + i * RM) * VW;
#if !LOCAL
        mb[i] = min(mb[i], M - VW);
#endif
    }
    VT acc[WM][WN];
    UNROLL
    for (int i = 0; i < WM; i++)
        UNROLL
        for (int j = 0; j < WN; j++)
            acc[i][j] = (VT)0;

#if LOCAL
    /* GPUs: TK x TM weights and TK x TN input values staged in local memory per step of K */
    __local T Ws[TK][TM];
    __local T Xs[TK][TN];
    const int lid = ly * RN + lx;
    for (int k0 = 0; k0 < K; k0 += TK) {
        for (int t = lid; t < TK * TM; t += RM * RN) {
            const int mm = t % TM, kk = t / TM;  /* m fastest: contiguous in W */
            const int k = k0 + kk;
            Ws[kk][mm] = k < K ? WLOAD(Wt, (long)k * M + min(m0 + mm, M - 1)) : (T)0;
        }
        for (int t = lid; t < TK * TN; t += RM * RN) {
            const int nn = t % TN, kk = t / TN;  /* p fastest: neighbouring pixels */
            const int k = k0 + kk, tap = k / C, c = k - tap * C, ky = tap / KW;
            const int p = min(p0 + nn, P - 1), oy = p / OW;
            const int iy = oy * sh - ph + ky * dh, ix = (p - oy * OW) * sw - pw + (tap - ky * KW) * dw;
            Xs[kk][nn] = (k < K && iy >= 0 && iy < H && ix >= 0 && ix < W) ? X[(long)c * HW + iy * W + ix] : (T)0;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int kk = 0; kk < TK; kk++) {
            VT wv[WM];
            T xv[WN];
            UNROLL
            for (int i = 0; i < WM; i++) wv[i] = VLOADW(&Ws[kk][(ly + i * RM) * VW]);
            UNROLL
            for (int j = 0; j < WN; j++) xv[j] = Xs[kk][lx + j * RN];
            UNROLL
            for (int i = 0; i < WM; i++)
                UNROLL
                for (int j = 0; j < WN; j++)
                    acc[i][j] = fma(wv[i], (VT)xv[j], acc[i][j]);
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
#else
    for (int tap = 0; tap < KHW; tap++) {
        const int ky = tap / KW, kx = tap - ky * KW;
        int off[WN];
#if PADDED
        T mk[WN];  /* 1 inside the input, 0 in the padding (whose address is clamped to 0) */
        int inside = 1;
#endif
        UNROLL
        for (int j = 0; j < WN; j++) {
            const int iy = iy0[j] + ky * dh, ix = ix0[j] + kx * dw;
#if PADDED
            const int in = iy >= 0 && iy < H && ix >= 0 && ix < W;
            off[j] = in ? iy * W + ix : 0;
            mk[j] = in ? (T)1 : (T)0;
            inside &= in;
#else
            off[j] = iy * W + ix;
#endif
        }
        __global const WS* wk = Wt + (long)tap * C * M;
#if PADDED
        if (!inside) {  /* a window of the tile reaches into the padding: masked loads */
            CHANNELS(LOAD_MASKED)
        } else
#endif
        {
            CHANNELS(LOAD)
        }
    }
#endif

#if HAS_BIAS
    __global const T* B = (__global const T*)(b_ + ob_) + g * M;
#endif
#if RESIDUAL
    __global const T* R = (__global const T*)(r_ + or_) + (long)z * M * P;
#endif
    UNROLL
    for (int i = 0; i < WM; i++) {
        for (int l = 0; l < VW; l++) {
            const int m = mb[i] + l;
            if (m >= M) break;
            UNROLL
            for (int j = 0; j < WN; j++) {
                const int p = p0 + lx + j * RN;
                if (p >= P) break;
                T v = LANE(acc[i][j], l);
#if HAS_BIAS
                v += B[m];
#endif
#if RESIDUAL
                v += R[(long)m * P + p];
#endif
#if RELU
                v = v < (T)0 ? (T)0 : v;  /* NaN passes, as NumPy's maximum */
#endif
                Y[(long)m * P + p] = v;
            }
        }
    }
}
