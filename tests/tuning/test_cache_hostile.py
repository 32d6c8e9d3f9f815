"""The performance cache and the tuning config as hostile inputs (issue 18). Whatever is found where the cache
file should be (deep nesting, a FIFO, a link to /dev/zero, a huge file, entries with wrong types, NaN times or
huge texts) the compile goes on with a fresh cache after ONE warning naming the file, within seconds; a bad
`performance_cache_dir` or config file is one ConfigError. Cases that could hang or eat memory before the fix
run in a child process with a time and an address-space limit."""

from __future__ import annotations

import json
import math
import os
import resource
import socket
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
from tuning_helpers import DEVICE, entry, mlp_model

from ctxrt.backends import get_backend
from ctxrt.compiler import compile_model
from ctxrt.errors import ConfigError, CtxrtWarning
from ctxrt.tuning import LocalDevice, Tuner
from ctxrt.tuning import cache as cache_module
from ctxrt.tuning.cache import MAX_FILE_BYTES, PerformanceCache, cache_file_name
from ctxrt.tuning.cache_schema import MAX_TEXT
from ctxrt.tuning.config import TuningConfig

HERE = Path(__file__).resolve().parent
NAME = cache_file_name(DEVICE)


def _doc(entries: Any, **extra: Any) -> bytes:
    return json.dumps({"format": "ctxrt-performance-cache", "version": 1, "entries": entries, **extra}).encode()


