"""Session options in onnxruntime's terms, for code written against `onnxruntime.SessionOptions`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ctxrt.errors import CtxrtError


@dataclass
class SessionOptions:
    """`intra_op_num_threads`: threads of every pool a run uses (BLAS, OpenMP); 0, the default, chooses from the
    cores other processes leave idle, measured as it runs. onnxruntime's own SessionOptions works too."""

    intra_op_num_threads: int = 0


def threads_of(sess_options: Any) -> int | None:
    """The thread count asked for by a SessionOptions (ctxrt's or onnxruntime's), None for the default."""
    if sess_options is None:
        return None
    n = getattr(sess_options, "intra_op_num_threads", None)
    if n is None:
        raise CtxrtError(f"sess_options must have intra_op_num_threads (like onnxruntime.SessionOptions), "
                         f"got {type(sess_options).__name__}")
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise CtxrtError(f"intra_op_num_threads must be an int >= 0 (0: the default), got {n!r}")
    return n or None


def is_session_options(value: Any) -> bool:
    return hasattr(value, "intra_op_num_threads")
