/* One output channel from one input channel's window, directly: depthwise Conv (OP_CONV: one input channel
 * per group, MULT output channels per input channel, weights per output channel), MaxPool (OP_MAX) and
 * AveragePool (OP_AVG).
 *
 * A work-item computes RY output rows x VW neighbouring columns of one output channel. It reads each input row
 * of its band once: per column tap one vector of VW input columns (see load_cols), combined into the
 * accumulators of every output row whose window holds that input row. A row in the padding is skipped. On a
 * CPU (PoCL) the vectors are SIMD lanes; on a GPU (VW=1) neighbouring work-items take neighbouring columns
 * (coalesced loads).
 *
 * Build options: OP, T, KH KW (the window), SH SW (strides), DH (the row dilation), FP64; OP_CONV: HAS_BIAS,
 * RESIDUAL, RELU, WTYPE (the weights stored as T, float16 or bfloat16: halfload.clh);
 * OP_AVG: INCLUDE_PAD (count_include_pad); tunable VW, RY (rows per work-item), WX WY (work-group).
 * get_global_id(2) is image * M + output channel. Average pools take the padding after the input as
 * arguments eh, ew: with count_include_pad a window counts the taps inside [-ph, H + eh) (ONNX; the part of a
 * ceil_mode window past the end padding is not counted, as in onnxruntime).
 */
#ifdef FP64
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
#endif

#define OP_CONV 0
#define OP_MAX 1
#define OP_AVG 2

#include "vectors.clh"
#include "halfload.clh"
#define as_VU CAT(as_, VU)
#if VW == 2
#define VLOAD2W(p) vload4(0, p)
#define IOTA (0, 1)
#elif VW == 4
#define VLOAD2W(p) vload8(0, p)
#define IOTA (0, 1, 2, 3)
#elif VW == 8
#define VLOAD2W(p) vload16(0, p)
#define IOTA (0, 1, 2, 3, 4, 5, 6, 7)
#elif VW == 16
#define IOTA (0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)
#endif
#ifdef FP64  /* lane indices and masks: integers as wide as T */
#define VI CAT(long, VW)
#define VU CAT(ulong, VW)
#else
#define VI CAT(int, VW)
#define VU CAT(uint, VW)
#endif

#define UNROLL _Pragma("unroll")  /* PoCL does not unroll these by itself: the accumulators would live in memory */

#if OP == OP_MAX
#define PAD_VALUE (-INFINITY)
#define COMBINE(acc, v, t) fmax(acc, v)
#elif OP == OP_AVG
#define PAD_VALUE ((T)0)
#define COMBINE(acc, v, t) ((acc) + (v))
#else
#define PAD_VALUE ((T)0)
#define COMBINE(acc, v, t) fma((VT)wk[t], v, acc)
#endif

/* VW input columns ix, ix + SW, ... of one row; PAD_VALUE for those outside [0, W). Inside the row: one vector
 * load (stride 1 or 2). At an edge of a row at least as long as the load: the load inside the row nearest to
 * the columns, its lanes moved into place (a permute), the padding's lanes replaced. Else lane by lane. */
