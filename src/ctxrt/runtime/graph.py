"""An executable graph: kernels built once, launches recorded against fixed views, replayed per run."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from ctxrt.backends.kernel import Kernel, Launch, NodeSpec, TensorSpec
from ctxrt.compiler.build import make_kernel
from ctxrt.compiler.program import ARENA, CONST, INPUT, CompiledGraph, Ref, TensorInfo
from ctxrt.errors import LifecycleError, ShapeError

if TYPE_CHECKING:
    from ctxrt.runtime.context import Context


class Graph:
    """One program of a context. Use `run(feeds)` or `execute(inputs, outputs)`."""

    def __init__(self, ctx: Context, compiled: CompiledGraph) -> None:
        self.ctx = ctx
        self.compiled = compiled
        self.name = compiled.name
        self.inputs: list[TensorInfo] = compiled.inputs
        self.outputs: list[TensorInfo] = compiled.outputs
        self._kernels: list[Kernel] = []
        self._launches: list[Launch] = []
        self._io: dict[str, Any] = {}

    @property
    def spillfill_size(self) -> int:
        return self.compiled.spillfill_size

    @property
    def lower_bound(self) -> int:
        return self.compiled.lower_bound

    # -- preparation (at finalize) -------------------------------------------------------------
    def _build_kernels(self, weights: Mapping[str, Any]) -> None:
        kernels = self.ctx.backend.kernels
        self._kernels = []
        for step in self.compiled.steps:
            spec = NodeSpec(step.op, step.name, step.attrs,
                            [TensorSpec(r.shape, np.dtype(r.dtype)) if r else None for r in step.inputs],
                            [TensorSpec(r.shape, np.dtype(r.dtype)) for r in step.outputs],
                            [weights[r.key] if r is not None and r.space == CONST else None
                             for r in step.inputs],
                            self.compiled.opset)
            self._kernels.append(make_kernel(kernels, spec))

    def _record(self, arena: tuple[Any, int], io: Mapping[str, Any], weights: Mapping[str, Any]) -> None:
        """Bind every kernel to its views; the launch list is what a run replays."""
        backend = self.ctx.backend
        arena_buf, base = arena

        def view(r: Ref) -> Any:
            if r.space == ARENA:
                return backend.view(arena_buf, base + r.offset, r.shape, r.dtype)
            if r.space == CONST:
                return weights[r.key].reshape(r.shape)
            return io[r.key].reshape(r.shape)

        self._io = dict(io)
        self._launches = [
            kernel.bind([view(r) if r else None for r in step.inputs], [view(r) for r in step.outputs],
                        [view(r) for r in step.scratch])
            for kernel, step in zip(self._kernels, self.compiled.steps, strict=True)]
        self.ctx.stats["recordings"] += 1

    # -- running ---------------------------------------------------------------------------------
    def _check_feed(self, info: TensorInfo, array: Any, role: str) -> None:
        if not isinstance(array, np.ndarray):
            raise ShapeError(f"{role} {info.name!r} must be a numpy.ndarray, got {type(array).__name__}")
        if array.shape != info.shape or array.dtype != np.dtype(info.dtype):
            raise ShapeError(f"{role} {info.name!r} expects {np.dtype(info.dtype)}{list(info.shape)}, "
                             f"got {array.dtype}{list(array.shape)}")

    def execute(self, inputs: Mapping[str, np.ndarray], outputs: Mapping[str, np.ndarray] | None = None) -> None:
        """Run once: copy `inputs` in, run, copy results into the arrays of `outputs` (if given)."""
        ctx = self.ctx
        if not ctx.finalized:
            raise LifecycleError(f"graph {self.name!r}: context was freed" if ctx.freed
                                 else f"graph {self.name!r}: context is not finalized; call finalize()")
        names = {i.name for i in self.inputs}
        if set(inputs) != names:
            missing, extra = sorted(names - set(inputs)), sorted(set(inputs) - names)
            raise ShapeError(f"graph {self.name!r} inputs: missing {missing}, unknown {extra}")
        for info in self.inputs:
            self._check_feed(info, inputs[info.name], "input")
        if outputs is not None:
            known = {o.name for o in self.outputs}
            if set(outputs) - known:
                raise ShapeError(f"graph {self.name!r} has no outputs {sorted(set(outputs) - known)}")
            for info in self.outputs:
                if info.name in outputs:
                    self._check_feed(info, outputs[info.name], "output")
        backend, stats = ctx.backend, ctx.stats
        with ctx.lock:
            for info in self.inputs:
                backend.copy_in(self._io[info.name].reshape(info.shape), inputs[info.name])
                stats["copies_in"] += 1
                stats["bytes_in"] += info.nbytes
            backend.run(self._launches)
            if outputs is not None:
                for info in self.outputs:
                    if info.name in outputs:
                        backend.copy_out(outputs[info.name], self._io[info.name].reshape(info.shape))
                        stats["copies_out"] += 1
                        stats["bytes_out"] += info.nbytes
            stats["runs"] += 1

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run once and return new arrays for every output."""
        outs = {o.name: np.empty(o.shape, np.dtype(o.dtype)) for o in self.outputs}
        self.execute(feeds, outs)
        return outs

    def __repr__(self) -> str:
        return (f"Graph({self.name!r}, inputs={[(i.name, i.shape) for i in self.inputs]}, "
                f"spillfill={self.spillfill_size})")


def io_buffer_bytes(infos: list[TensorInfo], alignment: int) -> list[tuple[str, int, int]]:
    """(name, offset, nbytes) of each IO tensor packed into one buffer."""
    out, offset = [], 0
    for info in infos:
        out.append((info.name, offset, info.nbytes))
        offset += -(-max(info.nbytes, 1) // alignment) * alignment
    return out


__all__ = ["Graph", "io_buffer_bytes", "INPUT"]
