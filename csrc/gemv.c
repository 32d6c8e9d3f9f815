/* float32 GEMV with its epilogue, for a GEMM of a few rows (a decoder's token): Y = A W (+ bias) (+ residual),
   then the fused Relu or GELU, W constant and stored [K, N] or [N, K]. Memory-bound: it reads W once, so on a
   machine with idle cores it is shared among the pool's threads (csrc/pool.c; the caller chooses how many, see
   src/ctxrt/backends/cpu/gemv.py). Each kernel is compiled for AVX2+FMA and in portable C. */

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

#include "gemv.h"
#include "pool.h"

/* How a GEMV is shared among the pool's threads (csrc/pool.c: the caller never waits for a thread that has not
   begun): in chunks of about GEMV_CHUNK_BYTES of W, each one contiguous range of it. W^T [n, k]: ranges of its
   rows (columns of Y). W [k, n]: ranges of its rows, each chunk summing into a part of its own (at most
   GEMV_PARTS_MAX, and GEMV_PARTS_BYTES of parts), added at the end. (Ranges of a wide W's columns, each a run of
   a few hundred bytes a row 4n bytes apart, streamed at half the speed: an LM head of 768 x 32000 took 6.4 ms on
   two threads, by rows 3.4.) */
#define GEMV_CHUNK_BYTES (64 << 10)
#define GEMV_CHUNKS_MAX 256
#define GEMV_PARTS_MAX 16
#define GEMV_PARTS_BYTES (1 << 20)
/* the parts' sum and the epilogue of a GEMV_ROWS_KN job are shared too from this many values (or columns of
   GELU, whose erf or tanh costs ~10 ns a value) */
#define GEMV_FINISH_SHARED 8192

/* A GEMM of 2 .. GEMM_ROWS_MAX rows by W [k, n] (a prompt's few tokens, a small batch) runs on register blocks
   (gemv_kernel.h, gemm_rows: W read once for every 6 rows, where the GEMV's loop reads it once a row), shared by
   blocks of 16 columns from GEMM_SHARED_WORK multiply-adds (~30 us on one core: a shared job waits for a chunk
   a worker claimed, which a busy core can hold for a scheduler slice; a small decoder's 8 x 128 x 352 GEMMs
   shared at 2^18 ran 2-3x slower beside another process's spinning threads) */
#define GEMM_ROWS_MAX 16
#define GEMM_SHARED_WORK (1 << 21)

enum { GEMV_COLUMNS_NK, GEMV_ROWS_KN, GEMV_FINISH, GEMM_COLUMNS };

typedef struct {
    const gemv_args *p;
    int64_t chunks;
    int64_t count;  /* GEMV_ROWS_KN's chunks, y and the parts (GEMV_FINISH reads them) */
    float *parts;   /* GEMV_ROWS_KN: (count - 1) * m * n floats */
    int kind;
} gemv_job;

/* the fused activation (gemv_args.act) of one value, as onnxruntime's Relu, Gelu and SiLU compute it */
static inline float gemv_act(float v, int act) {
    switch (act) {
    case 1: return v > 0.0f ? v : 0.0f;
    case 2: return 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
    case 3: return 0.5f * v * (1.0f + tanhf(0.79788456080286536f * (v + 0.044715f * v * v * v)));
    case 4: return v / (1.0f + expf(-v));
    case 5: {
        const float c = erfcf(v * -0.70710678118654752f);
        return c == 0.0f ? 0.0f : 0.5f * v * c;  /* v -> -inf: 0, not -inf x 0 */
    }
    case 6: return erff(v);
    default: return v;
    }
}

#define NAME(x) x##_c
#include "gemv_kernel.h"
#undef NAME

#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#define GEMV_AVX2 1
#define NAME(x) x##_avx2
#include "gemv_kernel.h"
#undef NAME
#undef GEMV_AVX2
#pragma GCC pop_options

static int avx2(void) { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }
#else
static int avx2(void) { return 0; }
#define gemv_avx2 gemv_c
#endif

/* Y = act(A W (+ bias) (+ residual)) for *p, shared among up to p->threads threads. Returns 0. */
int ctxrt_gemv(const gemv_args *p) {
    if (avx2()) gemv_avx2(p);
    else gemv_c(p);
    return 0;
}

/* y = act(x) over n floats, 8 lanes at a time in the AVX2 copy (erf, erfc: N. Juffa's, csrc/vmath.h). Returns 0. */
int ctxrt_act(const act_args *p) {
    if (p->y != p->x) memmove(p->y, p->x, (size_t)p->n * sizeof(float));
    if (avx2()) act_row_avx2(p->y, 0, p->n, (int)p->act);
    else act_row_c(p->y, 0, p->n, (int)p->act);
    return 0;
}
