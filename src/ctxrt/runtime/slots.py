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
    batches (`batched`, made at its first run)."""

    __slots__ = ("recording", "template", "layout", "block", "batched")

    def __init__(self, recording: list[Any], template: list[Any], layout: list[tuple[int, list[Any]]],
                 block: np.ndarray) -> None:
        self.recording, self.template, self.layout, self.block = recording, template, layout, block
        self.batched: list[Any] | None = None

    def state_block(self, cur: Sequence[Any]) -> np.ndarray | None:
        """The native slots' structs of the launches `cur` (a set of dims' launch per step), or None where one
        does not fit its slot. The launches keep no struct of their own (strided.structs): a state's structs are
        these bytes only."""
        out = np.zeros_like(self.block)
        for k, calls in self.layout:
            got = structs(cur[k])
            if got is None or len(got) != len(calls):
                return None
            for (fn, raw), (want, off, size) in zip(got, calls, strict=True):
                view = memoryview(raw).cast("B")
                if fn != want or view.nbytes != size:
                    return None
                out[off:off + size] = view
        return out


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
    return Shared(recording, template, layout, block)
