"""Every light model but VGG-19, and BERT, with oneDNN's kernels and with NumPy's alone, at 1 and 2 threads,
against onnxruntime (the default test of test_models.py runs whichever the machine has, VGG-19 included).

VGG-19 is left out here: its (op, algorithm) pairs under either kernel set are all in the other models' (oneDNN's
convs, or im2col and both Winograd tilings; Gemm, MaxPool, Softmax), and it cost a quarter of this file's time."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import zoo
from test_models import SEQ, Run, assert_close, light_want, ort_outputs

import ctxrt
from ctxrt.backends.cpu.backend import CpuBackend

MODELS = [*(name for name in zoo.LIGHT if name != "vgg19"), "bert"]


@pytest.fixture(scope="module", params=MODELS)
def model(request: pytest.FixtureRequest) -> Iterator[tuple[str, object, dict, dict]]:
    name = request.param
    if name == "bert":
        path, feeds = zoo.bert_model(layers=2, hidden=64, heads=4, seq=SEQ), zoo.bert_feeds(SEQ, pad=4)
        yield name, path, feeds, ort_outputs(path, feeds)
    else:
        path, feeds = zoo.light_model(name), zoo.light_feeds(name)
        yield name, path, feeds, light_want(name)  # shared with test_models.py's runs in this process


@pytest.mark.parametrize("onednn", [True, False], ids=["onednn", "numpy"])
def test_outputs_match_onnxruntime_with_and_without_onednn_at_1_and_2_threads(model, onednn: bool) -> None:
    name, path, feeds, want = model
    ctx = ctxrt.compile(path, shapes={k: v.shape for k, v in feeds.items()}, backend=CpuBackend(onednn=onednn))
    try:
        g = ctx.graph()
        steps = g.compiled.steps
        uses_onednn = any(s.algorithm.startswith("onednn") for s in steps)
        assert uses_onednn == onednn, "oneDNN runs the CNNs' convs and BERT's projections"
        for n in (1, 2):
            ctx.num_threads = n
            got = {k: np.array(v, copy=True) for k, v in g.run(feeds).items()}
            assert_close(Run(want, got, g.spillfill_size, g.lower_bound))
    finally:
        ctx.free()
