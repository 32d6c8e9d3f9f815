"""NumPy kernels of the ops the compiler's passes add and that need no provider: ChannelShuffle."""

from __future__ import annotations

import numpy as np

from ctxrt.backends.cpu.elementwise import BoundKernel
from ctxrt.backends.kernel import FnKernel, Kernel, NodeSpec
from ctxrt.errors import UnsupportedOpError


def channel_shuffle(spec: NodeSpec) -> Kernel:
    """Channel k * (C / g) + i goes to i * g + k, along `axis` of the stored shape (1 in NCHW, 3 in NHWC).

    With oneDNN, one reorder between two strided views of the same (pre, g, C / g, post) array: 3x faster than
    NumPy's copies (ShuffleNet's 56 x 56 x 112 channels-last: 72 us vs 207, one thread)."""
    shape = spec.inputs[0].shape
    axis, g = int(spec.attr("axis", 1)) % len(shape), int(spec.attr("group"))
    c = shape[axis]
    pre, post = int(np.prod(shape[:axis])), int(np.prod(shape[axis + 1:]))
    if spec.attr("kernel") == "onednn":  # recorded by the backend's lowering where oneDNN was enabled
        return _onednn_shuffle(spec, pre, g, c // g, post)

    if post > 1:  # channels first: runs of H * W pixels
        def run(i, o, s):
            np.copyto(o[0].reshape(pre, c // g, g, post), i[0].reshape(pre, g, c // g, post).transpose(0, 2, 1, 3))
        return FnKernel(run)

    # channels last: one copy per group, contiguous reads of C / g channels (a transposing copy moves runs of g:
    # 2-3x slower on ShuffleNet's 56 x 56 x 112, g = 4)
    def bind(i, o, s):
        src, dst = i[0].reshape(pre, g, c // g), o[0].reshape(pre, c // g, g)
        pairs = [(dst[:, :, k], src[:, k, :]) for k in range(g)]

        def run():
            for d, x in pairs:
                np.copyto(d, x)
        return run
    return BoundKernel(bind)


KERNELS = {"ChannelShuffle": channel_shuffle}


def _onednn_shuffle(spec: NodeSpec, pre: int, g: int, q: int, post: int) -> Kernel:
    from ctxrt.backends.cpu.onednn import api
    from ctxrt.backends.cpu.onednn.kernels import OneDnnKernel, reject_reference, reorder_maker

    api.require(f"ChannelShuffle {spec.name!r}")
    if np.dtype(spec.inputs[0].dtype) != np.float32:
        raise UnsupportedOpError(f"ChannelShuffle {spec.name!r}: oneDNN here is float32 only")
    dims = (pre, g, q, post)
    src = api.Desc.strided(dims, (g * q * post, q * post, post, 1))
    dst = api.Desc.strided(dims, (g * q * post, post, g * post, 1))
    make = reorder_maker(spec, src, dst)
    prim = make()
    reject_reference(prim, spec)
    return OneDnnKernel(spec, prim, [(api.ARG_FROM, "in", 0, src), (api.ARG_TO, "out", 0, dst)], "shuffle",
                        variant=make)
