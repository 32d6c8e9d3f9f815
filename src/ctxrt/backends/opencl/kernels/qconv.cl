/* QLinearConv and ConvInteger (2-D; 1-D as H = 1) on 8-bit integers: sums of products of the centred operands
 * (x - x_zero_point) * (w - w_zero_point), exact, then (QLINEAR) requantized as the NumPy backend does
 * (backends/cpu/quant/common.py, Requant): acc + bias converted to float32, times the multiplier
 * (x_scale * w_scale) / y_scale computed in float32 per output channel, rounded half to even, plus y_zero_point,
 * saturated to the output type. ConvInteger stores the int32 sums. Padding is x's zero point: a centred 0.
 *
 * Exactness: a product of two centred 8-bit values is at most 255 * 255 = 65025 in magnitude, an integer float32
 * holds exactly, and a sum of BLOCK = 256 of them stays below 2^24: the products are accumulated with float FMAs
 * (vector FMAs, as the float kernels compute) in blocks of at most BLOCK products, each block then added to an int32
 * accumulator. The result is the exact int32 sum, as an integer dot product would give.
 *
 * x is first centred into a float32 copy (kernel `centre`, into the node's scratch): the convolution kernels
 * then load its values as the float kernels do (conv.cl, window.cl: one broadcast load per value, vector loads
 * along rows) instead of converting and centring each byte where it is used (on PoCL a depthwise 3x3 conv at
 * 112x112 took 1.0 ms that way, 0.65 ms from the float copy).
 *
 * Scales and zero points are read from their tensors when the kernel runs (constants or computed ones alike);
 * x_scale, x_zero_point, y_scale and y_zero_point hold one value, w_scale and w_zero_point one or one per output
 * channel (WS_PC, WZ = 2), the bias one int32 per output channel.
 *
 * qconv: an implicit GEMM as conv.cl's (no local memory): weights prepacked at compile time to
 * [G][KH * KW][C][M] 8-bit values (quant_conv.py), a work-item holds WM vectors of VW output channels times WN
 * pixels; per input channel it loads WM weight vectors and WN input values. A channel vector past M starts at
 * M - VW (recomputed channels are stored twice with the same value); pixels past P are clamped on load and never
 * stored. get_global_id(2) is image * G + group.
 *
 * qdw: one input channel per group (depthwise), directly, as window.cl: a work-item computes RY output rows x VW
 * neighbouring columns of one output channel (KH * KW <= BLOCK products per output: the float sums are exact).
 * get_global_id(2) is image * M + output channel.
 *
 * Build options: XT WT (uchar or char), YT (uchar, char; int for ConvInteger), QLINEAR, HAS_XZ, WZ (0: none or
 * all zeros, 1: one value, 2: per channel), WS_PC, HAS_YZ, HAS_BIAS, YMIN YMAX, KH KW; qconv: PADDED, tunable
 * RM RN WM WN VW; qdw: SH SW DH, tunable VW RY WX WY.
 */
#pragma OPENCL FP_CONTRACT OFF  /* the multiplier and the requantization round as the CPU's float32 steps */
#ifdef FP64
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
#endif
#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#define UNROLL _Pragma("unroll")  /* PoCL does not unroll these by itself: the accumulators would live in memory */
#define KHW (KH * KW)
#define BLOCK 256

#if VW == 1
#define VF float
#define VI int
#define VLOADF(p) (*(p))
#define CVTF(v) convert_float(v)
#define CVTI(v) convert_int(v)
#define VLOADN(p) (*(p))
#define LANEI(v, l) (v)
#else
#define VF CAT(float, VW)
#define VI CAT(int, VW)
#define VLOADF(p) CAT(vload, VW)(0, p)
#define CVTF(v) CAT(convert_float, VW)(v)
#define CVTI(v) CAT(convert_int, VW)(v)
#define VLOADN(p) CAT(vload, VW)(0, p)
#define LANEI(v, l) (((int*)&(v))[l])
#endif
/* the multiplier's division, correctly rounded as the CPU's float32 one: through double where the device has it
 * (exact for float operands); OpenCL's float division may be 2.5 ulp off. DIV of floats, DIVV of VF vectors */
