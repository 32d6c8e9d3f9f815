"""The `ctxrt` command line contract (DESIGN.md §10): compile, inspect, run; one-line errors, exit 2."""

import json
import subprocess
import sys

import numpy as np
import pytest
from cli_helpers import cli, listing, relu_model


@pytest.fixture
def model(tmp_path):
    return relu_model(tmp_path / "m.onnx")


def test_run_json_has_the_contract_keys(capsys, model) -> None:
    code, out, _ = cli(capsys, "run", model, "--json", "--repeat", "3")
    assert code == 0
    report = json.loads(out)
    assert report["outputs"] == {"y": [8]}
    assert report["latency_ms"] >= 0
    assert report["stats"]["runs"] == 4 and report["stats"]["copies_in"] == 4  # one warm-up run, then 3 timed
    assert {"weights", "spillfill", "lower_bound", "io", "spillfill_saved"} <= set(report["memory"])


def test_run_reads_and_writes_npz(capsys, model, tmp_path) -> None:
    x = np.linspace(-1, 1, 16, dtype=np.float32).reshape(2, 8)
    np.savez(tmp_path / "in.npz", x=x)
    code, _, _ = cli(capsys, "run", model, "--shape", "x=2x8", "--inputs", tmp_path / "in.npz",
                      "--output", tmp_path / "out.npz")
    assert code == 0
    np.testing.assert_array_equal(np.load(tmp_path / "out.npz")["y"], np.maximum(x, 0).reshape(-1))


def test_compile_inspect_run_a_context_binary(capsys, model, tmp_path) -> None:
    ctx = tmp_path / "m.ctx"
    assert cli(capsys, "compile", model, "-o", ctx, "--epcontext")[0] == 0
    assert ctx.exists() and (tmp_path / "m_ctx.onnx").exists()
    code, out, _ = cli(capsys, "inspect", ctx, "--json")
    assert code == 0
    info = json.loads(out)
    for key in ("format_version", "backend", "weights_size", "spillfill_size", "alignment", "graphs"):
        assert key in info
    (g,) = info["graphs"]
    assert g["name"] == "m" and g["spillfill_size"] >= g["lower_bound"] > 0
    assert g["inputs"] == [{"name": "x", "dtype": "<f4", "shape": [1, 8], "mem_type": "raw"}]
    for target in (ctx, tmp_path / "m_ctx.onnx"):
        code, out, _ = cli(capsys, "run", target, "--json")
        assert code == 0 and json.loads(out)["outputs"] == {"y": [8]}
    assert cli(capsys, "inspect", tmp_path / "m_ctx.onnx")[0] == 0


def test_a_context_binary_with_an_empty_batch(capsys, model, tmp_path) -> None:
    ctx = tmp_path / "empty.ctx"
    assert cli(capsys, "compile", model, "-o", ctx, "--shape", "x=0x8")[0] == 0
    (g,) = json.loads(cli(capsys, "inspect", ctx, "--json")[1])["graphs"]
    assert g["inputs"][0]["shape"] == [0, 8]
    code, out, _ = cli(capsys, "run", ctx, "--json")
    assert code == 0 and json.loads(out)["outputs"] == {"y": [0]}


def test_multi_graph_context_with_per_graph_shapes(capsys, model, tmp_path) -> None:
    out = tmp_path / "ab.ctx"
    code, _, err = cli(capsys, "compile", model, model, "-o", out, "--shape", "0:x=1x8", "--shape", "1:x=4x8",
                        "--io-mem-type", "memhandle")
    assert code == 0, err
    info = json.loads(cli(capsys, "inspect", out, "--json")[1])
    assert [(g["name"], g["inputs"][0]["shape"]) for g in info["graphs"]] == [("m_0", [1, 8]), ("m_1", [4, 8])]
    assert info["graphs"][0]["inputs"][0]["mem_type"] == "memhandle"
    code, res, _ = cli(capsys, "run", out, "--graph", "m_1", "--json")
    assert json.loads(res)["outputs"] == {"y": [32]}


def test_console_script_reports_errors_without_traceback(tmp_path) -> None:
    p = subprocess.run([sys.executable, "-m", "ctxrt.cli", "run", str(tmp_path / "nope.onnx")],
                       capture_output=True, text=True)
    assert p.returncode == 2 and "Traceback" not in p.stderr and p.stderr.count("\n") == 1


