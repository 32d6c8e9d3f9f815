"""The host thread pools ctxrt drives (BLAS, OpenMP for oneDNN), held to one thread count per run.

Why the default is measured, not fixed: OpenBLAS splits a GEMM across its threads and synchronises them
several times per call, each waiting in a spin-and-yield loop. When another process keeps one of two cores
busy, one of our threads shares a core with it and every synchronisation waits for a scheduler time slice:
ResNet-50 went from 84 ms to 1,512 ms per run with 2 threads, but 194 ms with 1 (2 cores, a Python busy loop
as the other process). So `num_threads=None` counts the cores other processes leave idle, sampled from
/proc/stat at most every `_PERIOD` seconds, and uses that many (at least one). OpenMP's waiting threads are
told to spin only briefly (`GOMP_SPINCOUNT`, read when libgomp loads: see `openmp_waits`) before they sleep,
and oneDNN's primitives get variants for the smaller thread counts a busy machine leaves (kernels.py).

A run sets each pool's limit and restores the caller's setting afterwards: a user's own NumPy code keeps its
threads. Limits are process-wide for OpenBLAS's pthreads build; contexts running at once in several Python
threads with different settings see whichever was set last.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

_PERIOD = 0.25  # seconds between /proc/stat samples
_BUSY_CORE = 0.5  # another process using this much of a core takes that core away from us
# a gap between samples from which their average is the past rather than now: another process's burst that has
# ended (a benchmark's child processes) kept runs after it on one of two cores until the next sample, which a run
# loop of 36 calls in 25 ms never took (MobileNetV3's batch cycle 0.31 -> 0.48 ms a call). After such a gap, the
# tasks the kernel counts as running at this instant (/proc/loadavg) decide whether anything else runs now.
_STALE = 1.0


# libgomp's spin count before a waiting thread sleeps: about 0.14 ms (a pause costs 14 ns on a Xeon here; up to
# 50 ns on older ones). Measured, SqueezeNet with oneDNN on 2 cores, median of 30 runs: passive (0) 7.2-8.7 ms,
# 3,000 5.4-7.5, 10,000 4.7-5.4, 30,000 5.3-7.3 (onnxruntime 4.6-5.5). Passive waits pay a futex wake-up at each of
# a run's ~40 parallel regions; libgomp's own default (300,000, ~4 ms) keeps a core busy long after a run.
OPENMP_SPINCOUNT = "10000"


def openmp_waits() -> None:
    """Set OpenMP's waits for runtimes not yet loaded (libgomp reads them once, when it loads): spin briefly
    between parallel regions, long enough to span the gap between a run's kernels, then sleep. Under contention
    runs take fewer threads (the default count, and oneDNN primitive variants made for it), so no thread spins
    against a busy core. A user's own OMP_WAIT_POLICY or GOMP_SPINCOUNT is kept."""
    if "OMP_WAIT_POLICY" not in os.environ:
        os.environ.setdefault("GOMP_SPINCOUNT", OPENMP_SPINCOUNT)


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity), or the machine's count where affinity is unknown."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def busy_ticks(head: list[bytes]) -> int | None:
    """Ticks this machine's processes kept its cores busy, from /proc/stat's `cpu` line: user, nice, system,
    irq and softirq. Not idle or iowait; not steal (time the hypervisor gave our virtual cores to another
    machine: a noisy neighbour outside this machine, which more or fewer threads here do not change; counting
    it as busy dropped a quiet 2-core VM to one thread); not guest and guest_nice, already inside user/nice."""
    if len(head) < 5 or head[0] != b"cpu":
        return None
    try:
        ticks = [int(v) for v in head[1:]]
    except ValueError:
        return None
    return sum(ticks[i] for i in (0, 1, 2, 5, 6) if i < len(ticks))


