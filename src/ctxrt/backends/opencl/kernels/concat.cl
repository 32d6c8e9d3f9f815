/* Concat and Split along any axis: the concatenated tensor is viewed as (outer, total) columns, tensor k of a
 * group of up to NIN <= 8 occupying columns [col0 + starts_k, col0 + starts_k + widths_k) of every row (its
 * own rows being widths_k long). A 2-D launch over (the group's columns, outer rows); each work-item finds its
 * tensor by comparing its column with the starts (a tensor of width 0 is skipped: the next one has the same
 * start and wins). More than 8 tensors: one launch per group of 8.
 *
 * Build options: T (an unsigned type of the element's size), NIN.
 */
#define IN(p, o) ((__global const T*)((__global const char*)(p) + (o)))
#define OUT(p, o) ((__global T*)((__global char*)(p) + (o)))
#define PICK(k) if (NIN > k && c >= starts.s##k) { t = t##k; at = o##k; w = widths.s##k; c0 = starts.s##k; }
#define PICKS PICK(1) PICK(2) PICK(3) PICK(4) PICK(5) PICK(6) PICK(7)
#define TENSORS(q) q char* t0, const ulong o0, q char* t1, const ulong o1, q char* t2, const ulong o2, \
                   q char* t3, const ulong o3, q char* t4, const ulong o4, q char* t5, const ulong o5, \
                   q char* t6, const ulong o6, q char* t7, const ulong o7
#define GEOMETRY const int outer, const int cols, const int total, const int col0, const int8 starts, \
                 const int8 widths

__kernel void concat(GEOMETRY, __global char* y_, const ulong oy, TENSORS(__global const))
{
    const int c = get_global_id(0), r = get_global_id(1);
    if (c >= cols || r >= outer) return;
    __global const char* t = t0;
    ulong at = o0;
    int w = widths.s0, c0 = 0;
    PICKS
    OUT(y_, oy)[r * total + col0 + c] = IN(t, at)[r * w + c - c0];
}

__kernel void split(GEOMETRY, __global const char* x_, const ulong ox, TENSORS(__global))
{
    const int c = get_global_id(0), r = get_global_id(1);
    if (c >= cols || r >= outer) return;
    __global char* t = t0;
    ulong at = o0;
    int w = widths.s0, c0 = 0;
    PICKS
    OUT(t, at)[r * w + c - c0] = IN(x_, ox)[r * total + col0 + c];
}
