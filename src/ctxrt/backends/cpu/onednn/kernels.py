"""oneDNN kernels for the nodes the layout pass gave to oneDNN (`kernel="onednn"`, `src_layout`, `dst_layout`):
Conv (grouped and depthwise too; bias, residual add and Relu fused as post-ops), MaxPool, AveragePool,
GlobalAveragePool, LRN, BatchNormalization, and Reorder between layouts.

Built once, when a context is finalized: the primitive, then memory objects wrapping the arena views, IO
tensors and weights it reads and writes (no copies). Its scratchpad is user-managed: planned in the arena as
the kernel's scratch. A Conv's weights are reordered into the format its primitive chose at compile time and
stored in the context binary in that format (the tag's name is recorded in `weights_tag`), so loading
reorders nothing and the prepacked weights are memory-mapped and shared like any weight.

A primitive is made for the OpenMP thread count recorded at compile time (`threads`: the compiling machine's
cores): some choose their weights format and size their scratchpad by it, so the loaded primitive is the
compiled one; no run gives OpenMP more threads than that (threads.openmp_cap). A primitive also keeps the
count it was made for: oneDNN's convs open `omp parallel num_threads(n)` whatever OpenMP's limit says. So a
run with fewer threads (another process took a core, or `num_threads` asks for fewer) runs each node's
*variant* for that count, made from the same descriptors the first time a run needs it, reading the same
prepacked weights and the same planned scratch (a variant that would need a different weights format or more
scratch is not made: the node then runs its first primitive, as before).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from ctxrt.backends.cpu import gemv, native, threads
from ctxrt.backends.cpu.conv.convtranspose import begin_pads
from ctxrt.backends.cpu.onednn import api
from ctxrt.backends.kernel import Kernel, NodeSpec, TensorSpec
from ctxrt.errors import CtxrtError, UnsupportedOpError
from ctxrt.ir.layouts import LAYOUTS, PLAIN, Layout
from ctxrt.ir.memo import memo


def _layouts(spec: NodeSpec) -> tuple[Layout, Layout]:
    return LAYOUTS[spec.attr("src_layout", PLAIN.name)], LAYOUTS[spec.attr("dst_layout", PLAIN.name)]


_DATA_TYPES = {np.dtype(np.float32): api.F32, np.dtype(np.uint8): api.U8, np.dtype(np.int8): api.S8}


def data_type(spec: NodeSpec, t: TensorSpec) -> int:
    """oneDNN's data type of a float32 or 8-bit tensor (MaxPool and reorders of a QDQ model's activations)."""
    dt = _DATA_TYPES.get(np.dtype(t.dtype))
    if dt is None:
        raise UnsupportedOpError(f"{spec.op} {spec.name!r}: oneDNN here takes float32 and 8-bit tensors, got {t.dtype}")
    return dt


def _tag(layout: Layout, logical: tuple[int, ...], other: Layout) -> str:
    """The format tag of a value in `layout`; a one-pixel value marked plain takes the other side's tag (the
    same bytes), so that both sides of the primitive have one format."""
    if layout is PLAIN and logical[2] * logical[3] == 1:
        return other.tag
    return layout.tag


def _window(spec: NodeSpec, x: tuple[int, ...], y: tuple[int, ...], kernel: tuple[int, ...]
            ) -> tuple[list[int], list[int], list[int], list[int]]:
    """(strides, dilations as oneDNN counts them (d - 1), pads before, pads after making the output size)."""
    strides = list(spec.attr("strides") or [1, 1])
    dil = list(spec.attr("dilations") or [1, 1])
    auto = spec.attr("auto_pad", "NOTSET")
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        total = [max(0, (o - 1) * s + (k - 1) * d + 1 - i)
                 for o, s, k, d, i in zip(y[2:], strides, kernel, dil, x[2:], strict=True)]
        before = [t // 2 if auto == "SAME_UPPER" else t - t // 2 for t in total]
    elif auto == "VALID":
        before = [0, 0]
    else:
        before = list((spec.attr("pads") or [0, 0, 0, 0])[:2])
    after = [(o - 1) * s + (k - 1) * d + 1 - i - b
             for o, s, k, d, i, b in zip(y[2:], strides, kernel, dil, x[2:], before, strict=True)]
    return strides, [d - 1 for d in dil], before, after


def creation_threads(spec: NodeSpec) -> int:
    """The OpenMP threads a node's primitive is made for: as recorded at compile time (`threads`), so that the
    loaded primitive is the compiled one (weights format, scratchpad size); else this machine's cores."""
    return int(spec.attr("threads") or threads.usable_cores())


class OneDnnKernel(Kernel):
    """A primitive and how its arguments map to the node's inputs, outputs and scratch."""

    def __init__(self, spec: NodeSpec, prim: api.Primitive, args: list[tuple[int, str, int, api.Desc]],
                 algorithm: str, attrs: dict[str, Any] | None = None,
                 constants: dict[int, np.ndarray | None] | None = None,
                 variant: Callable[[int], api.Primitive] | None = None, weights: np.ndarray | None = None) -> None:
        self.prim = prim
        # Weights reordered for this kernel alone (a range program's shape whose primitive reads another format
        # than the stored one): bound in place of input 1, no thread variants (they would read the stored one).
        self.own_weights = weights
        if weights is not None:
            variant = None
            self.private_bytes = int(weights.nbytes)
        self.threads = creation_threads(spec)
        self._variant = variant  # thread count -> the same primitive made for that many threads
        self._variants: dict[int, api.Primitive | None] = {self.threads: prim}
        self.args = args  # (oneDNN argument, "in" / "out", index, descriptor)
        sp = prim.scratchpad_bytes
        self.scratch = (sp,) if sp else ()
        self.algorithm = f"onednn:{algorithm}:{prim.impl}"
        recorded = {} if spec.attr("threads") else {"threads": creation_threads(spec)}
        self.attrs = {**(attrs or {}), **recorded}
        self.constants = constants or {}

    held: list[np.ndarray] = []  # arrays the kernel made when built (int8: prepacked weights, scales, zero points)

    def bind(self, ins: list[Any], outs: list[Any], scratch: list[Any]) -> Callable[[], None]:
        places = {"in": ins, "out": outs, "held": self.held}
        if self.own_weights is not None:
            places["in"] = [self.own_weights if i == 1 else x for i, x in enumerate(ins)]
        args = [(arg, self._memory(arg, md, places[side][i].ctypes.data)) for arg, side, i, md in self.args]
        address = scratch[0].ctypes.data if self.scratch else 0

        def launch(prim: api.Primitive) -> Callable[[], None]:
            if not prim.scratchpad_bytes:
                return prim.launch(args)
            return prim.launch([*args, (api.ARG_SCRATCHPAD, api.Memory(prim.md(api.Q_SCRATCHPAD_MD), address))])

        first = launch(self.prim)
        if self._variant is None or self.threads <= 1:  # no run has fewer threads: no lookup per launch
            return first
        table: dict[int, Callable[[], None]] = {self.threads: first}
        now = threads.openmp_now

        def pick(n: int) -> Callable[[], None]:
            fn = table.get(n)
            if fn is None:
                prim = self.variant(n)
                fn = table[n] = first if prim is None else launch(prim)
            return fn

        def run() -> None:
            pick(now())()
        if getattr(first, "native", None) is not None:  # in a batch: the variant of the run's OpenMP threads
            run.native_at = lambda key: pick(key[0]).native  # type: ignore[attr-defined]
            run.keyed = True  # type: ignore[attr-defined]
        return run

    def _memory(self, arg: int, md: api.Desc, address: int) -> api.Memory:
        """The memory object of an argument at an address, made once (a range program rebinds its kernels to
        new IO tensors every token; the weights' and arena's objects stay the same)."""
        cache = self.__dict__.setdefault("_memories", {})
        mem = cache.get((arg, address))
        if mem is None:
            if len(cache) >= 64:
                cache.clear()
            mem = cache[(arg, address)] = api.Memory(md, address)
        return mem

    def variant(self, n: int) -> api.Primitive | None:
        """The primitive for runs with `n` OpenMP threads (made once), or None where the first one runs: `n` is
        not fewer than it was made for, or the variant would read other weights or need more scratch."""
        if n <= 0 or n >= self.threads or self._variant is None:
            return None
        if n not in self._variants:
            prim: api.Primitive | None
            try:
                prim = self._variant(n)
                prim.made()  # (made now: one that cannot be is not used, as one whose descriptor cannot)
            except CtxrtError:
                prim = None
            if prim is not None and (prim.impl.startswith("ref")
                                     or prim.scratchpad_bytes > (self.scratch[0] if self.scratch else 0)
                                     or any(prim.md(api.Q_WEIGHTS_MD) != md
                                            for arg, _, _, md in self.args if arg == api.ARG_WEIGHTS)):
                prim = None
            self._variants[n] = prim
        return self._variants[n]


