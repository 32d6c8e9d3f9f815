/* Quantized ops on OpenCL (quant_ops.py): QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear, QLinearAdd,
 * QLinearMul, QLinearLookup (a 256-byte table or an affine map per channel; QLinearSigmoid and QLinearLeakyRelu as
 * tables made at compile time), QLinearConcat (a part at a time),
 * QLinearGlobalAveragePool, QLinearAveragePool and MaxPool of integers.
 *
 * Each computes the float32 operations of the CPU backend's kernels (backends/cpu/quant/) in their order, so both
 * give the same bytes: no contraction into fma (the pragma), divisions correctly rounded (quant_ops.py builds with
 * -cl-fp32-correctly-rounded-divide-sqrt where the device has it), rint rounds half to even, saturation clamps
 * to the output type's range before the conversion (exact: integral values in range).
 *
 * Build options: one K_<kernel> selects the kernel; TX, TY, TZ the OpenCL types of the integer input, output and
 * zero point; YLO, YHI the output type's range as floats; WGS the work-group size (1-D kernels) or WX, WY (pools).
 * Each tensor is (buffer, byte offset); a zero point that is not given is a flag argument (0: its buffer is not
 * read, the zero point is 0: x - 0 and t + 0 are the values themselves).
 */
#pragma OPENCL FP_CONTRACT OFF

#define IN(T, p, o) ((__global const T*)((__global const char*)(p) + (o)))
#define OUT(T, p, o) ((__global T*)((__global char*)(p) + (o)))
/* NumPy's maximum then minimum (no NaN reaches here but a NaN input's) */
#define SAT(t) ((t) < (YLO) ? (YLO) : (t) > (YHI) ? (YHI) : (t))
#define ZP(T, given, p, o, c) ((given) ? (float)IN(T, p, o)[c] : 0.0f)
/* rint for a value saturated afterwards: below 2^22 in magnitude adding and subtracting 1.5 * 2^23 rounds half to
 * even exactly (the default rounding mode); beyond, the result is off by at most a unit but saturates all the same
 * (every type here is 16 bits or narrower); NaN and infinities pass through. PoCL's rint is ~20 instructions. */
#define RINT(t) (((t) + 12582912.0f) - 12582912.0f)

#ifdef K_QUANTIZE
/* QuantizeLinear: y = saturate(rint(x / scale[c]) + zp[c]), c = (i / post) % nch (per axis) or 0 (per tensor) */
__kernel __attribute__((reqd_work_group_size(WGS, 1, 1)))
void quantize(const uint n, const uint post, const uint nch, __global const char* x_, const ulong ox,
              __global const char* s_, const ulong os, const int has_z, __global const char* z_, const ulong oz,
              __global char* y_, const ulong oy)
{
    const uint i = get_global_id(0);
    if (i >= n) return;
    const uint c = nch > 1 ? (i / post) % nch : 0u;
    float t = RINT(IN(float, x_, ox)[i] / IN(float, s_, os)[c]);
    t = t + ZP(TZ, has_z, z_, oz, c);
    t = SAT(t);
    OUT(TY, y_, oy)[i] = (TY)t;
}
#endif

#ifdef K_DEQUANTIZE
/* DequantizeLinear: y = ((float)x - (float)zp[c]) * scale[c] */
__kernel __attribute__((reqd_work_group_size(WGS, 1, 1)))
void dequantize(const uint n, const uint post, const uint nch, __global const char* x_, const ulong ox,
                __global const char* s_, const ulong os, const int has_z, __global const char* z_, const ulong oz,
                __global char* y_, const ulong oy)
{
    const uint i = get_global_id(0);
    if (i >= n) return;
    const uint c = nch > 1 ? (i / post) % nch : 0u;
    float t = convert_float_rte(IN(TX, x_, ox)[i]);
    if (has_z)
        t = t - convert_float_rte(IN(TX, z_, oz)[c]);
    OUT(float, y_, oy)[i] = t * IN(float, s_, os)[c];
}
#endif

#ifdef K_DYNAMIC
/* DynamicQuantizeLinear in three launches: each work-group's min and max (part[2g], part[2g + 1]); the scale and
 * zero point from the groups' (one work-item); the quantization. Min and max are exact in any order. */
