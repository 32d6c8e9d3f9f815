"""NumPy kernels of the ops the compiler's passes add and that need no provider: ChannelShuffle."""

from __future__ import annotations

import numpy as np

from ctxrt.backends.cpu.elementwise import BoundKernel
from ctxrt.backends.kernel import FnKernel, Kernel, NodeSpec


def channel_shuffle(spec: NodeSpec) -> Kernel:
    """Channel k * (C / g) + i goes to i * g + k, along `axis` of the stored shape (1 in NCHW, 3 in NHWC)."""
    shape = spec.inputs[0].shape
    axis, g = int(spec.attr("axis", 1)) % len(shape), int(spec.attr("group"))
    c = shape[axis]
    pre, post = int(np.prod(shape[:axis])), int(np.prod(shape[axis + 1:]))

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
