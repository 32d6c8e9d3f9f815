"""Dynamic dimensions and value inputs (DESIGN.md §9b): sessions compile one variant per set of shapes and
values of value inputs; `ctxrt compile --value` bakes a value in; a binary run with another value is an error."""

from __future__ import annotations

import json
import re

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

import ctxrt
from ctxrt.cli import main as cli
from ctxrt.errors import ShapeError, UnsupportedOpError, ValueInputError

RNG = np.random.default_rng(0)


def vi(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def save(tmp_path, nodes, inputs, outputs, inits=None, name="m.onnx"):
    g = helper.make_graph(nodes, "g", inputs, outputs,
                          [numpy_helper.from_array(np.asarray(v), k) for k, v in (inits or {}).items()])
    path = tmp_path / name
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path


def ort_run(path, feeds):
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)


def cli_run(capsys, *argv):
    code = cli([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def mlp(tmp_path):
    """y = relu(x @ w1) @ w2 with x[batch, 8]: the batch is the only dynamic dim."""
    w1, w2 = RNG.standard_normal((8, 16)).astype(np.float32), RNG.standard_normal((16, 4)).astype(np.float32)
    return save(tmp_path, [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
                           helper.make_node("MatMul", ["r", "w2"], ["y"])],
                [vi("x", T.FLOAT, ["batch", 8])], [vi("y", T.FLOAT, ["batch", 4])], {"w1": w1, "w2": w2})


@pytest.fixture
def reshaper(tmp_path):
    """y = reshape(x, shape) * 2, then unsqueezed at `axes`: two value inputs, one through a Concat."""
    nodes = [helper.make_node("Concat", ["lead", "rest"], ["shape"], axis=0),
             helper.make_node("Reshape", ["x", "shape"], ["r"]), helper.make_node("Mul", ["r", "two"], ["m"]),
             helper.make_node("Unsqueeze", ["m", "axes"], ["y"])]
    return save(tmp_path, nodes, [vi("x", T.FLOAT, [4, 6]), vi("rest", T.INT64, [1]), vi("axes", T.INT64, [1])],
                [vi("y", T.FLOAT, None)], {"lead": np.array([-1], np.int64), "two": np.float32(2)})


def feeds(rest, axes):
    return {"x": np.arange(24, dtype=np.float32).reshape(4, 6), "rest": np.array([rest], np.int64),
            "axes": np.array([axes], np.int64)}


def test_session_compiles_once_for_every_batch_size_and_shows_symbolic_dims(mlp) -> None:
    theirs = ort.InferenceSession(str(mlp), providers=["CPUExecutionProvider"])
    with ctxrt.InferenceSession(mlp) as sess:
        assert [i.shape for i in sess.get_inputs()] == [["batch", 8]]
        assert [o.shape for o in sess.get_outputs()] == [["batch", 4]]
        for batch in (1, 3, 1, 3):
            x = RNG.standard_normal((batch, 8)).astype(np.float32)
            want = theirs.run(None, {"x": x})[0]
            got = sess.run(None, {"x": x})[0]
            assert got.shape == (batch, 4)
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())
        assert sess.stats["shape_variants_compiled"] == 1  # one range program for every batch size


def test_compile_binds_an_unbound_dim_to_one_and_says_so(capsys, mlp, tmp_path) -> None:
    out = tmp_path / "m.ctx"
    code, _, err = cli_run(capsys, "compile", mlp, "-o", out)
    assert code == 0
    assert err.count("\n") == 1 and "input 'x' axis 0 (batch)" in err and "bound to 1" in err
    assert ctxrt.read_metadata(out)["graphs"][0]["inputs"][0]["shape"] == [1, 8]
    code, _, err = cli_run(capsys, "compile", mlp, "-o", out, "--shape", "x=5x8")
    assert code == 0 and err == ""


def test_a_compile_failing_at_a_dim_bound_to_one_says_so_in_its_error_line(capsys, tmp_path) -> None:
    # reflect padding needs an axis longer than 1: the error alone would not tell the user why it is 1
    path = save(tmp_path, [helper.make_node("Pad", ["x", "pads"], ["y"], mode="reflect")],
                [vi("x", T.FLOAT, [1, "n"])], [vi("y", T.FLOAT, None)], {"pads": np.array([0, 1, 0, 1], np.int64)})
    code, _, err = cli_run(capsys, "compile", path, "-o", tmp_path / "m.ctx")
    assert code == 2 and err.count("\n") == 1
    assert "reflect" in err and "note: dynamic dims bound to 1: input 'x' axis 1 (n)" in err
    assert not (tmp_path / "m.ctx").exists()


def test_value_inputs_are_found_through_computation_and_named_when_missing(reshaper) -> None:
    with pytest.raises(ValueInputError, match="input 'rest' is needed at compile time.*Reshape.*--value rest=") as e:
        ctxrt.compile(reshaper)
    assert set(e.value.names) == {"rest", "axes"}


def test_compile_with_values_bakes_them_in_and_checks_them_at_run(reshaper) -> None:
    ctx = ctxrt.compile(reshaper, values={"rest": [3], "axes": [1]})
    g = ctx.graph()
    assert sorted(g.value_inputs) == ["axes", "rest"]
    got = g.run(feeds(3, 1))["y"]
    np.testing.assert_array_equal(got, ort_run(reshaper, feeds(3, 1))[0])
    with pytest.raises(ShapeError, match=r"input 'rest' is a value input compiled for \[3\]; got \[2\]"):
        g.run(feeds(2, 1))
    with pytest.raises(ShapeError, match="does not convert exactly"):
        ctxrt.compile(reshaper, values={"rest": [1.5], "axes": [1]})
    with pytest.raises(ShapeError, match="unknown inputs"):
        ctxrt.compile(reshaper, values={"nope": [1]})


def test_cli_value_inspect_and_run(capsys, reshaper, tmp_path) -> None:
    out = tmp_path / "r.ctx"
    code, _, err = cli_run(capsys, "compile", reshaper, "-o", out, "--value", "rest=8", "--value", "axes=0")
    assert code == 0, err
    code, text, _ = cli_run(capsys, "inspect", out)
    assert "rest: <i8[1] (raw, value input compiled for [8])" in text
    code, text, _ = cli_run(capsys, "inspect", out, "--json")
    assert json.loads(text)["graphs"][0]["value_inputs"] == {"rest": [8], "axes": [0]}
    code, text, _ = cli_run(capsys, "run", out, "--json")  # random inputs: value inputs get their value
    assert code == 0 and json.loads(text)["outputs"] == {"y": [1, 3, 8]}
    np.savez(tmp_path / "bad.npz", **feeds(6, 0))
    code, _, err = cli_run(capsys, "run", out, "--inputs", tmp_path / "bad.npz")
    assert code == 2 and err.count("\n") == 1 and "compiled for [8]; got [6]" in err
    code, _, err = cli_run(capsys, "compile", reshaper, "-o", out, "--value", "rest=x")
    assert code == 2 and "--value expects" in err
    code, _, err = cli_run(capsys, "compile", reshaper, "-o", out)
    assert code == 2 and err.count("\n") == 1 and "--value rest=" in err


def test_run_onnx_with_inputs_compiles_for_their_values(capsys, reshaper, tmp_path) -> None:
    for rest, axes in ((3, 0), (2, 2)):
        np.savez(tmp_path / "in.npz", **feeds(rest, axes))
        code, _, err = cli_run(capsys, "run", reshaper, "--inputs", tmp_path / "in.npz", "--output", tmp_path / "o.npz")
        assert code == 0, err
        with np.load(tmp_path / "o.npz") as o:
            np.testing.assert_array_equal(o["y"], ort_run(reshaper, feeds(rest, axes))[0])


def test_session_keys_variants_on_values(reshaper, tmp_path) -> None:
    for cache_dir in (None, tmp_path / "cache", tmp_path / "cache"):
        with ctxrt.InferenceSession(reshaper, cache_dir=cache_dir, max_shape_variants=2) as sess:
            for rest, axes in ((3, 0), (2, 1), (3, 0), (6, 2)):
                got = sess.run(None, feeds(rest, axes))[0]
                np.testing.assert_array_equal(got, ort_run(reshaper, feeds(rest, axes))[0])
            s = sess.stats
            assert s["shape_variants_compiled"] == 3 and s["shape_variants_freed"] == 1
            if cache_dir is not None:
                hits = s["compile_cache_hits"]
    assert hits == 3  # the second session found every variant in the cache


def test_a_shape_computed_from_data_is_refused_with_its_node(tmp_path) -> None:
    path = save(tmp_path, [helper.make_node("ArgMax", ["x"], ["k"], keepdims=0),
                           helper.make_node("Unsqueeze", ["k", "zero"], ["s"]),
                           helper.make_node("Reshape", ["x", "s"], ["y"], name="rs")],
                [vi("x", T.FLOAT, [6])], [vi("y", T.FLOAT, None)], {"zero": np.array([0], np.int64)})
    with pytest.raises(UnsupportedOpError, match=r"Reshape node 'rs': input 'shape' \('s'\) is computed at run time"):
        ctxrt.compile(path)


def test_a_window_larger_than_its_padded_input_is_a_shape_error(capsys, tmp_path) -> None:
    """A Conv whose kernel exceeds its padded input (onnx infers a negative dim): one ShapeError naming the value
    and its node, from the API and as the CLI's one line (exit 2), not an arena planner's error."""
    w = numpy_helper.from_array(np.ones((4, 3, 7, 7), np.float32), "w")
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], name="too_wide")], "g",
                              [helper.make_tensor_value_info("x", T.FLOAT, [1, 3, 5, 5])],
                              [helper.make_tensor_value_info("y", T.FLOAT, None)], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(ShapeError, match=r"'y' made by node 'too_wide' \(Conv\) would have the negative shape"):
        ctxrt.compile(model)
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    assert cli(["run", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "negative shape" in err[0], err


def test_a_fold_reinfers_only_the_nodes_it_left_untyped(monkeypatch) -> None:
    """A Reshape whose target is computed through Cast and Div (which onnx's data propagation does not follow) stays
    untyped until that chain is folded; the inference after the fold takes the Reshape, what follows it and the
    int64 chain of its target, not the activations before it (given as inputs of their static types): no second
    inference of the whole graph (PP-OCR's recognizer: a probe read 40 -> 28 ms). Outputs match onnxruntime."""
    from harness import spy

    from ctxrt.frontend.onnx import Folder

    nodes = [helper.make_node("Relu" if k % 2 else "Sigmoid", [f"a{k}"], [f"a{k + 1}"]) for k in range(40)]
    nodes += [helper.make_node("Shape", ["a40"], ["s"]), helper.make_node("Gather", ["s", "two"], ["h"]),
              helper.make_node("Cast", ["h"], ["hf"], to=T.FLOAT), helper.make_node("Div", ["hf", "half"], ["d"]),
              helper.make_node("Cast", ["d"], ["di"], to=T.INT64),
              helper.make_node("Concat", ["one", "di", "minus1"], ["to"], axis=0),
              helper.make_node("Reshape", ["a40", "to"], ["r"]), helper.make_node("Relu", ["r"], ["y"])]
    inits = {"two": np.array([2], np.int64), "half": np.array([0.5], np.float32),
             "one": np.array([1], np.int64), "minus1": np.array([-1], np.int64)}
    g = helper.make_graph(nodes, "g", [vi("a0", T.FLOAT, [1, 3, 8, 8])], [vi("y", T.FLOAT, None)],
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    whole = spy(monkeypatch, Folder, "infer")
    x = RNG.standard_normal((1, 3, 8, 8)).astype(np.float32)
    with ctxrt.compile(m) as ctx:
        got = ctx.graph().run({"a0": x})["y"]
    assert len(whole) == 1  # the first inference only
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"a0": x})[0]
    assert got.shape == want.shape == (1, 16, 12)
    np.testing.assert_allclose(got, want, rtol=1e-6)


def _counted(tmp_path):
    """y = arange(n) * s, one_hot(idx, depth), top_k(x, k): integer value inputs of one element (a scalar int64,
    a scalar int32, a [1] int64) whose values decide the outputs' shapes."""
    nodes = [helper.make_node("Range", ["zero", "n", "one"], ["r"]),
             helper.make_node("Cast", ["r"], ["rf"], to=T.FLOAT), helper.make_node("Mul", ["rf", "s"], ["y"]),
             helper.make_node("OneHot", ["idx", "depth", "vals"], ["oh"], axis=-1),
             helper.make_node("TopK", ["x", "k"], ["tv", "ti"], axis=-1)]
    return save(tmp_path, nodes, [vi("n", T.INT64, []), vi("s", T.FLOAT, []), vi("idx", T.INT64, ["b"]),
                                  vi("depth", T.INT32, []), vi("x", T.FLOAT, ["b", 64]), vi("k", T.INT64, [1])],
                [vi("y", T.FLOAT, None), vi("oh", T.FLOAT, None), vi("tv", T.FLOAT, None), vi("ti", T.INT64, None)],
                {"zero": np.int64(0), "one": np.int64(1), "vals": np.array([0, 1], np.float32)})


def _counted_feeds(n, depth, k, b, seed=0):
    rng = np.random.default_rng(seed)
    return {"n": np.array(n, np.int64), "s": np.array(1.5, np.float32), "idx": rng.integers(0, depth, b),
            "depth": np.array(depth, np.int32), "x": rng.standard_normal((b, 64)).astype(np.float32),
            "k": np.array([k], np.int64)}


def test_value_inputs_met_with_other_values_are_ranged_as_lengths(tmp_path) -> None:
    """Range's limit, OneHot's depth and TopK's K change every call: the first call compiles for its values, the
    second one range program over them (each input the length of a carrier, docs/shapes-and-control-flow.md), and
    every later value inside (or after one widening) runs on it, through run and through an IOBinding."""
    path = _counted(tmp_path)
    theirs = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    cases = [(0, 5, 3, 2), (9, 9, 7, 3), (3, 12, 1, 1), (17, 3, 12, 2), (30, 30, 12, 5), (5, 7, 2, 2), (60, 2, 40, 4)]
    for cache_dir in (None, tmp_path / "cache", tmp_path / "cache"):
        with ctxrt.InferenceSession(path, cache_dir=cache_dir) as sess:
            for i, case in enumerate(cases):
                f = _counted_feeds(*case, seed=i)
                want = theirs.run(None, f)
                binding = sess.io_binding()
                for name, v in f.items():
                    binding.bind_input(name, v)
                for out in ("y", "oh", "tv", "ti"):
                    binding.bind_output(out)
                sess.run_with_iobinding(binding)
                for got in (sess.run(None, f), binding.copy_outputs_to_cpu()):
                    for g, w in zip(got, want, strict=True):
                        assert g.shape == w.shape
                        np.testing.assert_allclose(g, w, rtol=1e-6)
            s = sess.stats
            # exact values, then one range program over n, depth and K, widened once (n 60, K 40)
            assert s["shape_variants_compiled"] == 3 and s["value_inputs_ranged"] == 3, dict(s)
            assert s["range_programs_compiled"] == 3
    assert s["compile_cache_hits"] == 3  # the second session found each in the cache


def test_a_value_input_that_cannot_be_a_length_stays_compiled_per_value(reshaper) -> None:
    """Reshape's shape (24 / rest rows: no polynomial) and Unsqueeze's axes (another rank) cannot be ranged: the
    attempt fails once, and those inputs are compiled per value from then on, with the right outputs."""
    with ctxrt.InferenceSession(reshaper) as sess:
        for rest, axes in ((3, 0), (2, 1), (3, 0), (6, 2), (4, 1)):
            got = sess.run(None, feeds(rest, axes))[0]
            np.testing.assert_array_equal(got, ort_run(reshaper, feeds(rest, axes))[0])
        assert sess._carry_failed == {"rest", "axes"} and sess.stats["value_inputs_ranged"] == 0


def test_elements_of_value_inputs_are_ranged_and_one_that_is_a_dim_follows_it(tmp_path) -> None:
    """Resize's sizes [1, 3, H, W] and a Reshape's target [b, 8, 8] change every call: H and W become dims of
    their own, the target's first element is the batch of `z` (equal at every compile: one dim), the fixed
    elements stay constants checked at each run; 7 calls, 3 compiles (exact values, one range program, one
    widening). A later target whose first element is not the batch gets a program of its own."""
    nodes = [helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], mode="nearest"),
             helper.make_node("Reshape", ["z", "shape"], ["r"]), helper.make_node("Relu", ["r"], ["w"])]
    path = save(tmp_path, nodes, [vi("x", T.FLOAT, [1, 3, 16, 16]), vi("sizes", T.INT64, [4]),
                                  vi("z", T.FLOAT, ["b", 64]), vi("shape", T.INT64, [3])],
                [vi("y", T.FLOAT, None), vi("w", T.FLOAT, None)])
    rng = np.random.default_rng(0)

    def feeds(h, w, b, lead=None):
        return {"x": rng.standard_normal((1, 3, 16, 16)).astype(np.float32),
                "sizes": np.array([1, 3, h, w], np.int64), "z": rng.standard_normal((b, 64)).astype(np.float32),
                "shape": np.array([lead, b * 8 // lead, 8] if lead else [b, 8, 8], np.int64)}
    with ctxrt.InferenceSession(path) as sess:
        for h, w, b in [(8, 8, 1), (20, 12, 2), (31, 5, 3), (16, 16, 4), (40, 9, 1), (3, 33, 7), (64, 64, 2)]:
            f = feeds(h, w, b)
            for got, want in zip(sess.run(None, f), ort_run(path, f), strict=True):
                assert got.shape == want.shape
                np.testing.assert_array_equal(got, want)
        assert sess.stats["shape_variants_compiled"] == 3
        assert sess._carry_specs == {"shape": ("b", 8, 8), "sizes": (1, 3, "sizes__length2", "sizes__length3")}
        f = feeds(5, 6, 2, lead=1)  # z of 2 rows reshaped to [1, 16, 8]: the target's first element is not b
        for got, want in zip(sess.run(None, f), ort_run(path, f), strict=True):
            np.testing.assert_array_equal(got, want)


def _limit_model() -> bytes:
    """y = x[:limit] + arange(limit)[:, None]: a scalar int64 input that decides two shapes."""
    nodes = [helper.make_node("Range", ["zero", "limit", "one"], ["r"]),
             helper.make_node("Cast", ["r"], ["rf"], to=T.FLOAT), helper.make_node("Unsqueeze", ["rf", "ax1"], ["ru"]),
             helper.make_node("Unsqueeze", ["limit", "ax0"], ["l1"]),
             helper.make_node("Slice", ["x", "ax0", "l1", "ax0"], ["xs"]), helper.make_node("Add", ["xs", "ru"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT, [64, 4]),
                                       helper.make_tensor_value_info("limit", T.INT64, [])],
                          [helper.make_tensor_value_info("y", T.FLOAT, None)],
                          [numpy_helper.from_array(np.int64(0), "zero"), numpy_helper.from_array(np.int64(1), "one"),
                           numpy_helper.from_array(np.array([1], np.int64), "ax1"),
                           numpy_helper.from_array(np.array([0], np.int64), "ax0")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()


def _sizes_model() -> bytes:
    g = helper.make_graph([helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], mode="nearest")], "g",
                          [helper.make_tensor_value_info("x", T.FLOAT, [1, 3, 8, 8]),
                           helper.make_tensor_value_info("sizes", T.INT64, [4])],
                          [helper.make_tensor_value_info("y", T.FLOAT, None)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()


def test_a_context_binary_takes_a_value_input_ranged(tmp_path, capsys) -> None:
    """`ctxrt compile --dim limit=1:64` (limit: an input whose value decides shapes, as TensorRT's shape tensors
    take a profile of values): one program for every value in the range, stored as such; the binary takes the
    value itself (Graph.run, InferenceSession.run, IOBinding), right at every value; a value outside the range, of
    another type or shape is a ShapeError naming the input. Before, a context binary was compiled for one value."""
    m = _limit_model()
    src, out = tmp_path / "limit.onnx", tmp_path / "limit.ctx"
    src.write_bytes(m)
    assert cli(["compile", str(src), "-o", str(out), "--dim", "limit=1:64"]) == 0
    assert cli(["inspect", str(out)]) == 0
    assert "value  limit: <i8[] = [limit]" in capsys.readouterr().out
    theirs = ort.InferenceSession(m, providers=["CPUExecutionProvider"])
    graph = ctxrt.context_from_binary(out).graph()
    sess = ctxrt.InferenceSession(out)
    assert [(i.name, i.shape) for i in sess.get_inputs()] == [("x", [64, 4]), ("limit", [])]
    rng = np.random.default_rng(0)
    for n in (1, 7, 64, 33):
        feeds = {"x": rng.standard_normal((64, 4)).astype(np.float32), "limit": np.array(n, np.int64)}
        want = theirs.run(None, feeds)[0]
        np.testing.assert_allclose(graph.run(feeds)["y"], want, rtol=1e-6)
        np.testing.assert_allclose(sess.run(None, feeds)[0], want, rtol=1e-6)
        binding = sess.io_binding()
        for k, v in feeds.items():
            binding.bind_input(k, v)
        binding.bind_output("y")
        sess.run_with_iobinding(binding)
        np.testing.assert_allclose(binding.copy_outputs_to_cpu()[0], want, rtol=1e-6)
    for bad, match in ((np.array(65, np.int64), r"input 'limit' is 65, outside the range 1\.\.64"),
                       (np.array(-1, np.int64), "input 'limit' is -1, outside"),
                       (np.array([3], np.int64), r"input 'limit' expects int64\[\]"),
                       (np.array(3, np.int32), r"input 'limit' expects int64\[\]")):
        for run in (lambda f: graph.run(f), lambda f: sess.run(None, f)):
            with pytest.raises(ShapeError, match=match):
                run({"x": np.zeros((64, 4), np.float32), "limit": bad})
    np.savez(tmp_path / "in.npz", x=np.ones((64, 4), np.float32), limit=np.array(7))  # `ctxrt run` takes it too
    assert cli(["run", str(out), "--inputs", str(tmp_path / "in.npz"), "--output", str(tmp_path / "o.npz")]) == 0
    with np.load(tmp_path / "o.npz") as o:
        np.testing.assert_allclose(o["y"], theirs.run(None, {"x": np.ones((64, 4), np.float32),
                                                             "limit": np.array(7)})[0], rtol=1e-6)
    np.savez(tmp_path / "bad.npz", x=np.ones((64, 4), np.float32), limit=np.array(70))
    assert cli(["run", str(out), "--inputs", str(tmp_path / "bad.npz")]) == 2
    assert "input 'limit' is 70, outside the range 1..64" in capsys.readouterr().err
    assert cli(["compile", str(src), "-o", str(tmp_path / "e.ctx"), "--dim", "limit=1:64", "--epcontext"]) == 2
    assert "cannot declare them" in capsys.readouterr().err
    assert not (tmp_path / "e.ctx").exists()  # (the command's files: all or none)


def test_elements_of_a_value_input_ranged_the_others_given(tmp_path) -> None:
    """Resize's sizes [1, 3, H, W]: H and W ranged as sizes[2], sizes[3], the others given with --value; one
    program for every size; another value of a fixed element names it."""
    m = _sizes_model()
    src, out = tmp_path / "sizes.onnx", tmp_path / "sizes.ctx"
    src.write_bytes(m)
    assert cli(["compile", str(src), "-o", str(out), "--dim", "sizes[2]=1:32", "--dim", "sizes[3]=1:32",
                "--value", "sizes=1,3,0,0"]) == 0
    theirs = ort.InferenceSession(m, providers=["CPUExecutionProvider"])
    with ctxrt.InferenceSession(out) as sess:
        for hw in ((5, 7), (32, 1), (16, 16), (1, 32)):
            feeds = {"x": np.arange(192, dtype=np.float32).reshape(1, 3, 8, 8), "sizes": np.array([1, 3, *hw])}
            got, want = sess.run(None, feeds)[0], theirs.run(None, feeds)[0]
            assert got.shape == want.shape
            np.testing.assert_array_equal(got, want)
        with pytest.raises(ShapeError, match=r"element 0 is compiled for the value 1; got 2 .*--dim sizes\[0\]"):
            sess.run(None, {"x": np.zeros((1, 3, 8, 8), np.float32), "sizes": np.array([2, 3, 4, 4])})
        with pytest.raises(ShapeError, match=r"input 'sizes' element 2 is 40, outside the range 1\.\.32"):
            sess.run(None, {"x": np.zeros((1, 3, 8, 8), np.float32), "sizes": np.array([1, 3, 40, 4])})


@pytest.mark.parametrize("args, match", [
    (["--dim", "sizes=1:32"], r"has 4 elements: range each as sizes\[J\]"),
    (["--dim", "sizes[2]=1:32"], "element 0 of input 'sizes' is not ranged: give the input's value"),
    (["--dim", "sizes[2]=-1:32", "--value", "sizes=1,3,0,0"], "0 <= MIN <= MAX"),
    (["--dim", "x=1:4"], "input 'x' is no integer input"),
])
def test_a_value_input_that_cannot_be_ranged_is_a_clear_error(tmp_path, capsys, args, match) -> None:
    src = tmp_path / "sizes.onnx"
    src.write_bytes(_sizes_model())
    assert cli(["compile", str(src), "-o", str(tmp_path / "s.ctx"), *args]) == 2
    err = capsys.readouterr().err
    assert re.search(match, err) and "Traceback" not in err, err


@pytest.mark.parametrize("edit, match", [
    (lambda r: [("x", *r[0][1:])], "apart from the graph's inputs"),
    (lambda r: [(r[0][0], "<f4", *r[0][2:])], "integer value input"),
    (lambda r: [(*r[0][:3], ("other",))], "no ranged dim"),
    (lambda r: [(*r[0][:3], (1, 2))], "a list of 1"),
    (lambda r: [(r[0][0], "|i1", r[0][2], (300,))], "an int in"),
])
def test_hostile_value_ranges_are_a_format_error(edit, match) -> None:
    from ctxrt.backends import get_backend
    from ctxrt.compiler import compile_graphs
    from ctxrt.errors import FormatError
    from ctxrt.format import context_bytes

    graphs, weights = compile_graphs([(_limit_model(), None, "main")], get_backend("cpu"), dims={"limit": (1, 8)})
    graphs[0].carriers = tuple(edit(graphs[0].carriers))
    with pytest.raises(FormatError, match=match):
        ctxrt.InferenceSession(context_bytes(graphs, weights, {"backend": "cpu", "hardware": "x86_64",
                                                               "producer": "test", "alignment": 64}))
