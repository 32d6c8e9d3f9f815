"""Sliding windows over N-D inputs: a padded copy in scratch, and strided views of its windows and taps."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ctxrt.backends.kernel import scratch_view


def extent(out: int, stride: int, kernel: int, dilation: int) -> int:
    """Input positions the windows of `out` outputs span."""
    return (out - 1) * stride + (kernel - 1) * dilation + 1


class PaddedND:
    """A block of channels copied into scratch inside a constant border wide enough for every window (explicit
    pads, auto_pad, and the windows ceil_mode lets hang past the end). Not needed when windows fit the input,
    unless `always` (a kernel that transforms values on the way in, like LpPool's |x|^p)."""

    def __init__(self, channels: int, sp: Sequence[int], osp: Sequence[int], kernel: Sequence[int],
                 strides: Sequence[int], dil: Sequence[int], pb: Sequence[int], dtype: np.dtype, fill: float,
                 always: bool = False) -> None:
        self.psp = tuple(max(b + s, extent(o, st, k, d))
                         for s, o, k, st, d, b in zip(sp, osp, kernel, strides, dil, pb, strict=True))
        self.needed = always or self.psp != tuple(sp) or any(pb)
        self.dtype, self.fill = np.dtype(dtype), fill
        self.shape = (channels, *self.psp)
        self.interior = (slice(None), *(slice(b, b + s) for b, s in zip(pb, sp, strict=True)))
        self.borders = []  # per axis: the slabs before and after the input, within the input on earlier axes
        for i, (b, s, p) in enumerate(zip(pb, sp, self.psp, strict=True)):
            for lo, hi in ((0, b), (b + s, p)):
                if hi > lo:
                    self.borders.append((*self.interior[:i + 1], slice(lo, hi)))
        self.nbytes = math.prod(self.shape) * self.dtype.itemsize if self.needed else 0

    def view(self, buf: np.ndarray, channels: int) -> np.ndarray:
        return scratch_view(buf, self.shape, self.dtype)[:channels]

    def refresh(self, x: np.ndarray, padded: np.ndarray) -> np.ndarray:
        """Rewrite the border (arena scratch is shared) and copy x in; returns the interior view."""
        for border in self.borders:
            padded[border].fill(self.fill)
        inner = padded[self.interior]
        np.copyto(inner, x)
        return inner


def windows(p: np.ndarray, kernel: Sequence[int], strides: Sequence[int], dil: Sequence[int],
            osp: Sequence[int]) -> np.ndarray:
    """A (C, *kernel, *osp) view of every window of a (C, *spatial) array."""
    st = p.strides[1:]
    return as_strided(p, (p.shape[0], *kernel, *osp),
                      (p.strides[0], *(s * d for s, d in zip(st, dil, strict=True)),
                       *(s * t for s, t in zip(st, strides, strict=True))), writeable=False)


def tap(t: int, out: int, stride: int, dilation: int) -> slice:
    """Along one axis, the input positions that tap t of the `out` windows reads."""
    start = t * dilation
    return slice(start, start + (out - 1) * stride + 1, stride)
