/* Gather and GatherND. An index k into a dim of size n is read as k + n when negative; one still outside
 * [0, n) wraps (NumPy's take(mode="wrap"); the CPU backend refuses it), so no index reads outside X.
 *
 * gather: Y (pre, count, post) = X (pre, n, post) at indices (count of them). A 3-D launch over (post, count,
 *   pre): no division, neighbouring work-items copy neighbouring elements of a row.
 * gather_nd: Y (tuples, inner) = rows of X (rows, inner): tuple t's row is its batch's first row plus
 *   sum_j index[t, j] * rstr_j over the KN <= 8 indexed dims (dims rdims). A 2-D launch over (inner, tuples).
 *
 * Build options: T (an unsigned type of the element's size), TI (the indices' type), KN (gather_nd).
 */
#define IN(T_, p, o) ((__global const T_*)((__global const char*)(p) + (o)))

inline long wrap(long k, const long n)
{
    if (k < 0) k += n;
    if (k < 0 || k >= n) { k %= n; if (k < 0) k += n; }  /* out of range: rare, the division only then */
    return k;
}

__kernel void gather(__global const char* x_, const ulong ox, __global const char* i_, const ulong oi,
                     __global char* y_, const ulong oy, const int n, const int count, const int post, const int pre)
{
    const int q = get_global_id(0), i = get_global_id(1), p = get_global_id(2);
    if (q >= post || i >= count || p >= pre) return;
    const int k = (int)wrap((long)IN(TI, i_, oi)[i], n);
    ((__global T*)(y_ + oy))[(p * count + i) * post + q] = IN(T, x_, ox)[(p * n + k) * post + q];
}

#ifdef KN
#define ROW(j) if (KN > j) row += (int)wrap((long)ix[j], rdims.s##j) * rstr.s##j;

__kernel void gather_nd(__global const char* x_, const ulong ox, __global const char* i_, const ulong oi,
                        __global char* y_, const ulong oy, const int inner, const int tuples,
                        const int per_batch, const int batch_rows, const int8 rdims, const int8 rstr)
{
    const int q = get_global_id(0), t = get_global_id(1);
    if (q >= inner || t >= tuples) return;
    __global const TI* ix = IN(TI, i_, oi) + t * KN;
    int row = t / per_batch * batch_rows;
    ROW(0) ROW(1) ROW(2) ROW(3) ROW(4) ROW(5) ROW(6) ROW(7)
    ((__global T*)(y_ + oy))[t * inner + q] = IN(T, x_, ox)[row * inner + q];
}
#endif
