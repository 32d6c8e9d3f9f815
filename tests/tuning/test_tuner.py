"""Tuning mode on this machine's OpenCL device (PoCL in CI): cache hits skip profiling, invalidation starts
afresh, a changed kernel source or space is a miss, every candidate is checked against the default's output,
and a tuned context computes what an untuned one does, also after a round trip through a context binary."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tuning_helpers import mlp_model

import ctxrt
from ctxrt.backends import get_backend, select_kernel
from ctxrt.backends.kernel import NodeSpec, TensorSpec
from ctxrt.backends.opencl.elementwise import Elementwise
from ctxrt.backends.opencl.kernel import Space
from ctxrt.compiler import compile_graphs, compile_model, save_context
from ctxrt.errors import ConfigError, CtxrtWarning
from ctxrt.format import read_metadata
from ctxrt.tuning import LocalDevice, Tuner, TuningConfig
from ctxrt.tuning.profiler import Settings, profile
from ctxrt.tuning.signature import signature

F32 = np.dtype(np.float32)


@pytest.fixture(scope="module")
def be(opencl: str) -> Any:
    return get_backend(opencl)


def _tuner(be: Any, cache: Path | None, **kw: Any) -> Tuner:
    cfg = TuningConfig(tuning_mode=True, performance_cache_dir=str(cache) if cache else None,
                       tuning_budget_candidates=kw.pop("budget", 2), **kw)
    return Tuner(cfg, LocalDevice(be))


def test_cache_hit_skips_profiling(be: Any, mlp: Path, tmp_path: Path) -> None:
    first = _tuner(be, tmp_path)
    g1, _ = compile_model(mlp, None, be, "main", tuner=first)
    assert first.counters["kernels_profiled"] == 3 and first.counters["kernels_from_cache"] == 0
    assert first.counters["candidates_tried"] > 0
    second = _tuner(be, tmp_path)
    g2, _ = compile_model(mlp, None, be, "main", tuner=second)
    assert second.counters["kernels_profiled"] == 0 and second.counters["kernels_from_cache"] == 3
    assert second.counters["candidates_tried"] == 0
    assert [s.params for s in g1.steps] == [s.params for s in g2.steps]
    assert {e["source"] for e in g2.tuning} == {"cache"}


def test_invalidate_starts_a_new_cache(be: Any, mlp: Path, tmp_path: Path) -> None:
    compile_model(mlp, None, be, "main", tuner=_tuner(be, tmp_path))
    other = mlp_model(tmp_path / "other.onnx", k=24)  # a MatMul of another shape: one more entry
    compile_model(other, None, be, "main", tuner=_tuner(be, tmp_path))
    (path,) = tmp_path.glob("*.perf.json")
    assert len(json.loads(path.read_text())["entries"]) == 4  # Add and Relu are shared
    fresh = _tuner(be, tmp_path, invalidate_performance_cache=True)
    compile_model(mlp, None, be, "main", tuner=fresh)
    assert fresh.counters["kernels_profiled"] == 3 and fresh.counters["kernels_from_cache"] == 0
    assert len(json.loads(path.read_text())["entries"]) == 3


def test_unwritable_cache_directory_fails_before_any_profiling(be: Any, tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match="cannot be written"):
        _tuner(be, tmp_path / "file" / "perf")


def test_tuned_context_computes_what_the_untuned_one_does(be: Any, mlp: Path, tmp_path: Path) -> None:
    x = np.random.default_rng(1).standard_normal((8, 16)).astype(np.float32)
    plain = ctxrt.compile(mlp, backend=be).graph("main").run({"x": x})["y"]
    tuned = ctxrt.compile(mlp, backend=be, tuning_mode=True, tuning_budget_candidates=3,
                          performance_cache_dir=str(tmp_path))
    np.testing.assert_allclose(tuned.graph("main").run({"x": x})["y"], plain, rtol=1e-5, atol=1e-5)
    graphs, weights = compile_graphs([(mlp, None, "main")], be, tuning_mode=True, tuning_budget_candidates=3,
                                     performance_cache_dir=str(tmp_path))
    path = save_context(tmp_path / "t.ctx", graphs, weights, be, [str(mlp)])
    meta = read_metadata(path)
    record = meta["tuning"]
    assert record["kernels_from_cache"] == 3 and record["device"]["tier"] == be.info.tier
    assert {e["op"] for e in record["kernels"]} == {"MatMul", "Add", "Relu"}
    ctx = ctxrt.context_from_binary(path, be)
    graph = ctx.graph("main")
    np.testing.assert_allclose(graph.run({"x": x})["y"], plain, rtol=1e-5, atol=1e-5)
    steps = {s.name: s for s in graph.compiled.steps}
    for kernel, step in zip(graph._kernels, graph.compiled.steps, strict=True):
        assert kernel.params == step.params  # loading built the kernels with the tuned parameters
    by_node = {n: e for e in record["kernels"] for n in e["nodes"]}
    assert all(steps[n].params == e["params"] for n, e in by_node.items())


def _relu_spec() -> NodeSpec:
    return NodeSpec("Relu", "r", {}, [TensorSpec((4, 64), F32)], [TensorSpec((4, 64), F32)])


def test_a_changed_source_or_space_is_a_miss(be: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kernel = Elementwise(_relu_spec(), be)
    before = signature(kernel)

    class Wider(Elementwise):
        space = Space(params={**Elementwise.space.params, "WGS": (32, 64, 128, 256, 512)},
                      defaults=Elementwise.space.defaults, work_group=Elementwise.space.work_group)

    assert signature(Wider(_relu_spec(), be)).key != before.key
    import ctxrt.backends.opencl.program as program

    monkeypatch.setattr(program, "source_hash", lambda name: "the hash of an edited elementwise.cl")
    assert signature(Elementwise(_relu_spec(), be)).key != before.key


class _Wrong(Elementwise):
    """A space whose BAD=1 computes another op, and BAD=2 a program that does not build."""

    space = Space(params={**Elementwise.space.params, "BAD": (0, 1, 2)},
                  defaults={k: {**v, "BAD": 0} for k, v in Elementwise.space.defaults.items()},
                  work_group=Elementwise.space.work_group)

    def defines(self) -> dict[str, Any]:
        d = {k: v for k, v in super().defines().items() if k != "BAD"}
        if self.params["BAD"] == 1:
            d["OP"] = "OP_Neg"
        if self.params["BAD"] == 2:
            d["VW"] = "not_a_number"
        return d


def test_every_candidate_is_checked_and_failures_keep_their_reason(be: Any) -> None:
    kernel = _Wrong(_relu_spec(), be)
    good = {**kernel.params, "WGS": 32}
    default, trials, spent = profile(be, kernel, [{**kernel.params, "BAD": 1}, {**kernel.params, "BAD": 2}, good,
                                                  {**kernel.params, "VW": 3}], Settings(min_runs=2))
    assert default.time_s is not None and default.error is None and not spent
    wrong, broken, ok, refused = trials
    assert wrong.time_s is None and "differs from the default" in wrong.error
    assert broken.time_s is None and "does not build" in broken.error
    assert ok.error is None and ok.time_s is not None and len(ok.runs) >= 2
    assert refused.time_s is None and "VW=3" in refused.error


def test_candidate_budget_is_kept(be: Any, tmp_path: Path) -> None:
    tuner = _tuner(be, None, budget=1)
    spec = NodeSpec("MatMul", "mm", {}, [TensorSpec((8, 16), F32), TensorSpec((16, 8), F32)],
                    [TensorSpec((8, 8), F32)])
    kernel, _ = select_kernel(be, spec)
    _, record = tuner.tune("g", {0: kernel}, {0: "mm"})
    assert record[0]["tried"] == 1 and not record[0]["complete"]
    assert tuner.counters["candidates_tried"] == 1


def test_a_spent_time_budget_keeps_the_default_and_still_times_it(be: Any) -> None:
    tuner = Tuner(TuningConfig(tuning_mode=True, tuning_budget_seconds=1e-9), LocalDevice(be))
    kernel, _ = select_kernel(be, _relu_spec())
    _, (entry,) = tuner.tune("g", {0: kernel}, {0: "r"})
    assert entry["tried"] == 0 and not entry["complete"] and entry["params"] == kernel.params
    assert entry["default_time_us"] is not None and entry["default_time_us"] == entry["best_time_us"]


def test_params_this_device_refuses_leave_the_defaults_with_a_warning(be: Any) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kernel, _ = select_kernel(be, _relu_spec(), None, {"VW": 3, "WGS": 64})
    assert kernel.params == Elementwise(_relu_spec(), be).params
    assert any(issubclass(w.category, CtxrtWarning) and "do not fit" in str(w.message) for w in caught)
    tuned, _ = select_kernel(be, _relu_spec(), None, {"VW": 2, "WGS": 32})
    assert tuned.params == {"VW": 2, "WGS": 32}
