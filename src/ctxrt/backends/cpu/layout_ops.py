"""NumPy kernels of the ops the compiler's passes add and that need no provider: ChannelShuffle."""

from __future__ import annotations

import numpy as np

from ctxrt.backends.kernel import FnKernel, Kernel, NodeSpec


def channel_shuffle(spec: NodeSpec) -> Kernel:
    """Channel k * (C / g) + i goes to i * g + k, along `axis` of the stored shape (1 in NCHW, 3 in NHWC)."""
    shape = spec.inputs[0].shape
    axis, g = int(spec.attr("axis", 1)) % len(shape), int(spec.attr("group"))
    c = shape[axis]
    pre, post = int(np.prod(shape[:axis])), int(np.prod(shape[axis + 1:]))

    def run(i, o, s):
        np.copyto(o[0].reshape(pre, c // g, g, post), i[0].reshape(pre, g, c // g, post).transpose(0, 2, 1, 3))
    return FnKernel(run)


KERNELS = {"ChannelShuffle": channel_shuffle}
