"""Constant folding of the shape arithmetic exporters write (Concat, Gather, Squeeze/Unsqueeze, Reshape, Slice,
Expand, Range, Trilu, integer Add/Sub/Mul) with the NumPy calls onnx.reference makes for them, without its evaluator.

The evaluator was built per folded node (a one-node model each) and its first use imported onnx.reference's
~200 op modules: 3.4 MiB resident in a session that compiled an ONNX model, and a GPT-2-style decoder folds
~60 such nodes at each of a range compile's probe points. Anything else, or any input these do not take, is
left to onnx.reference (`fold` returns None); an index out of bounds (a Gather past a position table's rows, as a
session's first upper bound can ask) is the model's error, raised as FoldError without trying the evaluator,
whose NumPy calls would fail the same way.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

_ARITH = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply}


def fold(op: str, attrs: Mapping[str, Any], ins: Sequence[np.ndarray | None], opset: int) -> list[np.ndarray] | None:
    """The outputs of default-domain node `op` (attributes as values, `ins` its constant inputs, None where
    absent) as onnx.reference computes them, or None where it is not one of these."""
    try:
        return _fold(op, attrs, ins, opset)
    except IndexError as e:  # (an AxisError too: a ValueError and an IndexError)
        raise FoldError(str(e)) from e
    except (ValueError, TypeError, ArithmeticError):
        return None  # (onnx.reference says what is wrong with it)


class FoldError(Exception):
    """The node cannot be computed on these inputs: an index or an axis out of bounds."""


def _fold(op: str, attrs: Mapping[str, Any], ins: Sequence[np.ndarray | None], opset: int) -> list[np.ndarray] | None:
    x = ins[0] if ins else None
    if x is None:
        return None
    if op == "Concat":
        if "axis" not in attrs or any(a is None or a.ndim == 0 for a in ins):
            return None
        return [np.concatenate(tuple(ins), int(attrs["axis"]))]
    if op in ("Squeeze", "Unsqueeze"):
        axes = (ins[1] if len(ins) > 1 else None) if opset >= 13 else attrs.get("axes") or None
        axes = None if axes is None else tuple(int(a) for a in np.asarray(axes).reshape(-1))
        if op == "Squeeze":  # (an empty axes input squeezes nothing; no axes, every axis of 1)
            return [np.squeeze(x) if axes is None else np.squeeze(x, axis=axes)]
        return None if not axes else [np.expand_dims(x, axis=axes)]
    if op == "Gather" and len(ins) == 2 and ins[1] is not None and ins[1].dtype.kind in "iu":
        idx = ins[1] if ins[1].flags.c_contiguous else np.ascontiguousarray(ins[1])  # (a 0-d index stays 0-d)
        data = x if x.flags.c_contiguous else np.ascontiguousarray(x)
        return [np.take(data, idx, axis=int(attrs.get("axis", 0)))]
    if op == "Reshape" and opset >= 5 and len(ins) == 2 and ins[1] is not None:
        shape = np.array(ins[1], np.int64).reshape(-1)
        if not attrs.get("allowzero", 0):
            zeros = np.where(shape == 0)[0]
            shape[zeros] = np.array(x.shape)[zeros]
        return [np.reshape(x, shape)]
    if op == "Expand" and len(ins) == 2 and ins[1] is not None:
        return [x * np.ones(np.asarray(ins[1], np.int64), dtype=x.dtype)]
    if op == "Slice" and opset >= 10 and 3 <= len(ins) <= 5 and ins[1] is not None and ins[2] is not None:
        starts, ends = np.asarray(ins[1]).reshape(-1), np.asarray(ins[2]).reshape(-1)
        axes = ins[3] if len(ins) > 3 and ins[3] is not None else None
        steps = ins[4] if len(ins) > 4 and ins[4] is not None else None
        if axes is None:
            axes = np.arange(len(starts))
        if steps is None:
            steps = np.ones(len(starts), np.int64)
        slices = [slice(0, n) for n in x.shape]
        for s, e, a, d in zip(starts, ends, np.asarray(axes).reshape(-1), np.asarray(steps).reshape(-1),
                              strict=True):
            slices[int(a)] = slice(int(s), int(e), int(d))
        return [x[tuple(slices)]]
    if op == "Range" and len(ins) == 3 and all(a is not None and a.dtype.kind in "iu" for a in ins) and ins[2].any():
        return [np.arange(ins[0], ins[1], ins[2]).astype(ins[0].dtype)]
    if op == "Trilu" and x.ndim >= 2:
        k = 0 if len(ins) < 2 or ins[1] is None else int(np.asarray(ins[1]).item())
        return [np.triu(x, k) if attrs.get("upper", 1) else np.tril(x, k)]
    if op in _ARITH and len(ins) == 2 and ins[1] is not None and x.dtype == ins[1].dtype and x.dtype.kind in "iu":
        return [_ARITH[op](x, ins[1]).astype(x.dtype, copy=False)]
    return None
