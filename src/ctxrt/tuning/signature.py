"""Kernel signatures: what a tuning result is valid for.

A signature is (op, kernel class and variant, attributes, input and output shapes and dtypes, the build macros
that are not tunable, the `.cl` source's hash, the parameter space's digest). A changed source or space makes a
new signature, so an old measurement is a miss, never a stale hit (tinygrad served wrong outputs from stale
tuning entries, its issue #11908; MNN and MACE check the source hash on load for the same reason). The node's
name is not part of it: every node with the same signature shares one measurement.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from ctxrt.backends.kernel import Kernel, NodeSpec
from ctxrt.backends.opencl.kernel import ClKernel


@dataclass(frozen=True)
class Signature:
    key: str  # hex digest of `fields`: the performance cache's key
    fields: dict[str, Any]  # readable: what was hashed

    @property
    def label(self) -> str:
        """e.g. `Gemm MatMul 512x768 @ 768x768 float32`."""
        f = self.fields
        shapes = " @ ".join("x".join(map(str, t[0])) for t in f["inputs"] if t is not None)
        return f"{f['kernel']} {f['op']} {shapes} {np.dtype(f['outputs'][0][1]).name}"


def tunable(kernel: Kernel) -> bool:
    """An OpenCL kernel whose space offers a choice (a class without parameters has nothing to tune)."""
    return isinstance(kernel, ClKernel) and any(len(v) > 1 for v in kernel.space.params.values())


def _plain(v: Any) -> Any:
    """Attribute values as JSON (numpy arrays and scalars as lists and numbers)."""
    if isinstance(v, np.ndarray | np.generic):
        return {"dtype": v.dtype.str, "value": np.asarray(v).tolist()}
    if isinstance(v, bytes):
        return v.hex()
    if isinstance(v, list | tuple):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    return v


def spec_tensors(spec: NodeSpec) -> tuple[list[Any], list[Any]]:
    """([[shape, dtype] or None per input], [[shape, dtype] per output])."""
    def t(x: Any) -> Any:
        return None if x is None else [list(map(int, x.shape)), np.dtype(x.dtype).str]
    return [t(x) for x in spec.inputs], [t(x) for x in spec.outputs]


def signature(kernel: ClKernel) -> Signature:
    spec = kernel.spec
    inputs, outputs = spec_tensors(spec)
    (program,) = kernel.programs
    fixed = {k: v for k, v in kernel.defines().items() if k not in kernel.space.params}
    fields = {"op": spec.op, "kernel": type(kernel).__name__, "variant": kernel.variant(),
              "attrs": _plain(spec.attrs), "inputs": inputs, "outputs": outputs, "problem": kernel.problem(),
              "defines": {k: str(v) for k, v in fixed.items()}, "source": kernel.source,
              "source_hash": program.source_hash, "space": kernel.space.digest()}
    text = json.dumps(fields, sort_keys=True, separators=(",", ":"))
    return Signature(hashlib.sha256(text.encode()).hexdigest()[:32], fields)
