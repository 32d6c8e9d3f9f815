"""Interrupted and failing writes leave the user's files as they were (issue 13).

Ctrl-C: `ctxrt` runs in a child process with CTXRT_TEST_PAUSE=POINT:FIFO; on reaching POINT it writes
POINT to the FIFO and waits, so the test sends SIGINT at a known point without sleeping. A full disk:
the file writer is made to fail with ENOSPC once some files are written.
"""

from __future__ import annotations

import errno
import os
import select
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import assert_one_line_error, cli, listing, relu_model

import ctxrt.format.atomic as atomic


@pytest.fixture
def ws(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    relu_model(tmp_path / "m.onnx")
    return tmp_path


def _interrupt_at(point: str, cwd: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """Run `ctxrt ARGV` in `cwd`, send it SIGINT when it reaches `point`, return how it ended."""
    fifo = cwd.parent / f"{cwd.name}.fifo"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # open before the child can reach the point
    try:
        env = dict(os.environ, CTXRT_TEST_PAUSE=f"{point}:{fifo}")
        child = subprocess.Popen([sys.executable, "-m", "ctxrt.cli", *argv], cwd=cwd, env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        said = b""
        while not said.endswith(b"\n"):
            ready, _, _ = select.select([reader], [], [], 120)  # a bound, not a synchronisation
            assert ready, f"ctxrt never reached {point!r}"
            chunk = os.read(reader, 100)
            assert chunk or child.poll() is None, f"ctxrt ended before {point!r}: {child.communicate()}"
            said += chunk
        assert said.decode().strip() == point
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=120)
        return subprocess.CompletedProcess(child.args, child.returncode, out, err)
    finally:
        os.close(reader)
        fifo.unlink()


def _assert_interrupted(done: subprocess.CompletedProcess[str]) -> None:
    assert done.returncode == 130, done
    assert done.stderr == "ctxrt: interrupted\n" and done.stdout == "", done


@pytest.mark.parametrize("point", ["staged", "commit"])
def test_ctrl_c_during_a_split_into_a_new_folder_leaves_no_folder(ws, point) -> None:
    before = listing(ws)
    _assert_interrupted(_interrupt_at(point, ws, "compile", "m.onnx", "--split", "2", "-o", "parts"))
    assert listing(ws) == before


@pytest.mark.parametrize("point", ["staged", "commit"])
def test_ctrl_c_during_a_split_into_a_used_folder_leaves_it_as_it_was(ws, capsys, point) -> None:
    assert cli(capsys, "compile", "m.onnx", "--split", "3", "-o", "parts")[0] == 0
    (ws / "parts" / "notes.txt").write_text("mine")
    before = listing(ws)
    _assert_interrupted(_interrupt_at(point, ws, "compile", "m.onnx", "--split", "2", "-o", "parts"))
    assert listing(ws) == before


def test_ctrl_c_during_an_epcontext_compile_writes_neither_file(ws, capsys) -> None:
    assert cli(capsys, "compile", "m.onnx", "-o", "m.ctx", "--shape", "x=2x8")[0] == 0  # an older m.ctx stays
    before = listing(ws)
    _assert_interrupted(_interrupt_at("staged", ws, "compile", "m.onnx", "-o", "m.ctx", "--epcontext"))
    assert listing(ws) == before


def test_ctrl_c_during_a_run_writes_no_outputs(ws) -> None:
    before = listing(ws)
    _assert_interrupted(_interrupt_at("running", ws, "run", "m.onnx", "--repeat", "3", "--output", "out.npz"))
    assert listing(ws) == before


class _DiskFull:
    """os.fdopen for file writes: the first `room` files write normally, later ones fail with ENOSPC."""

    def __init__(self, room: int) -> None:
        self.room, self.opened = room, 0
        self.real = os.fdopen

    def __call__(self, fd: int, mode: str = "r", *args, **kwargs):
        f = self.real(fd, mode, *args, **kwargs)
        if "w" not in mode:
            return f
        self.opened += 1
        if self.opened > self.room:
            def write(data):
                raise OSError(errno.ENOSPC, "No space left on device")
            f.write = write
        return f


@pytest.mark.parametrize("room, argv, named", [
    (0, ["compile", "m.onnx", "-o", "m.ctx"], "m.ctx"),
    (0, ["compile", "m.onnx", "-o", "m.ctx", "--epcontext"], "m.ctx"),
    (1, ["compile", "m.onnx", "-o", "m.ctx", "--epcontext"], "m_ctx.onnx"),
    (1, ["compile", "m.onnx", "--split", "3", "-o", "parts"], "parts/m_part1.ctx"),
    (3, ["compile", "m.onnx", "--split", "3", "-o", "parts"], "parts/m_ctx.onnx"),
    (0, ["run", "m.onnx", "--output", "out.npz"], "out.npz"),
    (0, ["inspect", "m.ctx", "--plot", "arena.png"], "arena.png"),
], ids=["ctx", "epcontext-binary", "epcontext-wrapper", "split-part", "split-wrapper", "run-output", "plot"])
@pytest.mark.parametrize("existing", [False, True], ids=["new", "overwrite"])
def test_a_full_disk_names_the_users_path_and_leaves_nothing(ws, capsys, monkeypatch, room, argv, named,
                                                             existing) -> None:
    if existing or argv[0] == "inspect":  # what an earlier successful command wrote must survive
        assert cli(capsys, "compile", "m.onnx", "-o", "m.ctx", "--epcontext")[0] == 0
        assert cli(capsys, "compile", "m.onnx", "--split", "3", "-o", "parts")[0] == 0
        assert cli(capsys, "run", "m.onnx", "--output", "out.npz")[0] == 0
        capsys.readouterr()
    before = listing(ws)
    monkeypatch.setattr(atomic.os, "fdopen", _DiskFull(room))
    assert_one_line_error(*cli(capsys, *argv), f"No space left on device: {named}")
    assert listing(ws) == before
