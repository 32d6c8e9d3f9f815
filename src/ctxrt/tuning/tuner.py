"""Tuning mode at compile time: each tunable kernel's signature is looked up in the performance cache, else its
candidates are profiled on the target device (this machine's, or a target server's), and the winner replaces
the default kernel before memory is planned.

The search knows nothing kernel-specific (CLBlast's rule): it reads the kernel's `Space`. Spaces small enough
(at most EXHAUSTIVE valid candidates) are tried whole; larger ones (the GEMM's has thousands on a CPU device) are
searched by steepest descent from the default: every valid candidate that differs from the current best in
one parameter is tried, the best becomes the current one if it is MOVE faster, until no neighbour is, or the
budget (candidates or seconds per kernel) is spent. A winner must beat the default by MIN_GAIN, or the default
stays: a difference inside the noise is no reason to leave the well-trodden configuration.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from ctxrt import progress
from ctxrt.backends.kernel import Kernel
from ctxrt.backends.opencl.kernel import ClKernel
from ctxrt.errors import ServerError
from ctxrt.tuning.cache import PerformanceCache
from ctxrt.tuning.config import TuningConfig
from ctxrt.tuning.profiler import Settings, Trial, profile
from ctxrt.tuning.signature import Signature, signature, tunable

EXHAUSTIVE = 64
MOVE = 0.03
MIN_GAIN = 0.02
# Server answers that concern one kernel (the rest, e.g. a lost connection, end the compile).
KERNEL_ERRORS = ("device_error", "unsupported", "job_timeout", "bad_request", "too_large")


class Device(Protocol):
    """Where candidates run: this machine's OpenCL device, or a target server's."""

    def device_id(self) -> dict[str, str]: ...

    def profile(self, kernel: ClKernel, candidates: list[dict[str, Any]], settings: Settings
                ) -> tuple[Trial, list[Trial], bool]: ...


class LocalDevice:
    """The OpenCL backend of this process."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend

    def device_id(self) -> dict[str, str]:
        return self.backend.device_id()

    def profile(self, kernel: ClKernel, candidates: list[dict[str, Any]], settings: Settings
                ) -> tuple[Trial, list[Trial], bool]:
        return profile(self.backend, kernel, candidates, settings)


def _frozen(p: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted(p.items()))


@dataclass
class Outcome:
    """One signature's result, as the performance cache stores it."""

    default: dict[str, Any]
    default_time_s: float | None
    best: dict[str, Any]
    best_time_s: float | None
    tried: list[list[Any]]  # [params, time_s or None, error or None]
    complete: bool
    note: str = ""

    def entry(self, sig: Signature) -> dict[str, Any]:
        return {"signature": sig.fields, "label": sig.label, "default": self.default,
                "default_time_s": self.default_time_s, "best": self.best, "best_time_s": self.best_time_s,
                "tried": self.tried, "complete": self.complete, "note": self.note}

    @classmethod
    def from_entry(cls, e: Mapping[str, Any]) -> Outcome:
        return cls(dict(e["default"]), e["default_time_s"], dict(e["best"]), e["best_time_s"], list(e["tried"]),
                   bool(e.get("complete")), str(e.get("note", "")))


class Tuner:
    """Tunes kernels for one device through one compile (several graphs or models share its results)."""

    def __init__(self, config: TuningConfig, device: Device) -> None:
        self.config = config
        self.device = device
        self.cache = (PerformanceCache(config.performance_cache_dir, device.device_id(),
                                       config.invalidate_performance_cache)
                      if config.performance_cache_dir else None)
        self.results: dict[str, Outcome] = {}
        self.counters: Counter[str] = Counter()  # kernels_profiled, kernels_from_cache, candidates_tried, ...
        self.best_speedup = 1.0

    def tune(self, graph: str, kernels: Mapping[int, Kernel], names: Mapping[int, str]
             ) -> tuple[dict[int, tuple[Kernel, dict[str, Any]]], list[dict[str, Any]]]:
        """Of one graph's kernels (step -> kernel; `names`: step -> node name), the tunable ones as
        (kernel with the winner's parameters, those parameters), and the graph's tuning record (one entry per
        signature: its nodes, parameters, default and best time)."""
        todo = {step: k for step, k in kernels.items() if tunable(k)}
        sigs = {step: signature(k) for step, k in todo.items()}  # type: ignore[arg-type]
        progress.stage(f"tuning {graph}", len(set(s.key for s in sigs.values())), "kernel")
        tuned: dict[int, tuple[Kernel, dict[str, Any]]] = {}
        record: dict[str, dict[str, Any]] = {}
        for step, kernel in todo.items():
            sig = sigs[step]
            if sig.key not in record:
                outcome, source = self._outcome(kernel, sig)  # type: ignore[arg-type]
                record[sig.key] = _record_entry(graph, kernel, sig, outcome, source)
                progress.advance()
            entry = record[sig.key]
            entry["nodes"].append(names[step])
            tuned[step] = self._rebuild(kernel, entry["params"]), dict(entry["params"])  # type: ignore[arg-type]
        return tuned, list(record.values())

    def _rebuild(self, kernel: ClKernel, params: dict[str, Any]) -> Kernel:
        return kernel if params == kernel.params else type(kernel)(kernel.spec, kernel.backend, params)

    def _outcome(self, kernel: ClKernel, sig: Signature) -> tuple[Outcome, str]:
        if sig.key in self.results:
            return self.results[sig.key], "profiled"
        hit = self.cache.get(sig.key) if self.cache else None
        if hit is not None and self._usable(hit, kernel):
            self.counters["kernels_from_cache"] += 1
            outcome, source = Outcome.from_entry(hit), "cache"
        else:
            outcome, source = _Search(kernel, self.device, self.config, self.counters, self._show).run(), "profiled"
            self.counters["kernels_profiled"] += 1
            if self.cache is not None and not outcome.note:
                self.cache.put(sig.key, outcome.entry(sig))  # saved now: a run killed later keeps it
        self.results[sig.key] = outcome
        if outcome.best_time_s and outcome.default_time_s:
            self.best_speedup = max(self.best_speedup, outcome.default_time_s / outcome.best_time_s)
        self._show()
        return outcome, source

    def _usable(self, entry: Mapping[str, Any], kernel: ClKernel) -> bool:
        """A cache entry serves if its search finished (or this run has a budget too) and its winner is valid."""
        budget = self.config.tuning_budget_seconds or self.config.tuning_budget_candidates
        if not (entry.get("complete") or budget):
            return False
        values = kernel.space.params
        if any(type(v) not in {type(x) for x in values.get(k, ())} for k, v in entry["best"].items()):
            return False  # 1.0 or true where the space has 1: equal in Python, another build of the kernel
        return kernel.space.why_invalid(entry["best"], kernel.problem(), kernel.backend.info) is None

    def _show(self) -> None:
        c = self.counters
        progress.postfix(f"{c['candidates_tried']} candidates, best {self.best_speedup:.2f}x, "
                         f"{c['kernels_from_cache']} from cache")


