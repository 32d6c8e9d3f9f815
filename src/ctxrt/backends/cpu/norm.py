"""LayerNormalization (opset 17) for the NumPy backend."""

from __future__ import annotations

import numpy as np

from ctxrt.backends.kernel import FnKernel, Kernel, NodeSpec, scratch_view
from ctxrt.errors import UnsupportedOpError


def _layernorm(spec: NodeSpec) -> Kernel:
    shape = spec.inputs[0].shape
    axis = int(spec.attr("axis", -1)) % len(shape)
    eps = float(spec.attr("epsilon", 1e-5))
    if len([o for o in spec.outputs]) > 1:
        raise UnsupportedOpError(f"LayerNormalization {spec.name!r}: Mean/InvStdDev outputs are not supported")
    red = tuple(range(axis, len(shape)))
    stat_shape = shape[:axis] + (1,) * len(red)
    dt = spec.outputs[0].dtype
    n = int(np.prod(stat_shape)) * np.dtype(dt).itemsize

    def run(i, o, s):
        x, y = i[0], o[0]
        mu, var = scratch_view(s[0], stat_shape, dt), scratch_view(s[1], stat_shape, dt)
        np.mean(x, axis=red, keepdims=True, out=mu)
        np.subtract(x, mu, out=y)
        np.multiply(y, y, out=s[2][:spec.outputs[0].nbytes].view(dt).reshape(shape))
        np.mean(s[2][:spec.outputs[0].nbytes].view(dt).reshape(shape), axis=red, keepdims=True, out=var)
        np.add(var, eps, out=var)
        np.sqrt(var, out=var)
        np.divide(y, var, out=y)
        np.multiply(y, i[1], out=y)
        if len(i) > 2 and i[2] is not None:
            np.add(y, i[2], out=y)
    return FnKernel(run, scratch=(n, n, spec.outputs[0].nbytes))


KERNELS = {"LayerNormalization": _layernorm}
