"""Progress of long work (compile, split, tuning) as one tqdm bar on stderr.

The command line turns it on with `showing(label, enabled)` (enabled when stderr is a terminal and
`--quiet` is not given); library code only reports where it is, through `stage`, `advance` and `part`,
which do nothing when no bar is shown (always, for library users).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from contextvars import ContextVar

from tqdm import tqdm

_bar: ContextVar[_Bar | None] = ContextVar("ctxrt_progress", default=None)


class _Bar:
    def __init__(self, label: str) -> None:
        self.label = label
        self.parts: list[str] = []
        self.tqdm = tqdm(desc=label, file=sys.stderr, leave=False, dynamic_ncols=True, mininterval=0.2)

    def stage(self, name: str, total: int | None, unit: str) -> None:
        self.tqdm.unit, self.tqdm.unit_scale = unit, unit == "B"
        self.tqdm.set_description(": ".join([self.label, *self.parts, name]), refresh=False)
        self.tqdm.set_postfix_str("", refresh=False)
        self.tqdm.reset(float("inf") if total is None else total)  # redraws the bar with the new name; inf: no total


def stage(name: str, total: int | None = None, unit: str = "it") -> None:
    """A new stage of the work: `total` units to `advance` through, or None when not counted."""
    bar = _bar.get()
    if bar is not None:
        bar.stage(name, total, unit)


def advance(n: int = 1) -> None:
    bar = _bar.get()
    if bar is not None:
        bar.tqdm.update(n)


def postfix(text: str) -> None:
    """A short status after the bar's counts (e.g. tuning's candidates tried and best speed-up so far), shown at
    once: it changes rarely, and each change is news."""
    bar = _bar.get()
    if bar is not None:
        bar.tqdm.set_postfix_str(text, refresh=True)


@contextlib.contextmanager
def part(name: str) -> Iterator[None]:
    """Stages inside this block are labelled with `name` (a model of several, a part of a split)."""
    bar = _bar.get()
    if bar is None:
        yield
        return
    bar.parts.append(name)
    try:
        yield
    finally:
        bar.parts.pop()


@contextlib.contextmanager
def showing(label: str, enabled: bool) -> Iterator[None]:
    """Show a bar for the work inside the block when `enabled`; it is erased when the block ends."""
    if not enabled:
        yield
        return
    bar = _Bar(label)
    token = _bar.set(bar)
    try:
        yield
    finally:
        _bar.reset(token)
        bar.tqdm.close()
