"""One launch list for every set of dims of a range program run on arrays (docs/shapes-and-control-flow.md,
"Shared launch lists").

The steps whose extents follow the dims (a decoder's attention: the past's Concat, Q.K^T, the mask, Softmax) get a
launch per set of dims (runtime/extents.py). Listed per set, every new past length of a generation made its own
batches of native calls (~10 for a GPT-2-style decoder, ~0.2 ms to list) and ran unbatched until then. Here the
recording of a family of sets (the same changed kernels) is merged once, with each such step a slot: run through
Python, the slot calls the step's launch at the run's dims (`ExtentRunner.cur`); a slot whose launches are native
calls of known struct sizes holds structs of its own in the list's `block`, and each run copies the structs of the
launches at its dims there (`Shared.block`, from the state's bytes: one NumPy copy). A set of dims whose
launches do not fit the slots (another number of calls) runs its own list.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ctxrt.backends.cpu.strided import is_native, structs

_ALIGN = 16


class Slot:
    """A step's place in a shared list, run through Python: its launch at the run's dims."""

    __slots__ = ("runner", "k")

    def __init__(self, runner: Any, k: int) -> None:
        self.runner, self.k = runner, k

    def __call__(self) -> None:
        self.runner.cur[self.k]()


class NativeSlot(Slot):
    """A slot of native calls: in a batch, the calls on the list's own structs (filled at each run)."""

    __slots__ = ("pairs",)

    def __init__(self, runner: Any, k: int, pairs: list[tuple[int, int]]) -> None:
        super().__init__(runner, k)
        self.pairs = pairs

    def native_at(self, key: Any = None) -> list[tuple[int, int]]:
        return self.pairs