class _DefaultFailed(Exception):
    """The default parameters could not be timed: nothing to compare candidates with."""


class _Search:
    """One kernel's search: the trials so far, the default's times, what is left of the budget."""

    def __init__(self, kernel: ClKernel, device: Device, config: TuningConfig, counters: Counter[str],
                 show: Any) -> None:
        self.kernel, self.device, self.config, self.counters, self.show = kernel, device, config, counters, show
        self.start = time.perf_counter()
        self.default = dict(kernel.params)
        self.trials: dict[tuple[tuple[str, Any], ...], Trial] = {}
        self.default_times: list[float] = []
        self.left = config.tuning_budget_candidates

    def run(self) -> Outcome:
        valid = list(self.kernel.space.candidates(self.kernel.problem(), self.kernel.backend.info))
        others = [p for p in valid if p != self.default]
        try:
            if len(valid) <= EXHAUSTIVE and (self.left is None or len(others) <= self.left):
                complete = self._batch(others)
            else:
                complete = self._descend(valid)
        except _DefaultFailed as e:
            return Outcome(self.default, None, self.default, None, [], False, f"the default parameters failed: {e}")
        except ServerError as e:
            if e.code not in KERNEL_ERRORS:
                raise
            return Outcome(self.default, None, self.default, None, [], False, f"target server: {e}")
        return _decide(self.default, min(self.default_times, default=None), self.trials, complete)

    def _batch(self, batch: list[dict[str, Any]]) -> bool:
        """Profile `batch` (the default is timed first, every time); False when the time budget ran out."""
        budget = self.config.tuning_budget_seconds
        if budget is not None:  # spent: the default is still timed (the record needs it), no candidate is
            budget = max(0.0, budget - (time.perf_counter() - self.start))
        default, done, spent = self.device.profile(self.kernel, batch, Settings(budget_s=budget))
        if default.time_s is None:
            raise _DefaultFailed(default.error or "no time")
        self.default_times.append(default.time_s)
        for t in done:
            self.trials[_frozen(t.params)] = t
        self.counters["candidates_tried"] += len(done)
        if self.left is not None:
            self.left -= len(done)
        self.show()
        return not spent

    def _descend(self, valid: list[dict[str, Any]]) -> bool:
        """Steepest descent over one-parameter moves; True when it converged (no budget cut it short)."""
        current = self.default
        while True:
            todo = [p for p in valid
                    if p != self.default and _frozen(p) not in self.trials and _distance(p, current) == 1]
            if not todo:
                return True
            cut = self.left is not None and len(todo) > self.left
            if cut:
                todo = todo[:self.left]
            if not todo or not self._batch(todo):
                return False
            best = _fastest(self.trials.values())
            base = (self.trials[_frozen(current)].time_s if current is not self.default
                    else min(self.default_times))
            if best is None or base is None or best.time_s >= base * (1 - MOVE):  # type: ignore[operator]
                return not cut  # no better neighbour among those tried: converged unless some were left out
            if cut:
                return False
            current = best.params


def _fastest(trials: Any) -> Trial | None:
    ok = [t for t in trials if t.time_s is not None]
    return min(ok, key=lambda t: t.time_s) if ok else None


def _distance(a: Mapping[str, Any], b: Mapping[str, Any]) -> int:
    return sum(a[k] != b[k] for k in a)


def _decide(default: dict[str, Any], default_time: float | None, trials: Mapping[Any, Trial],
            complete: bool) -> Outcome:
    tried = [[t.params, t.time_s, t.error] for t in trials.values()]
    best = _fastest(trials.values())
    if best is None or default_time is None or best.time_s > default_time * (1 - MIN_GAIN):  # type: ignore[operator]
        return Outcome(default, default_time, default, default_time, tried, complete)
    return Outcome(default, default_time, best.params, best.time_s, tried, complete)


def _us(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1e6, 3)


def _record_entry(graph: str, kernel: ClKernel, sig: Signature, o: Outcome, source: str) -> dict[str, Any]:
    """One signature's line of the context's tuning record (format/schema.py checks it)."""
    return {"graph": graph, "signature": sig.key, "label": sig.label, "op": kernel.spec.op,
            "kernel": type(kernel).__name__, "nodes": [], "params": o.best, "default_params": o.default,
            "default_time_us": _us(o.default_time_s), "best_time_us": _us(o.best_time_s),
            "tried": len(o.tried), "failed": sum(1 for t in o.tried if t[1] is None), "source": source,
            "complete": o.complete, "note": o.note}