def _open(directory: Path) -> list[str]:
    """Open the cache, save one entry; ctxrt's warnings."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        PerformanceCache(directory, DEVICE).put("k1", entry(1))
    return [str(w.message) for w in caught if issubclass(w.category, CtxrtWarning)]


_CHILD = """
import json, sys, warnings
sys.path.insert(0, sys.argv[2])
from tuning_helpers import DEVICE, entry
from ctxrt.errors import CtxrtWarning
from ctxrt.tuning.cache import PerformanceCache
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    PerformanceCache(sys.argv[1], DEVICE).put("k1", entry(1))
print(json.dumps([str(w.message) for w in caught if issubclass(w.category, CtxrtWarning)]))
"""


def _limits(address_space: int = 1 << 30) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))  # reading /dev/zero whole fails fast


def _open_in_child(directory: Path) -> list[str]:
    """`_open` in a child process that must finish within 60 s and 1 GiB of address space."""
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(directory), str(HERE)], capture_output=True, text=True,
                          timeout=60, preexec_fn=_limits)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def _assert_set_aside(directory: Path, said: list[str], *needles: str) -> None:
    """ONE warning naming the file (and `needles`), the file renamed aside, a fresh cache that works."""
    assert len(said) == 1, said
    assert str(directory / NAME) in said[0] and "set aside as" in said[0] and len(said[0]) < 2000, said[0]
    for needle in needles:
        assert needle in said[0], (needle, said[0])
    assert os.path.lexists(directory / f"{NAME}.corrupt-1")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert PerformanceCache(directory, DEVICE).get("k1") == entry(1)


# -- the file itself ---------------------------------------------------------------------------------
@pytest.mark.parametrize("content", [b"[" * 100_000 + b"]" * 100_000, b'{"a": ' * 50_000 + b"1" + b"}" * 50_000])
def test_deeply_nested_json_is_set_aside_not_a_recursion_error(tmp_path: Path, content: bytes) -> None:
    (tmp_path / NAME).write_bytes(content)
    _assert_set_aside(tmp_path, _open(tmp_path), "nested too deeply")


def test_a_fifo_is_set_aside_without_blocking(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / NAME)
    _assert_set_aside(tmp_path, _open_in_child(tmp_path), "is a FIFO, not a regular file")


def test_a_link_to_dev_zero_is_set_aside_without_reading(tmp_path: Path) -> None:
    (tmp_path / NAME).symlink_to("/dev/zero")
    _assert_set_aside(tmp_path, _open_in_child(tmp_path), "symbolic link")
    assert os.readlink(tmp_path / f"{NAME}.corrupt-1") == "/dev/zero"  # the link was moved, nothing opened


def test_a_link_to_a_good_cache_file_is_not_followed(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    PerformanceCache(elsewhere, DEVICE).put("k9", entry(9))
    (tmp_path / NAME).symlink_to(elsewhere / NAME)
    _assert_set_aside(tmp_path, _open(tmp_path), "symbolic link")
    assert PerformanceCache(elsewhere, DEVICE).get("k9") == entry(9)  # the link's target is untouched


@pytest.mark.parametrize("make", ["directory", "socket"])
def test_other_non_regular_files_are_set_aside(tmp_path: Path, make: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if make == "directory":
        (tmp_path / NAME).mkdir()
    else:
        monkeypatch.chdir(tmp_path)  # a socket's path is limited to 108 bytes
        with socket.socket(socket.AF_UNIX) as s:
            s.bind(NAME)
    _assert_set_aside(tmp_path, _open_in_child(tmp_path), f"is a {make}, not a regular file")


def test_a_file_over_the_size_limit_is_refused_before_parsing(tmp_path: Path) -> None:
    with open(tmp_path / NAME, "wb") as f:
        f.truncate(MAX_FILE_BYTES + 1)  # sparse: no disk used
    _assert_set_aside(tmp_path, _open_in_child(tmp_path), "over the limit of 64 MiB")


def test_an_integer_too_long_for_python_is_set_aside(tmp_path: Path) -> None:
    (tmp_path / NAME).write_bytes(b'{"format": "ctxrt-performance-cache", "version": ' + b"1" * 5000 + b"}")
    _assert_set_aside(tmp_path, _open(tmp_path), "not valid JSON")


@pytest.mark.parametrize("extra, needle", [
    ({"device": {"vendor": 7}}, "device['vendor']"), ({"device": []}, "device: expected an object"),
    ({"spare": 1}, "unknown keys 'spare'"), ({"version": "x" * 10**6}, "has version 'xxxx"),
])
def test_bad_document_fields_are_set_aside(tmp_path: Path, extra: dict[str, Any], needle: str) -> None:
    (tmp_path / NAME).write_bytes(_doc({"k": entry(1)}, **extra))
    _assert_set_aside(tmp_path, _open(tmp_path), needle)


# -- entries -----------------------------------------------------------------------------------------
def _deep(n: int) -> Any:
    v: Any = 1
    for _ in range(n):
        v = [v]
    return v


NAN, INF = float("nan"), float("inf")
BAD_ENTRIES: list[tuple[str, dict[str, Any], str]] = [
    ("tried [1]", {"tried": [1]}, "tried[0]: expected [params, time_s, error], got int 1"),
    ("tried item of 2", {"tried": [[{}, 1e-6]]}, "tried[0]: expected [params, time_s, error]"),
    ("tried time str", {"tried": [[{}, "fast", None]]}, "tried[0] time_s"),
    ("tried time NaN", {"tried": [[{}, NAN, None]]}, "tried[0] time_s"),
    ("tried error int", {"tried": [[{}, None, 5]]}, "tried[0] error"),
    ("tried error huge", {"tried": [[{}, None, "e" * (MAX_TEXT + 1)]]}, "tried[0] error"),
    ("tried params list", {"tried": [[[1], 1e-6, None]]}, "tried[0] params"),
    ("tried not a list", {"tried": {"a": 1}}, "tried: expected a list"),
    ("default time NaN", {"default_time_s": NAN}, "default_time_s: expected null or a time"),
    ("best time inf", {"best_time_s": INF}, "best_time_s"),
    ("best time negative", {"best_time_s": -1.0}, "best_time_s"),
    ("best time huge", {"best_time_s": 1e300}, "best_time_s"),
    ("best time str", {"best_time_s": "1e-6"}, "best_time_s"),
    ("best time bool", {"best_time_s": True}, "best_time_s"),
    ("best not a map", {"best": "fast"}, "best: expected an object"),
    ("best value list", {"best": {"VW": [4]}}, "best['VW']"),
    ("best value NaN", {"best": {"VW": NAN}}, "best['VW']"),
    ("best value huge int", {"best": {"VW": 10**30}}, "best['VW']"),
    ("best value long str", {"best": {"VW": "v" * 65}}, "best['VW']"),
    ("best empty name", {"best": {"": 1}}, "best name"),
    ("best 65 params", {"best": {f"P{i}": 1 for i in range(65)}}, "best: expected an object of at most 64"),
    ("default null", {"default": None}, "default: expected an object"),
    ("note 1 MiB", {"note": "n" * (1 << 20)}, "note: expected a str of at most"),
    ("note int", {"note": 5}, "note"),
    ("label list", {"label": ["x"]}, "label"),
    ("complete str", {"complete": "yes"}, "complete: expected true or false"),
    ("signature str", {"signature": "x"}, "signature: expected an object"),
    ("signature deep", {"signature": {"attrs": _deep(40)}}, "signature: nested deeper than 32"),
    ("unknown key", {"extra": 1}, "unknown keys 'extra'"),
]


@pytest.mark.parametrize("change, needle", [c[1:] for c in BAD_ENTRIES], ids=[c[0] for c in BAD_ENTRIES])
def test_a_bad_entry_sets_the_file_aside_naming_it(tmp_path: Path, change: dict[str, Any], needle: str) -> None:
    """One bad entry makes the whole file suspect (ctxrt never writes one): kept aside for a look, not used."""
    (tmp_path / NAME).write_bytes(_doc({"good": entry(2), "k7": {**entry(7), **change}}))
    _assert_set_aside(tmp_path, _open(tmp_path), "is malformed (entries['k7']", needle)


@pytest.mark.parametrize("entries, needle", [
    ({"k": {k: v for k, v in entry(1).items() if k != "default_time_s"}}, "missing keys ['default_time_s']"),
    ({"x" * 200: entry(1)}, "entries key: expected a str of 1 to 128"),
    ({"": entry(1)}, "entries key"),
    ({"k": 3}, "entries['k']: expected an object"),
    ([entry(1)], "entries: expected an object"),
])
def test_bad_keys_and_entry_shapes_are_set_aside(tmp_path: Path, entries: Any, needle: str) -> None:
    (tmp_path / NAME).write_bytes(_doc(entries))
    _assert_set_aside(tmp_path, _open(tmp_path), needle)


def test_a_good_file_still_gives_no_warning(tmp_path: Path) -> None:
    (tmp_path / NAME).write_bytes(_doc({"k2": entry(2), "k3": {**entry(3), "best_time_s": 0, "tried": []}}))
    assert _open(tmp_path) == []
    assert PerformanceCache(tmp_path, DEVICE).get("k3")["best_time_s"] == 0


# -- the writer ---------------------------------------------------------------------------------------
def test_long_texts_are_cut_when_saved(tmp_path: Path) -> None:
    long = {**entry(1), "label": "l" * 5000, "note": "n" * 5000,
            "tried": [[{"VW": 1, "WGS": 64}, None, "build failed: " + "x" * 5000]]}
    PerformanceCache(tmp_path, DEVICE).put("k1", long)
    back = PerformanceCache(tmp_path, DEVICE).get("k1")
    assert back is not None and len(back["label"]) == len(back["note"]) == len(back["tried"][0][2]) == MAX_TEXT


@pytest.mark.parametrize("change", [{"best_time_s": NAN}, {"tried": [1]}, {"best": {"VW": [1]}}])
def test_an_entry_the_reader_would_refuse_is_not_saved(tmp_path: Path, change: dict[str, Any]) -> None:
    cache = PerformanceCache(tmp_path, DEVICE)
    cache.put("k1", entry(1))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cache.put("k2", {**entry(2), **change})
    said = [str(w.message) for w in caught if issubclass(w.category, CtxrtWarning)]
    assert len(said) == 1 and "not saved" in said[0] and str(cache.path) in said[0], said
    assert set(json.loads(cache.path.read_text())["entries"]) == {"k1"}


def test_a_full_cache_is_not_written_over_the_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cache_module, "MAX_FILE_BYTES", 3000)
    cache = PerformanceCache(tmp_path, DEVICE)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in range(10):
            cache.put(f"k{n}", entry(n))
    said = [str(w.message) for w in caught if issubclass(w.category, CtxrtWarning)]
    assert len(said) == 1 and "is full" in said[0], said
    assert cache.path.stat().st_size <= 3000 and cache.get("k9") == entry(9)  # this compile still has it


def test_a_winner_of_another_type_is_not_used(opencl: str, mlp: Path, tmp_path: Path) -> None:
    """Floats where the kernel's space has ints pass the schema (and `1.0 in (1, 2)`), but are another build of
    the kernel (`-D VW=1.0`): such an entry is profiled again, not used."""
    be = get_backend(opencl)
    config = TuningConfig(tuning_mode=True, performance_cache_dir=str(tmp_path), tuning_budget_candidates=1)
    compile_model(mlp, None, be, "main", tuner=Tuner(config, LocalDevice(be)))
    (path,) = tmp_path.glob("*.perf.json")
    doc = json.loads(path.read_text())
    for e in doc["entries"].values():
        e["best"] = {k: float(v) for k, v in e["best"].items()}
    path.write_text(json.dumps(doc))
    tuner = Tuner(config, LocalDevice(be))
    graph, _ = compile_model(mlp, None, be, "main", tuner=tuner)
    assert tuner.counters["kernels_from_cache"] == 0 and tuner.counters["kernels_profiled"] == 3
    assert all(type(v) is int for s in graph.steps for v in (s.params or {}).values())


# -- the lock file ---------------------------------------------------------------------------------------
def test_a_lock_file_that_is_a_link_is_a_config_error(tmp_path: Path) -> None:
    target = tmp_path / "made-by-us"
    (tmp_path / f"{NAME}.lock").symlink_to(target)
    with pytest.raises(ConfigError, match=r"lock file .*\.lock is a symbolic link: remove it"):
        PerformanceCache(tmp_path, DEVICE)
    assert not target.exists()  # O_CREAT did not create the link's target


def test_a_lock_file_that_is_a_fifo_is_a_config_error(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / f"{NAME}.lock")
    with pytest.raises(ConfigError, match=r"lock file .*\.lock is a FIFO, not a regular file"):
        PerformanceCache(tmp_path, DEVICE)


# -- performance_cache_dir and the config file -----------------------------------------------------------
@pytest.mark.parametrize("directory", ["perf\0x", "\0"])
def test_a_nul_in_performance_cache_dir_is_a_config_error(tmp_path: Path, directory: str) -> None:
    with pytest.raises(ConfigError, match="performance_cache_dir must be a directory path without NUL"):
        TuningConfig.parse({"tuning_mode": True, "performance_cache_dir": directory}, "tuning.json")
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"tuning_mode": True, "performance_cache_dir": directory}))
    with pytest.raises(ConfigError, match="c.json: performance_cache_dir must be a directory path without NUL"):
        TuningConfig.load(config)
    with pytest.raises(ConfigError, match="performance_cache_dir .* is not a usable path"):
        PerformanceCache(directory, DEVICE)  # the class itself, used without a config


def test_an_overlong_performance_cache_dir_is_a_short_config_error() -> None:
    with pytest.raises(ConfigError, match="at most 4096 characters") as e:
        TuningConfig.parse({"tuning_mode": True, "performance_cache_dir": "d" * 100_000})
    assert len(str(e.value)) < 300


_CONFIG_CHILD = """
import sys
from ctxrt.errors import ConfigError
from ctxrt.tuning.config import TuningConfig
try:
    TuningConfig.load(sys.argv[1], "--config c.json")
