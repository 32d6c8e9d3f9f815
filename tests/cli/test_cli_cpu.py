"""The CPU options of the command line: run --threads and --repeat, compile --prefer, inspect --kernels."""

import json

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ctxrt.cli import main


def _conv_model(path):
    rng = np.random.default_rng(0)
    inits = {"w1": rng.standard_normal((32, 3, 3, 3)).astype(np.float32) / 5,
             "w2": rng.standard_normal((64, 32, 3, 3)).astype(np.float32) / 17}
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["a"], ["r"]),
             helper.make_node("Conv", ["r", "w2"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("GlobalAveragePool", ["c"], ["y"])]
    g = helper.make_graph(nodes, "t", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 40, 40])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path


def _run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_run_threads_and_repeat_with_a_warm_up(capsys, tmp_path) -> None:
    model = _conv_model(tmp_path / "m.onnx")
    code, out, err = _run(capsys, "run", model, "--threads", "1", "--repeat", "2", "--json")
    assert code == 0, err
    assert json.loads(out)["stats"]["runs"] == 3  # one untimed warm-up, two timed (median reported)
    code, _, err = _run(capsys, "run", model, "--threads", "-1")
    assert code == 2 and "--threads: expected a whole number >= 0" in err


def test_compile_prefer_memory_and_inspect_kernels(capsys, tmp_path) -> None:
    model = _conv_model(tmp_path / "m.onnx")
    sizes = {}
    for prefer in ("speed", "memory"):
        out = tmp_path / f"{prefer}.ctx"
        assert _run(capsys, "compile", model, "-o", out, "--prefer", prefer)[0] == 0
        code, text, _ = _run(capsys, "inspect", out, "--kernels", "--json")
        assert code == 0
        (g,) = json.loads(text)["kernels"]
        sizes[prefer] = json.loads(text)["weights_size"]
        assert {k["op"] for k in g["kernels"]} >= {"Conv", "GlobalAveragePool"}
        assert [(r["from"], r["to"]) for r in g["reorders"]] == [("nchw", "nhwc")]  # oneDNN's chain: the input
    assert sizes["memory"] <= sizes["speed"]
    code, text, _ = _run(capsys, "inspect", tmp_path / "speed.ctx", "--kernels")
    assert code == 0 and "reorder at step 0: x nchw -> nhwc" in text and "onednn:conv" in text


def test_compile_prefer_rejects_other_values(capsys, tmp_path) -> None:
    code, _, err = _run(capsys, "compile", _conv_model(tmp_path / "m.onnx"), "-o", tmp_path / "m.ctx",
                        "--prefer", "fast")
    assert code == 2 and "invalid choice" in err


def test_run_outputs_do_not_depend_on_threads(capsys, tmp_path) -> None:
    model = _conv_model(tmp_path / "m.onnx")
    for n in ("1", "2"):
        assert _run(capsys, "run", model, "--threads", n, "--output", tmp_path / f"{n}.npz")[0] == 0
    np.testing.assert_allclose(np.load(tmp_path / "1.npz")["y"], np.load(tmp_path / "2.npz")["y"], rtol=1e-5)


def test_run_a_range_program_on_inputs_of_any_shape_inside_its_ranges(capsys, tmp_path) -> None:
    """`ctxrt run prog.ctx --inputs` of a program compiled with `--dim`: feeds of any shape inside the ranges run
    (outputs of their shapes, equal to onnxruntime's); a shape outside is one line naming the dim, exit 2; another
    rank or dtype is refused before the run."""
    import onnxruntime as ort
    from cli_helpers import assert_one_line_error, relu_model

    model = relu_model(tmp_path / "m.onnx")
    prog = tmp_path / "m.ctx"
    code, _, err = _run(capsys, "compile", model, "-o", prog, "--dim", "N=1:16")
    assert code == 0, err
    ref = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    for n in (1, 5, 16):
        x = np.random.default_rng(n).standard_normal((n, 8)).astype(np.float32)
        np.savez(tmp_path / "in.npz", x=x)
        code, out, err = _run(capsys, "run", prog, "--inputs", tmp_path / "in.npz", "--output", tmp_path / "out.npz",
                              "--json")
        assert code == 0, err
        assert json.loads(out)["outputs"] == {"y": [n * 8]}
        with np.load(tmp_path / "out.npz") as got:
            np.testing.assert_array_equal(got["y"], ref.run(None, {"x": x})[0])
    for bad, needles in ((np.zeros((17, 8), np.float32), ("'N'", "17", "1..16")),
                         (np.zeros((4, 8, 1), np.float32), ("'x'", "float32[4, 8, 1]")),
                         (np.zeros((4, 8), np.float64), ("'x'", "float64"))):
        np.savez(tmp_path / "in.npz", x=bad)
        assert_one_line_error(*_run(capsys, "run", prog, "--inputs", tmp_path / "in.npz"), *needles)