def test_run_several_models_sharing_spillfill(capsys, tmp_path) -> None:
    small, large = relu_model(tmp_path / "small.onnx", 8), relu_model(tmp_path / "large.onnx", 4096)
    code, out, _ = cli(capsys, "compile", large, "-o", tmp_path / "large.ctx")
    assert code == 0
    args = ["run", small, tmp_path / "large.ctx", "--shape", "x=2x8", "--json"]
    code, out, _ = cli(capsys, *args)  # --shape binds the .onnx model compiled in memory; the .ctx is static
    assert code == 0
    alone = json.loads(out)["memory"]
    code, out, _ = cli(capsys, *args, "--share-spillfill")
    assert code == 0
    report = json.loads(out)
    assert report["outputs"] == {"small.onnx:y": [16], "large.ctx:y": [4096]}
    sizes = [c["spillfill_size"] for c in report["contexts"]]
    assert [c["loaded"] for c in report["contexts"]] == [1, 0]  # the larger one leads
    mem = report["memory"]
    assert mem["spillfill"] == max(sizes) and mem["spillfill_saved"] == min(sizes)
    assert alone["spillfill"] == sum(sizes) and alone["spillfill_saved"] == 0
    code, out, _ = cli(capsys, "run", small, tmp_path / "large.ctx", "--shape", "x=2x8", "--share-spillfill")
    assert code == 0 and "saved by sharing" in out


def test_inspect_memory_and_plot(capsys, model, tmp_path) -> None:
    ctx = tmp_path / "m.ctx"
    assert cli(capsys, "compile", model, "-o", ctx, "--shape", "x=4x8")[0] == 0
    code, out, _ = cli(capsys, "inspect", ctx, "--memory")
    assert code == 0 and "lower bound" in out and "arena/bound" in out
    code, out, _ = cli(capsys, "inspect", ctx, "--memory", "--json")
    mem = json.loads(out)["memory"][0]
    assert set(mem) >= {"name", "weights", "spillfill", "lower_bound", "io"}
    assert mem["io"] == 2 * 4 * 8 * 4 and mem["spillfill"] >= mem["lower_bound"] > 0
    png = tmp_path / "arena.png"
    code, out, _ = cli(capsys, "inspect", ctx, "--plot", png)
    assert code == 0 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_group_usage_errors(capsys, model, tmp_path) -> None:
    code, _, err = cli(capsys, "run", model, model, "--graph", "main", "--shape", "x=1x8")
    assert code == 2 and "--graph applies to a single model" in err


def test_the_same_binary_twice_keeps_both_outputs(capsys, model, tmp_path) -> None:
    assert cli(capsys, "compile", model, "-o", tmp_path / "m.ctx")[0] == 0
    code, out, _ = cli(capsys, "run", tmp_path / "m.ctx", tmp_path / "m.ctx", "--share-spillfill", "--json")
    assert code == 0 and set(json.loads(out)["outputs"]) == {"m.ctx#0:y", "m.ctx#1:y"}


def test_version_and_help(capsys) -> None:
    import ctxrt

    code, out, err = cli(capsys, "--version")
    assert code == 0 and out == f"ctxrt {ctxrt.__version__}\n" and err == ""
    code, out, _ = cli(capsys, "run", "--help")
    assert code == 0 and "--repeat N" in out and "N >= 1" in out


def test_multi_file_compiles_print_what_they_wrote_and_leave_no_temporaries(capsys, model, tmp_path) -> None:
    code, out, err = cli(capsys, "compile", model, "-o", tmp_path / "m.ctx", "--epcontext", "--embed",
                         "--shape", "x=1x8")
    assert code == 0 and err == "" and out == f"wrote {tmp_path / 'm.ctx'} and {tmp_path / 'm_ctx.onnx'}\n"
    code, out, err = cli(capsys, "compile", model, "--split", "2", "-o", tmp_path / "parts", "--shape", "x=1x8")
    assert code == 0 and err == ""
    assert [line.split(":")[0] for line in out.splitlines()] == [
        f"wrote {tmp_path / 'parts' / 'm_part0.ctx'}", f"wrote {tmp_path / 'parts' / 'm_part1.ctx'}",
        f"wrote {tmp_path / 'parts' / 'm_ctx.onnx'}"]
    code, out, _ = cli(capsys, "compile", model, "--split", "3", "-o", tmp_path / "parts")  # into a used folder
    assert code == 0
    assert sorted(listing(tmp_path)) == ["m.ctx", "m.onnx", "m_ctx.onnx", "parts/", "parts/m_ctx.onnx",
                                         "parts/m_part0.ctx", "parts/m_part1.ctx", "parts/m_part2.ctx"]
    code, out, _ = cli(capsys, "run", tmp_path / "parts" / "m_ctx.onnx", "--json")
    assert code == 0 and json.loads(out)["outputs"] == {"y": [8]}


def test_run_output_is_written_at_the_path_given(capsys, model, tmp_path) -> None:
    assert cli(capsys, "run", model, "--output", tmp_path / "o.npz")[0] == 0
    assert sorted(listing(tmp_path)) == ["m.onnx", "o.npz"]


