"""The four cells of DESIGN.md §6 (reference/001_*), asserted from ctx.stats on a real model (SqueezeNet,
random weights), prepared offline (a .ctx made with --io-mem-type) and online, on every backend, outputs
against onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
from harness import read, write
from test_models import Run, assert_close

import ctxrt
from ctxrt.cli import main as cli

RUNS = 3


def _prepare(path, prepared: str, offline: bool, tmp_path, backend: str):
    if not offline:
        return ctxrt.compile(path, io_mem_type=prepared, backend=backend)
    out = tmp_path / f"sq_{prepared}.ctx"
    assert cli(["compile", str(path), "-o", str(out), "--io-mem-type", prepared, "--backend", backend]) == 0
    meta = ctxrt.read_metadata(out)
    assert {t["mem_type"] for g in meta["graphs"] for t in g["inputs"] + g["outputs"]} == {prepared}
    return ctxrt.context_from_binary(out, backend)


def _handles(ctx, feeds):
    """One multi-tensor shared buffer holding every input and output, a handle for each."""
    g, be = ctx.graph(), ctx.backend
    infos = g.inputs + g.outputs
    offsets, off = [], 0
    for t in infos:
        offsets.append(off)
        off += -(-t.nbytes // 64) * 64
    buf = be.alloc_shared(off, 64)
    handles = {t.name: ctx.mem_register(buf, o, t.shape, t.dtype) for t, o in zip(infos, offsets, strict=True)}
    for name, x in feeds.items():
        write(be, handles[name].view, x)
    return handles


@pytest.mark.parametrize("offline", [True, False], ids=["offline", "online"])
@pytest.mark.parametrize("prepared,executed", [("raw", "raw"), ("raw", "memhandle"), ("memhandle", "raw"),
                                               ("memhandle", "memhandle")])
def test_io_mem_type_cell(squeezenet, prepared, executed, offline, tmp_path, backend) -> None:
    path, feeds, want = squeezenet
    ctx = _prepare(path, prepared, offline, tmp_path, backend)
    try:
        g = ctx.graph()
        io_bytes = sum(t.nbytes for t in g.inputs + g.outputs)
        n_in, n_out = len(g.inputs), len(g.outputs)
        s = ctx.stats
        # At finalize: internal IO buffers exist only when prepared as raw.
        if prepared == "raw":
            assert s["alloc_io_bytes"] >= io_bytes
        else:
            assert s["alloc_io_bytes"] == 0
        at_finalize = s["alloc_io_bytes"]
        if executed == "raw":
            outs = {o.name: np.empty(o.shape, np.dtype(o.dtype)) for o in g.outputs}
            for _ in range(RUNS):
                g.execute(feeds, outs)
            got = outs
        else:
            handles = _handles(ctx, feeds)
            for _ in range(RUNS):
                g.execute({i.name: handles[i.name] for i in g.inputs}, {o.name: handles[o.name] for o in g.outputs})
            got = {o.name: read(ctx.backend, handles[o.name].view) for o in g.outputs}
        assert_close(Run(want, got, 0, 0))

        if prepared == "memhandle" and executed == "raw":  # allocated at the first raw run, once
            assert s["lazy_allocs"] == n_in + n_out
            assert s["alloc_io_bytes"] == io_bytes
        else:
            assert s["lazy_allocs"] == 0
            assert s["alloc_io_bytes"] == at_finalize
        if executed == "raw":  # copies every run
            assert (s["copies_in"], s["copies_out"]) == (RUNS * n_in, RUNS * n_out)
            assert s["bytes_in"] == RUNS * sum(t.nbytes for t in g.inputs)
            assert s["bytes_out"] == RUNS * sum(t.nbytes for t in g.outputs)
        else:  # no copy
            assert s["copies_in"] == s["copies_out"] == s["bytes_in"] == s["bytes_out"] == 0
        assert s["runs"] == RUNS
    finally:
        ctx.free()
