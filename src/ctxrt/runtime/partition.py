"""CPU partitions: the steps a device backend has no kernel for, run by its fallback (docs/architecture.md).

A run of consecutive fallback steps is a partition. The device queue is synchronised once, before a
partition's first step (after it, device launches are simply issued again). The host reaches each tensor a
partition touches:

- through a zero-copy host view of the device memory, where the backend has one (memory shared with the
  host: PoCL, integrated and phone GPUs);
- else through host staging planned at finalize: one host buffer per graph, each partition's tensors at fixed
  offsets in it (partitions reuse the same bytes). A tensor read before the partition writes it is copied in
  before its first reader; a tensor written there and read after it (or a graph output) is copied back after
  its last writer. Every copy is counted in `ctx.stats`.

Constants are read from the context's host weights. The boundary tensors are the arena's, planned like any
other, so nothing here allocates or records per run (reference/003: per-run tensor creation at fallback
boundaries is the cost to avoid).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from ctxrt import dtypes
from ctxrt.backends.kernel import Kernel, Launch
from ctxrt.compiler.program import CONST, OUTPUT, Ref, Step
from ctxrt.planner import arena as planner

if TYPE_CHECKING:
    from ctxrt.runtime.context import Context

Root = tuple[str, str]  # (space, key): the storage a Ref points into (aliases and in-place results share it)

_ALIGN = 64


def _root(r: Ref) -> Root:
    return r.space, r.key


class HostSteps:
    """The plan for one graph's fallback steps: partitions, copies and staging slots."""

    def __init__(self, ctx: Context, steps: list[Step], host: list[bool],
                 weights: Mapping[str, np.ndarray] | None = None) -> None:
        self.ctx = ctx
        self.weights = ctx.host_weights if weights is None else weights  # a range program's child adds its own
        self.steps = steps
        self.host = host
        last_read: dict[Root, int] = {}
        for k, s in enumerate(steps):
            for r in s.inputs:
                if r is not None:
                    last_read[_root(r)] = k
        self.first: dict[int, int] = {}  # host step -> first step of its partition
        self.copy_in: dict[int, list[int]] = defaultdict(list)  # step -> input positions copied in before it
        self.copy_out: dict[int, list[int]] = defaultdict(list)  # step -> output positions copied back after it
        self.slot: dict[tuple[int, Root], int] = {}  # (partition start, root) -> staging offset
        self.staging_size = 0
        k = 0
        while k < len(steps):
            if not host[k]:
                k += 1
                continue
            end = k
            while end + 1 < len(steps) and host[end + 1]:
                end += 1
            self._plan(k, end, last_read)
            k = end + 1
        self.staging: np.ndarray | None = None  # the host allocation, once a tensor needs it
        self._aligned: np.ndarray | None = None

    def _plan(self, a: int, b: int, last_read: dict[Root, int]) -> None:
        sizes: dict[Root, int] = {}
        span: dict[Root, list[int]] = {}  # first and last step touching the root in this partition
        written: set[Root] = set()
        copied: set[Root] = set()
        last_writer: dict[Root, tuple[int, int]] = {}
        for k in range(a, b + 1):
            self.first[k] = a
            s = self.steps[k]
            for i, r in enumerate(s.inputs):
                if r is None or r.space == CONST:
                    continue
                root = _root(r)
                sizes[root] = max(sizes.get(root, 0), r.nbytes)
                if root not in written and root not in copied:
                    self.copy_in[k].append(i)
                    copied.add(root)
            for j, r in enumerate(s.outputs):
                root = _root(r)
                sizes[root] = max(sizes.get(root, 0), r.nbytes)
                written.add(root)
                last_writer[root] = (k, j)
            for r in s.scratch:
                sizes[_root(r)] = max(sizes.get(_root(r), 0), r.nbytes)
            for r in [*s.inputs, *s.outputs, *s.scratch]:
                if r is not None and r.space != CONST:
                    span.setdefault(_root(r), [k, k])[1] = k
        for root, (k, j) in last_writer.items():
            if root[0] == OUTPUT or last_read.get(root, -1) > b:
                self.copy_out[k].append(j)
        names = {f"{space}:{key}": (space, key) for space, key in sizes}
        plan = planner.plan([planner.Request(name, planner.align(max(sizes[root], 1), _ALIGN), *span[root])
                             for name, root in names.items()])
        for name, root in names.items():
            self.slot[(a, root)] = plan.allocations[name].offset
        self.staging_size = max(self.staging_size, plan.size)

    def runs(self, k: int) -> bool:
        return self.host[k]

    def _staging_array(self) -> np.ndarray:
        """The graph's host staging, allocated once, the first time a tensor without a host view needs it."""
        if self._aligned is None:
            self.staging = np.empty(self.staging_size + _ALIGN, np.uint8)
            start = -self.staging.ctypes.data % _ALIGN
            self._aligned = self.staging[start:start + self.staging_size]
            self.ctx.stats["alloc_staging_bytes"] += self.staging_size
        return self._aligned

    def bind(self, k: int, kernel: Kernel, view: Callable[[Ref], Any]) -> Launch:
        """Step k's CPU kernel bound to host arrays, with the partition's sync and copies around it."""
        ctx, step, first = self.ctx, self.steps[k], self.first[k]
        be = ctx.backend

        def host(r: Ref) -> tuple[np.ndarray, Any]:
            """(host array, device tensor to copy through, or None when the host array is the memory itself)"""
            if r.space == CONST:
                return dtypes.as_ref(self.weights[r.key], r.shape, r.dtype), None
            dev = view(r)
            direct = be.host_view(dev)
            if direct is not None:
                return direct, None
            off = self.slot[(first, _root(r))]
            return self._staging_array()[off:off + r.nbytes].view(np.dtype(r.dtype)).reshape(r.shape), dev

        ins: list[Any] = []
        before: list[tuple[np.ndarray, Any, int]] = []
        for i, r in enumerate(step.inputs):
            if r is None:
                ins.append(None)
                continue
            arr, dev = host(r)
            ins.append(arr)
            if dev is not None and i in self.copy_in[k]:
                before.append((arr, dev, r.nbytes))
        outs: list[np.ndarray] = []
        after: list[tuple[np.ndarray, Any, int]] = []
        for j, r in enumerate(step.outputs):
            arr, dev = host(r)
            outs.append(arr)
            if dev is not None and j in self.copy_out[k]:
                after.append((arr, dev, r.nbytes))
        launch = kernel.bind(ins, outs, [host(r)[0] for r in step.scratch])
        sync = k == first and k > 0  # device launches came before this partition
        if not (sync or before or after):
            return launch
        stats = ctx.stats

        def run() -> None:
            if sync:
                be.sync()
                stats["partition_syncs"] += 1
            for arr, dev, n in before:
                be.copy_out(arr, dev)
                stats["staging_copies_to_host"] += 1
                stats["staging_bytes_to_host"] += n
            launch()
            for arr, dev, n in after:
                be.copy_in(dev, arr)
                stats["staging_copies_to_device"] += 1
                stats["staging_bytes_to_device"] += n
        return run
