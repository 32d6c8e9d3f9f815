/* Worker threads for ctxrt's memory-bound native kernels (a token's GEMVs), with no barrier.

   OpenMP's parallel region ends at a barrier that waits for every thread of the team: on a VM whose second vCPU
   is not there when the barrier needs it (asleep and slow to wake, or taken by another tenant), a 50 us GEMV
   waits milliseconds (a 4-layer GPT-2's tokens: 99th percentile 12 ms on two OpenMP threads, 3.4 ms on one).
   Here the caller publishes a job of small chunks, starts taking chunks itself at once, and waits only for the
   chunks a worker has claimed (a worker claims one only while it runs): a worker that wakes late finds the job
   done. Workers spin briefly between jobs (a token's GEMVs come tens of microseconds apart), then sleep on a
   futex. A job and its claims share one 64-bit word (epoch, chunk count, next chunk), so a worker that read an
   old job can never claim a chunk of a newer one. One job at a time per process: a second caller meanwhile runs
   its chunks alone. Linux only (futex); elsewhere every chunk runs on the calling thread. */

#define _GNU_SOURCE
#include "pool.h"

#include <stdint.h>
#include <stdlib.h>

#if defined(__linux__)
#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/syscall.h>
#include <unistd.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define POOL_PAUSE() _mm_pause()
#else
#define POOL_PAUSE() ((void)0)
#endif

#define POOL_MAX 16                /* threads a job may use, the caller's included */
#define POOL_SPINS 10000           /* pauses a worker spins after a job before it sleeps (~0.1-0.5 ms) */
#define POOL_CHUNKS_MAX 0xFFFF

/* state: epoch << 32 | chunks << 16 | next */
static _Atomic uint64_t pool_state;
static _Atomic int64_t pool_done;
static _Atomic uint32_t pool_wake;    /* futex word: bumped at each job */
static _Atomic int pool_sleepers;
static _Atomic int pool_busy;         /* a job is running (one at a time) */
static _Atomic int pool_wanted;       /* workers asked to join the current job */
static pool_fn pool_job_fn;
static const void *pool_job_arg;
static int pool_workers;              /* started (guarded by pool_busy) */
static pthread_once_t pool_fork_once = PTHREAD_ONCE_INIT;

static long futex(_Atomic uint32_t *addr, int op, uint32_t val) {
    return syscall(SYS_futex, (uint32_t *)addr, op, val, NULL, NULL, 0);
}

/* claims the next chunk of job `epoch`: its index, or -1 when none is left (or another job is current) */
static int64_t claim(uint32_t epoch) {
    uint64_t s = atomic_load_explicit(&pool_state, memory_order_acquire);
    for (;;) {
        if ((uint32_t)(s >> 32) != epoch) return -1;
        uint64_t next = s & 0xFFFF, chunks = (s >> 16) & 0xFFFF;
        if (next >= chunks) return -1;
        if (atomic_compare_exchange_weak_explicit(&pool_state, &s, s + 1, memory_order_acq_rel,
                                                  memory_order_acquire))
            return (int64_t)next;
    }
}

static void *worker(void *self) {
    const int index = (int)(intptr_t)self;  /* 1 .. POOL_MAX - 1 */
    uint32_t seen = 0;
    for (;;) {
        uint32_t wake = atomic_load_explicit(&pool_wake, memory_order_acquire);
        uint32_t epoch = (uint32_t)(atomic_load_explicit(&pool_state, memory_order_acquire) >> 32);
        if (epoch != seen) {
            seen = epoch;
            if (index <= atomic_load_explicit(&pool_wanted, memory_order_acquire)) {
                int64_t c;
                /* the job's fn and arg stay valid while this worker holds a claimed chunk: the caller waits */
                while ((c = claim(epoch)) >= 0) {
                    pool_job_fn(pool_job_arg, c);
                    atomic_fetch_add_explicit(&pool_done, 1, memory_order_release);
                }
            }
            continue;
        }
        int spun = 0;
        while (spun < POOL_SPINS && atomic_load_explicit(&pool_wake, memory_order_acquire) == wake) {
            POOL_PAUSE();
            spun++;
        }
        if (spun == POOL_SPINS) {
            atomic_fetch_add(&pool_sleepers, 1);
            futex(&pool_wake, FUTEX_WAIT_PRIVATE, wake);
            atomic_fetch_sub(&pool_sleepers, 1);
        }
    }
    return NULL;
}

