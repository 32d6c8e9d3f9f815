"""The performance cache file: one per device tier, merged under a lock, replaced whole (never a torn file),
set aside with one warning when corrupt, an unwritable directory refused before any profiling."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from tuning_helpers import DEVICE, entry

from ctxrt.errors import ConfigError, CtxrtWarning
from ctxrt.tuning.cache import PerformanceCache, cache_file_name


def test_file_is_named_from_normalised_vendor_device_driver_and_version() -> None:
    assert cache_file_name(DEVICE) == "acme_acme-gpu-9000_1.2-build-7_ctxrt-0.1.0.perf.json"
    other_driver = cache_file_name({**DEVICE, "driver": "1.3"})
    assert other_driver != cache_file_name(DEVICE)
    long = cache_file_name({**DEVICE, "device": "x" * 500 + "/../../etc"})
    assert len(long) < 200 and "/" not in long and ".." not in long.replace(".perf.json", "")


def test_entries_persist_and_another_tier_has_its_own_file(tmp_path: Path) -> None:
    cache = PerformanceCache(tmp_path, DEVICE)
    assert cache.get("k1") is None
    cache.put("k1", entry(1))
    assert PerformanceCache(tmp_path, DEVICE).get("k1") == entry(1)
    other = PerformanceCache(tmp_path, {**DEVICE, "driver": "2.0"})
    assert other.get("k1") is None and other.path != cache.path


def test_invalidate_deletes_the_tier_file_only(tmp_path: Path) -> None:
    PerformanceCache(tmp_path, DEVICE).put("k1", entry(1))
    PerformanceCache(tmp_path, {**DEVICE, "driver": "2.0"}).put("k1", entry(1))
    fresh = PerformanceCache(tmp_path, DEVICE, invalidate=True)
    assert fresh.get("k1") is None and not fresh.path.exists()
    fresh.put("k2", entry(2))
    assert set(json.loads(fresh.path.read_text())["entries"]) == {"k2"}
    assert PerformanceCache(tmp_path, {**DEVICE, "driver": "2.0"}).get("k1") is not None


def test_a_miss_reads_what_another_tuner_saved_since(tmp_path: Path) -> None:
    mine, theirs = PerformanceCache(tmp_path, DEVICE), PerformanceCache(tmp_path, DEVICE)
    theirs.put("k7", entry(7))
    assert mine.get("k7") == entry(7)


def test_the_entry_that_explored_more_is_kept(tmp_path: Path) -> None:
    cache = PerformanceCache(tmp_path, DEVICE)
    cache.put("k", entry(1))
    partial = {**entry(2), "complete": False}
    cache.put("k", partial)
    assert PerformanceCache(tmp_path, DEVICE).get("k") == entry(1)


@pytest.mark.parametrize("content", [b"{not json", b"\xff\x00garbage", b"[]", b'{"format": "other"}',
                                     b'{"format": "ctxrt-performance-cache", "version": 99, "entries": {}}',
                                     b'{"format": "ctxrt-performance-cache", "version": 1, "entries": {"k": 3}}',
                                     b""])
def test_corrupt_file_is_set_aside_with_one_warning_and_rebuilt(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / cache_file_name(DEVICE)
    path.write_bytes(content)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cache = PerformanceCache(tmp_path, DEVICE)
        cache.put("k1", entry(1))
    mine = [w for w in caught if issubclass(w.category, CtxrtWarning)]
    assert len(mine) == 1 and "set aside" in str(mine[0].message)
    assert (tmp_path / (path.name + ".corrupt-1")).read_bytes() == content
    assert PerformanceCache(tmp_path, DEVICE).get("k1") == entry(1)


@pytest.mark.parametrize("where", ["a_file", "a_file/below", "/proc/ctxrt-perf-cache"])
def test_unwritable_directory_is_one_config_error(tmp_path: Path, where: str) -> None:
    (tmp_path / "a_file").write_text("x")
    directory = where if where.startswith("/") else tmp_path / where
    with pytest.raises(ConfigError, match="performance_cache_dir .* cannot be written"):
        PerformanceCache(directory, DEVICE)


# -- processes ---------------------------------------------------------------------------------------
_PUT = """
import json, sys
from ctxrt.tuning.cache import PerformanceCache
directory, device, first, count = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
sys.stdin.readline()  # every process is ready: go
cache = PerformanceCache(directory, device)
for n in range(first, first + count):
    cache.put(f"k{n}", {"signature": {"n": n}, "label": "", "default": {}, "default_time_s": 1.0, "best": {},
                        "best_time_s": 1.0, "tried": [], "complete": True, "note": ""})
print("done", flush=True)
"""


def _putter(tmp_path: Path, first: int, count: int, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", _PUT, str(tmp_path), json.dumps(DEVICE), str(first), str(count)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env={**os.environ, **env})


def test_four_concurrent_tuners_lose_no_entry(tmp_path: Path) -> None:
    procs = [_putter(tmp_path, 100 * k, 25) for k in range(4)]
    for proc in procs:  # all started (and importing) before any writes
        proc.stdin.write("go\n")  # type: ignore[union-attr]
        proc.stdin.flush()  # type: ignore[union-attr]
    for proc in procs:
        out, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0 and out.strip() == "done"
    keys = set(json.loads((tmp_path / cache_file_name(DEVICE)).read_text())["entries"])
    assert keys == {f"k{100 * k + n}" for k in range(4) for n in range(25)}
    assert not list(tmp_path.glob(".*.tmp"))


def test_kill_9_in_the_middle_of_a_write_leaves_a_readable_cache(tmp_path: Path) -> None:
    PerformanceCache(tmp_path, DEVICE).put("k1", entry(1))
    fifo = tmp_path.parent / f"{tmp_path.name}.fifo"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        proc = _putter(tmp_path, 2, 1, CTXRT_TEST_PAUSE=f"cache-write:{fifo}")
        proc.stdin.write("go\n")  # type: ignore[union-attr]
        proc.stdin.flush()  # type: ignore[union-attr]
        said = b""
        while not said.endswith(b"\n"):
            ready, _, _ = select.select([reader], [], [], 120)  # a bound, not a synchronisation
            assert ready and proc.poll() is None, "the writer never reached the middle of its write"
            said += os.read(reader, 100)
        assert said == b"cache-write\n"
        assert list(tmp_path.glob(".*.tmp")), "the write is under way: half a temporary file exists"
        proc.send_signal(signal.SIGKILL)
        proc.wait(60)
    finally:
        os.close(reader)
        fifo.unlink()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # readable: no "set aside" warning
        cache = PerformanceCache(tmp_path, DEVICE)
    assert cache.get("k1") == entry(1) and cache.get("k2") is None
    cache.put("k3", entry(3))  # the next writer sweeps the dead writer's temporary file
    assert not list(tmp_path.glob(".*.tmp"))
    assert set(json.loads(cache.path.read_text())["entries"]) == {"k1", "k3"}
