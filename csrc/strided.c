/* Element-wise ops over strided tensors, a run of native launches in one call, and oneDNN's execute as a native
   launch (backends/cpu/strided.py; docs/cpu.md, "Native kernels"). A decoder of hidden 128 runs ~150 small
   copies, transposes, slices and additions a token: through NumPy each costs ~1-2 us of dispatch, here ~0.1 us,
   and a run of them is one call from Python. */

#include <stdint.h>
#include <string.h>

#include "strided.h"

#define NAME(x) x##_c
#include "strided_kernel.h"
#undef NAME

#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#define NAME(x) x##_avx2
#include "strided_kernel.h"
#undef NAME
#pragma GCC pop_options

static int use_avx2 = -1;
static int avx2(void) {
    if (use_avx2 < 0) use_avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    return use_avx2;
}
#else
static int avx2(void) { return 0; }
#define add_row_avx2 add_row_c
#define sub_row_avx2 sub_row_c
#define mul_row_avx2 mul_row_c
#define div_row_avx2 div_row_c
#define neg_row_avx2 neg_row_c
#endif

typedef void (*arith_row)(float *, const float *, const float *, int64_t, int64_t, int64_t, int64_t);

/* n elements of `size` bytes from a (stride as) to y (stride ys) */
static void copy_row(char *y, const char *a, int64_t n, int64_t size, int64_t ys, int64_t as) {
    if (ys == 1 && as == 1) {
        memcpy(y, a, (size_t)(n * size));
        return;
    }
    switch (size) {
    case 4: {
        uint32_t *d = (uint32_t *)y;
        const uint32_t *s = (const uint32_t *)a;
        if (as == 0) { uint32_t v = s[0]; for (int64_t i = 0; i < n; i++) d[i * ys] = v; }
        else for (int64_t i = 0; i < n; i++) d[i * ys] = s[i * as];
        break;
    }
    case 8: {
        uint64_t *d = (uint64_t *)y;
        const uint64_t *s = (const uint64_t *)a;
        for (int64_t i = 0; i < n; i++) d[i * ys] = s[i * as];
        break;
    }
    case 2: {
        uint16_t *d = (uint16_t *)y;
        const uint16_t *s = (const uint16_t *)a;
        for (int64_t i = 0; i < n; i++) d[i * ys] = s[i * as];
        break;
    }
    default:
        for (int64_t i = 0; i < n; i++) y[i * ys] = a[i * as];
    }
}

/* y = c ? a : b, elements of `size` bytes */
static void where_row(char *y, const uint8_t *c, const char *a, const char *b, int64_t n, int64_t size, int64_t ys,
                      int64_t cs, int64_t as, int64_t bs) {
    if (size == 4) {
        uint32_t *d = (uint32_t *)y;
        const uint32_t *t = (const uint32_t *)a, *f = (const uint32_t *)b;
        for (int64_t i = 0; i < n; i++) d[i * ys] = c[i * cs] ? t[i * as] : f[i * bs];
        return;
    }
    for (int64_t i = 0; i < n; i++)
        memcpy(y + i * ys * size, c[i * cs] ? a + i * as * size : b + i * bs * size, (size_t)size);
}

int ctxrt_ew(const ew_args *p) {
    const int64_t r = p->rank, last = r - 1, size = p->size, n = p->shape[last];
    if (r < 1 || r > EW_RANK) return 1;
    for (int64_t d = 0; d < r; d++)
        if (p->shape[d] <= 0) return 0;
    arith_row arith = NULL;
    int fast = avx2();
    switch (p->op) {
    case EW_ADD: arith = fast ? add_row_avx2 : add_row_c; break;
    case EW_SUB: arith = fast ? sub_row_avx2 : sub_row_c; break;
    case EW_MUL: arith = fast ? mul_row_avx2 : mul_row_c; break;
    case EW_DIV: arith = fast ? div_row_avx2 : div_row_c; break;
    case EW_COPY: case EW_NEG: case EW_WHERE: break;
    default: return 2;
    }
    int64_t idx[EW_RANK] = {0};
    int64_t oy = 0, oa = 0, ob = 0, oc = 0;  /* element offsets of the row's start */
    char *y = (char *)p->y;
    const char *a = (const char *)p->a, *b = (const char *)p->b;
    for (;;) {
        switch (p->op) {
        case EW_COPY:
            copy_row(y + oy * size, a + oa * size, n, size, p->ys[last], p->as[last]);
            break;
        case EW_NEG:
            (fast ? neg_row_avx2 : neg_row_c)((float *)y + oy, (const float *)a + oa, n, p->ys[last], p->as[last]);
            break;
        case EW_WHERE:
            where_row(y + oy * size, p->c + oc, a + oa * size, b + ob * size, n, size, p->ys[last], p->cs[last],
                      p->as[last], p->bs[last]);
            break;
        default:
            arith((float *)y + oy, (const float *)a + oa, (const float *)b + ob, n, p->ys[last], p->as[last],
                  p->bs[last]);
        }
        int64_t d = last - 1;  /* the next row: an odometer over the outer dims */
        for (; d >= 0; d--) {
            idx[d]++;
            oy += p->ys[d], oa += p->as[d], ob += p->bs[d], oc += p->cs[d];
            if (idx[d] < p->shape[d]) break;
            oy -= p->ys[d] * p->shape[d], oa -= p->as[d] * p->shape[d];
            ob -= p->bs[d] * p->shape[d], oc -= p->cs[d] * p->shape[d];
            idx[d] = 0;
        }
        if (d < 0) return 0;
    }
}

/* Each launch of a run in order; at the first that fails, its index in `failed` and its status returned. */
int ctxrt_batch(batch_args *p) {
    for (int64_t i = 0; i < p->n; i++) {
        int status = p->fns[i](p->args[i]);
        if (status) {
            p->failed = i;
            return status;
        }
    }
    return 0;
}

int ctxrt_dnnl(const dnnl_args *p) {
    return p->execute(p->primitive, p->stream, (int)p->nargs, p->args);
}
