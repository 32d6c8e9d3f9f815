"""The transformer models on OpenCL now that their ops have OpenCL kernels (tests/opencl/test_misc_kernels.py):
BERT (both exporters) and the exported GPT run without a CPU partition (so without a partition sync), ViT but
for its patch Conv; a steady loop over the new kernels allocates nothing; the tuner tunes them and the tuned
outputs equal the defaults'."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from harness import make_model, rand, read, reference, steady_state_allocation, write
from onnx import helper

import ctxrt
from ctxrt.backends import get_backend

pytestmark = pytest.mark.usefixtures("opencl")


def _close(got: np.ndarray, want: np.ndarray, what: str) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype, what
    err, scale = float(np.max(np.abs(got - want))), float(np.max(np.abs(want)))
    assert err <= 1e-4 * scale + 1e-5, f"{what}: max |ctxrt - ort| = {err:.3g}, max |ort| = {scale:.3g}"


@pytest.mark.parametrize("exporter", ["dynamo", "legacy"])
def test_bert_runs_wholly_on_opencl_without_partition_syncs(exporter) -> None:
    import zoo
    from test_models import ort_outputs

    path, feeds = zoo.bert_model(layers=2, hidden=64, heads=4, seq=16, exporter=exporter), zoo.bert_feeds(16, pad=4)
    want = ort_outputs(path, feeds)
    with ctxrt.compile(path, shapes={k: v.shape for k, v in feeds.items()}, backend="opencl") as ctx:
        g = ctx.graph()
        assert [p["backend"] for p in g.partitions] == ["opencl"], g.partitions  # was 33 CPU partitions
        for _ in range(3):
            got = g.run(feeds)
            for name, w in want.items():
                _close(got[name], w, name)
        assert ctx.stats["partition_syncs"] == 0  # was one per CPU partition per run


@pytest.mark.parametrize("name, exporter, opset", [("gpt", "legacy", 17), ("gpt", "dynamo", 18),
                                                   ("vit", "dynamo", 18)])
def test_exported_transformers_on_opencl(name, exporter, opset) -> None:
    """GPT (KV cache: Concat, Split, Gather, Transpose, Softmax, LayerNorm) wholly on OpenCL; ViT but for its
    patch-embedding Conv."""
    import onnxruntime as ort
    from exported import exported_feeds, exported_model

    path = exported_model(name, exporter, opset)
    feeds = exported_feeds(name, 2)
    ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    want = ref.run(None, feeds)
    with ctxrt.compile(path, shapes={k: v.shape for k, v in feeds.items()}, backend="opencl") as ctx:
        g = ctx.graph()
        on_cpu = {op for p in g.partitions if p["backend"] == "cpu" for op in p["ops"]}
        assert on_cpu <= ({"Conv"} if name == "vit" else set()), g.partitions
        got = g.run(feeds)
        for o, w in zip(ref.get_outputs(), want, strict=True):
            _close(got[o.name], w, o.name)


def test_steady_loop_of_these_kernels_allocates_nothing() -> None:
    """Embedding Gather -> LayerNorm -> heads Transpose -> Softmax -> Concat -> ReduceMean -> Pad -> Slice, memory
    handles bound: a steady loop creates no buffer, records nothing and allocates no tensor memory on the host."""
    nodes = [helper.make_node("Gather", ["table", "ids"], ["e"]),
             helper.make_node("LayerNormalization", ["e", "g"], ["n"]),
             helper.make_node("Reshape", ["n", "heads"], ["h"]),
             helper.make_node("Transpose", ["h"], ["t"], perm=[0, 2, 1, 3]),
             helper.make_node("Softmax", ["t"], ["s"]),
             helper.make_node("Concat", ["s", "t"], ["c"], axis=1),
             helper.make_node("ReduceMean", ["c", "ax"], ["r"], keepdims=1),
             helper.make_node("Pad", ["r", "pads"], ["p"]),
             helper.make_node("Slice", ["p", "st", "en", "sa"], ["y"])]
    feeds = {"ids": np.array([[3, 99, 0, 7, 7]], np.int64)}
    inits = {"table": rand(100, 24), "g": rand(24), "heads": np.array([1, 5, 4, 6], np.int64),
             "ax": np.array([2], np.int64), "pads": np.array([0, 0, 0, 1, 0, 0, 0, 2], np.int64),
             "st": np.array([1], np.int64), "en": np.array([7], np.int64), "sa": np.array([1], np.int64)}
    model = make_model(nodes, feeds, inits, opset=18)
    (want,) = reference(model, feeds)
    be = get_backend("opencl")
    with ctxrt.compile(model, backend=be, io_mem_type="memhandle") as ctx:
        g = ctx.graph()
        assert [p["backend"] for p in g.partitions] == ["opencl"], g.partitions
        buf = be.alloc_shared(4096, 64)
        ids = ctx.mem_register(buf, 0, (1, 5), np.int64)
        y = ctx.mem_register(buf, 1024, want.shape, np.float32)
        write(be, ids.view, feeds["ids"])
        g.execute({"ids": ids}, {"y": y})
        made, recorded = be.stats["buffers_created"], ctx.stats["recordings"]
        peak, growth = steady_state_allocation(lambda: g.execute({"ids": ids}, {"y": y}))
        assert (be.stats["buffers_created"], ctx.stats["recordings"]) == (made, recorded)
        assert peak < 16384 and growth < 2048
        np.testing.assert_allclose(read(be, y.view), want, rtol=1e-5, atol=1e-6)
        ctx.mem_deregister(ids)
        ctx.mem_deregister(y)
        buf.release()


def test_tuner_tunes_these_kernels_and_the_tuned_outputs_equal_the_defaults(tmp_path: Path) -> None:
    from ctxrt.compiler import compile_model
    from ctxrt.tuning import LocalDevice, Tuner, TuningConfig

    nodes = [helper.make_node("LayerNormalization", ["x", "g"], ["n"]),
             helper.make_node("Transpose", ["n"], ["t"], perm=[1, 0]),
             helper.make_node("Softmax", ["t"], ["y"])]
    feeds = {"x": rand(33, 70)}
    model = make_model(nodes, feeds, {"g": rand(70)})
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    from ctxrt.backends.opencl.backend import OpenCLBackend

    be = OpenCLBackend(0)
    tuner = Tuner(TuningConfig(tuning_mode=True, tuning_budget_candidates=4), LocalDevice(be))
    graph, _ = compile_model(path, None, be, "main", tuner=tuner)
    assert {e["op"] for e in graph.tuning} == {"LayerNormalization", "Transpose", "Softmax"}
    assert tuner.counters["kernels_profiled"] == 3 and tuner.counters["candidates_tried"] > 3
    plain = ctxrt.compile(model, backend=be).graph().run(feeds)["y"]
    tuned = ctxrt.compile(model, backend=be, tuning_mode=True, tuning_budget_candidates=4,
                          performance_cache_dir=str(tmp_path / "perf"))
    np.testing.assert_allclose(tuned.graph().run(feeds)["y"], plain, rtol=1e-5, atol=1e-6)


def test_an_audio_front_end_on_opencl_is_one_program_for_every_length() -> None:
    """The strided audio front end of tests/unit/test_strided_ranges.py on OpenCL: one range program whose lengths
    are derived dims (compiler/floors.py), every length equal to onnxruntime's."""
    import sys

    import onnxruntime as ort

    sys.path.insert(0, str(Path(__file__).parents[1] / "unit"))
    from test_strided_ranges import SIZES, _audio

    data = _audio().SerializeToString()
    theirs = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    with ctxrt.InferenceSession(data, "opencl", dim_ranges={"batch": (1, 4), "n": (1, 1024)}) as sess:
        for b, n in SIZES:
            x = rng.standard_normal((b, n)).astype(np.float32)
            (got,), (want,) = sess.run(None, {"wav": x}), theirs.run(None, {"wav": x})
            assert got.shape == want.shape
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        assert sess.stats["shape_variants_compiled"] == 1 and sess._current.ranged.ranges.floors
