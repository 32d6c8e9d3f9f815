"""The `ctxrt` command line contract (DESIGN.md §10): compile, inspect, run; one-line errors, exit 2."""

import json
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from ctxrt.cli import main


def _relu_model(path, n=8):
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Reshape", ["a", "s"], ["b"]),
             helper.make_node("Relu", ["b"], ["y"])]
    g = helper.make_graph(nodes, "t", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", n])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(np.array([-1], np.int64), "s")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path


@pytest.fixture
def model(tmp_path):
    return _relu_model(tmp_path / "m.onnx")


def _run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_run_json_has_the_contract_keys(capsys, model) -> None:
    code, out, _ = _run(capsys, "run", model, "--json", "--repeat", "3")
    assert code == 0
    report = json.loads(out)
    assert report["outputs"] == {"y": [8]}
    assert report["latency_ms"] >= 0
    assert report["stats"]["runs"] == 4 and report["stats"]["copies_in"] == 4  # one warm-up run, then 3 timed
    assert {"weights", "spillfill", "lower_bound", "io", "spillfill_saved"} <= set(report["memory"])


def test_run_reads_and_writes_npz(capsys, model, tmp_path) -> None:
    x = np.linspace(-1, 1, 16, dtype=np.float32).reshape(2, 8)
    np.savez(tmp_path / "in.npz", x=x)
    code, _, _ = _run(capsys, "run", model, "--shape", "x=2x8", "--inputs", tmp_path / "in.npz",
                      "--output", tmp_path / "out.npz")
    assert code == 0
    np.testing.assert_array_equal(np.load(tmp_path / "out.npz")["y"], np.maximum(x, 0).reshape(-1))


def test_compile_inspect_run_a_context_binary(capsys, model, tmp_path) -> None:
    ctx = tmp_path / "m.ctx"
    assert _run(capsys, "compile", model, "-o", ctx, "--epcontext")[0] == 0
    assert ctx.exists() and (tmp_path / "m_ctx.onnx").exists()
    code, out, _ = _run(capsys, "inspect", ctx, "--json")
    assert code == 0
    info = json.loads(out)
    for key in ("format_version", "backend", "weights_size", "spillfill_size", "alignment", "graphs"):
        assert key in info
    (g,) = info["graphs"]
    assert g["name"] == "m" and g["spillfill_size"] >= g["lower_bound"] > 0
    assert g["inputs"] == [{"name": "x", "dtype": "<f4", "shape": [1, 8], "mem_type": "raw"}]
    for target in (ctx, tmp_path / "m_ctx.onnx"):
        code, out, _ = _run(capsys, "run", target, "--json")
        assert code == 0 and json.loads(out)["outputs"] == {"y": [8]}
    assert _run(capsys, "inspect", tmp_path / "m_ctx.onnx")[0] == 0


def test_multi_graph_context_with_per_graph_shapes(capsys, model, tmp_path) -> None:
    out = tmp_path / "ab.ctx"
    code, _, err = _run(capsys, "compile", model, model, "-o", out, "--shape", "0:x=1x8", "--shape", "1:x=4x8",
                        "--io-mem-type", "memhandle")
    assert code == 0, err
    info = json.loads(_run(capsys, "inspect", out, "--json")[1])
    assert [(g["name"], g["inputs"][0]["shape"]) for g in info["graphs"]] == [("m_0", [1, 8]), ("m_1", [4, 8])]
    assert info["graphs"][0]["inputs"][0]["mem_type"] == "memhandle"
    code, res, _ = _run(capsys, "run", out, "--graph", "m_1", "--json")
    assert json.loads(res)["outputs"] == {"y": [32]}


@pytest.mark.parametrize("argv, message", [
    (["run", "missing.onnx"], "no such model file"),
    (["run", "{model}", "--shape", "x=banana"], "--shape expects"),
    (["run", "{model}", "--shape", "zz=1x8"], "unknown inputs"),
    (["run", "{model}", "--inputs", "nothere.npz"], "cannot read inputs"),
    (["inspect", "{bad}"], ""),
    (["compile", "{model}"], "required"),
    (["frobnicate"], "invalid choice"),
])
def test_bad_input_is_one_line_exit_2(capsys, model, tmp_path, argv, message) -> None:
    bad = tmp_path / "bad.ctx"
    bad.write_bytes(b"CTXRTBIN" + b"\x00" * 10)
    code, out, err = _run(capsys, *[a.format(model=model, bad=bad) for a in argv])
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("ctxrt: error:") and message in err
    assert "Traceback" not in err


def test_console_script_reports_errors_without_traceback(tmp_path) -> None:
    p = subprocess.run([sys.executable, "-m", "ctxrt.cli", "run", str(tmp_path / "nope.onnx")],
                       capture_output=True, text=True)
    assert p.returncode == 2 and "Traceback" not in p.stderr and p.stderr.count("\n") == 1


def test_run_several_models_sharing_spillfill(capsys, tmp_path) -> None:
    small, large = _relu_model(tmp_path / "small.onnx", 8), _relu_model(tmp_path / "large.onnx", 4096)
    code, out, _ = _run(capsys, "compile", large, "-o", tmp_path / "large.ctx")
    assert code == 0
    args = ["run", small, tmp_path / "large.ctx", "--shape", "x=2x8", "--json"]
    code, out, _ = _run(capsys, *args)  # --shape binds the .onnx model compiled in memory; the .ctx is static
    assert code == 0
    alone = json.loads(out)["memory"]
    code, out, _ = _run(capsys, *args, "--share-spillfill")
    assert code == 0
    report = json.loads(out)
    assert report["outputs"] == {"small.onnx:y": [16], "large.ctx:y": [4096]}
    sizes = [c["spillfill_size"] for c in report["contexts"]]
    assert [c["loaded"] for c in report["contexts"]] == [1, 0]  # the larger one leads
    mem = report["memory"]
    assert mem["spillfill"] == max(sizes) and mem["spillfill_saved"] == min(sizes)
    assert alone["spillfill"] == sum(sizes) and alone["spillfill_saved"] == 0
    code, out, _ = _run(capsys, "run", small, tmp_path / "large.ctx", "--shape", "x=2x8", "--share-spillfill")
    assert code == 0 and "saved by sharing" in out


def test_inspect_memory_and_plot(capsys, model, tmp_path) -> None:
    ctx = tmp_path / "m.ctx"
    assert _run(capsys, "compile", model, "-o", ctx, "--shape", "x=4x8")[0] == 0
    code, out, _ = _run(capsys, "inspect", ctx, "--memory")
    assert code == 0 and "lower bound" in out and "arena/bound" in out
    code, out, _ = _run(capsys, "inspect", ctx, "--memory", "--json")
    mem = json.loads(out)["memory"][0]
    assert set(mem) >= {"name", "weights", "spillfill", "lower_bound", "io"}
    assert mem["io"] == 2 * 4 * 8 * 4 and mem["spillfill"] >= mem["lower_bound"] > 0
    png = tmp_path / "arena.png"
    code, out, _ = _run(capsys, "inspect", ctx, "--plot", png)
    assert code == 0 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_group_usage_errors(capsys, model, tmp_path) -> None:
    code, _, err = _run(capsys, "run", model, model, "--graph", "main", "--shape", "x=1x8")
    assert code == 2 and "--graph applies to a single model" in err


def test_the_same_binary_twice_keeps_both_outputs(capsys, model, tmp_path) -> None:
    assert _run(capsys, "compile", model, "-o", tmp_path / "m.ctx")[0] == 0
    code, out, _ = _run(capsys, "run", tmp_path / "m.ctx", tmp_path / "m.ctx", "--share-spillfill", "--json")
    assert code == 0 and set(json.loads(out)["outputs"]) == {"m.ctx#0:y", "m.ctx#1:y"}
