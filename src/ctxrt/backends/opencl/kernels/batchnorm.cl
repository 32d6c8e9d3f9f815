/* BatchNormalization (inference): y = (x - mean) * scale / sqrt(var + epsilon) + bias, per channel. A work-item
 * takes PV vectors of VW neighbouring values of one (image, channel) plane, whose factors it computes once.
 * y may be x (in place): each value is read before it is written, by the same work-item.
 *
 * Build options: T, FP64; tunable VW, PV, WX WY (work-group).
 */
#ifdef FP64
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
#endif

#include "vectors.clh"

__kernel __attribute__((reqd_work_group_size(WX, WY, 1)))
void batchnorm(const int C, const int HW, const T epsilon,
               __global char* x_, const ulong ox_, __global const char* s_, const ulong os_,
               __global const char* b_, const ulong ob_, __global const char* m_, const ulong om_,
               __global const char* v_, const ulong ov_, __global char* y_, const ulong oy_)
{
    const int c = get_global_id(1);
    if (c >= C)
        return;
    const long plane = ((long)get_global_id(2) * C + c) * HW;
    __global const T* X = (__global const T*)(x_ + ox_) + plane;
    __global T* Y = (__global T*)(y_ + oy_) + plane;
    const T a = ((__global const T*)(s_ + os_))[c] / sqrt(((__global const T*)(v_ + ov_))[c] + epsilon);
    const T mean = ((__global const T*)(m_ + om_))[c];
    const T b = ((__global const T*)(b_ + ob_))[c];
    const int p0 = get_global_id(0) * VW * PV;
    for (int i = 0; i < PV; i++) {
        const int p = p0 + i * VW;
        if (p + VW <= HW) {
            VSTOREW(fma(VLOADW(X + p) - (VT)mean, (VT)a, (VT)b), Y + p);
        } else {
            for (int q = p; q < HW; q++)
                Y[q] = fma(X[q] - mean, a, b);
            break;
        }
    }
}
