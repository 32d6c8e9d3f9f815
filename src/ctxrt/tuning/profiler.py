"""Timing a kernel's candidates on an OpenCL device (the same code runs in-process and in `ctxrt serve`).

For one kernel (one node's spec on one device) a `Bench` makes its input, output and scratch buffers once,
filled with the node's constants where it has them and seeded random values elsewhere. Each candidate is then:

1. built: `type(kernel)(spec, backend, params)` (a refusal is the candidate's error) and its program built;
2. launched once with its outputs filled with a sentinel: this warm-up absorbs one-time costs (PoCL compiles a
   work-group function at the first launch of each local size) and gives the output, which must match the
   default's (a candidate that computes something else, or leaves outputs unwritten, never wins);
3. launched again and again, each launch timed by its OpenCL profiling event (device time, not the host's
   clock), until at least `min_runs` ran and together they took `min_total_s` (tiny kernels need many runs to
   get past timer resolution); its time is the minimum.

A candidate that fails to build or run is kept with its reason. Launches go to a profiling queue of their own
on the backend's context, so programs built while tuning are the ones the compile then stores.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ctxrt.backends.kernel import NodeSpec
from ctxrt.backends.opencl.kernel import ClKernel
from ctxrt.errors import CtxrtError

_REASON = 300  # characters kept of an error message


@dataclass(frozen=True)
class Settings:
    """How each candidate is timed and how long one profile request may go on (None: no limit)."""

    min_runs: int = 3
    min_total_s: float = 0.005
    max_runs: int = 200
    budget_s: float | None = None


@dataclass
class Trial:
    params: dict[str, Any]
    time_s: float | None = None  # the fastest run; None when the candidate failed
    error: str | None = None
    runs: list[float] = field(default_factory=list)

    def as_wire(self) -> dict[str, Any]:
        return {"params": self.params, "time_s": self.time_s, "error": self.error}


class _ProfilingView:
    """The backend as kernels see it, with launches going to a profiling queue: same context, same programs."""

    def __init__(self, backend: Any) -> None:
        self._backend = backend
        self.queue = backend.cl.CommandQueue(backend.context, backend.device,
                                             properties=backend.cl.command_queue_properties.PROFILING_ENABLE)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)


def _fill(spec_dtype: np.dtype, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    dt = np.dtype(spec_dtype)
    if dt.kind == "f":
        return rng.uniform(-1.0, 1.0, shape).astype(dt)
    if dt.kind in "iu":
        return rng.integers(1, 3, shape).astype(dt)  # small and non-zero: safe as divisors and as indices
    if dt.kind == "b":
        return rng.integers(0, 2, shape).astype(dt)
    return np.zeros(shape, dt)


def _mismatch(out: np.ndarray, ref: np.ndarray) -> str | None:
    """None when `out` is `ref` up to reordered float sums (1e-4 of the largest value), else what differs."""
    if out.dtype.kind != "f":
        bad = np.count_nonzero(out != ref)
        return f"{bad} of {ref.size} values differ from the default's" if bad else None
    nan_out, nan_ref = np.isnan(out), np.isnan(ref)
    if not np.array_equal(nan_out, nan_ref):
        return "NaN where the default has a number (or the other way round): outputs left unwritten?"
    finite = ~nan_ref
    if not finite.any():
        return None
    scale = float(np.max(np.abs(ref[finite]), initial=0.0))
    diff = float(np.max(np.abs(out[finite].astype(np.float64) - ref[finite]), initial=0.0))
    tol = 1e-4 * scale + (1e-5 if out.dtype.itemsize <= 4 else 1e-10)
    return None if diff <= tol else f"output differs from the default's by {diff:.3g} (allowed {tol:.3g})"


class Bench:
    """One kernel's problem on one device: buffers made and filled once, reused by every candidate."""

    def __init__(self, backend: Any, kernel: ClKernel, inputs: list[np.ndarray | None] | None = None) -> None:
        self.backend = backend
        self.view = _ProfilingView(backend)
        self.spec: NodeSpec = kernel.spec
        self.kind = type(kernel)
        rng = np.random.default_rng(0)
        if inputs is None:
            inputs = [None if t is None else c if c is not None else _fill(t.dtype, t.shape, rng)
                      for t, c in zip(self.spec.inputs, self._consts(), strict=True)]
        self._buffers: list[Any] = []
        self.ins = [None if a is None else self._tensor(np.ascontiguousarray(a)) for a in inputs]
        self.outs = [self._tensor(np.empty(t.shape, np.dtype(t.dtype))) for t in self.spec.outputs]
        self.scratch = [self._tensor(np.zeros(int(n), np.uint8)) for n in kernel.scratch]
        self.sentinel = [np.full(t.shape, np.nan if np.dtype(t.dtype).kind == "f" else 0x5A, np.dtype(t.dtype))
                         for t in self.spec.outputs]
        self.reference: list[np.ndarray] | None = None

    def _consts(self) -> list[Any]:
        consts = list(self.spec.consts or [])
        return consts + [None] * (len(self.spec.inputs) - len(consts))

    def _tensor(self, value: np.ndarray) -> Any:
        buf = self.backend.alloc_device(value.nbytes)
        self._buffers.append(buf)
        t = self.backend.view(buf, 0, value.shape, value.dtype)
        if value.size:
            self.backend.copy_in(t, value)
        return t

    def close(self) -> None:
        for buf in self._buffers:
            buf.release()
        self._buffers = []

    def kernel(self, params: dict[str, Any]) -> ClKernel:
        return self.kind(self.spec, self.view, params)

    def run_once(self, kernel: ClKernel) -> tuple[list[np.ndarray], Any]:
        """Launch `kernel` once on sentinel-filled outputs: (outputs, the launch's event)."""
        for t, s in zip(self.outs, self.sentinel, strict=True):
            if s.size:
                self.backend.copy_in(t, s)
        launch = kernel.bind(self.ins, self.outs, self.scratch)
        event = launch()
        self.view.queue.finish()
        outs = [np.empty(t.shape, t.dtype) for t in self.outs]
        for host, t in zip(outs, self.outs, strict=True):
            if host.size:
                self.backend.copy_out(host, t)
        return outs, event

    def trial(self, params: dict[str, Any], settings: Settings) -> Trial:
        """Build, check and time one candidate (the first trial of a bench must be the default: its output is
        what the others are checked against)."""
        trial = Trial(dict(params))
        try:
            kernel = self.kernel(trial.params)
            for key in kernel.programs:
                self.backend.programs.get(key)
            outs, event = self.run_once(kernel)  # warm-up, and the output to check
            if event is None:
                raise CtxrtError("the launch returned no OpenCL event (nothing to time)")
            if self.reference is None:
                self.reference = outs
            else:
                for out, ref in zip(outs, self.reference, strict=True):
                    why = _mismatch(out, ref)
                    if why:
                        trial.error = why
                        return trial
            launch = kernel.bind(self.ins, self.outs, self.scratch)
            total = 0.0
            while len(trial.runs) < settings.max_runs and (len(trial.runs) < settings.min_runs
                                                           or total < settings.min_total_s):
                event = launch()
                event.wait()
                t = (event.profile.end - event.profile.start) * 1e-9
                trial.runs.append(t)
                total += t
            trial.time_s = min(trial.runs)
        except Exception as e:  # a candidate that does not build, is refused or fails to run: kept, never fatal
            trial.error = f"{type(e).__name__}: {' '.join(str(e).split())}"[:_REASON]
        return trial


def profile(backend: Any, kernel: ClKernel, candidates: list[dict[str, Any]], settings: Settings
            ) -> tuple[Trial, list[Trial], bool]:
    """(the default's trial, each candidate's trial, whether the time budget ran out before all were tried).
    `kernel` has the default parameters; `candidates` are tried in order."""
    start = time.perf_counter()
    bench = Bench(backend, kernel)
    try:
        default = bench.trial(kernel.params, settings)
        trials = []
        for params in candidates:
            if settings.budget_s is not None and time.perf_counter() - start >= settings.budget_s:
                return default, trials, True
            if default.time_s is None:  # no reference output: nothing can be checked against it
                trials.append(Trial(dict(params), error=f"the default parameters failed: {default.error}"))
                continue
            trials.append(bench.trial(params, settings))
        return default, trials, False
    finally:
        bench.close()


def execute(backend: Any, kernel: ClKernel, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
    """Run `kernel` once on `inputs` and return its outputs (the target server's finalize kernels)."""
    bench = Bench(backend, kernel, inputs)
    try:
        for key in kernel.programs:
            backend.programs.get(key)
        outs, _ = bench.run_once(bench.kernel(kernel.params))
        return outs
    finally:
        bench.close()
