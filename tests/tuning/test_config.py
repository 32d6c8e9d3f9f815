"""The compile config of tuning mode: QNN's keys, one clear error for everything wrong with it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import ctxrt
from ctxrt.errors import ConfigError
from ctxrt.tuning import make_tuner
from ctxrt.tuning.config import TuningConfig


def test_qnn_sample_config_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "tuning.json"
    path.write_text(json.dumps({"tuning_mode": True, "performance_cache_dir": str(tmp_path / "perf"),
                                "invalidate_performance_cache": False}))
    cfg = TuningConfig.load(path)
    assert cfg.tuning_mode and cfg.performance_cache_dir == str(tmp_path / "perf")
    assert not cfg.invalidate_performance_cache and cfg.tuning_budget_candidates is None


@pytest.mark.parametrize("values, needles", [
    ({"performance_cache_dir": "perf"}, ["performance_cache_dir needs \"tuning_mode\": true"]),
    ({"invalidate_performance_cache": True}, ["invalidate_performance_cache needs \"tuning_mode\": true"]),
    ({"tuning_mode": False, "performance_cache_dir": "perf"}, ["performance_cache_dir needs"]),
    ({"tuning_budget_candidates": 4}, ["tuning_budget_candidates needs"]),
    ({"tuning_mod": True}, ["unknown key 'tuning_mod'", "did you mean 'tuning_mode'"]),
    ({"zzz": 1}, ["unknown key 'zzz'", "known keys: tuning_mode"]),
    ({"tuning_mode": "yes"}, ["tuning_mode must be true or false", "(str)"]),
    ({"tuning_mode": 1}, ["tuning_mode must be true or false", "(int)"]),
    ({"tuning_mode": True, "performance_cache_dir": 5}, ["performance_cache_dir must be a directory path"]),
    ({"tuning_mode": True, "performance_cache_dir": ""}, ["performance_cache_dir must be a directory path"]),
    ({"tuning_mode": True, "invalidate_performance_cache": "no"}, ["invalidate_performance_cache must be true"]),
    ({"tuning_mode": True, "tuning_budget_seconds": 0}, ["tuning_budget_seconds must be a number of seconds > 0"]),
    ({"tuning_mode": True, "tuning_budget_seconds": True}, ["tuning_budget_seconds must be"]),
    ({"tuning_mode": True, "tuning_budget_candidates": 1.5}, ["tuning_budget_candidates must be a whole number"]),
    ({"tuning_mode": True, "tuning_budget_candidates": 0}, ["tuning_budget_candidates must be a whole number"]),
    ({"tuning_mod": True, "performance_cache_dir": 3}, ["unknown key 'tuning_mod'", "performance_cache_dir must"]),
])
def test_bad_config_is_one_error_naming_every_problem(values: dict, needles: list[str]) -> None:
    with pytest.raises(ConfigError) as e:
        TuningConfig.parse(values, "tuning.json")
    message = str(e.value)
    assert message.startswith("tuning.json: ") and "\n" not in message
    for needle in needles:
        assert needle in message


@pytest.mark.parametrize("text, needle", [
    ("{", "not valid JSON"), ("[1, 2]", "expected a JSON object"), ('"tuning"', "expected a JSON object"),
    ("", "not valid JSON"), ("{\"tuning_mode\": tru}", "not valid JSON"),
])
def test_unreadable_config_file(tmp_path: Path, text: str, needle: str) -> None:
    path = tmp_path / "c.json"
    path.write_text(text)
    with pytest.raises(ConfigError, match=needle):
        TuningConfig.load(path, "--config c.json")


def test_config_file_that_is_not_text(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    path.write_bytes(b"\xff\xfe{}")
    with pytest.raises(ConfigError, match="not UTF-8"):
        TuningConfig.load(path)


def test_keyword_arguments_are_checked_like_the_file(mlp: Path) -> None:
    with pytest.raises(ConfigError, match="unknown key 'tuning_mod'"):
        ctxrt.compile(mlp, backend="cpu", tuning_mod=True)
    with pytest.raises(ConfigError, match="performance_cache_dir needs"):
        ctxrt.compile(mlp, backend="cpu", performance_cache_dir="perf")


def test_tuning_mode_needs_an_opencl_backend(mlp: Path) -> None:
    with pytest.raises(ConfigError, match="tunes OpenCL kernels"):
        ctxrt.compile(mlp, backend="cpu", tuning_mode=True)


def test_no_tuning_mode_means_no_tuner() -> None:
    assert make_tuner(object(), {}) is None
    assert make_tuner(object(), {"tuning_mode": False}) is None
