"""Box blocks: an N-d index space cut into C-order boxes of bounded size.

Each box fixes the leading axes to one index, takes a range along one axis and everything after it, so it is
a contiguous range of the flat index space (the same rows of any C-contiguous array of that shape) and also a
plain slice of any array broadcast to the shape. Kernels that mix a contiguous tensor with a broadcast one
(PRelu's slope) or that fill a bounded scratch per block of output positions (im2col) walk these boxes.
"""

from __future__ import annotations

import itertools
import math


def boxes(shape: tuple[int, ...], limit: int) -> list[tuple[tuple[slice, ...], int, int]]:
    """(index, flat start, flat stop) per box, each box at most `limit` elements (at least one element of
    the axis it cuts). Every index keeps all axes (length-1 slices on the fixed ones)."""
    total = math.prod(shape)
    if total <= max(1, limit):
        return [(tuple(slice(None) for _ in shape), 0, total)]
    inner, axis = 1, len(shape) - 1
    while inner * shape[axis] <= limit:  # the box takes every axis after `axis` whole
        inner *= shape[axis]
        axis -= 1
    run = max(1, limit // inner)
    tail = (slice(None),) * (len(shape) - axis - 1)
    result = []
    for lead in itertools.product(*(range(d) for d in shape[:axis])):
        base = 0
        for i, d in zip(lead, shape[:axis], strict=True):
            base = base * d + i
        base *= shape[axis] * inner
        for s0 in range(0, shape[axis], run):
            s1 = min(shape[axis], s0 + run)
            index = tuple(slice(i, i + 1) for i in lead) + (slice(s0, s1),) + tail
            result.append((index, base + s0 * inner, base + s1 * inner))
    return result


def box_shape(index: tuple[slice, ...], shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape of `array[index]` for an array of `shape`."""
    return tuple(len(range(*s.indices(d))) for s, d in zip(index, shape, strict=True))
