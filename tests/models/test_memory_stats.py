"""Every byte a context allocates appears in ctx.stats by category (spill-fill, IO, kernel-private constants,
alignment padding): the categories sum to what NumPy's allocator reports (tracemalloc's NumPy domain) for
finalize and for a first run that records IO launches; weights are counted apart (memory-mapped or packed)."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
import zoo

import ctxrt
from ctxrt.backends.cpu.backend import CpuBackend

SEQ = 16
DOMAIN = np.lib.tracemalloc_domain


def _held() -> int:
    snap = tracemalloc.take_snapshot().filter_traces([tracemalloc.DomainFilter(True, DOMAIN)])
    return sum(s.size for s in snap.statistics("filename"))


def _model(name: str):
    if name == "bert":
        return zoo.bert_model(layers=2, hidden=64, heads=4, seq=SEQ), zoo.bert_feeds(SEQ, pad=4)
    return zoo.light_model(name), zoo.light_feeds(name)


def _allocated(ctx: ctxrt.Context) -> int:
    m = ctx.memory()
    return m["spillfill"] + m["io"] + m["kernel"] + m["padding"]


@pytest.mark.parametrize("onednn", [True, False])
@pytest.mark.parametrize("name", ["squeezenet", "shufflenet", "bert"])
def test_memory_categories_sum_to_what_the_context_allocated(name: str, onednn: bool) -> None:
    path, feeds = _model(name)
    shapes = {k: v.shape for k, v in feeds.items()}
    be = CpuBackend(onednn=onednn)
    ctxrt.compile(path, shapes=shapes, backend=be).free()  # process-wide caches (shared constants) filled
    for io in ("raw", "memhandle"):
        ctx = ctxrt.compile(path, shapes=shapes, backend=be, defer_graph_init=True, io_mem_type=io)
        tracemalloc.start()
        try:
            before = _held()
            ctx.finalize()
            assert _held() - before == _allocated(ctx)
            result = ctx.graph().run(feeds)  # memhandle IO run raw: IO buffers made now, IO launches bound now
            outputs = sum(v.nbytes for v in result.values())  # run() returns new arrays for the outputs
            assert _held() - before - outputs == _allocated(ctx)
        finally:
            tracemalloc.stop()
        m = ctx.memory()
        assert m["weights"] == ctx.properties["weights_buffer_size"] and 0 <= m["prepacked"] <= m["weights"]
        assert (m["io"] > 0) == (io == "raw" or ctx.stats["lazy_allocs"] > 0)
        ctx.free()


def test_winograd_weights_are_transformed_at_compile_time_not_at_load() -> None:
    """ResNet-50 without oneDNN: its Winograd convs read U from the weights section (prepacked), and loading
    makes no kernel constant beyond a few rows (the old kernels transformed 20 MiB of weights at load)."""
    path, feeds = _model("resnet50")
    with ctxrt.compile(path, shapes={k: v.shape for k, v in feeds.items()}, backend=CpuBackend(onednn=False)) as ctx:
        algorithms = {s.algorithm for s in ctx.graph().compiled.steps}
        assert any(a.startswith("winograd") for a in algorithms)
        m = ctx.memory()
        assert m["prepacked"] > 20 << 20 and m["kernel"] < 64 << 10