inline VT load_cols(__global const T* row, const int ix, const int W)
{
#if VW > 1 && (SW == 1 || (SW == 2 && VW <= 8))
    const VI lane = (VI)IOTA;
#if SW == 1
    if (ix >= 0 && ix + VW <= W)
        return VLOADW(row + ix);
    if (W >= VW) {
        const int start = clamp(ix, 0, W - VW);
        const VT moved = shuffle(VLOADW(row + start), as_VU(lane + (VI)(ix - start)));
#else
    if (ix >= 0 && ix + 2 * VW <= W)
        return VLOAD2W(row + ix).even;
    if (W >= 2 * VW) {
        const int start = clamp(ix, 0, W - 2 * VW);
        const VT moved = shuffle(VLOAD2W(row + start), as_VU(2 * lane + (VI)(ix - start)));
#endif
        const VI col = (VI)ix + SW * lane;
        return select((VT)PAD_VALUE, moved, (col >= (VI)0) & (col < (VI)W));
    }
#endif
    T v[VW];
    for (int l = 0; l < VW; l++) {
        const int i = ix + l * SW;
        v[l] = i >= 0 && i < W ? row[i] : PAD_VALUE;
    }
    return VLOADW(v);
}

/* taps of a window starting at i0 that count for an average over an axis of n inputs padded by b and e */
inline int taps(const int i0, const int k, const int n, const int b, const int e)
{
#if INCLUDE_PAD
    return min(i0 + k, n + e) - max(i0, -b);
#else
    return min(i0 + k, n) - max(i0, 0);
#endif
}

__kernel __attribute__((reqd_work_group_size(WX, WY, 1)))
void window(const int H, const int W, const int OH, const int OW, const int C, const int MULT,
            const int ph, const int pw, const int dw, const int eh, const int ew,
            __global const char* x_, const ulong ox_, __global const char* w_, const ulong ow_,
            __global const char* b_, const ulong ob_, __global const char* r_, const ulong or_,
            __global char* y_, const ulong oy_)
{
    const int ox0 = get_global_id(0) * VW, oy0 = get_global_id(1) * RY;
    const int z = get_global_id(2);
    const int M = C * MULT, m = z % M;
    __global const T* X = (__global const T*)(x_ + ox_) + ((long)(z / M) * C + m / MULT) * H * W;
#if OP == OP_CONV
    __global const WS* Wt = (__global const WS*)(w_ + ow_) + m * KH * KW;
    T wk[KH * KW];
    int t0 = 0;
#if WTYPE == 1  /* 8 converted at once (PoCL: vload_half16 ~20x faster per element than scalar vload_half) */
    UNROLL
    for (; t0 + 8 <= KH * KW; t0 += 8)
        vstore8(vload_half8(0, Wt + t0), 0, wk + t0);
#endif
    UNROLL
    for (int t = t0; t < KH * KW; t++)
        wk[t] = WLOAD(Wt, t);
#endif
    VT acc[RY];
    UNROLL
    for (int r = 0; r < RY; r++)
        acc[r] = (VT)PAD_VALUE;
    /* each input row of the band once: its KW column vectors go to every output row whose window has that row
     * (which ones is known at compile time: the loops are unrolled, SH and DH are macros) */
    UNROLL
    for (int i = 0; i < (RY - 1) * SH + (KH - 1) * DH + 1; i++) {
        const int iy = oy0 * SH - ph + i;
        if (iy < 0 || iy >= H)
            continue;
        UNROLL
        for (int kx = 0; kx < KW; kx++) {
            const VT v = load_cols(X + iy * W, ox0 * SW - pw + kx * dw, W);
            UNROLL
            for (int r = 0; r < RY; r++) {
                const int ky = i - r * SH;
                if (ky >= 0 && ky % DH == 0 && ky / DH < KH)
                    acc[r] = COMBINE(acc[r], v, ky / DH * KW + kx);
            }
        }
    }
#if OP == OP_AVG
    VT count_x;  /* taps per window along the row, per lane */
    {
        T cx[VW];
        for (int l = 0; l < VW; l++)
            cx[l] = (T)max(1, taps((ox0 + l) * SW - pw, KW, W, pw, ew));
        count_x = VLOADW(cx);
    }
#endif
#if OP == OP_CONV && HAS_BIAS
    const T bias = ((__global const T*)(b_ + ob_))[m];
#endif
    const long plane = (long)z * OH * OW;
    __global T* Y = (__global T*)(y_ + oy_) + plane;
#if OP == OP_CONV && RESIDUAL
    __global const T* R = (__global const T*)(r_ + or_) + plane;
#endif
    UNROLL
    for (int r = 0; r < RY; r++) {
        if (oy0 + r >= OH)
            break;
        VT v = acc[r];
        const int o = (oy0 + r) * OW + ox0;
#if OP == OP_AVG
        v = v / (count_x * (T)max(1, taps((oy0 + r) * SH - ph, KH, H, ph, eh)));
#elif HAS_BIAS
        v += (VT)bias;
#endif
        if (ox0 + VW <= OW) {
#if OP == OP_CONV && RESIDUAL
            v += VLOADW(R + o);
#endif
#if OP == OP_CONV && RELU
            v = v < (VT)0 ? (VT)0 : v;  /* NaN passes, as NumPy's maximum */
#endif
            VSTOREW(v, Y + o);
        } else {
            T lanes[VW];
            VSTOREW(v, lanes);
            for (int l = 0; l < VW && ox0 + l < OW; l++) {
                T s = lanes[l];
#if OP == OP_CONV && RESIDUAL
                s += R[o + l];
#endif
#if OP == OP_CONV && RELU
                s = s < (T)0 ? (T)0 : s;
#endif
                Y[o + l] = s;
            }
        }
    }
}
