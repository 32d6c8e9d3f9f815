"""Inverses of windowed ops: MaxUnpool (MaxPool's values put back at its indices) and Col2Im (im2col's columns
summed back into an image), for any spatial rank."""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np

from ctxrt.backends.cpu.elementwise import BoundKernel, flat
from ctxrt.backends.kernel import Kernel, Launch, NodeSpec, scratch_view
from ctxrt.errors import InvalidInputError, UnsupportedOpError


def _fail(spec: NodeSpec, what: str) -> UnsupportedOpError:
    return UnsupportedOpError(f"{spec.op} node {spec.name!r}: {what} is not supported")


def max_unpool(spec: NodeSpec) -> Kernel:
    """Zeros, with X's values at the flat indices I (MaxPool's Indices: over the whole output tensor, N and C
    included). With `output_shape` the indices address a tensor of that shape, as onnxruntime reads them (the
    MaxPool that made them ran on an input of that shape); onnx.reference and its test data instead place the
    inferred shape's tensor in the top-left corner of the larger one."""
    if spec.inputs[1] is None or tuple(spec.inputs[1].shape) != tuple(spec.inputs[0].shape):
        raise _fail(spec, "indices of another shape than X")
    name = spec.name

    def make(ins: list[Any], outs: list[Any], _s: list[Any]) -> Launch:
        x, at, y = ins[0].reshape(-1), ins[1].reshape(-1), flat(outs[0])

        def run() -> None:
            if at.size and (int(at.min()) < 0 or int(at.max()) >= y.size):  # (checked before anything is written)
                raise InvalidInputError(f"MaxUnpool node {name!r}: an index is outside the output's {y.size} "
                                        "elements")
            y.fill(0)
            y[at] = x
        return run
    return BoundKernel(make)


def col2im(spec: NodeSpec) -> Kernel:
    """[N, C * prod(block), L] -> [N, C, *image_shape]: each block position's column values added at its strided
    window of a padded image (scratch), whose interior is the output."""
    image, block = spec.attr("image_shape"), spec.attr("block_shape")
    if image is None or block is None:
        raise _fail(spec, "image_shape or block_shape unknown at compile time")
    image, block = [int(v) for v in np.asarray(image).reshape(-1)], [int(v) for v in np.asarray(block).reshape(-1)]
    nd = len(image)
    dt = np.dtype(spec.outputs[0].dtype)
    strides = list(spec.attr("strides") or [1] * nd)
    dil = list(spec.attr("dilations") or [1] * nd)
    pads = list(spec.attr("pads") or [0] * 2 * nd)
    if len(block) != nd or len(strides) != nd or len(dil) != nd or len(pads) != 2 * nd:
        raise _fail(spec, f"block_shape {block}, strides {strides}, dilations {dil}, pads {pads} for image_shape "
                    f"{image}")
    n, ck, length = spec.inputs[0].shape
    k = math.prod(block)
    if k == 0 or ck % k:
        raise _fail(spec, f"{ck} column rows for blocks of {block}")
    c = ck // k
    padded = [i + pads[d] + pads[nd + d] for d, i in enumerate(image)]
    grid = [(p - dl * (b - 1) - 1) // s + 1 for p, dl, b, s in zip(padded, dil, block, strides, strict=True)]
    if any(g <= 0 for g in grid) or math.prod(grid) != length:
        raise _fail(spec, f"{length} columns for a grid of {grid} block positions")
    interior = (slice(None), slice(None), *(slice(pads[d], pads[d] + image[d]) for d in range(nd)))
    windows = [(slice(None), slice(None), *(slice(o * dl, o * dl + s * (g - 1) + 1, s)
                                            for o, dl, s, g in zip(offset, dil, strides, grid, strict=True)))
               for offset in itertools.product(*(range(b) for b in block))]

    def make(ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        cols = ins[0].reshape(n, c, k, *grid)
        img = scratch_view(scratch[0], (n, c, *padded), dt)
        parts = [(img[w], cols[:, :, j]) for j, w in enumerate(windows)]
        inner, y = img[interior], outs[0]

        def run() -> None:
            img.fill(0)
            for window, part in parts:
                np.add(window, part, out=window)
            np.copyto(y, inner)
        return run
    return BoundKernel(make, (n * c * math.prod(padded) * dt.itemsize,))


KERNELS = {"MaxUnpool": max_unpool, "Col2Im": col2im}