#ifdef FP64
#define DIV(x, y) convert_float(convert_double(x) / convert_double(y))
#if VW == 1
#define DIVV(x, y) DIV(x, y)
#else
#define DIVV(x, y) CAT(convert_float, VW)(CAT(convert_double, VW)(x) / CAT(convert_double, VW)(y))
#endif
#else
#define DIV(x, y) ((x) / (y))
#define DIVV(x, y) ((x) / (y))
#endif

#define ARG(name) __global const char* name##_, const ulong o##name##_
#define PTR(T, name) ((__global const T*)(name##_ + o##name##_))

/* x's zero point as a float (0 without one) */
#if HAS_XZ
#define X_ZERO(xz) convert_float(PTR(XT, xz)[0])
#else
#define X_ZERO(xz) 0.0f
#endif

/* Requantization: t = float(acc + bias) * multiplier, clamped to [YMIN - yz, YMAX - yz] (integers: the same as
 * clamping after rounding), rounded half to even, plus yz: the NumPy backend's saturate(rint(t) + yz), with no int
 * overflow whatever the multiplier. The clamped |t| < 2^22 is rounded by adding 1.5 * 2^23 (in the default
 * rounding mode, half to even) and subtracting 1.5 * 2^23 - yz (exact): PoCL's rint and convert_int_rte are ~20
 * instructions of bit operations, fmin/fmax 3 (NaN rules); these selects are one each. `sum` is float(acc + bias):
 * an int32 sum converted, or (qdw) the exact float sum plus a bias a float holds exactly (one rounding either way). */
#if QLINEAR
#if HAS_YZ
#define Y_ZERO(yz) ((int)PTR(YT, yz)[0])
#else
#define Y_ZERO(yz) 0
#endif
#define ROUNDER 12582912.0f  /* 1.5 * 2^23 */
#define REQUANT_SETUP                                                           \
    const int yzi = Y_ZERO(yz);                                                 \
    const float ylo = (float)(YMIN - yzi), yhi = (float)(YMAX - yzi), unround = ROUNDER - (float)yzi;
inline VI requant(const VF sum, const VF mult, const float ylo, const float yhi, const float unround)
{
    VF t = sum * mult;
    t = select(t, (VF)ylo, t < (VF)ylo);
    t = select(t, (VF)yhi, t > (VF)yhi);
    return CVTI((t + (VF)ROUNDER) - (VF)unround);
}
#define REQUANT(sum, mult) requant(sum, mult, ylo, yhi, unround)
#endif

/* F = x - x_zero_point as floats, n values, 16 per work-item */
__kernel void centre(const int n, ARG(x), ARG(xz), __global char* f_, const ulong of_)
{
    const int i0 = get_global_id(0) * 16;
    if (i0 >= n)
        return;
    __global const XT* X = PTR(XT, x);
    __global float* F = (__global float*)(f_ + of_);
    const float xzf = X_ZERO(xz);
    if (i0 + 16 <= n) {
        vstore16(convert_float16(vload16(0, X + i0)) - (float16)xzf, 0, F + i0);
    } else {
        for (int i = i0; i < n; i++)
            F[i] = convert_float(X[i]) - xzf;
    }
}

#ifdef RM  /* ---- qconv: implicit GEMM ---------------------------------------------------------------------- */
#define TM (RM * WM * VW)
#define TN (RN * WN)

/* input channels c0 .. c1 of one tap: per channel WM weight vectors times WN input values (LOAD(j): pixel j's,
 * centred) into the float block accumulators */