def create(spec: NodeSpec, fn: str, *args: Any, attr: api.Attr | None = None, nthr: int | None = None
           ) -> api.Primitive:
    """`api.create` for the node's creation threads (or a variant's `nthr`), the last argument the attributes
    (default ones: a user-managed scratchpad). `attr` is held until the descriptor exists."""
    attr = attr or api.Attr()
    made, scope = _creating(spec, nthr)
    with made:
        return api.create(fn, f"{spec.op} {spec.name!r}", *args, attr.handle, scope=scope)


def _creating(spec: NodeSpec, nthr: int | None) -> tuple[Any, Callable[[], Any]]:
    """threads.creation for the node's first primitive descriptor (nthr None: its creation threads) or a variant's,
    and the scope its primitive is made in on its first launch (the same threads)."""
    n = nthr or creation_threads(spec)
    return threads.creation(n, variant=nthr is not None), functools.partial(threads.creation, n, True)


# -- Conv --------------------------------------------------------------------------------------------------
def _weights_dims(m: int, cg: int, kh: int, kw: int, g: int) -> tuple[int, ...]:
    return (m, cg, kh, kw) if g == 1 else (g, m // g, cg, kh, kw)


# a Conv's fused activation (FuseActivation's Relu, FuseConvActivation's others: activation_alpha and _beta are
# its parameters in oneDNN's terms, LeakyRelu a Relu of negative slope alpha, Clip's bounds alpha and beta)
CONV_ACTIVATIONS: dict[str | None, int | None] = {
    None: None, "Relu": api.ELTWISE_RELU, "LeakyRelu": api.ELTWISE_RELU, "Tanh": api.ELTWISE_TANH,
    "Sigmoid": api.ELTWISE_LOGISTIC, "Elu": api.ELTWISE_ELU, "Clip": api.ELTWISE_CLIP,
    "HardSigmoid": api.ELTWISE_HARDSIGMOID, "HardSwish": api.ELTWISE_HARDSWISH, "Swish": api.ELTWISE_SWISH,
    "Gelu": api.ELTWISE_GELU_ERF, "Gelu_tanh": api.ELTWISE_GELU_TANH}


def conv(spec: NodeSpec) -> Kernel:
    api.require(f"Conv {spec.name!r}")
    src, dst = _layouts(spec)
    x, y = src.logical(spec.inputs[0].shape), dst.logical(spec.outputs[0].shape)
    packed = spec.attr("weights_tag")
    m, cg, kh, kw = spec.attr("weight_shape") if packed else spec.inputs[1].shape
    g = int(spec.attr("group", 1))
    if spec.consts[1] is None:
        raise UnsupportedOpError(f"Conv {spec.name!r}: oneDNN kernels need constant weights")
    if np.dtype(spec.outputs[0].dtype) != np.float32:
        raise UnsupportedOpError(f"Conv {spec.name!r}: oneDNN kernels here are float32 only")
    act = spec.attr("activation")
    if act not in CONV_ACTIVATIONS:
        raise UnsupportedOpError(f"Conv {spec.name!r}: fused activation {act!r} is not supported by oneDNN here")
    strides, dil, pb, pe = _window(spec, x, y, (kh, kw))
    has_bias = len(spec.inputs) > 2 and spec.inputs[2] is not None
    residual = bool(spec.attr("residual", 0))
    native_act = gemv.conv_activation(spec.attrs) is not None
    pointwise = g == 1 and (kh, kw) == (1, 1) and strides == [1, 1] and pb == pe == [0, 0] and _rows(src, x) \
        and _rows(dst, y) and native_act
    depthwise = g > 1 and g == m == x[1] and cg == 1 and src.channels_last and dst.channels_last and native_act
    planar = g == 1 and src is PLAIN and dst.channels_last and x[1] < PLANAR_CHANNELS and not residual and native_act
    for flag, fits in (("any_rows", pointwise), ("dw_rows", depthwise), ("planar_rows", planar)):
        if spec.attr(flag) and not fits:  # a binary's choice this node cannot have (damaged or forged)
            raise UnsupportedOpError(f"Conv {spec.name!r}: compiled for a native kernel ({flag}) its shapes, "
                                     "layouts or activation do not fit; compile the model again")
    ranged = not packed and spec.options.get("ranges") and native.library() is not None
    if spec.attr("any_rows") or ranged and pointwise:
        return AnyRows(spec, m, cg, has_bias, residual)
    if spec.attr("dw_rows") or ranged and depthwise:
        return DepthwiseRows(spec, (kh, kw), (*strides, *pb, *[d + 1 for d in dil]), has_bias, residual)
    if spec.attr("planar_rows") or ranged and planar:
        return PlanarRows(spec, (m, cg, kh, kw), (*strides, *pb, *[d + 1 for d in dil]), has_bias)
    wdims = _weights_dims(m, cg, kh, kw, g)
    src_md = api.Desc.make(x, _tag(src, x, dst))
    dst_md = api.Desc.make(y, _tag(dst, y, src))
    bias_md = api.Desc.make((m,), "a") if has_bias else None
    attr = api.Attr(CONV_ACTIVATIONS[act], add=dst_md if residual else None,
                    alpha=float(spec.attr("activation_alpha", 0.0)), beta=float(spec.attr("activation_beta", 0.0)))

    def make(wfmt: int | str, nthr: int | None = None) -> api.Primitive:
        w_md = api.Desc.make(wdims, wfmt)
        return create(spec, "convolution_forward", api.FORWARD_INFERENCE, api.CONVOLUTION_DIRECT,
                       src_md.handle, w_md.handle, bias_md.handle if bias_md else None, dst_md.handle,
                       api.Dims(*strides), api.Dims(*dil), api.Dims(*pb), api.Dims(*pe), attr=attr, nthr=nthr)

    prim, packed, attrs, constants, own = _weighted(spec, make, wdims, "abcd" if len(wdims) == 4 else "abcde",
                                                    [m, cg, kh, kw])
    reject_reference(prim, spec)
    args = weighted_args(prim, src_md, dst_md, bias_md, attr.binary_index if residual else None)
    kind = "depthwise" if g > 1 and g == m == x[1] else "grouped" if g > 1 else "conv"
    return OneDnnKernel(spec, prim, args, kind, attrs, constants, variant=variant_of(spec, make, wdims, packed),
                        weights=own)


# -- ConvTranspose -------------------------------------------------------------------------------------------
# output channels from which oneDNN's deconvolution runs one (PP-OCR det's 24 -> 1 head: 0.51 ms in channels-last
# against NumPy's GEMM and copies on plain tensors, 0.15)
DECONV_MIN_OUTPUTS = 8


def conv_transpose(spec: NodeSpec) -> Kernel:
    """A 2-D ConvTranspose as oneDNN's deconvolution, in the layouts the layout pass gave it (that of the convs
    around it, as a conv's), its constant weights (ONNX's [C, M/g, kH, kW]: oneDNN's "iohw", "giohw" grouped)
    prepacked into the format the primitive prefers. Output padding past what the window covers stays with NumPy's
    kernel (convtranspose.py)."""
    api.require(f"ConvTranspose {spec.name!r}")
    src, dst = _layouts(spec)
    packed = spec.attr("weights_tag")
    wshape = tuple(spec.attr("weight_shape") if packed else spec.inputs[1].shape)
    g = int(spec.attr("group", 1))
    if len(wshape) != 4 or spec.consts[1] is None or np.dtype(spec.outputs[0].dtype) != np.float32 \
            or wshape[0] % g:
        raise UnsupportedOpError(f"ConvTranspose {spec.name!r}: oneDNN here takes 2-D float32 tensors and constant "
                                 "weights")
    c, mg, kh, kw = wshape
    act = spec.attr("activation")  # fused by FuseConvActivation, as a Conv's
    if act not in CONV_ACTIVATIONS:
        raise UnsupportedOpError(f"ConvTranspose {spec.name!r}: fused activation {act!r} is not supported by oneDNN "
                                 "here")
    x, y = src.logical(spec.inputs[0].shape), dst.logical(spec.outputs[0].shape)
    strides = list(spec.attr("strides") or [1, 1])
    dil = list(spec.attr("dilations") or [1, 1])
    pb = begin_pads(spec, x[2:], y[2:], (kh, kw), strides, dil, list(spec.attr("output_padding") or [0, 0]))
    pe = [(i - 1) * s + (k - 1) * d + 1 - b - o
          for i, o, k, s, d, b in zip(x[2:], y[2:], (kh, kw), strides, dil, pb, strict=True)]
    m = mg * g
    if min(*pb, *pe) < 0 or m < DECONV_MIN_OUTPUTS:
        raise UnsupportedOpError(f"ConvTranspose {spec.name!r}: output padding past the window or {m} output "
                                 f"channels (oneDNN here: pads of 0 or more, {DECONV_MIN_OUTPUTS} channels or more)")
    wdims = (m, c, kh, kw) if g == 1 else (g, mg, c // g, kh, kw)
    stored = "bacd" if g == 1 else "acbde"  # ONNX's [C, M/g, kH, kW] over oneDNN's (o, i, h, w) / (g, o, i, h, w)
    has_bias = len(spec.inputs) > 2 and spec.inputs[2] is not None
    src_md, dst_md = api.Desc.make(x, _tag(src, x, dst)), api.Desc.make(y, _tag(dst, y, src))
    bias_md = api.Desc.make((m,), "a") if has_bias else None
    attr = api.Attr(CONV_ACTIVATIONS[act], alpha=float(spec.attr("activation_alpha", 0.0)),
                    beta=float(spec.attr("activation_beta", 0.0)))

    def make(wfmt: int | str, nthr: int | None = None) -> api.Primitive:
        w_md = api.Desc.make(wdims, wfmt)
        return create(spec, "deconvolution_forward", api.FORWARD_INFERENCE, api.DECONVOLUTION_DIRECT,
                      src_md.handle, w_md.handle, bias_md.handle if bias_md else None, dst_md.handle,
                      api.Dims(*strides), api.Dims(*[d - 1 for d in dil]), api.Dims(*pb), api.Dims(*pe), attr=attr,
                      nthr=nthr)

    prim, packed, attrs, constants, own = _weighted(spec, make, wdims, stored, [c, mg, kh, kw])
    reject_reference(prim, spec)
    args = weighted_args(prim, src_md, dst_md, bias_md, None)
    return OneDnnKernel(spec, prim, args, "deconv", attrs, constants, variant=variant_of(spec, make, wdims, packed),
                        weights=own)


def _weighted(spec: NodeSpec, make: Callable[..., api.Primitive], wdims: tuple[int, ...], stored: str,
              shape: list[int]) -> tuple[api.Primitive, str, dict[str, Any], dict[int, np.ndarray | None],
                                         np.ndarray | None]:
    """A Conv's or ConvTranspose's primitive and weights: (primitive, weights format, the attributes that make it
    again from a binary, the prepacked weights as input 1's constant (from the ONNX weights stored as `stored` over
    `wdims`; none while the layout pass only asks whether oneDNN can), weights reordered for this kernel alone)."""
    packed = spec.attr("weights_tag")
    if packed:
        prim, own = recreate_or_reorder(spec, make, wdims, packed)
        return prim, packed, {}, {}, own
    wanted = (spec.options.get("weights_tags") or {}).get(spec.name)
    if wanted:  # a range compile's probe (compared, never run): the weights in the upper bound's format, which the
        # program reads at every shape (runtime: recreate_or_reorder), whatever oneDNN prefers at this one
        try:
            prim = recreate(spec, make, wdims, wanted)
        except UnsupportedOpError:
            prim = make(api.TAG_ANY)
        to = api.Desc.make(wdims, wanted)
        constants = {} if spec.options.get("probe") else {1: prepack(spec.consts[1], wdims, stored, to)}
        return prim, wanted, {"weights_tag": wanted, "weight_shape": shape}, constants, None
    prim, packed = choose_weights(spec, make, wdims, int(spec.consts[1].nbytes))
    constants = {} if spec.options.get("probe") else {
        1: prepack(spec.consts[1], wdims, stored, prim.md(api.Q_WEIGHTS_MD))}
    return prim, packed, {"weights_tag": packed, "weight_shape": shape}, constants, None


def _rows(layout: Layout, logical: tuple[int, ...]) -> bool:
    """Whether a 4-D value in `layout` is stored as (pixels, channels) rows: channels last, or one pixel."""
    return layout.channels_last or logical[2] * logical[3] == 1


def _fallback_launch(owner: Kernel, prim: api.Primitive, args: list[tuple[int, api.Memory]], attr: api.Attr,
                     dst: tuple[api.Desc, np.ndarray], bias: tuple[api.Desc | None, np.ndarray | None],
                     residual: np.ndarray | None, held: tuple[Any, ...]) -> Callable[[], None]:
    """The launch of a native kernel's oneDNN fallback (AnyRows, DepthwiseRows, PlanarRows where the extension is
    missing): its source and weights in `args`, then the output, the bias, the residual (binary post-op) and a
    scratchpad of its own (the arena planned none for it: counted in `owner.private_bytes`); the arrays kept alive
    with it."""
    dst_md, y = dst
    args.append((api.ARG_DST, api.Memory(dst_md, y.ctypes.data)))
    if bias[1] is not None:
        args.append((api.ARG_BIAS, api.Memory(bias[0], bias[1].ctypes.data)))
    if residual is not None:
        args.append((api.post_op_arg(attr.binary_index, api.ARG_SRC_1), api.Memory(dst_md, residual.ctypes.data)))
    pad = np.empty(prim.scratchpad_bytes, np.uint8)
    owner.private_bytes = (owner.private_bytes or 0) + pad.nbytes
    if pad.size:
        args.append((api.ARG_SCRATCHPAD, api.Memory(prim.md(api.Q_SCRATCHPAD_MD), pad.ctypes.data)))
    run = prim.launch(args)
    run.held = (pad, y, bias[1], residual, *held)  # type: ignore[attr-defined]  # alive with the launch
    return run


class _NativeConv(Kernel):
    """A range program's Conv on a native kernel that binds any shape (AnyRows, DepthwiseRows, PlanarRows): its spec
    (for its oneDNN fallback), bias and residual, fused activation; compiled now, the weights stored in the layout
    the kernel reads (`layout` of the ONNX weights, shared by the compile's probes) and the attribute `flag` that
    chooses this kernel again when the binary is loaded."""

    any_shape = True  # one object binds every batch size (runtime/extents.py keeps it per step)

    def __init__(self, spec: NodeSpec, flag: str, has_bias: bool, residual: bool,
                 layout: Callable[[np.ndarray], np.ndarray], key: Any) -> None:
        self.spec, self.has_bias, self.residual = spec, has_bias, residual
        self.act = gemv.conv_activation(spec.attrs)
        self.private_bytes = 0  # (its spec's constants are the model's: not its own)
        if spec.attr(flag):
            self.attrs, self.constants = {}, {}
        else:
            self.attrs = {flag: 1}
            w = spec.consts[1]
            self.constants = {} if spec.options.get("probe") else {1: memo(flag, w, key, lambda: layout(w))}

    def _window_at(self, x: tuple[int, ...], y: tuple[int, ...]) -> tuple[int, ...]:
        """The window (strides, pads before, dilations + 1) at these NCHW input and output shapes: SAME padding's
        pads follow the sizes (a range over an image's height: the upper bound's window would be another's)."""
        if self.spec.attr("auto_pad", "NOTSET") not in ("SAME_UPPER", "SAME_LOWER"):
            return self.window
        strides, dil, pb, _ = _window(self.spec, x, y, self.kernel_hw)
        return (*strides, *pb, *[d + 1 for d in dil])

    def _onednn_conv(self, src: tuple[api.Desc, int, int], dst: tuple[api.Desc, int, int], kernel: tuple[int, int],
                     wdims: tuple[int, ...], w: np.ndarray, stored: str, bias: np.ndarray | None, residual: bool
                     ) -> tuple[api.Primitive, api.Attr, api.Desc | None, np.ndarray]:
        """A fallback's oneDNN convolution of `src` (its descriptor, rows, columns) into `dst` over `self.window`:
        the primitive, its post-ops, the bias descriptor and the stored weights `w` (tag `stored` of `wdims`)
        reordered into its format (its own copy, counted in `private_bytes`)."""
        spec = self.spec
        (src_md, h, wd), (dst_md, oh, ow), (kh, kw) = src, dst, kernel
        sh, sw, ph, pw, dh, dw = self.window
        bias_md = api.Desc.make((wdims[0],), "a") if bias is not None else None
        pe = [(o - 1) * s + (k - 1) * d + 1 - i - b for o, s, k, d, i, b in
              ((oh, sh, kh, dh, h, ph), (ow, sw, kw, dw, wd, pw))]
        attr = api.Attr(CONV_ACTIVATIONS[spec.attr("activation")], add=dst_md if residual else None,
                        alpha=float(spec.attr("activation_alpha", 0.0)),
                        beta=float(spec.attr("activation_beta", 0.0)))
        any_md = api.Desc.make(wdims, api.TAG_ANY)  # (held: the call reads it)
        prim = create(spec, "convolution_forward", api.FORWARD_INFERENCE, api.CONVOLUTION_DIRECT, src_md.handle,
                      any_md.handle, bias_md.handle if bias_md else None, dst_md.handle, api.Dims(sh, sw),
                      api.Dims(dh - 1, dw - 1), api.Dims(ph, pw), api.Dims(*pe), attr=attr)
        reject_reference(prim, spec)
        packed = _prepack(w, wdims, stored, prim.md(api.Q_WEIGHTS_MD))
        self.private_bytes = (self.private_bytes or 0) + packed.nbytes
        return prim, attr, bias_md, packed


class AnyRows(_NativeConv):
    """A 1x1 convolution (stride 1, no padding, one group) over channels-last rows in a range program: a GEMM of
    (images x pixels) rows by the weights stored [K, N], run by csrc/gemv.c's many-rows kernel with the bias, the
    residual and the activation in its epilogue. The same code for every batch: a range program's batch cycle
    (sizes 1 .. 12 in turn) ran each size's own oneDNN primitives, ~100 KB of JIT code a size, all of it cold
    when the cycle came back (MobileNetV3 at batch 1: 0.11 ms repeated, 0.25-0.35 ms in the cycle; onnxruntime's
    MLAS, one code for every shape, 0.11 / 0.14). Where the extension is missing at run time, a oneDNN matmul
    made for the arrays' rows on the same weights."""

    algorithm = "native:gemm_rows"

    def __init__(self, spec: NodeSpec, m: int, k: int, has_bias: bool, residual: bool) -> None:
        self.shape = (k, m)  # the weights stored transposed, [K, N] (the same bytes as ONNX's)
        super().__init__(spec, "any_rows", has_bias, residual,
                         lambda w: np.ascontiguousarray(w.reshape(m, k).T).reshape(w.shape), (m, k))

    def bind(self, ins: list[Any], outs: list[Any], scratch: list[Any]) -> Callable[[], None]:
        k, n = self.shape
        rows = ins[0].size // k
        a, w, y = ins[0].reshape(rows, k), ins[1].reshape(k, n), outs[0].reshape(rows, n)
        bias = ins[2].reshape(n) if self.has_bias else None
        residual = ins[3].reshape(rows, n) if self.residual else None
        act, alpha, beta = self.act or (None, 0.0, 0.0)
        run = gemv.launch(a, w, False, y, bias, residual, act, alpha, beta, many=True)
        return run if run is not None else self._onednn(a, w, y, bias, residual)

    def _onednn(self, a: np.ndarray, w: np.ndarray, y: np.ndarray, bias: np.ndarray | None,
                residual: np.ndarray | None) -> Callable[[], None]:
        """oneDNN's matmul made for these rows, reading the weights as stored (the extension is missing)."""
        spec = self.spec
        (rows, k), n = a.shape, y.shape[1]
        src_md, dst_md = api.Desc.make((rows, k), "ab"), api.Desc.make((rows, n), "ab")
        bias_md = api.Desc.make((1, n), "ab") if bias is not None else None
        attr = api.Attr(CONV_ACTIVATIONS[spec.attr("activation")], add=dst_md if residual is not None else None,
                        alpha=float(spec.attr("activation_alpha", 0.0)),
                        beta=float(spec.attr("activation_beta", 0.0)))
        w_md = api.Desc.make((k, n), "ab")
        prim = create(spec, "matmul", src_md.handle, w_md.handle, bias_md.handle if bias_md else None,
                      dst_md.handle, attr=attr)
        args = [(api.ARG_SRC, api.Memory(src_md, a.ctypes.data)), (api.ARG_WEIGHTS, api.Memory(w_md, w.ctypes.data))]
        return _fallback_launch(self, prim, args, attr, (dst_md, y), (bias_md, bias), residual, (a, w))


def shape_free(spec: NodeSpec) -> bool:
    """Whether the node is compiled into a range program (or was: `any_shape`), whose kernels that exist in a form
    independent of the shape (ShapeFree, AnyRows, DepthwiseRows, PlanarRows) are that form."""
    return bool(spec.options.get("ranges") or spec.attr("any_shape"))


class ShapeFree(Kernel):
    """A kernel of a range program whose launch is made from the arrays alone (`bind(ins, outs)`): one object and
    one piece of code for every shape (runtime/extents.py keeps it per step; docs/cpu.md)."""

    any_shape = True

    def __init__(self, bind: Callable[[list[Any], list[Any]], Callable[[], None]], algorithm: str) -> None:
        self._bind, self.algorithm = bind, algorithm
        self.attrs = {"any_shape": 1}

    def bind(self, ins: list[Any], outs: list[Any], scratch: list[Any]) -> Callable[[], None]:
        return self._bind(ins, outs)


def _gap_launch(ins: list[Any], outs: list[Any]) -> Callable[[], None]:
    """GlobalAveragePool of channels-last images into one pixel (bytes (images, channels) in every layout)."""
    n, h, w, c = ins[0].shape
    x, y = ins[0].reshape(n, h * w, c), outs[0].reshape(n, c)
    run = native.gap(x, y) if native.library() is not None else None
    if run is not None:
        return run
    pixels = np.float32(h * w)

    def numpy_gap() -> None:
        np.add.reduce(x, axis=1, out=y)
        np.divide(y, pixels, out=y)
    return numpy_gap


class DepthwiseRows(_NativeConv):
    """A depthwise convolution (one input and one output channel per group) over channels-last images in a range
    program: csrc/dwconv.c, one object and the same code for every batch size (as AnyRows), its epilogue fused
    (bias, residual, activation), the weights stored [kh, kw, C]. Where the extension is missing at run time,
    oneDNN's convolution made for the arrays' batch, on those weights reordered into its format (its own copy)."""

    algorithm = "native:dwconv"

    def __init__(self, spec: NodeSpec, kernel: tuple[int, int], window: tuple[int, ...], has_bias: bool,
                 residual: bool) -> None:
        self.kernel, self.window = kernel, window  # the weights stored [kh, kw, C]
        self.kernel_hw = kernel
        super().__init__(spec, "dw_rows", has_bias, residual,
                         lambda w: np.ascontiguousarray(w.reshape(w.shape[0], -1).T).reshape(w.shape), kernel)

    def bind(self, ins: list[Any], outs: list[Any], scratch: list[Any]) -> Callable[[], None]:
        kh, kw = self.kernel
        x, y = ins[0], outs[0]
        c = x.shape[3]
        w = ins[1].reshape(kh, kw, c)
        bias = ins[2].reshape(c) if self.has_bias else None
        residual = ins[3].reshape(y.shape) if self.residual else None
        act, alpha, beta = self.act or (None, 0.0, 0.0)
        self.window = self._window_at((x.shape[0], c, *x.shape[1:3]), (y.shape[0], c, *y.shape[1:3]))
        run = native.dwconv(x, w, y, bias, residual, self.window, gemv.act_code(act) or 0, alpha, beta) \
            if native.library() is not None else None
        return run if run is not None else self._onednn(x, w, y, bias, residual)

    def _onednn(self, x: np.ndarray, w: np.ndarray, y: np.ndarray, bias: np.ndarray | None,
                residual: np.ndarray | None) -> Callable[[], None]:
        """oneDNN's depthwise convolution made for these images (the extension is missing), on the stored
        [kh, kw, C] weights reordered into its depthwise kernel's format."""
        n, h, wd, c = x.shape
        _, oh, ow, _ = y.shape
        src_md, dst_md = api.Desc.make((n, c, h, wd), "acdb"), api.Desc.make((n, c, oh, ow), "acdb")
        prim, attr, bias_md, packed = self._onednn_conv((src_md, h, wd), (dst_md, oh, ow), self.kernel,
                                                        (c, 1, 1, *self.kernel), w, "decab", bias,
                                                        residual is not None)
        args = [(api.ARG_SRC, api.Memory(src_md, x.ctypes.data)),
                (api.ARG_WEIGHTS, api.Memory(prim.md(api.Q_WEIGHTS_MD), packed.ctypes.data))]
        return _fallback_launch(self, prim, args, attr, (dst_md, y), (bias_md, bias), residual, (packed, x, w))


# input channels under which a range program's conv reads planar (NCHW) images directly (PlanarRows): a network's
# first conv, on the graph's input (the layout pass offers the planar source below 8)
PLANAR_CHANNELS = 8


class PlanarRows(_NativeConv):
    """A range program's convolution of few planar input channels (a network's first, on the graph's NCHW input)
    into channels-last output, one group: csrc/dwconv.c's ctxrt_planar_conv, the weights stored [C, kh, kw, M], the
    bias and activation fused; no reorder of the input before it (oneDNN has only its reference kernel for a planar
    source into a channels-last output: the program reordered the input, and made that reorder's and the conv's
    primitives at each new batch size). Where the extension is missing at run time: the input reordered into a
    channels-last copy of its own and oneDNN's convolution, both made for the arrays' batch."""

    algorithm = "native:planar_conv"

    def __init__(self, spec: NodeSpec, wshape: tuple[int, int, int, int], window: tuple[int, ...],
                 has_bias: bool) -> None:
        self.wshape, self.window = wshape, window
        self.kernel_hw = wshape[2:]
        super().__init__(spec, "planar_rows", has_bias, False,
                         lambda w: np.ascontiguousarray(w.reshape(wshape).transpose(1, 2, 3, 0)).reshape(w.shape),
                         wshape)

    def bind(self, ins: list[Any], outs: list[Any], scratch: list[Any]) -> Callable[[], None]:
        m, c, kh, kw = self.wshape
        x, y = ins[0], outs[0]
        w = ins[1].reshape(c, kh, kw, m)
        bias = ins[2].reshape(m) if self.has_bias else None
        act, alpha, beta = self.act or (None, 0.0, 0.0)
        self.window = self._window_at(x.shape, (y.shape[0], m, *y.shape[1:3]))
        run = native.planar_conv(x, w, y, bias, self.window, gemv.act_code(act) or 0, alpha, beta) \
            if native.library() is not None else None
        return run if run is not None else self._onednn(x, w, y, bias)

    def _onednn(self, x: np.ndarray, w: np.ndarray, y: np.ndarray, bias: np.ndarray | None) -> Callable[[], None]:
        """The input reordered channels-last into a buffer of its own, then oneDNN's convolution (the extension
        is missing): both primitives made for these arrays."""
        m, c, kh, kw = self.wshape
        n, _, h, wd = x.shape
        _, oh, ow, _ = y.shape
        plain, src_md = api.Desc.make((n, c, h, wd), "abcd"), api.Desc.make((n, c, h, wd), "acdb")
        dst_md = api.Desc.make((n, m, oh, ow), "acdb")
        prim, attr, bias_md, packed = self._onednn_conv((src_md, h, wd), (dst_md, oh, ow), (kh, kw), self.wshape,
                                                        w, "bcda", bias, False)  # (the stored [C, kh, kw, M])
        staged = np.empty((n, h, wd, c), np.float32)
        self.private_bytes += staged.nbytes
        to_last = api.reorder(plain, src_md)
        stage = to_last.launch([(api.ARG_FROM, api.Memory(plain, x.ctypes.data)),
                                (api.ARG_TO, api.Memory(src_md, staged.ctypes.data))])
        args = [(api.ARG_SRC, api.Memory(src_md, staged.ctypes.data)),
                (api.ARG_WEIGHTS, api.Memory(prim.md(api.Q_WEIGHTS_MD), packed.ctypes.data))]
        conv = _fallback_launch(self, prim, args, attr, (dst_md, y), (bias_md, bias), None, (packed, staged, x, w))

        def run() -> None:
            stage()
            conv()
        run.held = (stage, conv, to_last, plain)  # type: ignore[attr-defined]
        return run


# Weights formats tried, in order, when the one oneDNN prefers is padded and prefer="memory" (measured: given
# ABcd16b16a, oneDNN 3.2 runs 1x1 convs over NHWC with its jit_1x1 kernel where brgconv wanted Acdb48a).
UNPADDED = {4: ("ABcd16b16a", "ABcd8b8a", "Acdb16a", "Acdb8a", "Acdb32a", "Acdb64a", "acdb", "abcd"),
            5: ("aBCde16c16b", "aBCde8c8b", "Abcde16a", "Abcde8a", "abdec", "abcde"), 2: ("ab", "ba")}


def choose_weights(spec: NodeSpec, make: Callable[[int | str], api.Primitive], wdims: tuple[int, ...],
                   original: int) -> tuple[api.Primitive, str]:
    """The primitive with the weights format oneDNN prefers; with `prefer="memory"`, one no larger than the
    ONNX weights (`original` bytes): the preferred one if it is not padded, else the first of `UNPADDED` with a
    fast implementation; else UnsupportedOpError."""
    prim = make(api.TAG_ANY)
    w_md = prim.md(api.Q_WEIGHTS_MD)
    if w_md.nbytes <= original or spec.options.get("prefer", "speed") == "speed":
        name = w_md.tag_name(wdims)
        if name is None:
            raise UnsupportedOpError(f"{spec.op} {spec.name!r}: oneDNN chose a weights format with no tag name")
        return prim, name
    for name in UNPADDED[len(wdims)]:
        try:
            if api.Desc.make(wdims, name).nbytes > original:
                continue
            prim = make(name)
        except CtxrtError:
            continue
        if not prim.impl.startswith("ref"):
            return prim, name
    raise UnsupportedOpError(f"{spec.op} {spec.name!r}: oneDNN's weights format would be larger than the weights "
                             "(compiled with prefer='memory')")


def recreate(spec: NodeSpec, make: Callable[[int | str], api.Primitive], wdims: tuple[int, ...], name: str
             ) -> api.Primitive:
    """The primitive of a compiled node, reading weights stored in format `name`. Some implementations take
    only the format they choose themselves (given "any"), not the same format given by tag: ask for "any" and
    check that the choice is the stored format; a plain format chosen for prefer="memory" is given by tag."""
    if name in ("ab", "ba"):  # a GEMM's weights read as stored were asked for by tag at compile time
        # (matmul._stored_or_chosen): "any" would choose a blocked format, one descriptor made in vain (a range
        # program makes its GEMM kernels at each new row count: 36 of them for a BERT's new sequence length)
        try:
            prim = make(name)
            if not prim.impl.startswith("ref"):
                return prim
        except CtxrtError:
            pass
    want = api.Desc.make(wdims, name)
    prim = make(api.TAG_ANY)
    if prim.md(api.Q_WEIGHTS_MD) == want:
        return prim
    try:
        prim = make(name)
    except CtxrtError:
        prim = None
    if prim is None or prim.impl.startswith("ref"):
        raise UnsupportedOpError(f"{spec.op} {spec.name!r}: oneDNN here does not read weights in the format the "
                                 f"context was compiled with ({name}): another CPU or oneDNN version; compile it again")
    return prim


def recreate_or_reorder(spec: NodeSpec, make: Callable[[int | str], api.Primitive], wdims: tuple[int, ...],
                        name: str) -> tuple[api.Primitive, np.ndarray | None]:
    """(the primitive reading the stored weights (format `name`), None); or, in a range program at a shape whose
    implementations cannot read that format (oneDNN picks other kernels for one image than for a batch), (the
    preferred primitive, the stored weights reordered for it: kernel-private bytes)."""
    try:
        return recreate(spec, make, wdims, name), None
    except UnsupportedOpError:
        if spec.consts[1] is None:
            raise
    prim = make(api.TAG_ANY)
    reject_reference(prim, spec)
    return prim, prepack(spec.consts[1], wdims, name, prim.md(api.Q_WEIGHTS_MD))


def variant_of(spec: NodeSpec, make: Callable[..., api.Primitive], wdims: tuple[int, ...], name: str
               ) -> Callable[[int], api.Primitive]:
    """How a weighted node (Conv, MatMul) makes its primitive for another thread count: reading the weights
    stored in format `name`."""
    return lambda n: recreate(spec, lambda wfmt: make(wfmt, n), wdims, name)


def prepack(weights: np.ndarray, wdims: tuple[int, ...], tag: str, to: api.Desc) -> np.ndarray:
    """Weights stored as `tag` (over dims `wdims`) reordered into `to` (at compile time; stored in the binary).
    A range compile's probes share the result (ir/memo.py)."""
    name = to.tag_name(wdims)
    if name is None:
        return _prepack(weights, wdims, tag, to)
    return memo("prepacked", weights, (tuple(wdims), tag, name, to.nbytes),
                lambda: _prepack(weights, wdims, tag, to))


def _prepack(weights: np.ndarray, wdims: tuple[int, ...], tag: str, to: api.Desc) -> np.ndarray:
    src = np.ascontiguousarray(weights, np.float32)
    out = np.zeros(to.nbytes // 4, np.float32)
    plain = api.Desc.make(wdims, tag)
    prim = api.reorder(plain, to)
    if prim.scratchpad_bytes:
        raise UnsupportedOpError("oneDNN weight reorder needs a scratchpad")
    prim.launch([(api.ARG_FROM, api.Memory(plain, src.ctypes.data)), (api.ARG_TO, api.Memory(to, out.ctypes.data))])()
    return out


def weighted_args(prim: api.Primitive, src_md: Any, dst_md: Any, bias_md: Any, residual_index: int | None
                  ) -> list[tuple[int, str, int, Any]]:
    """A conv's or matmul's execution arguments: (oneDNN argument, "in"/"out", tensor index, descriptor) for the
    source, the prepacked weights, the destination, the bias and a residual summed in as a binary post-op."""
    args = [(api.ARG_SRC, "in", 0, src_md), (api.ARG_WEIGHTS, "in", 1, prim.md(api.Q_WEIGHTS_MD)),
            (api.ARG_DST, "out", 0, dst_md)]
    if bias_md is not None:
        args.append((api.ARG_BIAS, "in", 2, bias_md))
    if residual_index is not None:
        args.append((api.post_op_arg(residual_index, api.ARG_SRC_1), "in", 3, dst_md))
    return args


def reject_reference(prim: api.Primitive, spec: NodeSpec) -> None:
    """oneDNN's reference implementations are orders of magnitude slower than NumPy: never use them."""
    if prim.impl.startswith("ref"):
        raise UnsupportedOpError(f"{spec.op} {spec.name!r}: oneDNN has only its reference implementation "
                                 f"for these layouts ({spec.attr('src_layout')} -> {spec.attr('dst_layout')})")


# -- Softmax --------------------------------------------------------------------------------------------------
def softmax(spec: NodeSpec) -> Kernel:
    """Softmax of float32 along n of the (outer, n, inner) view NumPy's kernel uses, where n is innermost: one
    pass per row on every thread of the run. BERT's attention scores (12 x 128 rows of 128): 274 us with NumPy,
    97 us with oneDNN on one thread, 50 on two; a MiniLM-L6-shaped BERT on 2 cores went from 12.2 to 10.6 ms.
    (Concat was tried too: NumPy's copy was as fast, 42 us vs 54 for 55 x 55 x 128 channels-last.)"""
    from ctxrt.backends.cpu.reduce import softmax_view

    api.require(f"Softmax {spec.name!r}")
    if np.dtype(spec.inputs[0].dtype) != np.float32 or np.dtype(spec.outputs[0].dtype) != np.float32:
        raise UnsupportedOpError(f"Softmax {spec.name!r}: oneDNN's softmax is used for float32")
    view = softmax_view(spec)
    if 0 in view:
        raise UnsupportedOpError(f"Softmax {spec.name!r}: empty tensor")
    md = api.Desc.make(view, "abc"[:len(view)])

    def make(nthr: int | None = None) -> api.Primitive:
        return create(spec, "softmax_forward", api.FORWARD_INFERENCE, api.SOFTMAX_ACCURATE, md.handle, md.handle,
                      1, nthr=nthr)

    prim = make()
    reject_reference(prim, spec)
    small = len(view) == 2 and view[0] * view[1] <= NATIVE_ROWS_MAX and native.library() is not None
    kernel = (_NativeRows if small else OneDnnKernel)(
        spec, prim, [(api.ARG_SRC, "in", 0, md), (api.ARG_DST, "out", 0, md)], "softmax", variant=make)
    if small:
        kernel.rows = (True, view[0], view[1], 0.0)
    return kernel


# values of a Softmax or LayerNormalization up to which csrc/norms_kernel.h's rows run on one thread, where
# oneDNN's call costs more than the work (a small decoder's 4 x 8 x 8 attention scores: ~13 us -> ~2)
NATIVE_ROWS_MAX = 1 << 15


class _NativeRows(OneDnnKernel):
    """A small oneDNN Softmax (along the last axis) or LayerNormalization bound to csrc/norms_kernel.h's row
    kernel; the primitive where the arrays do not fit it."""

    rows: tuple[bool, int, int, float]  # (a Softmax, else a LayerNormalization; rows, row length, epsilon)

    def bind(self, ins: list[Any], outs: list[Any], scratch: list[Any]) -> Callable[[], None]:
        softmax, rows, n, eps = self.rows
        if native.library() is None or not native.rows_fit(*(a for a in (*ins, *outs) if a is not None)):
            return super().bind(ins, outs, scratch)
        if softmax:
            return native.softmax_rows(ins[0], outs[0], rows, n)
        return native.ln_rows(ins[0], ins[1], ins[2] if len(ins) > 2 else None, outs[0], rows, n, eps)


# -- pools, LRN, BatchNormalization ---------------------------------------------------------------------------
def _pool(spec: NodeSpec, alg: int, kernel: tuple[int, int] | None = None) -> Kernel:
    api.require(f"{spec.op} {spec.name!r}")
    src, dst = _layouts(spec)
    x, y = src.logical(spec.inputs[0].shape), dst.logical(spec.outputs[0].shape)
    kernel = kernel or tuple(spec.attr("kernel_shape"))
    strides, dil, pb, pe = _window(spec, x, y, kernel)
    given = list((spec.attr("pads") or [0, 0, 0, 0])[2:])
    if alg == api.POOLING_AVG_INCLUDE and spec.attr("auto_pad", "NOTSET") == "NOTSET" and pe != given:
        raise UnsupportedOpError(f"AveragePool {spec.name!r}: count_include_pad with ceil_mode is left to NumPy")
    dt = data_type(spec, spec.inputs[0])
    if dt != api.F32 and alg != api.POOLING_MAX:
        raise UnsupportedOpError(f"{spec.op} {spec.name!r}: oneDNN here averages float32 tensors only")
    src_md, dst_md = api.Desc.make(x, _tag(src, x, dst), dt), api.Desc.make(y, _tag(dst, y, src), dt)

    def make(nthr: int | None = None) -> api.Primitive:
        return create(spec, "pooling_forward", api.FORWARD_INFERENCE, alg, src_md.handle, dst_md.handle,
                      api.Dims(*strides), api.Dims(*kernel), api.Dims(*dil), api.Dims(*pb), api.Dims(*pe), nthr=nthr)

    prim = make()
    reject_reference(prim, spec)
    if prim.md(api.Q_WORKSPACE_MD).nbytes:
        raise UnsupportedOpError(f"{spec.op} {spec.name!r}: oneDNN asks for a workspace in inference")
    return OneDnnKernel(spec, prim, [(api.ARG_SRC, "in", 0, src_md), (api.ARG_DST, "out", 0, dst_md)], "pool",
                        variant=make)


def maxpool(spec: NodeSpec) -> Kernel:
    if len(spec.outputs) > 1:
        raise UnsupportedOpError(f"MaxPool {spec.name!r}: the Indices output is not supported")
    return _pool(spec, api.POOLING_MAX)


def avgpool(spec: NodeSpec) -> Kernel:
    include = bool(spec.attr("count_include_pad", 0))
    return _pool(spec, api.POOLING_AVG_INCLUDE if include else api.POOLING_AVG_EXCLUDE)


def global_avgpool(spec: NodeSpec) -> Kernel:
    src, _ = _layouts(spec)
    if shape_free(spec) and src.channels_last and np.dtype(spec.inputs[0].dtype) == np.float32 \
            and np.dtype(spec.outputs[0].dtype) == np.float32:
        return ShapeFree(_gap_launch, "native:gap")
    return _pool(spec, api.POOLING_AVG_EXCLUDE, tuple(src.logical(spec.inputs[0].shape)[2:]))


def lrn(spec: NodeSpec) -> Kernel:
    api.require(f"LRN {spec.name!r}")
    size = int(spec.attr("size"))
    if size % 2 == 0:
        raise UnsupportedOpError(f"LRN {spec.name!r}: oneDNN centres even windows differently from ONNX")
    src, dst = _layouts(spec)
    x = src.logical(spec.inputs[0].shape)
    src_md, dst_md = api.Desc.make(x, src.tag), api.Desc.make(x, dst.tag)

    def make(nthr: int | None = None) -> api.Primitive:
        return create(spec, "lrn_forward", api.FORWARD_INFERENCE, api.LRN_ACROSS_CHANNELS, src_md.handle,
                      dst_md.handle, size, float(spec.attr("alpha", 1e-4)), float(spec.attr("beta", 0.75)),
                      float(spec.attr("bias", 1.0)), nthr=nthr)

    prim = make()
    reject_reference(prim, spec)
    if prim.md(api.Q_WORKSPACE_MD).nbytes:
        raise UnsupportedOpError(f"LRN {spec.name!r}: oneDNN asks for a workspace in inference")
    return OneDnnKernel(spec, prim, [(api.ARG_SRC, "in", 0, src_md), (api.ARG_DST, "out", 0, dst_md)], "lrn",
                        variant=make)


def batchnorm(spec: NodeSpec) -> Kernel:
    api.require(f"BatchNormalization {spec.name!r}")
    if any(c is None for c in spec.consts[1:5]) or len(spec.outputs) > 1:
        raise UnsupportedOpError(f"BatchNormalization {spec.name!r}: oneDNN here needs constant parameters "
                                 "and one output")
    if any(np.dtype(s.dtype) != np.float32 for s in spec.inputs[1:5]):
        raise UnsupportedOpError(f"BatchNormalization {spec.name!r}: oneDNN here needs float32 parameters")
    src, dst = _layouts(spec)
    x = src.logical(spec.inputs[0].shape)
    src_md, dst_md = api.Desc.make(x, src.tag), api.Desc.make(x, dst.tag)
    flags = api.USE_GLOBAL_STATS | api.USE_SCALE | api.USE_SHIFT

    def make(nthr: int | None = None) -> api.Primitive:
        return create(spec, "batch_normalization_forward", api.FORWARD_INFERENCE, src_md.handle, dst_md.handle,
                      float(spec.attr("epsilon", 1e-5)), flags, nthr=nthr)

    prim = make()
    reject_reference(prim, spec)
    vec = api.Desc.make((x[1],), "a")
    args = [(api.ARG_SRC, "in", 0, src_md), (api.ARG_DST, "out", 0, dst_md), (api.ARG_SCALE, "in", 1, vec),
            (api.ARG_SHIFT, "in", 2, vec), (api.ARG_MEAN, "in", 3, vec), (api.ARG_VARIANCE, "in", 4, vec)]
    return OneDnnKernel(spec, prim, args, "batchnorm", variant=make)


def eltwise(spec: NodeSpec) -> Kernel:
    """HardSwish (or HardSigmoid) of float32 tensors (any layout: element-wise over the bytes) in one pass, where
    NumPy's kernel makes five (MobileNetV3's HardSwish on [6, 16, 16, 72]: 43 us -> ~12 us)."""
    api.require(f"{spec.op} {spec.name!r}")
    if any(np.dtype(t.dtype) != np.float32 for t in (spec.inputs[0], spec.outputs[0])):
        raise UnsupportedOpError(f"{spec.op} {spec.name!r}: oneDNN's element-wise kernels are used for float32")
    size = int(np.prod(spec.inputs[0].shape))
    if size == 0:
        raise UnsupportedOpError(f"{spec.op} {spec.name!r}: empty tensor")
    if spec.op == "HardSwish":  # x * clip(alpha x + beta, 0, 1); alpha, beta set by FuseSilu, else ONNX's
        alg, alpha, beta = api.ELTWISE_HARDSWISH, spec.attr("alpha", 1 / 6), spec.attr("beta", 0.5)
    else:  # clip(alpha x + beta, 0, 1)
        alg, alpha, beta = api.ELTWISE_HARDSIGMOID, spec.attr("alpha", 0.2), spec.attr("beta", 0.5)
    if shape_free(spec) and native.library() is not None:  # csrc/gemv.c's ctxrt_act (codes 7, 10): one pass
        code = gemv.PARAMETERIZED[spec.op]

        def act(ins: list[Any], outs: list[Any]) -> Callable[[], None]:
            return native.act(ins[0], outs[0], code, alpha, beta)
        kernel = ShapeFree(act, "native:act")
        kernel.attrs = {"any_shape": 1, "kernel": "onednn"}
        return kernel
    md = api.Desc.make((size,), "a")

    def make(nthr: int | None = None) -> api.Primitive:
        return create(spec, "eltwise_forward", api.FORWARD_INFERENCE, alg, md.handle, md.handle, float(alpha),
                      float(beta), nthr=nthr)

    prim = make()
    reject_reference(prim, spec)
    return OneDnnKernel(spec, prim, [(api.ARG_SRC, "in", 0, md), (api.ARG_DST, "out", 0, md)], "eltwise",
                        {"kernel": "onednn"}, variant=make)


def layernorm(spec: NodeSpec) -> Kernel:
    """LayerNormalization of float32 rows (the trailing axes from `axis`) with Scale and B of the normalized
    shape (constants or run-time tensors), Y only: one pass per row in compiled code, where NumPy's kernel makes
    ten calls (a decoder's [1, 256] rows: 21 us -> ~4 us a node; BERT's [128, 384]: one pass instead of ten).
    oneDNN computes the statistics in float32, as ONNX's default stash_type says."""
    api.require(f"LayerNormalization {spec.name!r}")
    x = spec.inputs[0].shape
    rank = len(x)
    axis = int(spec.attr("axis", -1))
    if not -rank <= axis < rank or rank == 0:
        raise UnsupportedOpError(f"LayerNormalization {spec.name!r}: axis {axis} of rank {rank}")
    axis %= rank
    rows, n = int(np.prod(x[:axis], dtype=np.int64)), int(np.prod(x[axis:], dtype=np.int64))
    present = spec.attr("outputs_present")
    extra = len(spec.outputs) > 1 and (present is None or any(int(k) for k in list(present)[1:]))
    params = [t for t in spec.inputs[1:3] if t is not None]
    if (extra or int(spec.attr("stash_type", 1)) != 1 or rows == 0 or n == 0
            or any(np.dtype(t.dtype) != np.float32 for t in [spec.inputs[0], *params, spec.outputs[0]])
            or any(int(np.prod(t.shape)) != n or len(t.shape) > rank - axis for t in params)):
        raise UnsupportedOpError(f"LayerNormalization {spec.name!r}: oneDNN here normalizes float32 rows with a "
                                 "Scale and B of the normalized shape, Y only")
    md, vec = api.Desc.make((rows, n), "ab"), api.Desc.make((n,), "a")
    has_b = len(spec.inputs) > 2 and spec.inputs[2] is not None
    flags = api.USE_SCALE | (api.USE_SHIFT if has_b else 0)

    def make(nthr: int | None = None) -> api.Primitive:
        return create(spec, "layer_normalization_forward", api.FORWARD_INFERENCE, md.handle, md.handle, None,
                      float(spec.attr("epsilon", 1e-5)), flags, nthr=nthr)

    prim = make()
    reject_reference(prim, spec)
    args = [(api.ARG_SRC, "in", 0, md), (api.ARG_DST, "out", 0, md), (api.ARG_SCALE, "in", 1, vec)]
    if has_b:
        args.append((api.ARG_SHIFT, "in", 2, vec))
    small = rows * n <= NATIVE_ROWS_MAX and native.library() is not None
    kernel = (_NativeRows if small else OneDnnKernel)(spec, prim, args, "layernorm", variant=make)
    if small:
        kernel.rows = (False, rows, n, float(spec.attr("epsilon", 1e-5)))
    return kernel


def reorder(spec: NodeSpec) -> Kernel:
    """Between layouts (`from`, `to` attributes). (In a range program too: a native transposing copy of a CNN's
    NCHW input into NHWC, its innermost axis 3 channels 16 KB apart, made MobileNetV3's batch cycle 1.0 -> 1.3-1.6x
    onnxruntime.)"""
    api.require(f"Reorder {spec.name!r}")
    src, dst = LAYOUTS[spec.attr("from")], LAYOUTS[spec.attr("to")]
    x = src.logical(spec.inputs[0].shape)
    dt = data_type(spec, spec.inputs[0])
    src_md, dst_md = api.Desc.make(x, src.tag, dt), api.Desc.make(x, dst.tag, dt)
    make = reorder_maker(spec, src_md, dst_md)
    return OneDnnKernel(spec, make(), [(api.ARG_FROM, "in", 0, src_md), (api.ARG_TO, "out", 0, dst_md)], "reorder",
                        variant=make)


def reorder_maker(spec: NodeSpec, src: api.Desc, dst: api.Desc) -> Callable[..., api.Primitive]:
    """A reorder primitive from `src` to `dst` for the node's creation threads, or (given) a variant's."""
    def make(nthr: int | None = None) -> api.Primitive:
        made, scope = _creating(spec, nthr)
        with made:
            return api.reorder(src, dst, scope)
    return make