class Shared:
    """A recording's launches with its live steps as slots (`template`), the native slots' structs (`block`,
    `layout`: per native slot, its step and (function, offset, bytes) per call), and the template merged into
    batches (`batched`, made at its first run).

    The structs of a new set of dims are predicted where they can be (`predict`): each 8-byte word of a slot's
    structs (an extent, a stride, a pointer into the arena) is fitted as a polynomial in the dims that vary among
    the sets run so far (at most MAX_VARYING; of degree 1 in each, or 2 where that fits more words), from sets
    whose structs were made from their launches (`learn`), with integer coefficients verified exactly on VERIFY more
    sets than it needs. A slot's
    structs are predicted only where every word of it fits, at varying dims >= 2 (a dim of 1 or 0 drops or empties
    an axis: those sets are made from their launches, and not fitted), the other dims as in every sample; a made
    set that disagrees with the fit drops it. A predicted struct addresses the same elements as the one its launch
    would make (a merge of contiguous axes is the same at every fitted set, or the fit fails)."""

    __slots__ = ("recording", "template", "layout", "block", "batched", "samples", "fit", "slot_words", "plans",
                 "made", "loaded")

    def __init__(self, recording: list[Any], template: list[Any], layout: list[tuple[int, list[Any]]],
                 block: np.ndarray) -> None:
        self.recording, self.template, self.layout, self.block = recording, template, layout, block
        self.batched: list[Any] | None = None
        self.samples: list[tuple[tuple[int, ...], np.ndarray]] = []  # (dims, the structs as int64 words)
        self.fit: _Fit | None = None
        # per native slot, the slice of words its structs take
        self.slot_words = [(k, calls[0][1] // 8, (calls[-1][1] + calls[-1][2] + 7) // 8) for k, calls in layout]
        self.plans: dict[Any, Any] = {}  # feeds.Plan by thread key, rebased for each set (ExtentRunner._plan)
        self.made: frozenset[int] = frozenset()  # slots never predicted (UNPREDICTED ops)
        self.loaded: np.ndarray | None = None  # the state's structs the block holds now (ExtentRunner._shared)

    def state_block(self, cur: Sequence[Any], out: np.ndarray | None = None,
                    layout: list[tuple[int, list[Any]]] | None = None) -> np.ndarray | None:
        """The native slots' structs of the launches `cur` (a set of dims' launch per step), or None where one
        does not fit its slot; into `out` (only the slots of `layout`, else all). The launches keep no struct of
        their own (strided.structs): a state's structs are these bytes only."""
        out = np.zeros_like(self.block) if out is None else out
        for k, calls in self.layout if layout is None else layout:
            got = structs(cur[k])
            if got is None or len(got) != len(calls):
                return None
            for (fn, raw), (want, off, size) in zip(got, calls, strict=True):
                view = memoryview(raw).cast("B")
                if fn != want or view.nbytes != size:
                    return None
                out[off:off + size] = view
        return out

    def learn(self, dims: tuple[int, ...], block: np.ndarray) -> None:
        """A set of dims whose structs were made from its launches: checked against the fit, kept to fit."""
        words = block.view(np.int64)
        fit = self.fit
        if fit is not None:
            got = fit.words(dims)
            if got is not None and not np.array_equal(got[fit.ok], words[fit.ok]):
                self.fit = None  # the polynomials do not hold here: fitted again from more sets
        self.samples.append((dims, words))
        if len(self.samples) > MAX_SAMPLES:
            self.samples.pop(0)
        if self.fit is None or not self.fit.ok.all():  # (a quadratic fit needs more sets than a linear one)
            self.fit = _Fit.of(self.samples) or self.fit

    def predict(self, dims: tuple[int, ...]) -> tuple[np.ndarray, frozenset[int]] | None:
        """The structs at `dims` of every slot whose words fit (a new block) and those slots' steps; None where
        none is predicted."""
        fit = self.fit
        if fit is None:
            return None
        words = fit.words(dims)
        if words is None:
            return None
        if fit.done is None:  # the slots whose every word fits, the live steps left to make (once per fit)
            fit.done = frozenset(k for k, lo, hi in self.slot_words if fit.ok[lo:hi].all() and k not in self.made)
            fit.left = ([k for k, launch in enumerate(self.recording) if hasattr(launch, "at") and k not in fit.done],
                        [(k, calls) for k, calls in self.layout if k not in fit.done])
        if not fit.done:
            return None
        return words.view(np.uint8), fit.done

    def predicted(self, dims: tuple[int, ...], vals: list[int]) -> tuple[list[Any], np.ndarray] | None:
        """(the launch per step, the structs) at these dims with the fitted slots' structs predicted: only the
        other live steps' launches are made (a predicted slot's launch is made only if a batch falls back to it:
        its entry is the recording's, which makes it at the run's dims); None where nothing is predicted."""
        got = self.predict(dims)
        if got is None:
            return None
        block, _ = got
        make, left = self.fit.left
        cur = list(self.recording)
        for k in make:
            cur[k] = cur[k].at(vals)
        if left and self.state_block(cur, block, left) is None:
            return None
        return cur, block


MAX_VARYING = 2
MAX_SAMPLES = 16
VERIFY = 2
FIT_FROM = 2  # the smallest value of a varying dim a fit learns from (0 and 1 empty or drop an axis)
FIT_SAMPLES = 2 + VERIFY  # the sets a linear fit in one dim learns from


class _Fit:
    """Integer polynomials of the words of a shared list's structs in the dims that vary among its samples."""

    __slots__ = ("varying", "fixed", "exps", "ref", "ref_feats", "coef", "ok", "done", "exps_list", "ref_list",
                 "left")

    def __init__(self, varying: list[int], fixed: dict[int, int], exps: np.ndarray, ref: np.ndarray,
                 ref_feats: np.ndarray, coef: np.ndarray, ok: np.ndarray) -> None:
        self.varying, self.fixed, self.exps, self.ref, self.ref_feats = varying, fixed, exps, ref, ref_feats
        self.coef, self.ok = coef, ok
        self.done: frozenset[int] | None = None  # (Shared.predict)
        self.left: tuple[list[int], list[tuple[int, list[Any]]]] = ([], [])  # (Shared.predicted)
        self.exps_list, self.ref_list = exps.tolist(), ref_feats.tolist()  # (words: Python ints, no NumPy call)

    @staticmethod
    def of(samples: list[tuple[tuple[int, ...], np.ndarray]]) -> _Fit | None:
        dims = np.array([d for d, _ in samples], np.int64)
        if dims.ndim != 2 or not len(dims):
            return None
        varying = [j for j in range(dims.shape[1]) if len(set(dims[:, j].tolist())) > 1]
        if not varying or len(varying) > MAX_VARYING:
            return None
        keep = (dims[:, varying] >= FIT_FROM).all(axis=1)  # a varying dim of 0 or 1 empties or drops an axis
        samples = [x for x, kept in zip(samples, keep.tolist(), strict=True) if kept]
        dims = dims[keep]
        if len(samples) < FIT_SAMPLES:
            return None
        fixed = {j: int(dims[0, j]) for j in range(dims.shape[1]) if j not in varying}
        best = None
        for degree in (1, 2):  # linear first (most words: fewer sets made before predicting), then quadratic
            exps = np.array([e for e in np.ndindex(*([degree + 1] * len(varying))) if any(e)], np.int64)
            feats = _features(dims[:, varying], exps)  # (samples, monomials)
            m = len(exps)
            df = (feats[1:] - feats[0]).astype(np.float64)
            if len(samples) < m + 1 + VERIFY or np.linalg.matrix_rank(df) < m:
                break
            words = np.stack([w for _, w in samples])
            dw = words[1:] - words[0]
            coef = np.rint(np.linalg.lstsq(df, dw.astype(np.float64), rcond=None)[0]).astype(np.int64)
            ok = ((feats[1:] - feats[0]) @ coef == dw).all(axis=0)
            if best is None or ok.sum() > best.ok.sum():
                best = _Fit(varying, fixed, exps, words[0], feats[0], coef, ok)
            if ok.all():
                break
        return best

    def words(self, dims: tuple[int, ...]) -> np.ndarray | None:
        """The fitted words at `dims` (only those in `ok` are right), or None where a fixed dim differs."""
        for j, v in self.fixed.items():
            if dims[j] != v:
                return None
        if min(dims[j] for j in self.varying) < 2:
            return None
        values = [dims[j] for j in self.varying]
        out = self.ref.copy()
        for e, ref, c in zip(self.exps_list, self.ref_list, self.coef, strict=True):  # a few monomials
            f = 1
            for v, p in zip(values, e, strict=True):
                f *= v ** p
            if f != ref:
                out += (f - ref) * c
        return out


def _features(values: np.ndarray, exps: np.ndarray) -> np.ndarray:
    """The monomials prod(values ** exps) per row of `values` (samples x dims), one column per exponent row."""
    return np.prod(values[:, None, :] ** exps[None, :, :], axis=2)


def share(runner: Any, recording: list[Any], cur: Sequence[Any]) -> Shared | None:
    """The shared list of `recording` (its live steps: the entries with `at`), slots laid out after the launches
    `cur` of one set of dims; None where one of them is native with calls of unknown size (a set of dims to share
    from is looked for again at the next)."""
    template = list(recording)
    layout: list[tuple[int, list[Any]]] = []
    total = 0
    for k, launch in enumerate(recording):
        if not hasattr(launch, "at"):
            continue
        if not is_native(cur[k]):
            template[k] = Slot(runner, k)
            continue
        got = structs(cur[k])
        if got is None:
            return None
        if not got:  # nothing to call at these dims (an empty output): a slot through Python
            template[k] = Slot(runner, k)
            continue
        calls = []
        for fn, raw in got:
            n = memoryview(raw).nbytes
            calls.append((fn, total, n))
            total += -(-n // _ALIGN) * _ALIGN
        layout.append((k, calls))
    block = np.zeros(max(total, _ALIGN), np.uint8)
    base = block.ctypes.data
    for k, calls in layout:
        template[k] = NativeSlot(runner, k, [(fn, base + off) for fn, off, _ in calls])
    shared = Shared(recording, template, layout, block)
    steps = runner.g.compiled.steps
    shared.made = frozenset(k for k, _ in layout if steps[k].op in UNPREDICTED)
    return shared


# ops whose launch's views are not polynomials of the extents everywhere: NumPy clamps and wraps a Slice's
# constant bounds (x[-8:] is the whole axis below 8 rows), so a fit from long axes would address memory outside a
# short one; their structs are always made from their launches
UNPREDICTED = frozenset({"Slice"})
