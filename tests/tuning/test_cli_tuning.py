"""`ctxrt compile --config` with tuning mode, `tune-report`, `inspect --tuning`, and the tuning progress bar."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_helpers import on_a_terminal
from tuning_helpers import mlp_model

from ctxrt.cli import main


@pytest.fixture
def ws(opencl: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    mlp_model(tmp_path / "mlp.onnx")
    (tmp_path / "tuning.json").write_text(json.dumps({"tuning_mode": True, "performance_cache_dir": "perf",
                                                      "invalidate_performance_cache": False,
                                                      "tuning_budget_candidates": 2}))
    return tmp_path


def test_compile_with_config_then_report(ws: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compile", "mlp.onnx", "-o", "a.ctx", "--backend", "opencl", "--config", "tuning.json"]) == 0
    assert main(["compile", "mlp.onnx", "-o", "b.ctx", "--backend", "opencl", "--config", "tuning.json"]) == 0
    capsys.readouterr()
    assert main(["tune-report", "a.ctx", "--json"]) == 0
    first = json.loads(capsys.readouterr().out)
    assert first["tuned"] and first["kernels_profiled"] == 3 and first["kernels_from_cache"] == 0
    assert {k["op"] for k in first["kernels"]} == {"MatMul", "Add", "Relu"}
    assert all(k["default_us"] > 0 and k["tuned_us"] > 0 and k["speedup"] >= 1.0 for k in first["kernels"])
    assert main(["tune-report", "b.ctx"]) == 0
    text = capsys.readouterr().out
    assert "0 profiled, 3 from the performance cache" in text and "speed-up" in text and "MatMul" in text
    assert main(["inspect", "a.ctx"]) == 0
    assert "tuned: 3 kernels for" in capsys.readouterr().out
    assert main(["inspect", "b.ctx", "--tuning"]) == 0
    shown = capsys.readouterr().out
    assert "ctxrt context binary" in shown and "3 from the performance cache" in shown
    assert main(["inspect", "a.ctx", "--tuning", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["tuning_report"]["kernels_profiled"] == 3
    pytest.importorskip("matplotlib")
    assert main(["tune-report", "a.ctx", "--plot", "t.png"]) == 0
    assert (ws / "t.png").read_bytes().startswith(b"\x89PNG")


def test_untuned_binary_reports_no_tuning(ws: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compile", "mlp.onnx", "-o", "u.ctx", "--backend", "opencl", "-q"]) == 0
    capsys.readouterr()
    assert main(["tune-report", "u.ctx"]) == 0
    assert capsys.readouterr().out.startswith("tuning: none")


def test_split_contexts_are_tuned_part_by_part(ws: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compile", "mlp.onnx", "--split", "2", "-o", "parts", "--backend", "opencl", "--config",
                 "tuning.json", "-q"]) == 0
    capsys.readouterr()
    assert main(["tune-report", "parts/mlp_ctx.onnx"]) == 0
    out = capsys.readouterr().out
    assert out.count("tuning: ") == 2 and "[mlp_part0.ctx]" in out and "[mlp_part1.ctx]" in out


def test_a_terminal_shows_the_tuning_bar(ws: Path) -> None:
    code, out, shown = on_a_terminal(ws, "compile", "mlp.onnx", "-o", "t.ctx", "--backend", "opencl", "--config",
                                     "tuning.json")
    assert code == 0 and out.startswith("wrote"), (out, shown)
    assert "tuning mlp" in shown and "kernel" in shown and "candidates, best" in shown and "x, 0 from cache" in shown
    code, _, shown = on_a_terminal(ws, "compile", "mlp.onnx", "-o", "t2.ctx", "--backend", "opencl", "--config",
                                   "tuning.json")
    assert code == 0 and "3 from cache" in shown
