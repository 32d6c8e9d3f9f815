/* Data movement by element: Transpose, Slice, Expand, Tile, DepthToSpace/SpaceToDepth and the copies of
 * Reshape & co. read Y (contiguous) from a strided view of X; Pad reads it through per-dim index maps.
 *
 * copy_nd: Y[i] = X[base + sum_d i_d * str_d] over up to 8 collapsed output dims (int8 dims and str, component
 *   s0 the innermost); strides may be 0 (broadcast) or negative (reversed slices). A 3-D launch: global ids 0
 *   and 1 are the two innermost output dims (no division), id 2 the others (decomposed with divisions).
 * transpose_tiled: for views whose innermost output dim is strided in X while another output dim (P) is X's
 *   contiguous one: TILE x TILE tiles through local memory, read along P (contiguous in X) and written along
 *   the innermost output dim L (contiguous in Y), so both sides are coalesced on GPUs and vectorised by PoCL.
 *   A work-group of TILE x ROWS work-items moves TILE / ROWS elements each; the other output dims are a batch
 *   (get_group_id(2), up to 6 dims with their X and Y strides).
 * pad: Y[i] reads X at coordinates c_d - before_d mapped into the kept range [lo_d, hi_d) of X (negative pads
 *   crop it) by MODE: 0 constant (outside: value), 1 edge (clamp), 2 wrap, 3 reflect.
 *
 * Build options: T (an unsigned type of the element's size: copies never look at values), RANK, TILE and
 * ROWS and BRANK (transpose_tiled), MODE (pad). Element offsets fit in int (the Python side declines larger tensors).
 */

#ifndef TILE
#define TILE 16
#define ROWS 4
#endif
#ifndef MODE
#define MODE 0
#endif
#ifndef RANK
#define RANK 1
#endif
#ifndef BRANK
#define BRANK 0
#endif
#define IN(p, o) ((__global const T*)((__global const char*)(p) + (o)))
#define OUT(p, o) ((__global T*)((p) + (o)))

/* component k of the 3-D launch's third id: its coordinate c and the remaining index i */
#define COORD(k, c) int c = i; if (RANK > k + 1) { const int q = i / dims.s##k; c = i - q * dims.s##k; i = q; }

#define OFF(k) if (RANK > k) { COORD(k, c) o += c * str.s##k; }

__kernel void copy_nd(__global const char* x_, const ulong ox, const int base, __global char* y_, const ulong oy,
                      const int8 dims, const int8 str, const int rest)
{
    const int i0 = get_global_id(0), i1 = get_global_id(1), i2 = get_global_id(2);
    if (i0 >= dims.s0 || i1 >= dims.s1 || i2 >= rest) return;
    int o = base + i0 * str.s0 + i1 * str.s1, i = i2;
    OFF(2) OFF(3) OFF(4) OFF(5) OFF(6) OFF(7)
    OUT(y_, oy)[(i2 * dims.s1 + i1) * dims.s0 + i0] = IN(x_, ox)[o];
}

/* batch offsets in X and Y of batch index i over bdims (rank BRANK <= 6) */
#define BOFF(k) if (BRANK > k) { const int q = i / bdims.s##k; const int c = i - q * bdims.s##k; i = q; \
                                 bx += c * bxs.s##k; by += c * bys.s##k; }

__kernel void transpose_tiled(__global const char* x_, const ulong ox, __global char* y_, const ulong oy,
                              const int np, const int nl, const int xl, const int yp,
                              const int8 bdims, const int8 bxs, const int8 bys)
{
    __local T tile[TILE][TILE + 1];
    const int lx = get_local_id(0), ly = get_local_id(1);
    const int p0 = get_group_id(0) * TILE, l0 = get_group_id(1) * TILE;
    int i = get_group_id(2), bx = 0, by = 0;
    BOFF(0) BOFF(1) BOFF(2) BOFF(3) BOFF(4) BOFF(5)
    __global const T* x = IN(x_, ox) + bx;
    __global T* y = OUT(y_, oy) + by;
    for (int k = ly; k < TILE; k += ROWS) {
        const int p = p0 + lx, l = l0 + k;
        if (p < np && l < nl)
            tile[k][lx] = x[l * xl + p];
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int k = ly; k < TILE; k += ROWS) {
        const int p = p0 + k, l = l0 + lx;
        if (p < np && l < nl)
            y[p * yp + l] = tile[lx][k];
    }
}

/* output coordinate c of dim k -> X coordinate, into o; a constant pad's outside writes `value` and returns */
#if MODE == 0
#define MAPC(k, j) if (j < lo.s##k || j >= hi.s##k) { OUT(y_, oy)[at] = value; return; }
#elif MODE == 1
#define MAPC(k, j) j = clamp(j, lo.s##k, hi.s##k - 1);
#elif MODE == 2
#define MAPC(k, j) { const int m = hi.s##k - lo.s##k; j = lo.s##k + ((j - lo.s##k) % m + m) % m; }
#else
#define MAPC(k, j) { const int m = hi.s##k - lo.s##k, per = max(2 * (m - 1), 1); \
                     const int t = ((j - lo.s##k) % per + per) % per; j = lo.s##k + (t < m ? t : per - t); }
#endif
#define PADC(k, c) { int j = (c) - before.s##k; MAPC(k, j) o += j * str.s##k; }
#define PAD(k) if (RANK > k) { COORD(k, c) PADC(k, c) }

__kernel void pad(__global const char* x_, const ulong ox, __global char* y_, const ulong oy, const int8 dims,
                  const int8 str, const int8 before, const int8 lo, const int8 hi, const int rest, const T value)
{
    const int i0 = get_global_id(0), i1 = get_global_id(1), i2 = get_global_id(2);
    if (i0 >= dims.s0 || i1 >= dims.s1 || i2 >= rest) return;
    const int at = (i2 * dims.s1 + i1) * dims.s0 + i0;
    int o = 0, i = i2;
    PADC(0, i0)
    if (RANK > 1) PADC(1, i1)
    PAD(2) PAD(3) PAD(4) PAD(5) PAD(6) PAD(7)
    OUT(y_, oy)[at] = IN(x_, ox)[o];
}
