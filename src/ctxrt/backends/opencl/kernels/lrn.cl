/* LRN across channels: y = x / (bias + alpha / size * sum of x^2 over channels [c - LO, c + HI])^beta.
 * A work-item computes VW neighbouring pixels (a vector; past the end of a plane, lanes of zeros that are not
 * stored) of CB neighbouring channels of one image; each output sums its window's squares again (size loads
 * from cache: no running sum, whose subtractions would round differently from onnxruntime's sums).
 *
 * Build options: T, LO HI (the window around a channel), FP64; tunable VW, CB (channels per work-item),
 * WX WY (work-group).
 */
#ifdef FP64
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
#endif

#include "vectors.clh"

/* VW values of a plane from p on; 0 past its n values */
inline VT load(__global const T* plane, const int p, const int n)
{
    if (p + VW <= n)
        return VLOADW(plane + p);
    T v[VW];
    for (int l = 0; l < VW; l++)
        v[l] = p + l < n ? plane[p + l] : (T)0;
    return VLOADW(v);
}

__kernel __attribute__((reqd_work_group_size(WX, WY, 1)))
void lrn(const int C, const int HW, const T alpha_over_size, const T beta, const T bias,
         __global const char* x_, const ulong ox_, __global char* y_, const ulong oy_)
{
    const int p = get_global_id(0) * VW, c0 = get_global_id(1) * CB;
    const long image = (long)get_global_id(2) * C * HW;
    __global const T* X = (__global const T*)(x_ + ox_) + image;
    __global T* Y = (__global T*)(y_ + oy_) + image;
    for (int c = c0; c < min(c0 + CB, C); c++) {
        VT s = (VT)0;
        for (int k = max(0, c - LO); k <= min(C - 1, c + HI); k++) {
            const VT v = load(X + (long)k * HW, p, HW);
            s = fma(v, v, s);
        }
        /* d^-beta as exp2(-beta * log2(d)), d >= bias > 0: PoCL's pow is a scalar call, 4x slower */
        const VT y = load(X + (long)c * HW, p, HW) * exp2(-beta * log2(fma(s, (VT)alpha_over_size, (VT)bias)));
        if (p + VW <= HW) {
            VSTOREW(y, Y + (long)c * HW + p);
        } else {
            T lanes[VW];
            VSTOREW(y, lanes);
            for (int l = 0; p + l < HW; l++)
                Y[(long)c * HW + p + l] = lanes[l];
        }
    }
}
