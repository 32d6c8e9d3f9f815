/* GlobalAveragePool and GlobalMaxPool: each row (image, channel) of L = H * W (any spatial rank) values is
 * reduced to one. R work-items share a row: each reduces VW-wide vectors R vectors apart (neighbouring
 * work-items read neighbouring memory: coalesced on GPUs), then the R partial results are combined in local
 * memory; RPG rows per work-group. PoCL: R = 1 (one work-item per row, vector loads along it).
 *
 * Build options: T, MAX (0: the average), FP64; tunable VW, R (a power of two), RPG.
 */
#ifdef FP64
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
#endif

#include "vectors.clh"
#if MAX
#define INIT (-INFINITY)
#define COMBINE(a, b) fmax(a, b)
#else
#define INIT 0
#define COMBINE(a, b) ((a) + (b))
#endif

__kernel __attribute__((reqd_work_group_size(R, RPG, 1)))
void global_pool(const int rows, const int L, __global const char* x_, const ulong ox_, __global char* y_,
                 const ulong oy_)
{
    const int lid = get_local_id(0);
    const int row = get_global_id(1);
    __global const T* X = (__global const T*)(x_ + ox_) + (long)min(row, rows - 1) * L;
    VT acc = (VT)INIT;
    for (int i = lid * VW; i + VW <= L; i += R * VW)
        acc = COMBINE(acc, VLOADW(X + i));
    T lanes[VW];
    VSTOREW(acc, lanes);
    T s = lanes[0];
    for (int l = 1; l < VW; l++)
        s = COMBINE(s, lanes[l]);
    for (int i = L / VW * VW + lid; i < L; i += R)
        s = COMBINE(s, X[i]);
#if R > 1
    __local T part[RPG][R];
    const int ly = get_local_id(1);
    part[ly][lid] = s;
    for (int width = R / 2; width > 0; width /= 2) {
        barrier(CLK_LOCAL_MEM_FENCE);
        if (lid < width)
            part[ly][lid] = COMBINE(part[ly][lid], part[ly][lid + width]);
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    s = part[ly][0];
#endif
    if (lid == 0 && row < rows)
#if MAX
        ((__global T*)(y_ + oy_))[row] = s;
#else
        ((__global T*)(y_ + oy_))[row] = s / (T)L;
#endif
}
