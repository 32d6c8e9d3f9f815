/* Row kernels: Softmax and LogSoftmax, LayerNormalization, the ReduceX family, ArgMax and ArgMin.
 *
 * Each folds "rows": row r (0 <= r < rows) is the n elements of X at kbase(r) + roff(j), 0 <= j < n. kbase
 * decomposes r over the kept dims (KRANK <= 4; kdims and kstr are int4, component s0 the innermost) and roff
 * decomposes j over the reduced dims (RRANK <= 4; rdims, rstr). CONTIG: one reduced dim of stride 1, the row is
 * contiguous. Softmax and LayerNorm write Y at the same offsets as X (so they run in place); reductions write
 * Y[r] (the kept dims in order are the output's row-major order).
 *
 * ALG 0: one work-item per row, WGS rows per work-group. Contiguous rows are read VW elements at a time as
 *        explicit vectors (PoCL vectorises across work-items, never along a loop inside one); strided rows
 *        (a reduced dim that is not innermost) are read one element per step, neighbouring work-items reading
 *        neighbouring elements (coalesced on GPUs, vectorised across work-items by PoCL).
 * ALG 1: one work-group of WGS work-items per row (GPUs, long rows): they stride along the row (coalesced)
 *        and combine their partial results in local memory, a tree of log2(WGS) steps.
 *
 * Build options: T (element type), FLOAT (T is a float type), FP64, KRANK, RRANK, CONTIG, ALG, VW, WGS (power of 2), and per kernel:
 * LOG (softmax: LogSoftmax), HAS_B and TS, HAS_MEAN, HAS_INV (layernorm: bias, the statistics' type and which
 * statistics are written), COMB, INIT, PRE, POST, LSE (reduce: e.g. C_ADD, 0, SQUARE, P_SQRT), ARGMAX and LAST (arg).
 * Element counts fit in int (the Python side declines tensors past 2^31 elements).
 */
#ifdef FP64
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
#endif

#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#define VEC(t, n) CAT(t, n)
#if VW == 1
#define TV T
#define VLD(p) (p)[j]
#define VST(v, p) (p)[j] = (v)
#else
#define TV VEC(T, VW)
#define VLD(p) CAT(vload, VW)(0, (p) + j)
#define VST(v, p) CAT(vstore, VW)(v, 0, (p) + j)
#endif
#define SLD(p) (p)[j]

/* combining two partial results; NaN propagates through max and min as NumPy's maximum.reduce does. Written
 * with | and ?: so that they take scalars and vectors (a vector condition selects per component). */
#define C_ADD(a, b) ((a) + (b))
#define C_MUL(a, b) ((a) * (b))
#define C_MAX(a, b) ((((a) >= (b)) | ((a) != (a))) ? (a) : (b))
#define C_MIN(a, b) ((((a) <= (b)) | ((a) != (a))) ? (a) : (b))
/* the map applied to each element before combining (ReduceL1, L2, SumSquare) */
#define IDENT(v) (v)
#define ABSV(v) (((v) < (T)0) ? -(v) : (v))
#define SQUARE(v) ((v) * (v))

/* horizontal fold of a TV vector's components */
#define HRED2(C, v) C((v).s0, (v).s1)
#define HRED4(C, v) HRED2(C, C((v).lo, (v).hi))
#define HRED8(C, v) HRED4(C, C((v).lo, (v).hi))
#define HRED16(C, v) HRED8(C, C((v).lo, (v).hi))
#if VW == 1
#define HRED(C, v) (v)
#else
#define HRED(C, v) CAT(HRED, VW)(C, v)
#endif

/* element offset of index i over `rank` dims (innermost first): the last dim needs no division */
#define STEP(c) { const int q = i / d.c; o += (i - q * d.c) * s.c; i = q; }
inline int offset_of(int i, const int4 d, const int4 s, const int rank)
{
    int o = 0;
    if (rank > 1) STEP(s0)
    if (rank > 2) STEP(s1)
    if (rank > 3) STEP(s2)
    return o + i * (rank <= 1 ? s.s0 : rank == 2 ? s.s1 : rank == 3 ? s.s2 : s.s3);
}
#if CONTIG
#define ROFF(j) (j)
#else
#define ROFF(j) offset_of(j, rdims, rstr, RRANK)
#endif
#define ROW_ARGS const int n, const int4 rdims, const int4 rstr, __local T* red

#if ALG == 0 && CONTIG && VW > 1
#define VECTOR_ROWS 1
#else
#define VECTOR_ROWS 0
#endif

/* T NAME(x, n, rdims, rstr, red, p): COMB over the row of F(x[j], p), starting from INIT. ALG 1: every
 * work-item of the group returns the result (the local memory is free again when it returns). */
