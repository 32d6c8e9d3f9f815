"""Helpers of the command-line tests: small models, running `ctxrt` in process, and the check every
failing command must pass (one line on stderr, exit 2, nothing written)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from ctxrt.cli import main


def relu_model(path: Path, n: int = 8, out: str = "y", batch: int | str = "N") -> Path:
    """x[batch, n] -> Relu -> Reshape(-1) -> Relu -> out (batch dynamic unless given as a number)."""
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="relu_a"), helper.make_node("Reshape", ["a", "s"], ["b"]),
             helper.make_node("Relu", ["b"], [out], name="relu_out")]
    g = helper.make_graph(nodes, "t", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, n])],
                          [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(np.array([-1], np.int64), "s")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path


def gemm_model(path: Path) -> Path:
    """x[1, 64] @ W[64, 256] + b: a model with a weights section worth flipping a byte in."""
    rng = np.random.default_rng(0)
    g = helper.make_graph([helper.make_node("Gemm", ["x", "w", "b"], ["y"], name="fc")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 256])],
                          [numpy_helper.from_array(rng.standard_normal((64, 256)).astype(np.float32), "w"),
                           numpy_helper.from_array(rng.standard_normal(256).astype(np.float32), "b")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path


def cli(capsys: pytest.CaptureFixture[str], *argv: object) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def listing(root: Path) -> dict[str, bytes | None]:
    """Every file and folder under `root`, hidden ones too, with file contents (None for folders)."""
    found: dict[str, bytes | None] = {}
    for folder, dirs, files in os.walk(root):
        for d in dirs:
            found[os.path.relpath(os.path.join(folder, d), root) + "/"] = None
        for f in files:
            p = os.path.join(folder, f)
            found[os.path.relpath(p, root)] = Path(p).read_bytes() if os.path.isfile(p) else None
    return found


def assert_one_line_error(code: int, out: str, err: str, *needles: str) -> None:
    """Exit 2, nothing on stdout, exactly one line on stderr naming what the user gave, no traceback and no
    temporary file name."""
    assert code == 2, (code, err)
    assert out == "", out
    assert err.startswith("ctxrt: error: ") and err.endswith("\n") and err.count("\n") == 1, err
    assert "Traceback" not in err and ".tmp" not in err, err
    for needle in needles:
        assert needle in err, (needle, err)


def on_a_terminal(cwd: Path, *argv: str, timeout: float = 300) -> tuple[int, str, str]:
    """Run `ctxrt ARGV` with stderr on a pseudo-terminal of 160 columns: (exit status, stdout, what the
    terminal showed)."""
    import fcntl
    import pty
    import select
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 160, 0, 0))
    child = subprocess.Popen([sys.executable, "-m", "ctxrt.cli", *argv], cwd=cwd, stdout=subprocess.PIPE,
                             stderr=slave, text=True)
    os.close(slave)
    shown = b""
    try:
        while True:
            ready, _, _ = select.select([master], [], [], timeout)
            assert ready, f"no output and no end in {timeout} s"
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the child closed the terminal (EIO on Linux)
                break
            if not chunk:
                break
            shown += chunk
    finally:
        os.close(master)
    out = child.stdout.read()  # type: ignore[union-attr]
    return child.wait(), out, shown.decode(errors="replace")
