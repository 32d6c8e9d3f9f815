"""How much work a program's kernels do, for its thread policy (docs/cpu.md, "Threads").

A program whose largest kernel is small runs on one thread: each kernel of many threads ends at a barrier, and
when another process takes a core, one of our threads waits a scheduler time slice at every barrier (a 565-node
Qwen2-style decoder: 2.1 ms per run on one thread, 26 ms on two with the machine busy). Splitting a small kernel
gains microseconds; a barrier against a busy core costs milliseconds.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from ctxrt.compiler.program import Step

SMALL_WORK = 1 << 22  # multiply-adds (or elements) of a program's largest kernel under which it runs on 1 thread
# ... unless its kernels together do this much, SPLIT_MEAN a step on average: many kernels each worth splitting.
# MobileNetV3 (64 x 64) on 2 cores, largest kernel under SMALL_WORK at every batch up to 9: batch 2 (4.7 M, 153 K a
# step) 0.261 -> 0.231 ms on the idle cores, batch 4 (9.5 M) 0.333 -> 0.264, batch 6 0.486 -> 0.346 (onnxruntime
# 0.192, 0.265, 0.383); batch 1 (2.4 M) the same either way. A Qwen2-style decoder of 175 steps (7.1 M, 40 K a step:
# hundreds of barriers, the collapse above) stays on one.
SPLIT_TOTAL = 1 << 22
SPLIT_MEAN = 100_000
_GEMMS = {"MatMul", "Gemm", "MatMulInteger", "QLinearMatMul", "FusedMatMul", "MatMulNBits"}
_CONVS = {"Conv", "ConvInteger", "QLinearConv", "ConvTranspose"}
_OPAQUE = {"If", "Loop", "Scan"}  # bodies whose work a step's shapes do not show
_PICKS = {"Gather", "GatherElements", "GatherND", "Slice"}  # read only what they output (an embedding's rows)


def step_work(step: Step) -> int | None:
    """Multiply-adds of a GEMM or conv step, elements moved by any other; None where the shapes cannot tell."""
    if step.op in _OPAQUE:
        return None
    out = max((math.prod(r.shape) for r in step.outputs), default=0)
    ins = [r for r in step.inputs if r is not None]
    if step.op in _GEMMS and ins and ins[0].shape:
        a = ins[0].shape
        k = a[0] if step.op == "Gemm" and step.attrs.get("transA") and len(a) == 2 else a[-1]
        return out * k
    if step.op in _CONVS and len(ins) > 1:
        w = step.attrs.get("weight_shape") or ins[1].shape
        per_output = math.prod(w[1:]) if len(w) > 1 else 1
        return out * per_output
    if step.op in _PICKS:
        return out
    return max([out, *(math.prod(r.shape) for r in ins)])


def thread_cap(steps: Iterable[Step]) -> int | None:
    """1 when every kernel of the program is small (SMALL_WORK) and together they are not worth splitting
    (`splits`), else None (as many threads as are idle)."""
    largest = total = count = 0
    for step in steps:
        work = step_work(step)
        if work is None:
            return None
        largest = max(largest, work)
        total += work
        count += 1
    return None if largest >= SMALL_WORK or splits(total, count) else 1


def splits(total: int, steps: int) -> bool:
    """Whether `steps` kernels doing `total` multiply-adds (or elements) between them run faster on the idle
    cores although none is large: enough work, and enough per kernel to pay for its barrier (SPLIT_TOTAL,
    SPLIT_MEAN)."""
    return total >= SPLIT_TOTAL and total >= SPLIT_MEAN * max(steps, 1)


def blas_run(steps: Iterable[Step], kernels: Iterable[object]) -> bool:
    """Whether every large kernel of a program (SMALL_WORK or more) does its work in BLAS calls (`Kernel.blas`),
    and one does: its runs give BLAS the threads (a program with oneDNN kernels otherwise keeps BLAS at one)."""
    large = [getattr(k, "blas", False) for s, k in zip(steps, kernels, strict=True)
             if (step_work(s) or 0) >= SMALL_WORK]
    return bool(large) and all(large)
