/* ctxrt's own worker threads for memory-bound native kernels (csrc/pool.c). */
#ifndef CTXRT_POOL_H
#define CTXRT_POOL_H
#include <stddef.h>
#include <stdint.h>

typedef void (*pool_fn)(const void *arg, int64_t chunk);

/* Takes the pool for a job of up to `threads` threads, the caller's included: returns how many it may use (>= 2),
   or 0 where it cannot (one thread asked, another job holding the pool, no threads on this platform): then the
   caller runs its work alone. Each successful begin is followed by ctxrt_pool_end. */
int ctxrt_pool_begin(int64_t threads);

/* `bytes` of scratch memory, the pool's own, valid until ctxrt_pool_end (kept and reused by later jobs). NULL where
   it cannot be allocated. */
void *ctxrt_pool_scratch(size_t bytes);

/* fn(arg, c) for every chunk c < chunks, on the calling thread and the workers begin granted. The caller takes
   chunks itself from the start and waits only for chunks a worker has begun: a worker that is asleep, or whose
   core another process holds, is never waited for. Returns when every chunk is done. */
void ctxrt_pool_run(pool_fn fn, const void *arg, int64_t chunks);

void ctxrt_pool_end(void);

#endif