__kernel __attribute__((reqd_work_group_size(WGS, 1, 1)))
void minmax(const uint n, __global const char* x_, const ulong ox, __global char* p_, const ulong op)
{
    __global const float* x = IN(float, x_, ox);
    float lo = INFINITY, hi = -INFINITY;
    for (uint i = get_global_id(0); i < n; i += get_global_size(0)) {
        const float v = x[i];
        lo = v < lo ? v : lo;
        hi = v > hi ? v : hi;
    }
    __local float llo[WGS], lhi[WGS];
    const uint l = get_local_id(0);
    llo[l] = lo;
    lhi[l] = hi;
    for (uint width = WGS / 2; width > 0; width /= 2) {
        barrier(CLK_LOCAL_MEM_FENCE);
        if (l < width) {
            llo[l] = llo[l + width] < llo[l] ? llo[l + width] : llo[l];
            lhi[l] = lhi[l + width] > lhi[l] ? lhi[l + width] : lhi[l];
        }
    }
    if (l == 0) {
        __global float* part = OUT(float, p_, op);
        part[2 * get_group_id(0)] = llo[0];
        part[2 * get_group_id(0) + 1] = lhi[0];
    }
}

/* scale = (hi - lo) / 255 (1 where hi == lo), zp = rint(min(255, max(0, 0 - lo / scale))), the range [lo, hi]
 * stretched to hold 0: Python's min and max of float32 scalars as the CPU kernel takes them */
__kernel void dynamic_params(const uint groups, __global const char* p_, const ulong op, __global char* s_,
                             const ulong os, __global char* z_, const ulong oz)
{
    __global const float* part = IN(float, p_, op);
    float lo = INFINITY, hi = -INFINITY;
    for (uint g = 0; g < groups; g++) {
        lo = part[2 * g] < lo ? part[2 * g] : lo;
        hi = part[2 * g + 1] > hi ? part[2 * g + 1] : hi;
    }
    lo = lo < 0.0f ? lo : 0.0f;
    hi = hi > 0.0f ? hi : 0.0f;
    const float scale = hi == lo ? 1.0f : (hi - lo) / 255.0f;
    float q = 0.0f - lo / scale;
    q = q > 0.0f ? q : 0.0f;
    q = q < 255.0f ? q : 255.0f;
    OUT(float, s_, os)[0] = scale;
    OUT(uchar, z_, oz)[0] = (uchar)rint(q);
}

__kernel __attribute__((reqd_work_group_size(WGS, 1, 1)))
void dynamic_quantize(const uint n, __global const char* x_, const ulong ox, __global const char* s_,
                      const ulong os, __global const char* z_, const ulong oz, __global char* y_, const ulong oy)
{
    const uint i = get_global_id(0);
    if (i >= n) return;
    float t = RINT(IN(float, x_, ox)[i] / IN(float, s_, os)[0]) + (float)IN(uchar, z_, oz)[0];
    t = SAT(t);
    OUT(uchar, y_, oy)[i] = (uchar)t;
}
#endif

#ifdef K_BINARY
/* QLinearAdd: C = rint((A_scale (A - A_zp) + B_scale (B - B_zp)) / C_scale) + C_zp; QLinearMul (MUL):
 * C = rint((A - A_zp)(B - B_zp) ((A_scale B_scale) / C_scale)) + C_zp; saturated. A and B broadcast against C
 * as the float element-wise kernel's inputs: MA, MB 0 at C's index, 1 one element, 2 through strides over the
 * collapsed dims (RANK of them; int8 components, s0 innermost). */
#define DIM(d, c) if (RANK > d) { const uint q = r / (uint)dims.c; const uint x = r - q * (uint)dims.c; r = q; \
                                  ka += x * (uint)sta.c; kb += x * (uint)stb.c; }