#if WZ
#define CENTRE_W(i, v) ((v) - wzv[i])
#else
#define CENTRE_W(i, v) (v)
#endif
#define CHANNELS(LOAD)                                                          \
    for (int c = c0; c < c1; c++) {                                             \
        VF wv[WM];                                                              \
        UNROLL                                                                  \
        for (int i = 0; i < WM; i++)                                            \
            wv[i] = CENTRE_W(i, CVTF(VLOADN(wk + (long)c * M + mb[i])));         \
        UNROLL                                                                  \
        for (int j = 0; j < WN; j++) {                                          \
            const VF xv = (VF)(LOAD(j));                                        \
            UNROLL                                                              \
            for (int i = 0; i < WM; i++)                                        \
                fac[i][j] = fma(wv[i], xv, fac[i][j]);                          \
        }                                                                       \
    }
#define LOAD(j) X[(long)c * HW + off[j]]
#define LOAD_MASKED(j) (X[(long)c * HW + off[j]] * mk[j])
#define FLUSH                                                                   \
    UNROLL                                                                      \
    for (int i = 0; i < WM; i++)                                                \
        UNROLL                                                                  \
        for (int j = 0; j < WN; j++) {                                          \
            acc[i][j] += CVTI(fac[i][j]);                                       \
            fac[i][j] = (VF)0;                                                  \
        }

__kernel __attribute__((reqd_work_group_size(RN, RM, 1)))
void qconv(const int C, const int H, const int W, const int OH, const int OW, const int M, const int G,
           const int sh, const int sw, const int ph, const int pw, const int dh, const int dw,
           ARG(x), ARG(w), ARG(xs), ARG(xz), ARG(ws), ARG(wz), ARG(ys), ARG(yz), ARG(b),
           __global char* y_, const ulong oy_)
{
    const int lx = get_local_id(0), ly = get_local_id(1);
    const int p0 = get_group_id(0) * TN, m0 = get_group_id(1) * TM;
    const int z = get_global_id(2), g = z % G;
    const int HW = H * W, P = OH * OW;
    __global const float* X = PTR(float, x) + (long)z * C * HW;  /* centred */
    __global const WT* Wt = PTR(WT, w) + (long)g * KHW * C * M;

    int iy0[WN], ix0[WN];
    UNROLL
    for (int j = 0; j < WN; j++) {
        const int p = min(p0 + lx + j * RN, P - 1);
        const int oy = p / OW;
        iy0[j] = oy * sh - ph;
        ix0[j] = (p - oy * OW) * sw - pw;
    }
    int mb[WM];  /* first channel of each vector (in the group) */
    UNROLL
    for (int i = 0; i < WM; i++)
        mb[i] = min(m0 + (ly + i * RM) * VW, M - VW);
#if WZ == 2
    VF wzv[WM];
    UNROLL
    for (int i = 0; i < WM; i++)
        wzv[i] = CVTF(VLOADN(PTR(WT, wz) + g * M + mb[i]));
#elif WZ == 1
    VF wzv[WM];
    UNROLL
    for (int i = 0; i < WM; i++)
        wzv[i] = (VF)convert_float(PTR(WT, wz)[0]);
#endif
    VI acc[WM][WN];
    VF fac[WM][WN];
    UNROLL
    for (int i = 0; i < WM; i++)
        UNROLL
        for (int j = 0; j < WN; j++) {
            acc[i][j] = (VI)0;
            fac[i][j] = (VF)0;
        }

    int pending = 0;  /* products summed in fac since the last flush */
    for (int tap = 0; tap < KHW; tap++) {
        const int ky = tap / KW, kx = tap - ky * KW;
        int off[WN];
#if PADDED
        float mk[WN];  /* 1 inside the input, 0 in the padding (whose address is clamped to 0) */
        int inside = 1;
#endif
        UNROLL
        for (int j = 0; j < WN; j++) {
            const int iy = iy0[j] + ky * dh, ix = ix0[j] + kx * dw;
#if PADDED
            const int in = iy >= 0 && iy < H && ix >= 0 && ix < W;
            off[j] = in ? iy * W + ix : 0;
            mk[j] = in ? 1.0f : 0.0f;
            inside &= in;
#else
            off[j] = iy * W + ix;
#endif
        }
        __global const WT* wk = Wt + (long)tap * C * M;
        for (int c0 = 0; c0 < C; c0 += BLOCK) {
            const int c1 = min(C, c0 + BLOCK);
            if (pending + (c1 - c0) > BLOCK) {
                FLUSH
                pending = 0;
            }
#if PADDED
            if (!inside) {  /* a window of the tile reaches into the padding: masked loads */
                CHANNELS(LOAD_MASKED)
            } else
#endif
            {
                CHANNELS(LOAD)
            }
            pending += c1 - c0;
        }
    }
    FLUSH

    __global YT* Y = (__global YT*)(y_ + oy_) + (long)z * M * P;
#if QLINEAR
    /* per vector of channels: the multipliers (x_scale * w_scale) / y_scale and the bias */
    const float xs = PTR(float, xs)[0], ys = PTR(float, ys)[0];
    REQUANT_SETUP
#endif
    UNROLL
    for (int i = 0; i < WM; i++) {
#if QLINEAR
#if WS_PC
        const VF mult = DIVV((VF)xs * VLOADF(PTR(float, ws) + g * M + mb[i]), (VF)ys);
#else
        const VF mult = (VF)DIV(xs * PTR(float, ws)[0], ys);
#endif
#if HAS_BIAS
        const VI bias = VLOADN(PTR(int, b) + g * M + mb[i]);
#else
        const VI bias = (VI)0;
#endif
#endif
        UNROLL
        for (int j = 0; j < WN; j++) {
            const int p = p0 + lx + j * RN;
            if (p >= P) break;
#if QLINEAR
            const VI v = REQUANT(CVTF(acc[i][j] + bias), mult);
#else
            const VI v = acc[i][j];
#endif
            for (int l = 0; l < VW; l++)  /* mb[i] + l < M (mb[i] <= M - VW) */
                Y[(long)(mb[i] + l) * P + p] = (YT)LANEI(v, l);
        }
    }
}
#endif  /* RM */