static void forked_child(void) {  /* the workers are not in a forked child: start new ones when needed */
    pool_workers = 0;
    atomic_store(&pool_busy, 0);
    atomic_store(&pool_sleepers, 0);
}

static void register_fork(void) { pthread_atfork(NULL, NULL, forked_child); }

static void *pool_mem;
static size_t pool_mem_bytes;
static int pool_granted;

int ctxrt_pool_begin(int64_t threads) {
    int expected = 0;
    if (threads > POOL_MAX) threads = POOL_MAX;
    if (threads <= 1 || !atomic_compare_exchange_strong(&pool_busy, &expected, 1)) return 0;
    pthread_once(&pool_fork_once, register_fork);
    while (pool_workers < threads - 1) {
        pthread_t t;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        int failed = pthread_create(&t, &attr, worker, (void *)(intptr_t)(pool_workers + 1));
        pthread_attr_destroy(&attr);
        if (failed) break;
        pool_workers++;
    }
    if (pool_workers == 0) {
        atomic_store_explicit(&pool_busy, 0, memory_order_release);
        return 0;
    }
    pool_granted = threads - 1 < pool_workers ? (int)threads : pool_workers + 1;
    return pool_granted;
}

void *ctxrt_pool_scratch(size_t bytes) {
    if (bytes > pool_mem_bytes) {
        void *grown = realloc(pool_mem, bytes);
        if (!grown) return NULL;
        pool_mem = grown, pool_mem_bytes = bytes;
    }
    return pool_mem;
}

void ctxrt_pool_run(pool_fn fn, const void *arg, int64_t chunks) {
    if (chunks > POOL_CHUNKS_MAX) {
        for (int64_t c = 0; c < chunks; c++) fn(arg, c);
        return;
    }
    pool_job_fn = fn, pool_job_arg = arg;
    atomic_store_explicit(&pool_done, 0, memory_order_relaxed);
    atomic_store_explicit(&pool_wanted, pool_granted - 1, memory_order_relaxed);
    uint32_t epoch = (uint32_t)(atomic_load_explicit(&pool_state, memory_order_relaxed) >> 32) + 1;
    if (epoch == 0) epoch = 1;  /* 0: a worker's "seen nothing yet" */
    atomic_store_explicit(&pool_state, (uint64_t)epoch << 32 | (uint64_t)chunks << 16, memory_order_release);
    atomic_fetch_add_explicit(&pool_wake, 1, memory_order_release);
    if (atomic_load(&pool_sleepers) > 0) futex(&pool_wake, FUTEX_WAKE_PRIVATE, (uint32_t)pool_granted - 1);
    int64_t c, mine = 0;
    while ((c = claim(epoch)) >= 0) {
        fn(arg, c);
        mine++;
    }
    /* the chunks left are running on workers that claimed them */
    while (atomic_load_explicit(&pool_done, memory_order_acquire) + mine < chunks) POOL_PAUSE();
}

void ctxrt_pool_end(void) { atomic_store_explicit(&pool_busy, 0, memory_order_release); }

#else

int ctxrt_pool_begin(int64_t threads) {
    (void)threads;
    return 0;
}

void *ctxrt_pool_scratch(size_t bytes) {
    (void)bytes;
    return NULL;
}

void ctxrt_pool_run(pool_fn fn, const void *arg, int64_t chunks) {
    for (int64_t c = 0; c < chunks; c++) fn(arg, c);
}

void ctxrt_pool_end(void) {}

#endif