except ConfigError as e:
    print(e)
"""


@pytest.mark.parametrize("make, needle", [
    ("fifo", "is a FIFO, not a regular file"), ("zero", "is a character device, not a regular file"),
    ("deep", "nested too deeply"), ("big", "over the limit of 1 MiB"), ("digits", "not valid JSON"),
])
def test_a_hostile_config_file_is_one_config_error(tmp_path: Path, make: str, needle: str) -> None:
    path = tmp_path / "c.json"
    if make == "fifo":
        os.mkfifo(path)
    elif make == "zero":
        path.symlink_to("/dev/zero")
    else:
        path.write_bytes({"deep": b"[" * 100_000, "big": b" " * (2 << 20) + b"{}",
                          "digits": b'{"tuning_budget_candidates": ' + b"7" * 5000 + b"}"}[make])
    proc = subprocess.run([sys.executable, "-c", _CONFIG_CHILD, str(path)], capture_output=True, text=True,
                          timeout=60, preexec_fn=_limits)
    assert proc.returncode == 0 and proc.stdout.startswith("--config c.json") and needle in proc.stdout, (
        proc.stdout, proc.stderr[-2000:])


@pytest.mark.parametrize("value", [10**400, 10**5000, 1e300, math.inf], ids=["1e400", "1e5000", "1e300", "inf"])
def test_huge_budget_seconds_are_a_config_error(value: float) -> None:
    with pytest.raises(ConfigError, match="tuning_budget_seconds must be a number of seconds > 0"):
        TuningConfig.parse({"tuning_mode": True, "tuning_budget_seconds": value})


def test_config_errors_show_hostile_values_briefly() -> None:
    with pytest.raises(ConfigError) as e:
        TuningConfig.parse({"tuning_mode": _deep(5000), "tuning_budget_candidates": "c" * 10**6})
    assert len(str(e.value)) < 400 and "tuning_mode must be true or false" in str(e.value)


# -- through the command line ----------------------------------------------------------------------------
def test_cli_compile_with_hostile_caches_warns_in_one_line(opencl: str, tmp_path: Path) -> None:
    """`ctxrt compile --config` over each hostile cache: exit 0, one `ctxrt:` warning line naming the file, no
    traceback; a NUL in performance_cache_dir: exit 2, one error line."""
    mlp_model(tmp_path / "mlp.onnx")
    (tmp_path / "t.json").write_text(json.dumps({"tuning_mode": True, "performance_cache_dir": "perf",
                                                 "tuning_budget_candidates": 1}))

    def compile_(config: str = "t.json") -> tuple[int, list[str], str]:
        proc = subprocess.run([sys.executable, "-m", "ctxrt.cli", "compile", "mlp.onnx", "-o", "m.ctx", "--backend",
                               "opencl", "--config", config, "-q"], cwd=tmp_path, capture_output=True, text=True,
                              timeout=300, preexec_fn=lambda: _limits(8 << 30))
        return proc.returncode, [line for line in proc.stderr.splitlines() if line.startswith("ctxrt:")], proc.stderr

    code, said, err = compile_()
    assert code == 0 and said == [], err
    (path,) = (tmp_path / "perf").glob("*.perf.json")
    good = json.loads(path.read_text())
    key = sorted(good["entries"])[0]
    nan_and_int = {**good, "entries": {**good["entries"], key: {**good["entries"][key], "tried": [1],
                                                                "default_time_s": NAN}}}
    hostile = {"nested": lambda: path.write_bytes(b"[" * 100_000), "fifo": lambda: os.mkfifo(path),
               "dev/zero": lambda: path.symlink_to("/dev/zero"),
               "bad entry": lambda: path.write_text(json.dumps(nan_and_int))}
    for name, make in hostile.items():
        path.unlink()
        make()
        code, said, err = compile_()
        assert code == 0 and "Traceback" not in err, (name, err)
        assert len(said) == 1 and str(path.name) in said[0] and "set aside as" in said[0], (name, said)
        assert json.loads(path.read_text())["entries"], name  # a fresh cache, filled by this compile
    (tmp_path / "nul.json").write_text(json.dumps({"tuning_mode": True, "performance_cache_dir": "pe\0rf"}))
    code, said, err = compile_("nul.json")
    assert code == 2 and "Traceback" not in err and err.count("\n") == 1, err
    assert said[0].startswith("ctxrt: error: --config nul.json: performance_cache_dir must be a directory path "
                              "without NUL"), said
