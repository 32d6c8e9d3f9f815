"""What the probe compiles of one range compile share (compiler/ranges.py): the model's initializers as arrays,
their transposed and prepacked copies. Each probe lowers the same ONNX proto, so the same initializer object gives
the same array, and the same array the same derived constant: made once per range compile, not once per probe.
Outside a range compile (or a session's attempts at one) nothing is kept."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Hashable, Iterator
from contextvars import ContextVar
from typing import Any, TypeVar

T = TypeVar("T")
_TABLE: ContextVar[dict[Any, tuple[Any, Any]] | None] = ContextVar("ctxrt_probe_memo", default=None)


@contextlib.contextmanager
def shared() -> Iterator[None]:
    """Inside: `memo` keeps what it makes (until the block ends). Nested in another block: that block's table (a
    session's compile attempts for one run share the model's arrays, as one compile's probes do)."""
    if _TABLE.get() is not None:
        yield
        return
    token = _TABLE.set({})
    try:
        yield
    finally:
        _TABLE.reset(token)


def memo(kind: str, source: Any, extra: Hashable, make: Callable[[], T]) -> T:
    """`make()`, or what it gave before for the same `source` object (kept alive here, so its id is not reused)
    and `extra`, inside `shared()`."""
    table = _TABLE.get()
    if table is None:
        return make()
    key = (kind, id(source), extra)
    hit = table.get(key)
    if hit is not None and hit[0] is source:
        return hit[1]
    value = make()
    table[key] = (source, value)
    return value
