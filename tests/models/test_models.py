"""Whole models through ctxrt against onnxruntime, on every backend: the light zoo (random weights) and
exported BERTs."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import zoo  # tests/models is on sys.path (pytest's prepend import mode)
from harness import ITERATOR_BUFFER, steady_state_allocation

import ctxrt

SEQ, PAD = 16, 4


@dataclass
class Run:
    """One model run once by each engine, plus ctxrt's arena numbers."""

    want: dict[str, np.ndarray]
    got: dict[str, np.ndarray]
    spillfill_size: int
    lower_bound: int


def ort_outputs(path: Path, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds), strict=True))


def run_both(path: Path, feeds: dict[str, np.ndarray], backend: str = "cpu",
             want: dict[str, np.ndarray] | None = None) -> Run:
    if want is None:
        want = ort_outputs(path, feeds)  # its session is gone before ctxrt loads VGG-19's 548 MiB
    ctx = ctxrt.compile(path, shapes={k: v.shape for k, v in feeds.items()}, backend=backend)
    try:
        g = ctx.graph()
        # copies: outputs may be views of buffers that ctx.free() releases
        got = {k: np.array(v, copy=True) for k, v in g.run(feeds).items()}
        return Run(want, got, g.spillfill_size, g.lower_bound)
    finally:
        ctx.free()


def assert_close(run: Run) -> None:
    assert set(run.got) == set(run.want)
    for name, want in run.want.items():
        got = run.got[name]
        assert got.shape == want.shape and got.dtype == want.dtype, \
            f"{name}: {got.dtype}{got.shape} != {want.dtype}{want.shape}"
        err, scale = float(np.max(np.abs(got - want))), float(np.max(np.abs(want)))
        assert err <= 1e-4 * scale + 1e-5, f"{name}: max |ctxrt - ort| = {err:.3g}, max |ort| = {scale:.3g}"


def assert_arena_near_bound(run: Run) -> None:
    assert run.lower_bound <= run.spillfill_size <= 1.05 * run.lower_bound, \
        f"arena {run.spillfill_size} B vs lower bound {run.lower_bound} B"


# ---- light zoo: one module-scoped run per model, shared by its tests --------------------------------

@functools.cache
def light_want(name: str) -> dict[str, np.ndarray]:
    """onnxruntime's outputs for a light model, computed once a process: every backend's run is compared with them
    (VGG-19 takes onnxruntime ~4 s)."""
    return ort_outputs(zoo.light_model(name), zoo.light_feeds(name))


@pytest.fixture(scope="module", params=zoo.LIGHT)
def light(request: pytest.FixtureRequest, backend: str) -> Iterator[Run]:
    # feeds from the name: reading inputs from the small source beats parsing VGG-19's 575 MB
    name = request.param
    yield run_both(zoo.light_model(name), zoo.light_feeds(name), backend, light_want(name))


def test_light_model_matches_onnxruntime(light: Run) -> None:
    assert_close(light)


def test_light_model_arena_within_5_percent_of_lower_bound(light: Run) -> None:
    assert_arena_near_bound(light)


# ---- BERT: both exporters at batch 1 (with padding), dynamo at batch 2 -------------------------------

BERT_CASES = {"dynamo-b1": ("dynamo", 1), "legacy-b1": ("legacy", 1), "dynamo-b2": ("dynamo", 2)}


@pytest.fixture(scope="module", params=list(BERT_CASES))
def bert(request: pytest.FixtureRequest, backend: str) -> Iterator[Run]:
    exporter, batch = BERT_CASES[request.param]
    path = zoo.bert_model(layers=2, hidden=64, heads=4, seq=SEQ, exporter=exporter)
    yield run_both(path, zoo.bert_feeds(SEQ, batch=batch, pad=PAD), backend)


def test_bert_matches_onnxruntime(bert: Run) -> None:
    assert_close(bert)


def test_bert_arena_within_5_percent_of_lower_bound(bert: Run) -> None:
    assert_arena_near_bound(bert)



@pytest.mark.parametrize("name", ["squeezenet", "bert"])
def test_steady_state_run_of_a_real_model_allocates_no_tensor_memory(name: str, backend: str) -> None:
    if name == "bert":
        path, feeds = zoo.bert_model(layers=2, hidden=64, heads=4, seq=SEQ), zoo.bert_feeds(SEQ, pad=PAD)
    else:
        path = zoo.light_model(name)
        feeds = zoo.light_feeds(path)
    with ctxrt.compile(path, shapes={k: v.shape for k, v in feeds.items()}, backend=backend) as ctx:
        g = ctx.graph()
        outs = {o.name: np.empty(o.shape, np.dtype(o.dtype)) for o in g.outputs}
        made, recorded = ctx.backend.stats["buffers_created"], ctx.stats["recordings"]
        peak, growth = steady_state_allocation(lambda: g.execute(feeds, outs))
        assert ctx.backend.stats["buffers_created"] == made and ctx.stats["recordings"] == recorded
    assert peak < ITERATOR_BUFFER, f"{peak} bytes allocated during steady-state runs"
    assert growth < 2048  # nothing accumulates from run to run
