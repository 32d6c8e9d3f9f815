"""Quantized models on the OpenCL device: the small CNN and transformer block of tests/models/test_quantized.py,
quantized by onnxruntime's own tools (QDQ per tensor and per channel, QOperator, dynamic), compiled for OpenCL.
Every step runs on the device (the integer kernels of backends/opencl/quant/: no CPU partition), the weights
uploaded to the device are the 8-bit ones (about a quarter of the float model's), and the output is the CPU
backend's within one quantization step of the output (onnxruntime's within a step too). A context binary made for
OpenCL gives the same bytes when loaded."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_quantized import MODELS, _ort, _save, _step, quantize

import ctxrt
from ctxrt.backends import get_backend
from ctxrt.compiler import compile_graphs, save_context

pytestmark = pytest.mark.usefixtures("opencl")
pytest.importorskip("onnxruntime.quantization")

KINDS = ["QDQ-tensor", "QDQ-channel", "QOperator-channel", "dynamic"]


def _cpu_steps(g: ctxrt.Graph) -> dict[str, int]:
    """op -> steps that run in CPU partitions."""
    ops: dict[str, int] = {}
    for p in g.partitions:
        if p["backend"] == "cpu":
            for op, n in p["ops"].items():
                ops[op] = ops.get(op, 0) + n
    return ops


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", MODELS)
def test_quantized_model_runs_on_the_device(tmp_path: Path, name: str, kind: str) -> None:
    src, shape = _save(MODELS[name](), tmp_path / f"{name}.onnx")
    path = quantize(src, shape, kind, tmp_path / f"{name}-{kind}.onnx")
    feeds = {"x": np.random.default_rng(4).standard_normal(shape).astype(np.float32)}
    with ctxrt.compile(path, backend="cpu") as ctx:
        want = ctx.graph().run(feeds)["y"]
    with ctxrt.compile(path, backend="opencl") as ctx:
        g = ctx.graph()
        assert _cpu_steps(g) == {}, g.partitions
        # inspect --kernels names the device kernel of each step (not "default")
        assert all(str(s.algorithm).startswith("opencl:") for s in g.compiled.steps), \
            {s.algorithm for s in g.compiled.steps}
        got = g.run(feeds)["y"]
        uploaded = ctx.stats["weights_uploaded_bytes"]
    step = _step(path)
    assert np.abs(got - want).max() <= max(step, 1e-5) * 1.001, (np.abs(got - want).max(), step)
    assert np.abs(got - _ort(path, feeds, optimize=False)).max() <= max(2 * step, 1e-4)
    with ctxrt.compile(src, backend="opencl") as ctx:
        float_bytes = ctx.stats["weights_uploaded_bytes"]
    # 8-bit weights (int32 biases and per-channel scales: a few percent more on these small layers)
    assert uploaded <= 0.32 * float_bytes, (uploaded, float_bytes)

    backend = get_backend("opencl")  # a context binary made for OpenCL: the same bytes once loaded
    graphs, weights = compile_graphs([(path, None, "main")], backend)
    binary = save_context(tmp_path / "m.ctx", graphs, weights, backend, [path])
    with ctxrt.context_from_binary(binary) as ctx:
        np.testing.assert_array_equal(ctx.graph().run(feeds)["y"], got)