#if ALG == 0
#if VECTOR_ROWS
#define ROW_FOLD(NAME, COMB, INIT, F)                                                                  \
inline T NAME(__global const T* x, ROW_ARGS, const T p)                                               \
{                                                                                                      \
    TV vacc = (TV)(INIT);                                                                              \
    int j = 0;                                                                                         \
    for (; j + VW <= n; j += VW) { const TV v = VLD(x); vacc = COMB(vacc, F(v, p)); }                  \
    T acc = HRED(COMB, vacc);                                                                          \
    for (; j < n; j++) { const T v = x[j]; acc = COMB(acc, F(v, p)); }                                 \
    return acc;                                                                                        \
}
#else
#define ROW_FOLD(NAME, COMB, INIT, F)                                                                  \
inline T NAME(__global const T* x, ROW_ARGS, const T p)                                               \
{                                                                                                      \
    T acc = (T)(INIT);                                                                                 \
    for (int j = 0; j < n; j++) { const T v = x[ROFF(j)]; acc = COMB(acc, F(v, p)); }                  \
    return acc;                                                                                        \
}
#endif
#else
#define ROW_FOLD(NAME, COMB, INIT, F)                                                                  \
inline T NAME(__global const T* x, ROW_ARGS, const T p)                                               \
{                                                                                                      \
    const int lid = get_local_id(0);                                                                   \
    T acc = (T)(INIT);                                                                                 \
    for (int j = lid; j < n; j += WGS) { const T v = x[ROFF(j)]; acc = COMB(acc, F(v, p)); }           \
    red[lid] = acc;                                                                                    \
    barrier(CLK_LOCAL_MEM_FENCE);                                                                      \
    for (int h = WGS / 2; h > 0; h >>= 1) {                                                            \
        if (lid < h) red[lid] = COMB(red[lid], red[lid + h]);                                          \
        barrier(CLK_LOCAL_MEM_FENCE);                                                                  \
    }                                                                                                  \
    acc = red[0];                                                                                      \
    barrier(CLK_LOCAL_MEM_FENCE);                                                                      \
    return acc;                                                                                        \
}
#endif

/* Y[j] = G(X[j], LD) over the row, LD loading another per-element operand at j (LayerNorm's scale and bias) */
#if VECTOR_ROWS
#define ROW_MAP(G)                                                                                     \
    { int j = 0;                                                                                       \
      for (; j + VW <= n; j += VW) { const TV v = VLD(x); VST(G(v, VLD), y); }                         \
      for (; j < n; j++) { const T v = x[j]; y[j] = G(v, SLD); } }
#elif ALG == 0
#define ROW_MAP(G) for (int j = 0; j < n; j++) { const T v = x[ROFF(j)]; y[ROFF(j)] = G(v, SLD); }
#else
#define ROW_MAP(G) for (int j = get_local_id(0); j < n; j += WGS) { const T v = x[ROFF(j)]; y[ROFF(j)] = G(v, SLD); }
#endif

/* which row this work-item works on, and the local memory ALG 1 combines in */
#if ALG == 0
#define ROW_START const int r = get_global_id(0); if (r >= rows) return; __local T* red = 0;
#else
#define ROW_START const int r = get_group_id(0); __local T red[WGS];
#endif
#define GEOMETRY const int rows, const int n, const int4 kdims, const int4 kstr, const int4 rdims, const int4 rstr
#ifndef TS
#define TS T
#endif
#define IN(T_, p, o) ((__global const T_*)((__global const char*)(p) + (o)))

#define ID2(v, p) (v)
#define EXP_SHIFT(v, p) exp((v) - (p))
#define SQ_DEV(v, p) (((v) - (p)) * ((v) - (p)))

#if FLOAT
ROW_FOLD(row_max, C_MAX, -INFINITY, ID2)
ROW_FOLD(row_sum, C_ADD, 0, ID2)
ROW_FOLD(row_sum_exp, C_ADD, 0, EXP_SHIFT)
ROW_FOLD(row_sum_sq_dev, C_ADD, 0, SQ_DEV)
#define ISNAN(v) isnan(v)
#else
#define ISNAN(v) 0
#endif

#if FLOAT
/* ---- Softmax / LogSoftmax: max, sum of exp(x - max), then the map; correct in place ----------------------- */
#define SOFTMAX_G(v, LD) (exp((v) - m) * inv)
#define LOGSOFTMAX_G(v, LD) ((v) - l)

