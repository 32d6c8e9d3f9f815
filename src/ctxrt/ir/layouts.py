"""Memory layouts of 4-D activations (N, C, H, W as ONNX sees them) and the shapes they are stored in.

A value's IR shape is its stored (physical) shape: after the layout pass a channels-last value is
(N, H, W, C) and a blocked one (N, C / b, H, W, b), so plain kernels never mistake one for the other and
layout-agnostic ones (element-wise, Concat along channels) run unchanged on the stored shape.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Layout:
    name: str  # as shown by `inspect`: nchw, nhwc, nChw8c, nChw16c
    tag: str  # oneDNN's format tag for the same memory (abcd, acdb, aBcd8b, aBcd16b)
    block: int = 0  # channels per block; 0: not blocked
    channels_last: bool = False

    @property
    def channel_axis(self) -> int:
        """The stored axis along which channels (or channel blocks) are concatenated."""
        return 3 if self.channels_last else 1

    def fits(self, shape: tuple[int, ...]) -> bool:
        """Whether a logical 4-D shape can be stored in this layout (blocked layouts need whole blocks)."""
        return len(shape) == 4 and (not self.block or shape[1] % self.block == 0)

    def physical(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        n, c, h, w = shape
        if self.channels_last:
            return (n, h, w, c)
        if self.block:
            return (n, c // self.block, h, w, self.block)
        return (n, c, h, w)

    def logical(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        if self.channels_last:
            n, h, w, c = shape
            return (n, c, h, w)
        if self.block:
            n, cb, h, w, b = shape
            return (n, cb * b, h, w)
        return tuple(shape)


PLAIN = Layout("nchw", "abcd")
LAYOUTS = {lay.name: lay for lay in (PLAIN, Layout("nhwc", "acdb", channels_last=True),
                                     Layout("nChw8c", "aBcd8b", block=8), Layout("nChw16c", "aBcd16b", block=16))}


def same_bytes(shape: tuple[int, ...], layout: Layout) -> bool:
    """True when a logical 4-D shape is stored identically in `layout` and plain (one pixel per image):
    such a value needs no reorder between the two."""
    return len(shape) == 4 and shape[2] * shape[3] == 1 and layout.fits(shape)