__kernel __attribute__((reqd_work_group_size(WGS, 1, 1)))
void qbinary(const uint n, const int8 dims, const int8 sta, const int8 stb,
             __global const char* a_, const ulong oa, __global const char* as_, const ulong oas, const int has_za,
             __global const char* az_, const ulong oaz,
             __global const char* b_, const ulong ob, __global const char* bs_, const ulong obs, const int has_zb,
             __global const char* bz_, const ulong obz,
             __global const char* cs_, const ulong ocs, const int has_zc, __global const char* cz_, const ulong ocz,
             __global char* y_, const ulong oy)
{
    const uint i = get_global_id(0);
    if (i >= n) return;
    uint ka = 0, kb = 0;
#if MA == 2 || MB == 2
    uint r = i;
    DIM(0, s0) DIM(1, s1) DIM(2, s2) DIM(3, s3) DIM(4, s4) DIM(5, s5) DIM(6, s6) DIM(7, s7)
#endif
    ka = MA == 0 ? i : MA == 1 ? 0u : ka;
    kb = MB == 0 ? i : MB == 1 ? 0u : kb;
    const float ta = (float)IN(TX, a_, oa)[ka] - ZP(TX, has_za, az_, oaz, 0);
    const float tb = (float)IN(TX, b_, ob)[kb] - ZP(TX, has_zb, bz_, obz, 0);
    const float sa = IN(float, as_, oas)[0], sb = IN(float, bs_, obs)[0], sc = IN(float, cs_, ocs)[0];
#if MUL
    const float m = (sa * sb) / sc;
    float t = (ta * tb) * m;
#else
    float t = (ta * sa + tb * sb) / sc;
#endif
    t = RINT(t) + ZP(TX, has_zc, cz_, ocz, 0);
    t = SAT(t);
    OUT(TY, y_, oy)[i] = (TY)t;
}
#endif

#ifdef K_LOOKUP
/* QLinearLookup: y = table[x] on the bytes */
__kernel __attribute__((reqd_work_group_size(WGS, 1, 1)))
void lookup(const uint n, __global const char* x_, const ulong ox, __global const char* t_, const ulong ot,
            __global char* y_, const ulong oy)
{
    const uint i = get_global_id(0);
    if (i >= n) return;
    OUT(uchar, y_, oy)[i] = IN(uchar, t_, ot)[IN(uchar, x_, ox)[i]];
}
#endif

#ifdef K_AFFINE
/* QLinearLookup's affine form: y = saturate(rint(x a[c] + b[c])), the multiply and the add rounded apart;
 * c = (i / post) % count, or 0 with one map; params = [a | b], count floats each */
__kernel __attribute__((reqd_work_group_size(WGS, 1, 1)))
void affine(const uint n, const uint post, const uint count, __global const char* x_, const ulong ox,
            __global const char* p_, const ulong op, __global char* y_, const ulong oy)
{
    const uint i = get_global_id(0);
    if (i >= n) return;
    const uint c = count > 1 ? (i / post) % count : 0u;
    __global const float* p = IN(float, p_, op);
    float t = (float)IN(TX, x_, ox)[i] * p[c];
    t = RINT(t + p[count + c]);
    t = SAT(t);
    OUT(TY, y_, oy)[i] = (TY)t;
}
#endif

#ifdef K_CONCAT
/* QLinearConcat, one part: its (outer, width) values into columns [start, start + width) of the output's
 * (outer, total): t = ((x - zp) scale) / y_scale, rint, + y_zp, saturated */
__kernel __attribute__((reqd_work_group_size(WGS, 1, 1)))
void requant(const uint outer, const uint width, const uint total, const uint start,
             __global const char* x_, const ulong ox, __global const char* s_, const ulong os, const int has_z,
             __global const char* z_, const ulong oz, __global const char* ys_, const ulong oys, const int has_yz,
             __global const char* yz_, const ulong oyz, __global char* y_, const ulong oy)
{
    const uint i = get_global_id(0);
    if (i >= outer * width) return;
    const uint row = i / width, col = i - row * width;
    float t = (float)IN(TX, x_, ox)[i] - ZP(TX, has_z, z_, oz, 0);
    t = t * IN(float, s_, os)[0];
    t = t / IN(float, ys_, oys)[0];
    t = RINT(t) + ZP(TX, has_yz, yz_, oyz, 0);
    t = SAT(t);
    OUT(TY, y_, oy)[row * total + start + col] = (TY)t;
}
#endif

#ifdef K_GAP
/* QLinearGlobalAveragePool: output j = (o, c) of (outer, inner) sums x[o, k, c] over k < count exactly (int),
 * then t = rint((float)(sum - count x_zp) * (x_scale / (y_scale count))) + y_zp, saturated */