class CoreMonitor:
    """How many cores other processes leave idle, from the system's busy time minus this process's own.

    `available()` is cheap between samples (a clock read); a sample reads /proc/stat. Where /proc/stat cannot
    be read, every usable core counts as available."""

    def __init__(self, period: float = _PERIOD) -> None:
        self.period = period
        self.cores = usable_cores()
        self._lock = threading.Lock()
        self._tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self._last: tuple[float, float, float] | None = self._sample()
        self._value = self.cores

    def _sample(self) -> tuple[float, float, float] | None:
        """(wall seconds, busy core-seconds of the machine, core-seconds of this process)."""
        try:
            with open("/proc/stat", "rb") as f:
                head = f.readline().split()
        except OSError:
            return None
        busy = busy_ticks(head)
        if busy is None:
            return None
        t = os.times()
        return time.monotonic(), busy / self._tick, t.user + t.system

    @staticmethod
    def _running() -> int | None:
        """The tasks running or runnable on the machine at this instant, this thread included (/proc/loadavg's
        fourth field), or None where it cannot be read."""
        try:
            with open("/proc/loadavg", "rb") as f:
                return int(f.read().split()[3].split(b"/")[0])
        except (OSError, IndexError, ValueError):
            return None

    def available(self) -> int:
        last = self._last
        if last is None or time.monotonic() - last[0] < self.period or not self._lock.acquire(blocking=False):
            return self._value
        try:
            now = self._sample()
            if now is not None and now[0] > last[0]:
                others = max(0.0, (now[1] - last[1]) - (now[2] - last[2])) / (now[0] - last[0])
                if now[0] - last[0] > _STALE and self._running() == 1:  # only this thread runs now
                    others = 0.0
                self._value = max(1, min(self.cores, self.cores - int(others + 1 - _BUSY_CORE)))
            self._last = now
        finally:
            self._lock.release()
        return self._value


class _Pool:
    """One library's thread limit through direct ctypes calls (threadpoolctl's own setter ignores calls from
    any Python thread but the first that set OpenBLAS's limit)."""

    def __init__(self, name: str, get: Callable[[], int], set_: Callable[[int], Any], openmp: bool) -> None:
        self.name, self.get, self.set, self.openmp = name, get, set_, openmp


def _pools() -> list[_Pool]:
    from threadpoolctl import ThreadpoolController

    pools = []
    for c in ThreadpoolController().lib_controllers:
        lib = c.dynlib
        openmp = c.user_api == "openmp" or getattr(c, "threading_layer", "") == "openmp"
        if c.internal_api == "openblas" and not openmp:
            affix = getattr(c, "_symbol_prefix", ""), getattr(c, "_symbol_suffix", "")
            get = getattr(lib, f"{affix[0]}openblas_get_num_threads{affix[1]}", None)
            set_ = getattr(lib, f"{affix[0]}openblas_set_num_threads{affix[1]}", None)
        elif openmp:
            get, set_ = getattr(lib, "omp_get_max_threads", None), getattr(lib, "omp_set_num_threads", None)
        else:
            get, set_ = c.get_num_threads, c.set_num_threads
        if get is not None and set_ is not None:
            if isinstance(set_, ctypes._CFuncPtr):
                set_.argtypes, set_.restype = [ctypes.c_int], None
            pools.append(_Pool(f"{c.internal_api}:{os.path.basename(c.filepath or '')}", get, set_, openmp))
    return pools


_STATE: dict[str, Any] = {"pools": None, "monitor": None}
_STATE_LOCK = threading.Lock()


def pools() -> list[_Pool]:
    """The thread pools of the libraries loaded now (found once; `refresh` after loading another)."""
    if _STATE["pools"] is None:
        with _STATE_LOCK:
            if _STATE["pools"] is None:
                _STATE["pools"] = _pools()
    return _STATE["pools"]


def refresh() -> None:
    """Look for thread pools again (a library with its own pool, e.g. libgomp through oneDNN, was loaded)."""
    with _STATE_LOCK:
        _STATE["pools"] = None


def monitor() -> CoreMonitor:
    if _STATE["monitor"] is None:
        with _STATE_LOCK:
            if _STATE["monitor"] is None:
                _STATE["monitor"] = CoreMonitor()
    return _STATE["monitor"]


def check_num_threads(num_threads: Any) -> int | None:
    """None or 0 (as onnxruntime's intra_op_num_threads = 0): chosen per run from the idle cores; else >= 1."""
    from ctxrt.errors import CtxrtError

    if num_threads is None or (isinstance(num_threads, int) and not isinstance(num_threads, bool)
                               and num_threads == 0):
        return None
    if isinstance(num_threads, bool) or not isinstance(num_threads, int) or num_threads < 0:
        raise CtxrtError(f"num_threads must be a positive int, or 0 / None for the default, got {num_threads!r}")
    return num_threads


_CURRENT = threading.local()  # .n: the OpenMP thread count of the run in progress on this Python thread; .idle:
# the threads ctxrt's own pool may use in it (idle_now)


def openmp_now() -> int:
    """The OpenMP thread count the run in progress on this thread set (0 outside a run): a oneDNN launch picks
    the primitive made for that count."""
    return getattr(_CURRENT, "n", 0)


