"""What a plain `pip install ctxrt` gives: oneDNN's kernels on Linux x86-64 (a default dependency, no extra),
NumPy's elsewhere, and `ctxrt devices` saying which."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

import ctxrt
from ctxrt.backends.cpu.backend import CpuBackend
from ctxrt.cli import main

REPO = Path(__file__).resolve().parents[2]
LINUX_X86 = sys.platform == "linux" and platform.machine() == "x86_64"


def test_a_plain_install_brings_onednn_on_linux_x86_64(tmp_path: Path) -> None:
    """pip resolves `pip install .` (no extras, nothing installed) to a set that holds onednn-cpu-gomp."""
    report = tmp_path / "report.json"
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
                           "--report", str(report), str(REPO)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    names = {item["metadata"]["name"].lower() for item in json.loads(report.read_text())["install"]}
    assert {"ctxrt", "numpy", "onnx"} <= names
    assert ("onednn-cpu-gomp" in names) == LINUX_X86, names


def _conv_model(path: Path) -> Path:
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((32, 16, 3, 3)).astype(np.float32), "w")
    w2 = numpy_helper.from_array(rng.standard_normal((32, 32, 3, 3)).astype(np.float32) * 0.1, "w2")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Conv", ["r", "w2"], ["y"], pads=[1, 1, 1, 1])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 32, 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32, 32, 32])],
                              initializer=[w, w2])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


@pytest.mark.skipif(not LINUX_X86, reason="oneDNN's wheel exists for Linux x86-64 only")
def test_the_default_cpu_backend_runs_onednn_and_numpy_gives_the_same_outputs(tmp_path: Path,
                                                                            capsys: pytest.CaptureFixture[str]) -> None:
    model = _conv_model(tmp_path / "conv.onnx")
    x = np.random.default_rng(1).standard_normal((1, 16, 32, 32)).astype(np.float32)
    fast = ctxrt.compile(str(model))
    slow = ctxrt.compile(str(model), backend=CpuBackend(onednn=False))
    assert CpuBackend.describe()["provider"].startswith("oneDNN 3.")
    y_fast, y_slow = fast.graph().run({"x": x})["y"], slow.graph().run({"x": x})["y"]
    (want,) = onnxruntime.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    tol = 1e-4 * np.abs(want).max() + 1e-5  # the tests' bar for every model (NumPy's 3x3 convs are Winograd's)
    assert np.abs(y_fast - want).max() <= tol and np.abs(y_slow - want).max() <= tol
    fast.free()
    slow.free()
    assert main(["compile", str(model), "-o", str(tmp_path / "conv.ctx")]) == 0
    capsys.readouterr()
    assert main(["inspect", str(tmp_path / "conv.ctx"), "--kernels", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    algorithms = {k["algorithm"] for g in report["kernels"] for k in g["kernels"]}
    assert any("onednn" in a for a in algorithms), algorithms
    assert main(["devices"]) == 0
    assert "kernels: oneDNN 3." in capsys.readouterr().out