__kernel void softmax(GEOMETRY, __global const char* x_, const ulong ox, __global char* y_, const ulong oy)
{
    ROW_START
    const int base = offset_of(r, kdims, kstr, KRANK);
    __global const T* x = IN(T, x_, ox) + base;
    __global T* y = (__global T*)(y_ + oy) + base;
    const T m = row_max(x, n, rdims, rstr, red, (T)0);
    const T s = row_sum_exp(x, n, rdims, rstr, red, m);
#if LOG
    const T l = m + log(s);
    ROW_MAP(LOGSOFTMAX_G)
#else
    const T inv = (T)1 / s;
    ROW_MAP(SOFTMAX_G)
#endif
}

/* ---- LayerNormalization over contiguous rows: mean, mean squared deviation (two passes, as the reference),
 * y = (x - mean) * invstd * scale + bias; Mean and InvStdDev per row in TS when asked; correct in place --- */
#if HAS_B
#define LN_G(v, LD) (((v) - mean) * inv * LD(g) + LD(b))
#else
#define LN_G(v, LD) (((v) - mean) * inv * LD(g))
#endif

__kernel void layernorm(GEOMETRY, __global const char* x_, const ulong ox, __global const char* g_, const ulong og,
                        __global const char* b_, const ulong ob, __global char* y_, const ulong oy,
                        __global char* mean_, const ulong omean, __global char* inv_, const ulong oinv, const T eps)
{
    ROW_START
    const int base = offset_of(r, kdims, kstr, KRANK);
    __global const T* x = IN(T, x_, ox) + base;
    __global T* y = (__global T*)(y_ + oy) + base;
    __global const T* g = IN(T, g_, og);
    __global const T* b = IN(T, b_, ob);
    const T mean = row_sum(x, n, rdims, rstr, red, (T)0) / (T)n;
    const T inv = rsqrt(row_sum_sq_dev(x, n, rdims, rstr, red, mean) / (T)n + eps);
    ROW_MAP(LN_G)
#if HAS_MEAN || HAS_INV
    if (ALG == 0 || get_local_id(0) == 0) {
#if HAS_MEAN
        ((__global TS*)(mean_ + omean))[r] = (TS)mean;
#endif
#if HAS_INV
        ((__global TS*)(inv_ + oinv))[r] = (TS)inv;
#endif
    }
#endif
}

#endif

/* ---- ReduceX: Y[r] = POST(COMB over the row of PRE(x)); ReduceLogSumExp as max + log(sum(exp(x - max))) ---- */
#define P_ID(a) (a)
#define P_MEAN_F(a) ((a) * ((T)1 / (T)n))
#define P_MEAN_I(a) ((a) / (T)n)
#define P_SQRT(a) sqrt(a)
#ifdef COMB
#define PRE2(v, p) PRE(v)
ROW_FOLD(row_reduce, COMB, INIT, PRE2)

__kernel void reduce(GEOMETRY, __global const char* x_, const ulong ox, __global char* y_, const ulong oy)
{
    ROW_START
    __global const T* x = IN(T, x_, ox) + offset_of(r, kdims, kstr, KRANK);
#if LSE
    const T m = row_max(x, n, rdims, rstr, red, (T)0);
    const T v = m + log(row_sum_exp(x, n, rdims, rstr, red, m));
#else
    const T acc = row_reduce(x, n, rdims, rstr, red, (T)0);
    const T v = POST(acc);
#endif
    if (ALG == 0 || get_local_id(0) == 0)
        ((__global T*)(y_ + oy))[r] = v;
}
#endif

/* ---- ArgMax / ArgMin along one axis (ALG 0): the first extreme (LAST: the last); NaN counts as the
 * extreme, its first (last) occurrence wins, as NumPy's argmax of the (reversed) row -------------------------- */
#ifdef ARGMAX
#if ARGMAX
#define BEYOND(v, best) ((v) > (best))
#else
#define BEYOND(v, best) ((v) < (best))
#endif
#if LAST
#define BETTER(v, best) (ISNAN(v) || (!ISNAN(best) && ((v) == (best) || BEYOND(v, best))))
#else
#define BETTER(v, best) (!ISNAN(best) && (ISNAN(v) || BEYOND(v, best)))
#endif

__kernel void arg(GEOMETRY, __global const char* x_, const ulong ox, __global char* y_, const ulong oy)
{
    const int r = get_global_id(0);
    if (r >= rows) return;
    __global const T* x = IN(T, x_, ox) + offset_of(r, kdims, kstr, KRANK);
    T best = x[0];
    long at = 0;
    for (int j = 1; j < n; j++) {
        const T v = x[ROFF(j)];
        if (BETTER(v, best)) { best = v; at = j; }
    }
    ((__global long*)(y_ + oy))[r] = at;
}
#endif
