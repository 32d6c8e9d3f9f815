"""Kernels of nodes whose half-precision constants are widened to float32 when the kernel is built (the `widen`
attribute of ir/passes/half.py): the weights section keeps them at half size, the float32 form lives in the
kernel's own memory (counted as kernel-private bytes).

The wrapped factory sees an ordinary float32 node: the widened constants as its `consts`, float32 tensor specs.
Whatever it would make of them at compile time (a prepacked oneDNN format, Winograd-transformed or bias-folded
weights) it makes again each time the kernel is built, from the stored half weights: such constants are kernel
memory here, never written to the binary. So the node records, instead of the wrapped kernel's choices, the compile
options they were made with (`widen_options`), and the one choice a rebuild must repeat to plan the same scratch
(oneDNN's `threads`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from ctxrt.backends.kernel import Kernel, KernelFactory, Launch, NodeSpec, TensorSpec

WIDEN = "widen"  # as ir/passes/half.py writes it
OPTIONS = "widen_options"
_REPEATED = ("threads",)
# compile options of the compile itself, not of the kernels: not recorded (a range compile's probes, compared with
# the upper bound's program, would differ by it: a float16 BERT fell back to exact shapes)
_COMPILE_ONLY = frozenset({"probe_arena", "weights_tags", "algorithms"})


def widened_spec(spec: NodeSpec) -> tuple[NodeSpec, dict[int, np.ndarray]]:
    """The node as a float32 kernel sees it, and the widened constants by input index."""
    wide: dict[int, np.ndarray] = {}
    for i in spec.attr(WIDEN) or ():
        const = spec.consts[i] if i < len(spec.consts) else None
        if const is not None:
            wide[i] = np.asarray(const, np.float32)
    consts = [wide.get(i, c) for i, c in enumerate(spec.consts)]
    inputs = [TensorSpec(t.shape, np.dtype(np.float32)) if i in wide and t is not None else t
              for i, t in enumerate(spec.inputs)]
    attrs = {k: v for k, v in spec.attrs.items() if k not in (WIDEN, OPTIONS)}
    options = dict(spec.options) or dict(spec.attr(OPTIONS) or {})
    return replace(spec, attrs=attrs, inputs=inputs, consts=consts, options=options), wide


class Widened(Kernel):
    """A float32 kernel reading, in place of some constant inputs, arrays it holds: widened weights, or what the
    wrapped kernel made of them."""

    def __init__(self, inner: Kernel, held: dict[int, np.ndarray], options: dict[str, Any]) -> None:
        self.inner, self.held = inner, held
        self.scratch, self.programs = inner.scratch, inner.programs
        self.algorithm = f"{inner.algorithm}+widened"
        self.attrs = {OPTIONS: {k: v for k, v in options.items() if k not in _COMPILE_ONLY},
                      **{k: inner.attrs[k] for k in _REPEATED if k in inner.attrs}}
        self.constants = {}

    def bind(self, ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        ins = [self.held.get(i, x) for i, x in enumerate(ins)]
        return self.inner.bind(ins, outs, scratch)


def widening(factory: KernelFactory) -> KernelFactory:
    """`factory` for nodes with a `widen` attribute too."""
    def build(spec: NodeSpec) -> Kernel:
        if not spec.attr(WIDEN):
            return factory(spec)
        wide_spec, wide = widened_spec(spec)
        inner = factory(wide_spec)
        held = dict(wide)
        for i, array in inner.constants.items():
            if array is None:
                held.pop(i, None)
            else:
                held[i] = array
            if i < len(wide_spec.consts):  # built: the plain widened copy is not kept alive by the spec it holds
                wide_spec.consts[i] = None
        return Widened(inner, held, wide_spec.options)
    return build