#ifdef RY  /* ---- qdw: depthwise, direct ---------------------------------------------------------------------- */
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
#define VU CAT(uint, VW)
#define VSTORE(v, p) CAT(vstore, VW)(v, 0, p)
#define CVTY(v) CAT(CAT(convert_, YT), VW)(v)

/* VW input columns ix, ix + SW, ... of one row of the centred input; 0 for those outside [0, W). Inside the row:
 * one vector load (stride 1 or 2). At an edge of a row at least as long as the load: the load inside the row
 * nearest to the columns, its lanes moved into place (a permute), the padding's lanes zeroed. Else lane by lane. */
inline VF load_cols(__global const float* row, const int ix, const int W)
{
#if VW > 1 && (SW == 1 || (SW == 2 && VW <= 8))
    const VI lane = (VI)IOTA;
#if SW == 1
    if (ix >= 0 && ix + VW <= W)
        return VLOADF(row + ix);
    if (W >= VW) {
        const int start = clamp(ix, 0, W - VW);
        const VF moved = shuffle(VLOADF(row + start), CAT(as_, VU)(lane + (VI)(ix - start)));
#else
    if (ix >= 0 && ix + 2 * VW <= W)
        return VLOAD2W(row + ix).even;
    if (W >= 2 * VW) {
        const int start = clamp(ix, 0, W - 2 * VW);
        const VF moved = shuffle(VLOAD2W(row + start), CAT(as_, VU)(2 * lane + (VI)(ix - start)));
#endif
        const VI col = (VI)ix + SW * lane;
        return select((VF)0.0f, moved, (col >= (VI)0) & (col < (VI)W));
    }
#endif
    float v[VW];
    for (int l = 0; l < VW; l++) {
        const int i = ix + l * SW;
        v[l] = i >= 0 && i < W ? row[i] : 0.0f;
    }
    return VLOADF(v);
}

__kernel __attribute__((reqd_work_group_size(WX, WY, 1)))
void qdw(const int H, const int W, const int OH, const int OW, const int C, const int MULT,
         const int ph, const int pw, const int dw,
         ARG(x), ARG(w), ARG(xs), ARG(xz), ARG(ws), ARG(wz), ARG(ys), ARG(yz), ARG(b),
         __global char* y_, const ulong oy_)
{
    const int ox0 = get_global_id(0) * VW, oy0 = get_global_id(1) * RY;
    const int z = get_global_id(2);
    const int M = C * MULT, m = z % M;
    if (ox0 >= OW || oy0 >= OH)
        return;
    __global const float* X = PTR(float, x) + ((long)(z / M) * C + m / MULT) * H * W;  /* centred */
#if WZ == 2
    const float wzf = convert_float(PTR(WT, wz)[m]);
#elif WZ == 1
    const float wzf = convert_float(PTR(WT, wz)[0]);
#else
    const float wzf = 0.0f;
#endif
    __global const WT* Wt = PTR(WT, w) + m * KHW;
    float wk[KHW];
    UNROLL
    for (int t = 0; t < KHW; t++)
        wk[t] = convert_float(Wt[t]) - wzf;
    VF acc[RY];
    UNROLL
    for (int r = 0; r < RY; r++)
        acc[r] = (VF)0;
    /* each input row of the band once: its KW column vectors go to every output row whose window has that row */
    UNROLL
    for (int i = 0; i < (RY - 1) * SH + (KH - 1) * DH + 1; i++) {
        const int iy = oy0 * SH - ph + i;
        if (iy < 0 || iy >= H)
            continue;
        UNROLL
        for (int kx = 0; kx < KW; kx++) {
            const VF v = load_cols(X + iy * W, ox0 * SW - pw + kx * dw, W);
            UNROLL
            for (int r = 0; r < RY; r++) {
                const int ky = i - r * SH;
                if (ky >= 0 && ky % DH == 0 && ky / DH < KH)
                    acc[r] = fma((VF)wk[ky / DH * KW + kx], v, acc[r]);
            }
        }
    }
    __global YT* Y = (__global YT*)(y_ + oy_) + (long)z * OH * OW;
#if QLINEAR
    const float mult = DIV(PTR(float, xs)[0] * PTR(float, ws)[WS_PC ? m : 0], PTR(float, ys)[0]);
    REQUANT_SETUP
#if HAS_BIAS
    const int bias = PTR(int, b)[m];
#else
    const int bias = 0;
#endif
    const int exact_bias = abs(bias) <= 16777216u;  /* a float holds it: acc + bias rounds once in float */
#endif
    UNROLL
    for (int r = 0; r < RY; r++) {
        if (oy0 + r >= OH)
            break;
#if QLINEAR
        VI q;
        if (exact_bias)
            q = REQUANT(acc[r] + (VF)(float)bias, (VF)mult);
        else
            q = REQUANT(CVTF(CVTI(acc[r]) + (VI)bias), (VF)mult);
#if VW == 1
        const YT v = (YT)q;
#else
        const CAT(YT, VW) v = CVTY(q);
#endif
#else
        const VI v = CVTI(acc[r]);
#endif
        const int o = (oy0 + r) * OW + ox0;
        if (ox0 + VW <= OW) {
#if VW == 1
            Y[o] = v;
#else
            VSTORE(v, Y + o);
#endif
        } else {
            for (int l = 0; l < VW && ox0 + l < OW; l++)
                Y[o + l] = ((YT*)&v)[l];
        }
    }
}
#endif  /* RY */
