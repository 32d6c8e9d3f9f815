"""Resize's native pass (csrc/gemv.c ctxrt_resize2d) where the extension is missing at run time."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from harness import make_model, rand
from onnx import helper

import ctxrt
from ctxrt.backends import get_backend
from ctxrt.backends.cpu import native
from ctxrt.compiler import compile_graphs, save_context


def test_image_resize_compiled_native_runs_without_the_extension(tmp_path, monkeypatch) -> None:
    """A binary whose Resize was compiled for the native pass, loaded where the extension is missing: NumPy's passes
    on scratch of the kernel's own (counted as its private bytes), the same outputs."""
    if native.library() is None:
        pytest.skip("the native extension is not built here")
    nodes = [helper.make_node("Conv", ["x", "w0"], ["h"], pads=[1, 1, 1, 1]),
             helper.make_node("Resize", ["h", "", "s"], ["r"], mode="linear"),
             helper.make_node("Conv", ["r", "w1"], ["y"])]
    inits = {"w0": rand(8, 4, 3, 3), "s": np.array([1, 1, 2, 2], np.float32), "w1": rand(4, 8, 1, 1)}
    feeds = {"x": rand(2, 4, 9, 10)}
    onnx.save(make_model(nodes, feeds, inits, opset=18), tmp_path / "m.onnx")
    backend = get_backend("cpu")
    graphs, weights = compile_graphs([(str(tmp_path / "m.onnx"), {"x": feeds["x"].shape}, "main")], backend)
    path = save_context(tmp_path / "m.ctx", graphs, weights, backend, [str(tmp_path / "m.onnx")])
    with ctxrt.context_from_binary(path) as ctx:
        want = ctx.graph().run(feeds)["y"]
    monkeypatch.setitem(native._STATE, "lib", None)
    with ctxrt.context_from_binary(path) as ctx:
        g = ctx.graph()
        (k,) = [k for s, k in zip(g.compiled.steps, g._kernels, strict=True) if s.op == "Resize"]
        assert k.algorithm.startswith("native:") and k.private_bytes
        np.testing.assert_allclose(g.run(feeds)["y"], want, rtol=1e-5, atol=1e-6)
