/* Element-wise ops over strided tensors, a run of native launches in one call, and oneDNN's execute as a native
   launch (backends/cpu/strided.py; docs/cpu.md, "Native kernels"). A decoder of hidden 128 runs ~150 small
   copies, transposes, slices and additions a token: through NumPy each costs ~1-2 us of dispatch, here ~0.1 us,
   and a run of them is one call from Python. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
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
#define bmm_axpy_row_avx2 bmm_axpy_row_c
#define bmm_dot_row_avx2 bmm_dot_row_c
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

#ifndef COPY_TI
#define COPY_TI 32
#endif
#ifndef COPY_TJ
#define COPY_TJ 8
#endif

#define TILE_LOOP(T)                                                                                       \
    for (int64_t i = i0; i < i1; i++) {                                                                    \
        T *d = (T *)y + oy + i * yt;                                                                       \
        const T *s = (const T *)a + oa + i;                                                                \
        for (int64_t j = j0; j < j1; j++) d[j] = s[j * al];                                                \
    }

/* A transposing copy (a Transpose whose output rows read the input across its rows: SegFormer's (C, HW) ->
   (HW, C)), y's rows contiguous and a contiguous along another axis t: in tiles of COPY_TILE x COPY_TILE over
   (t, last), whose source lines stay in cache while each output row of the tile is written (the row-by-row loop
   read every element from another line: 1.5 ms for 128 x 4096 floats). Returns 0 where the copy is not such. */
static int copy_tiled(const ew_args *p) {
    const int64_t r = p->rank, last = r - 1, size = p->size;
    if (r < 2 || p->ys[last] != 1 || p->as[last] == 1 || p->as[last] == 0 || p->shape[last] < 8 ||
        (size != 2 && size != 4 && size != 8))
        return 0;
    int64_t t = -1;
    for (int64_t d = last - 1; d >= 0; d--)
        if (p->as[d] == 1 && p->shape[d] >= 8) { t = d; break; }
    if (t < 0) return 0;
    const int64_t nt = p->shape[t], nl = p->shape[last], yt = p->ys[t], al = p->as[last];
    int64_t idx[EW_RANK] = {0};
    int64_t oy = 0, oa = 0;
    char *y = (char *)p->y;
    const char *a = (const char *)p->a;
    for (;;) {
        for (int64_t i0 = 0; i0 < nt; i0 += COPY_TI) {
            const int64_t i1 = i0 + COPY_TI < nt ? i0 + COPY_TI : nt;
            for (int64_t j0 = 0; j0 < nl; j0 += COPY_TJ) {
                const int64_t j1 = j0 + COPY_TJ < nl ? j0 + COPY_TJ : nl;
                if (size == 4) { TILE_LOOP(uint32_t) }
                else if (size == 2) { TILE_LOOP(uint16_t) }
                else { TILE_LOOP(uint64_t) }
            }
        }
        int64_t d = last - 1;  /* the next plane: an odometer over the dims but t and last */
        for (; d >= 0; d--) {
            if (d == t) continue;
            idx[d]++;
            oy += p->ys[d], oa += p->as[d];
            if (idx[d] < p->shape[d]) break;
            oy -= p->ys[d] * p->shape[d], oa -= p->as[d] * p->shape[d];
            idx[d] = 0;
        }
        if (d < 0) return 1;
    }
}