def blas_held() -> bool:
    """Whether the run in progress on this thread holds BLAS to one thread while OpenMP has more (a context with
    oneDNN kernels): a NumPy kernel's large GEMM then runs on oneDNN's GEMM, on OpenMP's threads (nn.py)."""
    return getattr(_CURRENT, "blas_held", False)


def idle_now() -> int:
    """The threads a native kernel on ctxrt's own pool may use in the run in progress (gemv.py): the run's count
    (the context's setting, else the cores other processes leave idle), not rounded to what oneDNN's primitives
    were made for, and not held to one in a program of small kernels: the pool has no barrier (csrc/pool.c), so
    a GEMV streaming 1 MiB of weights takes a second idle core (~45 us instead of ~80) without the risk that
    holds the program's other kernels to one thread. 1 outside a run."""
    return getattr(_CURRENT, "idle", 1)


def openmp_count(n: int) -> int:
    """OpenMP's threads for a run of `n`: every thread the primitives were made for (`openmp_cap`) when `n`
    reaches it, else the largest power of two <= n, so that a process makes primitives for few counts (1, 2, 4,
    ... and the cap), each once, when a run first needs it."""
    cap = openmp_cap()
    return cap if n >= cap else 1 << (max(n, 1).bit_length() - 1)


class ThreadScope:
    """Enter before a run, exit after it: every pool limited to the context's thread count, then restored.

    Allocates nothing in steady state (the restore list is reused); not re-entrant."""

    def __init__(self, num_threads: int | None = None) -> None:
        self.num_threads = check_num_threads(num_threads)
        self._restore: list[tuple[_Pool, int]] = []
        self.last = 0  # the thread count of the latest run
        # Set for a context with oneDNN kernels: OpenMP's threads do its heavy work, BLAS gets one thread. Two
        # pools of n threads on n cores fight: after each BLAS call (a GEMV, attention's small GEMMs) OpenBLAS's
        # workers spin for ~0.1 s, taking a core from oneDNN's threads for the whole next run (ResNet-50 on 2
        # cores: 78-90 ms with both pools at 2 threads, 40-46 ms with BLAS at 1).
        self.openmp_owns = False
        self._outer = self._outer_idle = 0
        self._outer_held = False
        self.cap: int | None = None  # set by the program about to run: 1 when all its kernels are small (work.py)
        self.blas = False  # set by the program about to run: its large kernels are BLAS calls (GEMVs)

    def count(self) -> int:
        if self.num_threads:
            return self.num_threads
        return 1 if self.cap == 1 else monitor().available()

    def __enter__(self) -> ThreadScope:
        n = self.last = self.count()
        omp = openmp_count(n)  # never more than oneDNN's primitives were made for
        self._outer, _CURRENT.n = openmp_now(), omp
        self._outer_idle = idle_now()
        _CURRENT.idle = (self.num_threads or monitor().available()) if self.cap == 1 else n
        self._outer_held, _CURRENT.blas_held = blas_held(), bool(self.openmp_owns and not self.blas and omp > 1)
        for pool in pools():
            want = omp if pool.openmp else 1 if self.openmp_owns and not self.blas else n
            old = pool.get()
            if old != want:
                pool.set(want)
                self._restore.append((pool, old))
        return self

    def __exit__(self, *exc: object) -> None:
        for pool, old in self._restore:
            pool.set(old)
        self._restore.clear()
        _CURRENT.n, _CURRENT.idle, _CURRENT.blas_held = self._outer, self._outer_idle, self._outer_held


@contextlib.contextmanager
def creation(n: int, variant: bool = False) -> Iterator[None]:
    """Around creating a oneDNN primitive for `n` threads: OpenMP allows `n` while it is made (a primitive may
    size its scratchpad, even choose its weights format, by that count), and no run of the process will give
    OpenMP more (`openmp_cap`): running with more threads than a primitive was made for would overrun it. A
    `variant` (the same node's primitive for a run with fewer threads, used only when OpenMP has exactly `n`)
    leaves the cap alone."""
    if not variant:
        with _STATE_LOCK:
            _STATE["openmp_cap"] = min(_STATE.get("openmp_cap") or n, n)
    changed = [(p, p.get()) for p in pools() if p.openmp]
    for pool, old in changed:
        if old != n:
            pool.set(n)
    try:
        yield
    finally:
        for pool, old in changed:
            pool.set(old)


def openmp_cap() -> int:
    """The most OpenMP threads a run may use: the fewest any oneDNN primitive of the process was made for (else the
    usable cores, as the core monitor read them once: not a system call per run)."""
    return _STATE.get("openmp_cap") or monitor().cores