def test_an_epcontext_file_with_two_independent_models(capsys, tmp_path) -> None:
    """Two models in one context, both with an input "x" and an output "logits": each runs on its own, from
    the command line and through InferenceSession(graph=...); tensors of the same name are not chained."""
    import ctxrt

    a, b = relu_model(tmp_path / "a.onnx", 8, "logits"), relu_model(tmp_path / "b.onnx", 16, "logits")
    assert cli(capsys, "compile", a, b, "-o", tmp_path / "ab.ctx", "--epcontext")[0] == 0
    wrapper = tmp_path / "ab_ctx.onnx"
    for graph, n in ((None, 8), ("a", 8), ("b", 16)):
        code, out, _ = cli(capsys, "run", wrapper, "--json", *(["--graph", graph] if graph else []))
        assert code == 0 and json.loads(out)["outputs"] == {"logits": [n]}
        sess = ctxrt.InferenceSession(wrapper, graph=graph)
        assert [(i.name, i.shape) for i in sess.get_inputs()] == [("x", [1, n])]
        x = np.linspace(-1, 1, n, dtype=np.float32).reshape(1, n)
        (y,) = sess.run(None, {"x": x})
        np.testing.assert_array_equal(y, np.maximum(x, 0).reshape(-1))
        sess.close()
    with pytest.raises(ctxrt.CtxrtError, match="no graph 'c'.*'a', 'b'"):
        ctxrt.InferenceSession(wrapper, graph="c")


def test_inspect_memory_verifies_the_weights_like_run(capsys, tmp_path) -> None:
    from cli_helpers import gemm_model

    ctx = tmp_path / "w.ctx"
    assert cli(capsys, "compile", gemm_model(tmp_path / "w.onnx"), "-o", ctx)[0] == 0
    assert cli(capsys, "inspect", ctx, "--memory")[0] == 0
    data = bytearray(ctx.read_bytes())
    data[-10] ^= 0xFF
    ctx.write_bytes(bytes(data))
    assert cli(capsys, "inspect", ctx)[0] == 0  # header and metadata only: the weights are not read
    for argv in (["inspect", ctx, "--memory"], ["run", ctx]):
        code, _, err = cli(capsys, *argv)
        assert code == 2 and "checksum mismatch" in err and str(ctx) in err


def test_a_kernel_that_fails_inside_names_the_op_and_node(capsys, model, monkeypatch) -> None:
    """A kernel factory failing on a case it does not handle (a 1-D Conv unpacking a 4-D shape, say) is one
    line naming the op, the node and its input shapes."""
    from ctxrt.backends.cpu.registry import KERNELS

    def fails(spec):
        n, c, h, w = spec.inputs[0].shape
    monkeypatch.setitem(KERNELS, "Relu", fails)
    code, out, err = cli(capsys, "run", model)
    assert code == 2 and err.count("\n") == 1 and "Relu node 'relu_a'" in err and "(1, 8)" in err


def test_unexpected_failures_are_one_line_too(capsys, model, monkeypatch) -> None:
    import ctxrt.cli

    class ArrayMemoryError(MemoryError):  # like numpy's: not made from a message alone
        def __init__(self, shape, dtype):
            super().__init__(f"Unable to allocate 2.91 TiB for an array with shape {shape}")

    def boom(*_, **__):
        raise ArrayMemoryError((3200000000064,), "uint8")
    monkeypatch.setattr(ctxrt, "compile", boom)
    code, _, err = cli(capsys, "run", model)
    assert code == 2 and err == (f"ctxrt: error: not enough memory: {model}: Unable to allocate 2.91 TiB for an "
                                 "array with shape (3200000000064,)\n")
    monkeypatch.undo()

    def bug(*_):
        raise TypeError("'NoneType' object is not subscriptable")
    monkeypatch.setattr(ctxrt.cli, "random_feeds", bug)
    code, _, err = cli(capsys, "run", model)
    assert code == 1 and err.count("\n") == 1 and err.startswith("ctxrt: internal error") and "TypeError" in err


def test_a_reader_that_leaves_early_is_not_an_error(model, tmp_path) -> None:
    """`ctxrt inspect ... | head -1`: stdout closes early; no error line, no 'Exception ignored' noise."""
    subprocess.run([sys.executable, "-m", "ctxrt.cli", "compile", str(model), "-o", str(tmp_path / "m.ctx")],
                   check=True, capture_output=True)
    child = subprocess.Popen([sys.executable, "-m", "ctxrt.cli", "inspect", str(tmp_path / "m.ctx")],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    child.stdout.close()
    assert child.wait() == 141 and child.stderr.read() == b""
