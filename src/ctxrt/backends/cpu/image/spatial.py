"""Conv and pooling for every spatial rank: checks the attributes, then dispatches.

2-D nodes run nn.py's tuned kernels; 1-D convolutions compiled with the native extension there run conv1d.py's
kernel and float32 1-D pools `Pool1d` (one native call each); other 1-D nodes run nn.py's kernels on zero-copy
(N, C, 1, L) views (`Lifted`), except long convolutions, whose single im2col row would be unbounded; 3-D (and
higher) nodes, MaxPool's Indices output, dilated AveragePool, LpPool and integer MaxPool run the N-D kernels of
convnd.py and poolnd.py.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ctxrt.backends.cpu import native, nn
from ctxrt.backends.cpu.conv import conv1d, convnd
from ctxrt.backends.cpu.image import poolnd
from ctxrt.backends.kernel import Kernel, KernelFactory, Launch, NodeSpec, TensorSpec
from ctxrt.errors import UnsupportedOpError

AUTO_PADS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")
_AXIS_ATTRS = ("kernel_shape", "strides", "dilations")  # per spatial axis: 1 for an added axis of size 1
_LIFT_COLS = 2 << 20  # bytes of im2col columns up to which a 1-D conv runs lifted on nn.py's 2-D kernel


def fail(spec: NodeSpec, attr: str, value: Any, why: str = "is not supported") -> UnsupportedOpError:
    return UnsupportedOpError(f"{spec.op} node {spec.name!r}: attribute {attr}={value!r} {why}")


def check_window(spec: NodeSpec, kernel: tuple[int, ...] | None = None) -> int:
    """The spatial rank, after checking the window attributes against it (one clear error each)."""
    x = spec.inputs[0].shape
    nd = len(x) - 2
    if nd < 1:
        raise UnsupportedOpError(f"{spec.op} node {spec.name!r}: input of shape {x} has no spatial axes")
    auto = spec.attr("auto_pad", "NOTSET")
    if auto not in AUTO_PADS:
        raise fail(spec, "auto_pad", auto)
    for key in ("kernel_shape", "strides", "dilations", "output_padding"):
        value = spec.attr(key)
        if value is not None and len(value) != nd:
            raise fail(spec, key, value, f"does not have one value per spatial axis ({nd})")
        if value is not None and key != "output_padding" and min(value) < 1:
            raise fail(spec, key, value, "must be positive")
    pads = spec.attr("pads")
    if pads is not None and (len(pads) != 2 * nd or min(pads) < 0):
        raise fail(spec, "pads", pads, f"must be {2 * nd} non-negative values")
    if kernel is not None and spec.attr("kernel_shape") is not None and tuple(spec.attr("kernel_shape")) != kernel:
        raise fail(spec, "kernel_shape", spec.attr("kernel_shape"), f"does not match the weights' {kernel}")
    return nd


def _lift_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    return (*shape[:2], 1, *shape[2:])


def lift(spec: NodeSpec) -> NodeSpec:
    """The 2-D form of a 1-D node: every rank-3 tensor (data, weights, residual, outputs) gets an axis of 1."""
    attrs = dict(spec.attrs)
    for key in _AXIS_ATTRS:
        if attrs.get(key) is not None:
            attrs[key] = [1, *attrs[key]]
    if attrs.get("pads") is not None:
        attrs["pads"] = [0, attrs["pads"][0], 0, attrs["pads"][1]]

    def up(t: TensorSpec | None) -> TensorSpec | None:
        return t if t is None or len(t.shape) != 3 else TensorSpec(_lift_shape(t.shape), t.dtype)

    consts = [c if c is None or c.ndim != 3 else c.reshape(_lift_shape(c.shape)) for c in spec.consts]
    return NodeSpec(spec.op, spec.name, attrs, [up(t) for t in spec.inputs], [up(t) for t in spec.outputs],
                    consts, spec.opset)


def view_as(a: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """A reshaped view; never a copy (a copy would detach the kernel from the arena)."""
    return np.reshape(a, shape, copy=False)


class Lifted(Kernel):
    """A 2-D kernel run on (N, C, 1, L) views of a 1-D node's tensors."""

    def __init__(self, spec: NodeSpec, factory: KernelFactory) -> None:
        self.spec2 = lift(spec)
        self.inner = factory(self.spec2)
        self.scratch, self.algorithm = self.inner.scratch, self.inner.algorithm

    def bind(self, ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        def up(arrays: list[Any], specs: list[TensorSpec | None]) -> list[Any]:
            return [a if a is None or t is None else view_as(a, t.shape) for a, t in zip(arrays, specs, strict=False)]
        return self.inner.bind(up(ins, self.spec2.inputs), up(outs, self.spec2.outputs), scratch)


class Pool1d(Kernel):
    """A 1-D MaxPool (`inv` None) or AveragePool (`inv`: 1 / each output position's divisor) of float32 signals in
    one native call (csrc/dwconv.c ctxrt_pool1d); `fallback` (NumPy's lifted kernel) where the extension is
    missing."""

    algorithm = "native:pool1d"

    def __init__(self, spec: NodeSpec, fallback: Kernel, inv: np.ndarray | None) -> None:
        (k,) = spec.attr("kernel_shape")
        (s,), (d,), (b,), _ = nn._window(spec, (k,))
        self.window, self.inv, self.fallback = (k, s, b, d), inv, fallback
        self.scratch = fallback.scratch  # (the native call needs none)
        self.shapes = (tuple(spec.inputs[0].shape), tuple(spec.outputs[0].shape))
        # in a range program, one object for every length (runtime/extents.py): a MaxPool whose window is fixed
        # (an AveragePool's divisors and SAME's pads follow the length); its fallback's scratch at the upper bound
        self.any_shape = self.scratch_grows = inv is None and spec.attr("auto_pad", "NOTSET") not in (
            "SAME_UPPER", "SAME_LOWER")

    def bind(self, ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        run = native.pool1d(ins[0], outs[0], self.window, self.inv) if native.library() is not None else None
        if run is None and (tuple(ins[0].shape), tuple(outs[0].shape)) != self.shapes:
            raise UnsupportedOpError(f"{self.fallback.__class__.__name__}: the 1-D pool's fallback runs its compiled "
                                     f"shapes only, not {list(ins[0].shape)} -> {list(outs[0].shape)}")
        return run if run is not None else self.fallback.bind(ins, outs, scratch)


def _by_rank(spec: NodeSpec, nd: int, two_d: KernelFactory, n_d: KernelFactory) -> Kernel:
    if nd == 2:
        return two_d(spec)
    if nd == 1:
        return Lifted(spec, two_d)
    return n_d(spec)


def conv(spec: NodeSpec) -> Kernel:
    w = tuple(spec.attr("weight_shape") or spec.inputs[1].shape)  # the ONNX shape of weights prepacked at compile
    nd = check_window(spec, tuple(w[2:]))
    g = int(spec.attr("group", 1))
    c = spec.inputs[0].shape[1]
    if len(w) != nd + 2 or g < 1 or c % g or w[0] % g or w[1] * g != c:
        raise UnsupportedOpError(f"Conv node {spec.name!r}: weights {w} do not fit input {spec.inputs[0].shape} "
                                 f"with group={g}")
    if nd == 1 and conv1d.eligible(spec):  # one native call (csrc/dwconv.c), chosen at compile time
        return conv1d.Conv1d(spec)
    if nd == 1 and w[2] > 1 and c * w[2] * spec.outputs[0].shape[2] * spec.outputs[0].dtype.itemsize > _LIFT_COLS:
        # nn.py blocks im2col by output rows, and a lifted 1-D conv has one: long signals go to the N-D kernel,
        # which blocks along the signal (64 channels x 16000 samples, k=3: 13.4 -> 6.8 ms, 16 -> 6 MiB scratch).
        return convnd.conv(spec)
    return _by_rank(spec, nd, nn.conv, convnd.conv)


def _pool_window(spec: NodeSpec) -> int:
    if spec.attr("kernel_shape") is None:
        raise fail(spec, "kernel_shape", None, "is required")
    nd = check_window(spec)
    if int(spec.attr("ceil_mode", 0)) not in (0, 1):
        raise fail(spec, "ceil_mode", spec.attr("ceil_mode"))
    if not spec.attr("ceil_mode", 0):
        return nd
    strides, _, pb, _ = nn._window(spec, tuple(spec.attr("kernel_shape")))
    sp, osp = spec.inputs[0].shape[2:], spec.outputs[0].shape[2:]
    for axis, (i, o, s, b) in enumerate(zip(sp, osp, strides, pb, strict=True)):
        if (o - 1) * s >= i + b:  # a clear error rather than an output shaped unlike onnxruntime's
            raise UnsupportedOpError(f"{spec.op} node {spec.name!r}: the output shape {tuple(spec.outputs[0].shape)} "
                                     f"has a window starting in the end padding of spatial axis {axis} (ceil_mode=1), "
                                     "which the ONNX spec and onnxruntime drop (onnx shape inference keeps it)")
    return nd


def maxpool(spec: NodeSpec) -> Kernel:
    nd = _pool_window(spec)
    if int(spec.attr("storage_order", 0)) not in (0, 1):
        raise fail(spec, "storage_order", spec.attr("storage_order"))
    if len(spec.outputs) > 1:
        return poolnd.maxpool_with_indices(spec)
    if np.dtype(spec.inputs[0].dtype).kind != "f":  # nn.py pads with -inf
        return poolnd.pool(spec)
    if nd == 1 and np.dtype(spec.inputs[0].dtype) == np.float32:
        return Pool1d(spec, Lifted(spec, nn.maxpool), None)
    return _by_rank(spec, nd, nn.maxpool, poolnd.pool)


def avgpool(spec: NodeSpec) -> Kernel:
    nd = _pool_window(spec)
    if int(spec.attr("count_include_pad", 0)) not in (0, 1):
        raise fail(spec, "count_include_pad", spec.attr("count_include_pad"))
    if max(spec.attr("dilations") or [1]) > 1:  # nn.py's divisor counts undilated windows
        return poolnd.pool(spec)
    if nd == 1 and np.dtype(spec.inputs[0].dtype) == np.float32:
        (k,) = spec.attr("kernel_shape")
        (s,), _, (b,), (e,) = nn._window(spec, (k,))
        counts = nn.window_counts(spec.outputs[0].shape[2], spec.inputs[0].shape[2], k, s, b, e,
                                  bool(spec.attr("count_include_pad", 0)))
        return Pool1d(spec, Lifted(spec, nn.avgpool), (1.0 / counts).astype(np.float32))
    return _by_rank(spec, nd, nn.avgpool, poolnd.pool)


def lppool(spec: NodeSpec) -> Kernel:
    _pool_window(spec)
    return poolnd.pool(spec)


def global_pool(spec: NodeSpec) -> Kernel:
    check_window(spec)
    return poolnd.global_pool(spec)


KERNELS = {"Conv": conv, "MaxPool": maxpool, "AveragePool": avgpool, "LpPool": lppool,
           "GlobalMaxPool": global_pool, "GlobalLpPool": global_pool}
