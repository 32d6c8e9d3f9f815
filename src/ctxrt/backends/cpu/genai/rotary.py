"""Rotary position embeddings: com.microsoft RotaryEmbedding and ONNX's RotaryEmbedding-23, and the rotation
GroupQueryAttention applies to its query and key.

Each head's first `rotary_embedding_dim` channels are rotated as pairs (x1, x2) -> (x1 cos - x2 sin,
x1 sin + x2 cos): halves of that span, or interleaved neighbours; the remaining channels are copied. cos/sin are
(max_position, dim / 2) caches indexed by position (position_ids; com.microsoft's may be a one-element offset:
positions offset, offset + 1, ...), or, for RotaryEmbedding-23 without position_ids, (batch, sequence, dim / 2)
values. Launches allocate nothing: a gather writes the rows for the positions into scratch.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ctxrt.backends.cpu.elementwise import BoundKernel
from ctxrt.backends.kernel import Kernel, Launch, NodeSpec, scratch_view
from ctxrt.errors import ShapeError, UnsupportedOpError


def rotate(x: np.ndarray, y: np.ndarray, cos: np.ndarray, sin: np.ndarray, tmp: np.ndarray, half: int,
           interleaved: bool) -> None:
    """y = x with its first 2 * half channels (last axis) rotated; x and y must not overlap. cos and sin
    broadcast against x[..., :half]; tmp has that shape."""
    span = 2 * half
    if interleaved:
        a, b, ya, yb = x[..., 0:span:2], x[..., 1:span:2], y[..., 0:span:2], y[..., 1:span:2]
    else:
        a, b, ya, yb = x[..., :half], x[..., half:span], y[..., :half], y[..., half:span]
    np.multiply(a, cos, out=ya)
    np.multiply(b, sin, out=tmp)
    np.subtract(ya, tmp, out=ya)
    np.multiply(a, sin, out=yb)
    np.multiply(b, cos, out=tmp)
    np.add(yb, tmp, out=yb)
    if span < x.shape[-1]:
        np.copyto(y[..., span:], x[..., span:])


def _fail(spec: NodeSpec, what: str) -> UnsupportedOpError:
    return UnsupportedOpError(f"{spec.op} node {spec.name!r}: {what}")


def rotary_embedding(spec: NodeSpec) -> Kernel:
    """com.microsoft RotaryEmbedding(input, position_ids, cos_cache, sin_cache) and RotaryEmbedding-23(X,
    cos_cache, sin_cache, position_ids?): input (B, S, num_heads * H) or (B, num_heads, S, H)."""
    ms = spec.op.startswith("com.microsoft.")
    x_i, pos_i, cos_i, sin_i = (0, 1, 2, 3) if ms else (0, 3, 1, 2)
    ins = spec.inputs + [None] * (4 - len(spec.inputs))
    shape, dt = ins[x_i].shape, np.dtype(ins[x_i].dtype)
    if dt.kind != "f" or len(shape) not in (3, 4):
        raise _fail(spec, f"input {dt}{list(shape)} (3-D or 4-D floats)")
    if int(spec.attr("is_packed_batching", 0)):
        raise _fail(spec, "attribute is_packed_batching=1 is not supported")
    heads, dim = int(spec.attr("num_heads", 0)), int(spec.attr("rotary_embedding_dim", 0))
    cos_shape = ins[cos_i].shape
    if len(shape) == 4:
        head = shape[3]
    elif heads > 0 and shape[2] % heads == 0:
        head = shape[2] // heads
    elif heads == 0 and ms and dim == 0:
        head = 2 * cos_shape[-1]  # onnxruntime: the head size is the cache's
    else:
        raise _fail(spec, f"a 3-D input {list(shape)} needs num_heads dividing its last axis (num_heads={heads})")
    span = dim or head
    half = span // 2
    if span % 2 or span > head or shape[-1] % head or cos_shape[-1] < half or ins[sin_i].shape != cos_shape:
        raise _fail(spec, f"rotary_embedding_dim={dim} for head size {head} and caches {list(cos_shape)}")
    b, s = shape[0], shape[1] if len(shape) == 3 else shape[2]
    view = (b, s, shape[2] // head, head) if len(shape) == 3 else shape
    # cos/sin rows (batch, position, channel) get a unit heads axis: (B, S, 1, half) or (B, 1, S, half)
    heads_axis = (slice(None), slice(None), None) if len(shape) == 3 else (slice(None), None)
    pos = ins[pos_i]
    if pos is None:
        if len(cos_shape) != 3 or cos_shape[:2] != (b, s):
            raise _fail(spec, f"caches of shape {list(cos_shape)} without position_ids ((batch, sequence, dim / 2) "
                              "expected)")
        mode = "direct"
    elif len(cos_shape) != 2:
        raise _fail(spec, f"caches of shape {list(cos_shape)} with position_ids (2-D expected)")
    elif int(np.prod(pos.shape)) == 1 and ms:
        mode = "offset"
    elif tuple(pos.shape) == (b, s):
        mode = "gather"
    else:
        raise _fail(spec, f"position_ids of shape {list(pos.shape)} for input {list(shape)}")
    interleaved = bool(spec.attr("interleaved", 0))
    item = dt.itemsize
    width = cos_shape[-1]
    gathered = (b * s * width * item,) * 2 if mode == "gather" else ()
    tmp_shape = (*view[:-1], half)
    limit = cos_shape[0]

    def make(ins_: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        x, y = ins_[x_i].reshape(view), outs[0].reshape(view)
        cos, sin = ins_[cos_i], ins_[sin_i]
        tmp = scratch_view(scratch[0], tmp_shape, dt)
        if mode == "direct":
            c, sn = cos[..., :half][heads_axis], sin[..., :half][heads_axis]
            return lambda: rotate(x, y, c, sn, tmp, half, interleaved)
        if mode == "gather":
            p = ins_[pos_i]
            gc, gs = (scratch_view(scratch[k], (b, s, width), dt) for k in (1, 2))
            c, sn = gc[..., :half][heads_axis], gs[..., :half][heads_axis]

            def run() -> None:
                np.take(cos, p, axis=0, out=gc, mode="clip")
                np.take(sin, p, axis=0, out=gs, mode="clip")
                rotate(x, y, c, sn, tmp, half, interleaved)
            return run
        offset = ins_[pos_i].reshape(-1)

        def run_offset() -> None:
            start = int(offset[0])
            if not 0 <= start <= limit - s:
                raise ShapeError(f"{spec.op} node {spec.name!r}: positions {start}..{start + s - 1} are outside "
                                 f"the caches' {limit} rows")
            rotate(x, y, cos[None, start:start + s, :half][heads_axis], sin[None, start:start + s, :half][heads_axis],
                   tmp, half, interleaved)
        return run_offset
    return BoundKernel(make, (int(np.prod(tmp_shape)) * item, *gathered))


KERNELS = {"com.microsoft.RotaryEmbedding": rotary_embedding, "RotaryEmbedding": rotary_embedding}