int ctxrt_ew(const ew_args *p) {
    if (p->rank < 1 || p->rank > EW_RANK) return 1;
    const int64_t r = p->rank, last = r - 1, size = p->size, n = p->shape[last];
    for (int64_t d = 0; d < r; d++)
        if (p->shape[d] <= 0) return 0;
    if (p->op == EW_COPY && copy_tiled(p)) return 0;
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
/* A batched float32 matrix product over strided views (backends/cpu/extents.py's MatMul of a range program's
   attention: a token's Q.K^T and weights.V at every past length, one call instead of NumPy's matmul). Rows of y
   contiguous over n with b contiguous over n take multiply-add rows; b contiguous over k (K read as stored,
   transB) with a contiguous over k take dot products; anything else the scalar loop. */
int ctxrt_bmm(const bmm_args *p) {
    if (p->rank < 0 || p->rank > BMM_RANK) return 1;
    const int64_t m = p->m, n = p->n, k = p->k, r = p->rank;
    if (m <= 0 || n <= 0) return 0;
    for (int64_t d = 0; d < r; d++)
        if (p->batch[d] <= 0) return 0;
    const int fast = avx2();
    int64_t idx[BMM_RANK] = {0};
    for (;;) {
        int64_t oa = 0, ob = 0, oy = 0;
        for (int64_t d = 0; d < r; d++) {
            oa += idx[d] * p->as[d];
            ob += idx[d] * p->bs[d];
            oy += idx[d] * p->ys[d];
        }
        const float *a = p->a + oa, *b = p->b + ob;
        float *y = p->y + oy;
        for (int64_t i = 0; i < m; i++) {
            float *yr = y + i * p->ym;
            const float *ar = a + i * p->am;
            if (p->yn == 1 && p->bn == 1)
                (fast ? bmm_axpy_row_avx2 : bmm_axpy_row_c)(yr, ar, p->ak, b, p->bk, n, k);
            else if (p->ak == 1 && p->bk == 1)
                (fast ? bmm_dot_row_avx2 : bmm_dot_row_c)(yr, p->yn, ar, b, p->bn, n, k);
            else
                for (int64_t j = 0; j < n; j++) {
                    float acc = 0.0f;
                    for (int64_t q = 0; q < k; q++) acc += ar[q * p->ak] * b[q * p->bk + j * p->bn];
                    yr[j * p->yn] = acc;
                }
        }
        int64_t d = r - 1;
        while (d >= 0 && ++idx[d] == p->batch[d]) idx[d--] = 0;
        if (d < 0) break;
    }
    return 0;
}

/* ONNX Trilu (backends/cpu/extents.py: a range program's causal mask at every past length): one pass copying x
   to y and zeroing the other triangle; x may be y. */
int ctxrt_trilu(const trilu_args *p) {
    const int64_t sz = p->size, far = p->rows + p->cols + 1;
    if (sz != 1 && sz != 2 && sz != 4 && sz != 8) return 1;
    int64_t k = p->k ? *p->k : p->k_value;
    k = k < -far ? -far : k > far ? far : k;  /* beyond the matrix either way: the same, and no overflow */
    for (int64_t b = 0; b < p->batch; b++)
        for (int64_t i = 0; i < p->rows; i++) {
            const char *x = (const char *)p->x + (b * p->xb + i * p->xr) * sz;
            char *y = (char *)p->y + (b * p->yb + i * p->yr) * sz;
            /* upper: zero j < i + k, keep the rest; lower: keep j <= i + k, zero the rest */
            int64_t edge = p->upper ? i + k : i + k + 1;
            edge = edge < 0 ? 0 : edge > p->cols ? p->cols : edge;
            const int64_t lo = p->upper ? 0 : edge, hi = p->upper ? edge : p->cols;  /* zeroed: [lo, hi) */
            for (int64_t j = 0; j < p->cols; j++) {
                char *o = y + j * p->yc * sz;
                if (j >= lo && j < hi) memset(o, 0, (size_t)sz);
                else if (x != y || p->xc != p->yc) memcpy(o, x + j * p->xc * sz, (size_t)sz);
            }
        }
    return 0;
}

int ctxrt_range(const range_args *p) {
    switch (p->type) {
    case RANGE_I64: {
        const uint64_t s = (uint64_t)(p->start ? *(const int64_t *)p->start : p->start_i);
        const uint64_t d = (uint64_t)(p->delta ? *(const int64_t *)p->delta : p->delta_i);
        for (int64_t i = 0; i < p->n; i++) ((int64_t *)p->y)[i] = (int64_t)(s + (uint64_t)i * d);  /* wraps */
        return 0;
    }
    case RANGE_I32: {
        const uint64_t s = (uint64_t)(p->start ? (int64_t)*(const int32_t *)p->start : p->start_i);
        const uint64_t d = (uint64_t)(p->delta ? (int64_t)*(const int32_t *)p->delta : p->delta_i);
        for (int64_t i = 0; i < p->n; i++) ((int32_t *)p->y)[i] = (int32_t)(uint32_t)(s + (uint64_t)i * d);
        return 0;
    }
    case RANGE_F32: {
        const float s = p->start ? *(const float *)p->start : (float)p->start_f;
        const float d = p->delta ? *(const float *)p->delta : (float)p->delta_f;
        for (int64_t i = 0; i < p->n; i++) ((float *)p->y)[i] = (float)(s + (double)i * d);
        return 0;
    }
    case RANGE_F64: {
        const double s = p->start ? *(const double *)p->start : p->start_f;
        const double d = p->delta ? *(const double *)p->delta : p->delta_f;
        for (int64_t i = 0; i < p->n; i++) ((double *)p->y)[i] = s + (double)i * d;
        return 0;
    }
    default:
        return 1;
    }
}

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

/* ew_args(op, y, a, b, c) -> (bytearray holding an ew_args, its address), or None where a view does not fit: y's
   shape with size-1 dims dropped and contiguous runs merged, each operand's strides over it (NumPy's broadcasting,
   0 along a broadcast dim) in elements; an operand overlapping y other than element for element, a misaligned
   view, or more than EW_RANK dims left give None. b and c may be None. The caller keeps the arrays alive. Made in C:
   the same work in Python (ctypes' addresses, NumPy's broadcast_to) cost ~30 us, a range program's ~30 element-wise
   launches at each new set of dims ~1 ms. */
#define EW_MAX_IN_RANK 32
static PyObject *ew_args_py(PyObject *self, PyObject *const *argv, Py_ssize_t argc) {
    (void)self;
    if (argc != 5) {
        PyErr_SetString(PyExc_TypeError, "ew_args(op, y, a, b, c)");
        return NULL;
    }
    long op = PyLong_AsLong(argv[0]);
    if (op == -1 && PyErr_Occurred()) return NULL;
    Py_buffer views[4];
    int got = 0, n_ops = 1;
    PyObject *result = NULL;
    PyObject *objs[4] = {argv[1], argv[2], argv[3], argv[4]};
    int present[4] = {1, 1, argv[3] != Py_None, argv[4] != Py_None};
    for (int i = 0; i < 4; i++) {
        if (!present[i]) continue;
        if (PyObject_GetBuffer(objs[i], &views[i], i == 0 ? PyBUF_RECORDS : PyBUF_RECORDS_RO) < 0) {
            PyErr_Clear();  /* not a strided buffer (or y read-only): NumPy's launch */
            goto none;
        }
        got |= 1 << i;
    }
    Py_buffer *y = &views[0];
    int64_t rank = y->ndim;
    if (rank > EW_MAX_IN_RANK) goto none;
    int64_t st[4][EW_MAX_IN_RANK];
    char *ptr[4];
    int which[4] = {0, 1, 2, 3};
    int count = 0;
    for (int i = 0; i < 4; i++) {
        if (!present[i]) continue;
        Py_buffer *v = &views[i];
        int lead = (int)(rank - v->ndim);
        if (lead < 0 || (v->itemsize != 1 && v->itemsize != 2 && v->itemsize != 4 && v->itemsize != 8)) goto none;
        if ((uintptr_t)v->buf % (uintptr_t)v->itemsize) goto none;
        for (int d = 0; d < rank; d++) {
            Py_ssize_t n = y->shape[d];
            if (d < lead) { st[count][d] = 0; continue; }
            Py_ssize_t m = v->shape[d - lead], s = v->strides[d - lead];
            if (m == n) st[count][d] = n > 1 ? s : 0;
            else if (m == 1) st[count][d] = 0;
            else goto none;
            if (st[count][d] % v->itemsize) goto none;
            st[count][d] /= v->itemsize;
        }
        ptr[count] = (char *)v->buf;
        which[count] = i;
        count++;
    }
    n_ops = count;
    /* overlap with y: allowed only element for element (same start, same strides) */
    {
        char *lo_y = ptr[0], *hi_y = ptr[0];
        for (int d = 0; d < rank; d++) {
            int64_t e = (y->shape[d] - 1) * st[0][d] * y->itemsize;
            if (e < 0) lo_y += e; else hi_y += e;
        }
        hi_y += y->itemsize;
        for (int k = 1; k < n_ops; k++) {
            Py_buffer *v = &views[which[k]];
            char *lo = ptr[k], *hi = ptr[k];
            int same = ptr[k] == ptr[0];
            for (int d = 0; d < rank; d++) {
                int64_t e = (y->shape[d] - 1) * st[k][d] * v->itemsize;
                if (e < 0) lo += e; else hi += e;
                if (y->shape[d] > 1 && st[k][d] * v->itemsize != st[0][d] * y->itemsize) same = 0;
            }
            hi += v->itemsize;
            if (lo < hi_y && lo_y < hi && !same) goto none;
        }
    }
    ew_args p;
    memset(&p, 0, sizeof p);
    int64_t r = 0;
    for (int d = 0; d < rank; d++) {
        int64_t n = y->shape[d];
        if (n == 1) continue;
        if (r > 0) {
            int merge = 1;
            for (int k = 0; k < n_ops; k++) {
                int64_t *col = k == 0 ? p.ys : which[k] == 1 ? p.as : which[k] == 2 ? p.bs : p.cs;
                if (col[r - 1] != st[k][d] * n) merge = 0;
            }
            if (merge) {
                p.shape[r - 1] *= n;
                for (int k = 0; k < n_ops; k++) {
                    int64_t *col = k == 0 ? p.ys : which[k] == 1 ? p.as : which[k] == 2 ? p.bs : p.cs;
                    col[r - 1] = st[k][d];
                }
                continue;
            }
        }
        if (r == EW_RANK) goto none;
        p.shape[r] = n;
        for (int k = 0; k < n_ops; k++) {
            int64_t *col = k == 0 ? p.ys : which[k] == 1 ? p.as : which[k] == 2 ? p.bs : p.cs;
            col[r] = st[k][d];
        }
        r++;
    }
    int empty = 0;
    for (int64_t d = 0; d < rank; d++)
        if (y->shape[d] == 0) empty = 1;
    if (empty || r == 0) {  /* no elements, or one (every dim of size 1): one dim of that size, strides 0 */
        memset(p.ys, 0, sizeof p.ys), memset(p.as, 0, sizeof p.as), memset(p.bs, 0, sizeof p.bs);
        memset(p.cs, 0, sizeof p.cs);
        r = 1;
        p.shape[0] = empty ? 0 : 1;
    }
    for (int64_t d = r; d < EW_RANK; d++) p.shape[d] = 1;
    p.op = op, p.rank = r, p.size = y->itemsize;
    p.y = ptr[0];
    for (int k = 1; k < n_ops; k++) {
        if (which[k] == 1) p.a = ptr[k];
        else if (which[k] == 2) p.b = ptr[k];
        else p.c = (const uint8_t *)ptr[k];
    }
    {
        PyObject *blob = PyByteArray_FromStringAndSize((const char *)&p, sizeof p);
        if (blob == NULL) goto done;
        result = Py_BuildValue("(NK)", blob, (unsigned long long)(uintptr_t)PyByteArray_AS_STRING(blob));
    }
    goto done;
none:
    result = Py_NewRef(Py_None);
done:
    for (int i = 0; i < 4; i++)
        if (got & (1 << i)) PyBuffer_Release(&views[i]);
    return result;
}

/* bmm_args(a, b, y) -> bytearray holding the bmm_args of y = a @ b (NumPy's matmul broadcasting over the batch
   dims, b any view: a transposed one read as stored), or None where they do not fit: not float32 ("f", 4 bytes),
   fewer than two dims, more than BMM_RANK batch dims, a stride not a whole element, a or b with more batch dims than
   y, a misfit of shapes. Made in C: native.bmm's Python (ctypes' addresses and fields) cost ~20 us a launch, made at
   each of a decoder's first past lengths (8 attention products a token). The caller keeps the arrays alive. */
static PyObject *bmm_args_py(PyObject *self, PyObject *const *argv, Py_ssize_t argc) {
    (void)self;
    if (argc != 3) {
        PyErr_SetString(PyExc_TypeError, "bmm_args(a, b, y)");
        return NULL;
    }
    Py_buffer v[3];
    int got = 0;
    PyObject *result = NULL;
    for (int i = 0; i < 3; i++) {
        if (PyObject_GetBuffer(argv[i], &v[i], (i == 2 ? PyBUF_RECORDS : PyBUF_RECORDS_RO)) < 0) {
            PyErr_Clear();
            goto none;
        }
        got |= 1 << i;
        if (v[i].itemsize != 4 || v[i].format == NULL || strcmp(v[i].format, "f") != 0 || v[i].ndim < 2 ||
                (uintptr_t)v[i].buf % 4)
            goto none;
        for (int d = 0; d < v[i].ndim; d++)
            if (v[i].strides[d] % 4) goto none;
    }
    Py_buffer *a = &v[0], *b = &v[1], *y = &v[2];
    int64_t r = y->ndim - 2;
    if (r > BMM_RANK || a->ndim - 2 > r || b->ndim - 2 > r) goto none;
    bmm_args p;
    memset(&p, 0, sizeof p);
    p.rank = r;
    p.m = y->shape[r], p.n = y->shape[r + 1], p.k = a->shape[a->ndim - 1];
    if (a->shape[a->ndim - 2] != p.m || b->shape[b->ndim - 2] != p.k || b->shape[b->ndim - 1] != p.n) goto none;
    p.a = a->buf, p.b = b->buf, p.y = y->buf;
    p.am = a->strides[a->ndim - 2] / 4, p.ak = a->strides[a->ndim - 1] / 4;
    p.bk = b->strides[b->ndim - 2] / 4, p.bn = b->strides[b->ndim - 1] / 4;
    p.ym = y->strides[r] / 4, p.yn = y->strides[r + 1] / 4;
    for (int64_t d = 0; d < r; d++) {  /* batch dims broadcast from the left; a size-1 one by stride 0 */
        p.batch[d] = y->shape[d];
        p.ys[d] = y->strides[d] / 4;
        Py_buffer *x[2] = {a, b};
        int64_t *out[2] = {p.as, p.bs};
        for (int q = 0; q < 2; q++) {
            int64_t e = d - (r - (x[q]->ndim - 2));  /* the operand's own batch dim, or < 0: broadcast */
            if (e < 0) { out[q][d] = 0; continue; }
            Py_ssize_t n = x[q]->shape[e];
            if (n != 1 && n != y->shape[d]) goto none;
            out[q][d] = n == 1 ? 0 : x[q]->strides[e] / 4;
        }
    }
    result = PyByteArray_FromStringAndSize((const char *)&p, sizeof p);
    goto done;
none:
    result = Py_NewRef(Py_None);
done:
    for (int i = 0; i < 3; i++)
        if (got & (1 << i)) PyBuffer_Release(&v[i]);
    return result;
}

/* addresses(arrays, cls, writable) -> [address or None per item]: an item of exactly type `cls` (numpy.ndarray)
   that is C-contiguous, writable where asked, aligned to its item size and not empty gives its data address; any
   other item (None, another type, a strided view) None. runtime/feeds.py's Plan.bind reads the addresses of a
   decoder's ~16 feeds and outputs a token: `.ctypes.data` cost ~1.1 us each. */
static PyObject *addresses_py(PyObject *self, PyObject *const *argv, Py_ssize_t argc) {
    (void)self;
    if (argc != 3 || !PyList_Check(argv[0]) || !PyType_Check(argv[1])) {
        PyErr_SetString(PyExc_TypeError, "addresses(list, type, writable)");
        return NULL;
    }
    int writable = PyObject_IsTrue(argv[2]);
    if (writable < 0) return NULL;
    Py_ssize_t n = PyList_GET_SIZE(argv[0]);
    PyObject *out = PyList_New(n);
    if (out == NULL) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *o = PyList_GET_ITEM(argv[0], i), *got = NULL;
        Py_buffer v;
        if (Py_IS_TYPE(o, (PyTypeObject *)argv[1]) &&
                PyObject_GetBuffer(o, &v, PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0)) == 0) {
            if (v.len > 0 && v.itemsize > 0 && (uintptr_t)v.buf % (uintptr_t)v.itemsize == 0)
                got = PyLong_FromUnsignedLongLong((unsigned long long)(uintptr_t)v.buf);
            PyBuffer_Release(&v);
            if (got == NULL && PyErr_Occurred()) {
                Py_DECREF(out);
                return NULL;
            }
        } else {
            PyErr_Clear();
        }
        PyList_SET_ITEM(out, i, got != NULL ? got : Py_NewRef(Py_None));
    }
    return out;
}

PyMethodDef ctxrt_strided_methods[] = {
    {"ew_args", (PyCFunction)(void (*)(void))ew_args_py, METH_FASTCALL, "csrc/strided.c's ew_args for views"},
    {"addresses", (PyCFunction)(void (*)(void))addresses_py, METH_FASTCALL, "data addresses of C-contiguous arrays"},
    {"bmm_args", (PyCFunction)(void (*)(void))bmm_args_py, METH_FASTCALL, "csrc/strided.c's bmm_args for views"},
    {NULL, NULL, 0, NULL},
};
