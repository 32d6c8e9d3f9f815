"""Fixtures of the command-line tests: a workspace of good and hostile files."""

from __future__ import annotations

import builtins
import errno
import os
from pathlib import Path

import numpy as np
import pytest
from cli_helpers import gemm_model, relu_model

from ctxrt.cli import main


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Good inputs (models, binaries, .npz) and hostile ones, made once per test module."""
    ws = tmp_path_factory.mktemp("ws")
    relu_model(ws / "m.onnx")
    relu_model(ws / "a.onnx", 8, "logits")
    relu_model(ws / "b.onnx", 16, "logits")
    relu_model(ws / "q_ctx.onnx")  # a plain model whose name is what `-o q.ctx --epcontext` would write
    gemm_model(ws / "w.onnx")
    cwd = os.getcwd()
    os.chdir(ws)
    try:
        for argv in (["compile", "m.onnx", "-o", "m.ctx", "--epcontext", "-q"],
                     ["compile", "w.onnx", "-o", "w.ctx", "-q"],
                     ["compile", "a.onnx", "b.onnx", "-o", "ab.ctx", "--epcontext", "-q"],
                     ["compile", "m.onnx", "--split", "2", "-o", "split", "-q"]):
            assert main(argv) == 0, argv
    finally:
        os.chdir(cwd)
    flipped = bytearray((ws / "w.ctx").read_bytes())
    flipped[-10] ^= 0xFF  # a weights byte: the section's checksum no longer matches
    (ws / "w_flipped.ctx").write_bytes(bytes(flipped))
    (ws / "binary.png").write_bytes((ws / "m.ctx").read_bytes())  # a context binary under another name
    (ws / "truncated.ctx").write_bytes((ws / "m.ctx").read_bytes()[:100])
    (ws / "garbage.ctx").write_bytes(b"garbage")
    (ws / "garbage.onnx").write_bytes(b"garbage")
    (ws / "notes.txt").write_text("hello\n")
    (ws / "tune_bad.json").write_text("{\"tuning_mode\": tru")
    (ws / "tune_unknown.json").write_text('{"tuning_mode": true, "cache_dir": "perf"}')
    (ws / "tune_nomode.json").write_text('{"performance_cache_dir": "perf"}')
    (ws / "tune_types.json").write_text('{"tuning_mode": "yes", "tuning_budget_candidates": 0}')
    (ws / "tune.json").write_text('{"tuning_mode": true}')
    (ws / "empty.onnx").write_bytes(b"")
    (ws / "adir").mkdir()
    (ws / "dir.ctx").mkdir()
    (ws / "dir.npz").mkdir()
    (ws / "dir.png").mkdir()
    os.mkfifo(ws / "fifo.ctx")
    x = np.linspace(-1, 1, 8, dtype=np.float32).reshape(1, 8)
    np.save(ws / "plain.npy", x)
    np.savez(ws / "in.npz", x=x)
    np.savez(ws / "in_names.npz", z=x)
    np.savez(ws / "in_dtype.npz", x=x.astype(np.float64))
    np.savez(ws / "in_shape.npz", x=np.zeros((2, 8), np.float32))
    np.savez(ws / "in_object.npz", x=np.array([{"a": 1}], dtype=object))
    (ws / "unreadable.onnx").write_bytes((ws / "m.onnx").read_bytes())
    (ws / "unreadable.ctx").write_bytes((ws / "m.ctx").read_bytes())
    (ws / "unreadable.npz").write_bytes((ws / "in.npz").read_bytes())
    for name in ("unreadable.onnx", "unreadable.ctx", "unreadable.npz"):
        os.chmod(ws / name, 0)
    return ws


@pytest.fixture
def in_workspace(workspace: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Run in the workspace (paths as a user types them), files named unreadable* unreadable even for root."""
    monkeypatch.chdir(workspace)
    real_open = builtins.open

    def guarded(file, *args, **kwargs):  # chmod 0 does not stop root
        if isinstance(file, str | os.PathLike) and Path(file).name.startswith("unreadable"):
            raise PermissionError(errno.EACCES, "Permission denied", os.fspath(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", guarded)
    return workspace
