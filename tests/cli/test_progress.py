"""Progress bars: on stderr while compiling or splitting when stderr is a terminal, never with --quiet or
when stderr is a file or pipe (then stderr stays empty on success)."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_helpers import cli, on_a_terminal, relu_model


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    """Static models: a dynamic dim bound to 1 would be noted on stderr (tests/unit/test_shapes_and_values.py)."""
    relu_model(tmp_path / "m.onnx", batch=1)
    relu_model(tmp_path / "b.onnx", 16, batch=1)
    return tmp_path


@pytest.mark.parametrize("argv, stages", [
    (["compile", "m.onnx", "-o", "m.ctx"], ["compile m.onnx", "kernels", "node", "writing"]),
    (["compile", "m.onnx", "b.onnx", "-o", "mb.ctx"], ["compile 2 models: m: kernels", "b: kernels", "writing"]),
    (["compile", "m.onnx", "--split", "2", "-o", "parts"], ["split m.onnx", "part 1/2: kernels", "part 2/2: writing"]),
    (["run", "m.onnx"], ["compile m.onnx", "kernels"]),
], ids=["compile", "several", "split", "run"])
def test_a_terminal_shows_progress_by_stage(ws, argv, stages) -> None:
    code, out, shown = on_a_terminal(ws, *argv)
    assert code == 0 and out.startswith(("wrote", "y:")), (out, shown)
    for stage in stages:
        assert stage in shown, (stage, shown)
    assert shown.endswith("\r") and shown.split("\r")[-2].strip() == ""  # the bar is erased at the end


@pytest.mark.parametrize("argv", [["compile", "m.onnx", "-o", "m.ctx", "--quiet"],
                                  ["compile", "m.onnx", "--split", "2", "-o", "parts", "-q"],
                                  ["run", "m.onnx", "--quiet"]])
def test_quiet_shows_nothing(ws, argv) -> None:
    code, out, shown = on_a_terminal(ws, *argv)
    assert code == 0 and shown == "", shown


def test_no_terminal_no_progress(ws, capsys, monkeypatch) -> None:
    monkeypatch.chdir(ws)
    for argv in (["compile", "m.onnx", "-o", "m.ctx"], ["compile", "m.onnx", "--split", "2", "-o", "parts"],
                 ["run", "m.onnx"]):
        code, _, err = cli(capsys, *argv)
        assert code == 0 and err == ""