__kernel __attribute__((reqd_work_group_size(WGS, 1, 1)))
void qgap(const uint outs, const uint count, const uint inner, __global const char* x_, const ulong ox,
          __global const char* xs_, const ulong oxs, const int has_xz, __global const char* xz_, const ulong oxz,
          __global const char* ys_, const ulong oys, const int has_yz, __global const char* yz_, const ulong oyz,
          __global char* y_, const ulong oy)
{
    const uint j = get_global_id(0);
    if (j >= outs) return;
    const uint o = j / inner, c = j - o * inner;
    __global const TX* x = IN(TX, x_, ox) + (ulong)o * count * inner + c;
    int s = 0;
    for (uint k = 0; k < count; k++)
        s += x[(ulong)k * inner];
    const long xz = has_xz ? (long)IN(TX, xz_, oxz)[0] : 0;
    const long d = (long)s - xz * (long)count;
    const float mult = IN(float, xs_, oxs)[0] / (IN(float, ys_, oys)[0] * convert_float_rte(count));
    float t = RINT(convert_float_rte(d) * mult) + ZP(TX, has_yz, yz_, oyz, 0);
    t = SAT(t);
    OUT(TY, y_, oy)[j] = (TY)t;
}
#endif

#ifdef K_POOL
/* QLinearAveragePool (AVG) and MaxPool of integers over 2-D windows (1-D: H = 1), any layout: element (b, c, y, x)
 * at b sx.s0 + c sx.s1 + y sx.s2 + x sx.s3 of the input (sy of the output). geo: h, w, oh, ow, kh, kw, sh, sw,
 * ph, pw (padding before), dh, dw, c (channels), eh, ew (padding after, counted with count_include_pad).
 * AVG: each tap dequantized ((x - zp) scale), summed along the row then the rows summed (the CPU's separable
 * order: padding adds 0), times float(1 / count), then / y_scale, rint, + y_zp, saturated. MAX: the largest
 * tap inside the input. */
__kernel __attribute__((reqd_work_group_size(WX, WY, 1)))
void pool(const int16 geo, const int4 sx, const int4 sy, __global const char* x_, const ulong ox,
          __global const char* xs_, const ulong oxs, const int has_xz, __global const char* xz_, const ulong oxz,
          __global const char* ys_, const ulong oys, const int has_yz, __global const char* yz_, const ulong oyz,
          __global char* y_, const ulong oy)
{
    const int h = geo.s0, w = geo.s1, oh = geo.s2, ow = geo.s3, kh = geo.s4, kw = geo.s5, sh = geo.s6,
              sw = geo.s7, ph = geo.s8, pw = geo.s9, dh = geo.sa, dw = geo.sb, ch = geo.sc;
    const int px = get_global_id(0), py = get_global_id(1), bc = get_global_id(2);
    if (px >= ow || py >= oh) return;
    const int b = bc / ch, c = bc - b * ch;
    __global const TX* x = IN(TX, x_, ox) + (long)b * sx.s0 + (long)c * sx.s1;
    const int y0 = py * sh - ph, x0 = px * sw - pw;
#if AVG
    const float xz = ZP(TX, has_xz, xz_, oxz, 0), xs = IN(float, xs_, oxs)[0];
    float acc = 0.0f;
    for (int ky = 0; ky < kh; ky++) {
        const int iy = y0 + ky * dh;
        if (iy < 0 || iy >= h) continue;
        float row = 0.0f;
        for (int kx = 0; kx < kw; kx++) {
            const int ix = x0 + kx * dw;
            if (ix < 0 || ix >= w) continue;
            row = row + ((float)x[(long)iy * sx.s2 + (long)ix * sx.s3] - xz) * xs;
        }
        acc = acc + row;
    }
#if INCLUDE_PAD
    const int ylo = -ph, yhi = h + geo.sd, xlo = -pw, xhi = w + geo.se;
#else
    const int ylo = 0, yhi = h, xlo = 0, xhi = w;
#endif
    const int cy = max(1, min(y0 + kh, yhi) - max(y0, ylo)), cx = max(1, min(x0 + kw, xhi) - max(x0, xlo));
    acc = acc * (1.0f / (float)(cy * cx));
    float t = RINT(acc / IN(float, ys_, oys)[0]) + ZP(TX, has_yz, yz_, oyz, 0);
    t = SAT(t);
    const TY v = (TY)t;
#else
    TX v = (TX)YLO;
    for (int ky = 0; ky < kh; ky++) {
        const int iy = y0 + ky * dh;
        if (iy < 0 || iy >= h) continue;
        for (int kx = 0; kx < kw; kx++) {
            const int ix = x0 + kx * dw;
            if (ix < 0 || ix >= w) continue;
            const TX e = x[(long)iy * sx.s2 + (long)ix * sx.s3];
            v = e > v ? e : v;
        }
    }
#endif
    OUT(TY, y_, oy)[(long)b * sy.s0 + (long)c * sy.s1 + (long)py * sy.s2 + (long)px * sy.s3] = v;
}
#endif
