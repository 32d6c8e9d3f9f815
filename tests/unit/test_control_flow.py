"""If, Loop and Scan (DESIGN.md §9b, issue 9): inlined when the condition or trip count is known at compile
time, else compiled bodies run by If/Loop kernels over the node's scratch; outputs against onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from harness import ITERATOR_BUFFER, spy, steady_state_allocation
from onnx import TensorProto as T
from onnx import helper, numpy_helper

import ctxrt
from ctxrt.errors import ShapeError, UnsupportedOpError, ValueInputError
from ctxrt.frontend.onnx import Folder

F = T.FLOAT
RNG = np.random.default_rng(0)


def vi(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def model(nodes, inputs, outputs, inits=None, opset=17):
    g = helper.make_graph(nodes, "g", inputs, outputs,
                          [numpy_helper.from_array(np.asarray(v), k) for k, v in (inits or {}).items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def ort_run(m, feeds):
    return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def check(m, feeds, ctx=None):
    """ctxrt's outputs (of a fresh compile, or of `ctx`) match onnxruntime's; returns the compiled ops."""
    ctx = ctx or ctxrt.compile(m)
    got = ctx.graph().run(feeds)
    for out, want in zip(m.graph.output, ort_run(m, feeds), strict=True):
        assert got[out.name].shape == want.shape, out.name
        np.testing.assert_allclose(got[out.name], want, rtol=1e-5, atol=1e-6, err_msg=out.name)
    return [s.op for s in ctx.graph().compiled.steps]


def data_if(captured_const=False):
    """y = x*x + w if sum(x) > 0 else -x: the condition comes from the data."""
    then = helper.make_graph([helper.make_node("Mul", ["x", "x"], ["t0"]), helper.make_node("Add", ["t0", "w"], ["t"])],
                             "then", [], [vi("t", F, [3, 4])])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [], [vi("e", F, [3, 4])])
    nodes = [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
             helper.make_node("Greater", ["s", "zero"], ["c"]),
             helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other, name="if0")]
    return model(nodes, [vi("x", F, [3, 4])], [vi("y", F, [3, 4])],
                 {"zero": np.float32(0), "w": RNG.standard_normal((3, 4)).astype(np.float32)})


def test_data_dependent_if_takes_both_branches_at_run_time() -> None:
    m = data_if()
    ctx = ctxrt.compile(m)
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    for feed in (np.abs(x), -np.abs(x)):  # sum > 0: then; sum < 0: else
        assert "If" in check(m, {"x": feed}, ctx)
    step = next(s for s in ctx.graph().compiled.steps if s.op == "If")
    then = step.attrs["then_branch"]
    assert then.arena_size > 0 and step.scratch[0].nbytes >= then.arena_size  # x*x lives in the If's scratch
    assert [r.key for r in step.inputs[1:]] == ["x", "w"]  # captured: an outer input and a weight


def test_if_with_a_known_condition_is_inlined() -> None:
    then = helper.make_graph([helper.make_node("Relu", ["x"], ["t"])], "then", [], [vi("t", F, [2, 3])])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [], [vi("e", F, [2, 3])])
    m = model([helper.make_node("Shape", ["x"], ["sh"]), helper.make_node("ReduceSum", ["sh"], ["n"], keepdims=0),
               helper.make_node("Greater", ["n", "four"], ["c"]),
               helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)],
              [vi("x", F, [2, 3])], [vi("y", F, [2, 3])], {"four": np.int64(4)})
    ops = check(m, {"x": RNG.standard_normal((2, 3)).astype(np.float32)})
    assert ops == ["Relu"]


def test_if_on_a_boolean_input_is_a_value_input_in_sessions() -> None:
    then = helper.make_graph([helper.make_node("Relu", ["x"], ["t"])], "then", [], [vi("t", F, [2, 3])])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [], [vi("e", F, [2, 3])])
    m = model([helper.make_node("If", ["flag"], ["y"], then_branch=then, else_branch=other)],
              [vi("x", F, [2, 3]), vi("flag", T.BOOL, [])], [vi("y", F, [2, 3])])
    x = RNG.standard_normal((2, 3)).astype(np.float32)
    assert check(m, {"x": x, "flag": np.array(True)}) == ["If"]  # no value given: chosen at run time
    baked = ctxrt.compile(m, values={"flag": False})  # --value flag=false: the else branch only
    assert check(m, {"x": x, "flag": np.array(False)}, baked) == ["Neg"]
    with pytest.raises(ShapeError, match="value input compiled for \\[False\\]"):
        baked.graph().run({"x": x, "flag": np.array(True)})
    with ctxrt.InferenceSession(m.SerializeToString()) as sess:
        for flag in (True, False, True):
            feeds = {"x": x, "flag": np.array(flag)}
            np.testing.assert_allclose(sess.run(None, feeds)[0], ort_run(m, feeds)[0])
        assert sess.stats["shape_variants_compiled"] == 2  # one inlined variant per value
        assert all(s.op != "If" for v in sess._variants.values() for s in v.stages[0].graph.compiled.steps)


def test_if_on_a_value_input_is_inlined_before_shape_inference(monkeypatch) -> None:
    """silero VAD's whole model is two Ifs on its sample rate: a session compiling for a run's feeds inlines the
    branch the value input picks before it infers any shape, so inference never types the other branch (nor both
    again after each fold: a probe read 123 -> 55 ms). Dynamic dims: the session compiles a range program."""
    def branch(name: str, op: str) -> onnx.GraphProto:
        return helper.make_graph([helper.make_node("MatMul", ["x", "w"], [f"{name}0"]),
                                  helper.make_node(op, [f"{name}0"], [name])], name, [], [vi(name, F, ["n", 4])])
    m = model([helper.make_node("Equal", ["sr", "k16"], ["c"]),
               helper.make_node("If", ["c"], ["y"], then_branch=branch("t", "Relu"), else_branch=branch("e", "Neg"))],
              [vi("x", F, ["n", 3]), vi("sr", T.INT64, [])], [vi("y", F, ["n", 4])],
              {"k16": np.int64(16000), "w": RNG.standard_normal((3, 4)).astype(np.float32)})
    inferred = spy(monkeypatch, Folder, "skeleton", lambda folder: sorted({n.op_type for n in folder.nodes}))
    with ctxrt.InferenceSession(m.SerializeToString()) as sess:
        for n, sr in ((2, 16000), (5, 16000), (3, 8000)):
            feeds = {"x": RNG.standard_normal((n, 3)).astype(np.float32), "sr": np.array(sr, np.int64)}
            np.testing.assert_allclose(sess.run(None, feeds)[0], ort_run(m, feeds)[0], rtol=1e-5, atol=1e-6)
        assert sess.stats["shape_variants_compiled"] == 2  # one range program per sample rate
    assert inferred and not any("If" in ops for ops in inferred), inferred


def test_torch_cond_export_runs_both_branches_through_a_session(tmp_path) -> None:
    torch = pytest.importorskip("torch")

    class Gate(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)

        def forward(self, x):
            return torch.cond(x.sum() > 0, lambda x: self.lin(x) * 2, lambda x: torch.relu(x) - 1, (x,))

    torch.manual_seed(0)
    path = tmp_path / "cond.onnx"
    x = torch.randn(2, 8)
    torch.onnx.export(Gate().eval(), (x,), str(path), dynamo=True, dynamic_shapes={"x": {0: "batch"}})
    assert any(n.op_type == "If" for n in onnx.load(str(path)).graph.node)
    theirs = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    with ctxrt.InferenceSession(path) as sess:
        for batch, sign in ((2, 1), (2, -1), (3, 1), (3, -1)):
            feed = {"x": sign * np.abs(RNG.standard_normal((batch, 8))).astype(np.float32)}
            want = theirs.run(None, feed)[0]
            np.testing.assert_allclose(sess.run(None, feed)[0], want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
        # one range program for every batch size (its bodies fitted with it); the branch chosen at run time
        assert sess.stats["shape_variants_compiled"] == 1 and sess.stats["range_programs_compiled"] == 1
        for v in sess._variants.values():
            g = v.stages[0].graph
            assert "If" in [s.op for s in g.compiled.steps] and g.spillfill_size <= 1.05 * g.lower_bound


def counting_loop(trips_from: str, scan: bool = True):
    """acc += x * i for i < M, scanning sum(acc); M a constant, a graph input or computed from x."""
    body_nodes = [helper.make_node("Cast", ["i"], ["fi"], to=F), helper.make_node("Mul", ["x", "fi"], ["xi"]),
                  helper.make_node("Add", ["acc", "xi"], ["acc2"]), helper.make_node("Identity", ["cond"], ["cond2"])]
    outs = [vi("cond2", T.BOOL, []), vi("acc2", F, [3, 4])]
    if scan:
        body_nodes.append(helper.make_node("ReduceSum", ["acc2"], ["s"], keepdims=0))
        outs.append(vi("s", F, []))
    body = helper.make_graph(body_nodes, "body", [vi("i", T.INT64, []), vi("cond", T.BOOL, []), vi("acc", F, [3, 4])],
                             outs)
    inits = {"z": np.zeros((3, 4), np.float32)}
    nodes, inputs = [], [vi("x", F, [3, 4])]
    if trips_from == "const":
        inits["M"] = np.int64(5)
    elif trips_from == "input":
        inputs.append(vi("M", T.INT64, []))
    else:
        nodes += [helper.make_node("ReduceSum", ["x"], ["sx"], keepdims=0), helper.make_node("Abs", ["sx"], ["ax"]),
                  helper.make_node("Cast", ["ax"], ["M"], to=T.INT64)]
    names = ["acc_out", "scan"] if scan else ["acc_out"]
    nodes.append(helper.make_node("Loop", ["M", "", "z"], names, body=body, name="loop"))
    return model(nodes, inputs, [vi(n, F, None) for n in names], inits)


def test_loop_with_a_known_trip_count_is_unrolled() -> None:
    m = counting_loop("const")
    ops = check(m, {"x": RNG.standard_normal((3, 4)).astype(np.float32)})
    assert "Loop" not in ops and ops.count("Add") == 5


def test_loop_trip_count_input_sizing_scan_outputs_is_a_value_input() -> None:
    m = counting_loop("input")
    with pytest.raises(ValueInputError, match="input 'M' is needed at compile time \\(Loop node 'loop' trip count"):
        ctxrt.compile(m)
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    assert "Loop" not in check(m, {"x": x, "M": np.array(3, np.int64)}, ctxrt.compile(m, values={"M": 3}))
    with ctxrt.InferenceSession(m.SerializeToString()) as sess:
        for trips in (2, 4, 2):
            feeds = {"x": x, "M": np.array(trips, np.int64)}
            for got, want in zip(sess.run(None, feeds), ort_run(m, feeds), strict=True):
                np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        assert sess.stats["shape_variants_compiled"] == 2


def test_loop_with_a_data_dependent_trip_count_runs_as_a_kernel() -> None:
    m = counting_loop("data", scan=False)
    ctx = ctxrt.compile(m)
    for total in (6.0, 36.0, 0.0):  # trip count = |sum(x)|: zero iterations included
        x = np.full((3, 4), total / 12, np.float32)
        assert check(m, {"x": x}, ctx)[-1] == "Loop"


def test_loop_scan_outputs_need_a_known_trip_count() -> None:
    with pytest.raises(UnsupportedOpError, match="scan output.*trip count known at compile time"):
        ctxrt.compile(counting_loop("data"))


def test_loop_that_stops_on_its_condition_returns_the_real_scan_length() -> None:
    """while sum(acc) < limit and i < 20: acc += x; scan acc. The scan output is planned at 20 rows."""
    body = helper.make_graph(
        [helper.make_node("Add", ["acc", "x"], ["acc2"]), helper.make_node("ReduceSum", ["acc2"], ["s"], keepdims=0),
         helper.make_node("Less", ["s", "limit"], ["go"]), helper.make_node("Identity", ["acc2"], ["row"])],
        "body", [vi("i", T.INT64, []), vi("cond", T.BOOL, []), vi("acc", F, [2, 2])],
        [vi("go", T.BOOL, []), vi("acc2", F, [2, 2]), vi("row", F, [2, 2])])
    m = model([helper.make_node("Loop", ["M", "", "z"], ["final", "rows"], body=body)],
              [vi("x", F, [2, 2]), vi("limit", F, [])], [vi("final", F, None), vi("rows", F, None)],
              {"M": np.int64(20), "z": np.zeros((2, 2), np.float32)})
    ctx = ctxrt.compile(m)
    g = ctx.graph()
    assert g.outputs[1].shape == (20, 2, 2)
    for limit in (3.0, 10.0, 1e9):
        feeds = {"x": np.ones((2, 2), np.float32), "limit": np.array(limit, np.float32)}
        check(m, feeds, ctx)
        outs = {o.name: np.empty(o.shape, o.dtype) for o in g.outputs}
        shapes = g.execute(feeds, outs)
        assert shapes["rows"][0] == min(20, int(np.ceil(limit / 4))) if limit < 1e9 else 20


def test_big_constant_loop_runs_as_a_kernel_without_allocating() -> None:
    n = 8192  # tensors bigger than NumPy's iterator buffers: any copy made per run would show
    body = helper.make_graph(
        [helper.make_node("Mul", ["acc", "k"], ["a1"]), helper.make_node("Add", ["a1", "x"], ["acc2"]),
         helper.make_node("Identity", ["cond"], ["c2"])],
        "body", [vi("i", T.INT64, []), vi("cond", T.BOOL, []), vi("acc", F, [n])],
        [vi("c2", T.BOOL, []), vi("acc2", F, [n])])
    m = model([helper.make_node("Loop", ["M", "", "z"], ["y"], body=body)], [vi("x", F, [n])], [vi("y", F, None)],
              {"M": np.int64(3000), "z": np.zeros(n, np.float32), "k": np.float32(0.5)})
    ctx = ctxrt.compile(m)
    x = RNG.standard_normal(n).astype(np.float32)
    assert check(m, {"x": x}, ctx) == ["Loop"]  # 3000 x 3 nodes: not unrolled
    g, out = ctx.graph(), {"y": np.empty(n, np.float32)}
    peak, growth = steady_state_allocation(lambda: g.execute({"x": x}, out), settle=3, measure=10)
    assert peak < ITERATOR_BUFFER and growth < 2048


def scan_model(**attrs):
    body = helper.make_graph([helper.make_node("Add", ["st", "e"], ["st2"]),
                              helper.make_node("Mul", ["st2", "e"], ["o"])],
                             "sb", [vi("st", F, [4]), vi("e", F, [4])], [vi("st2", F, [4]), vi("o", F, [4])])
    shape = [4, 5] if attrs.get("scan_input_axes") == [1] else [5, 4]
    m = model([helper.make_node("Scan", ["init", "x"], ["final", "ys"], body=body, num_scan_inputs=1, **attrs)],
              [vi("x", F, shape)], [vi("final", F, None), vi("ys", F, None)], {"init": np.zeros(4, np.float32)})
    return m, shape


@pytest.mark.parametrize("attrs", [{}, {"scan_input_directions": [1]}, {"scan_output_directions": [1]},
                                   {"scan_input_axes": [1], "scan_output_axes": [1]}, {"scan_output_axes": [-1]}])
def test_scan_matches_onnxruntime(attrs) -> None:
    m, shape = scan_model(**attrs)
    check(m, {"x": RNG.standard_normal(shape).astype(np.float32)})


def scan8_model(batch: int, directions: list[int], lens: list[int] | None = None):
    """Opset 8: a running sum and product over [batch, 5, 3] and [batch, 5] inputs (one reversed if asked)."""
    body = helper.make_graph([helper.make_node("Add", ["s", "a"], ["s2"]), helper.make_node("Mul", ["s2", "b"], ["o"])],
                             "sb", [vi("s", F, [3]), vi("a", F, [3]), vi("b", F, [])],
                             [vi("s2", F, [3]), vi("o", F, [3])])
    inits = {"init": np.ones((batch, 3), np.float32)}
    if lens is not None:
        inits["lens"] = np.array(lens, np.int64)
    node = helper.make_node("Scan", ["lens" if lens is not None else "", "init", "x", "w"], ["final", "ys"],
                            body=body, num_scan_inputs=2, directions=directions)
    return model([node], [vi("x", F, [batch, 5, 3]), vi("w", F, [batch, 5])], [vi("final", F, None), vi("ys", F, None)],
                 inits, opset=8)


@pytest.mark.parametrize("batch, directions, lens", [(1, [0, 0], None), (3, [0, 1], None), (2, [1, 0], [5, 5])])
def test_scan_opset8_batch_rows_match_onnxruntime(batch: int, directions: list[int], lens: list[int] | None) -> None:
    m = scan8_model(batch, directions, lens)
    feeds = {"x": RNG.standard_normal((batch, 5, 3)).astype(np.float32),
             "w": RNG.standard_normal((batch, 5)).astype(np.float32)}
    check(m, feeds)
    sess = ctxrt.InferenceSession(m.SerializeToString())
    for got, want in zip(sess.run(None, feeds), ort_run(m, feeds), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_scan_opset8_shorter_sequence_lens_is_refused() -> None:
    with pytest.raises(UnsupportedOpError, match=r"Scan node .*sequence_lens \[5, 3\].*length \(5\)"):
        ctxrt.compile(scan8_model(2, [0, 0], [5, 3]))


def nested_loop(trips_from: str):
    """Each iteration: acc = acc + x if i is even else acc - x (an If inside the Loop body)."""
    add = helper.make_graph([helper.make_node("Add", ["acc", "x"], ["a"])], "add", [], [vi("a", F, [3])])
    sub = helper.make_graph([helper.make_node("Sub", ["acc", "x"], ["b"])], "sub", [], [vi("b", F, [3])])
    body = helper.make_graph(
        [helper.make_node("Mod", ["i", "two"], ["r"]), helper.make_node("Equal", ["r", "zero"], ["even"]),
         helper.make_node("If", ["even"], ["acc2"], then_branch=add, else_branch=sub, name="inner"),
         helper.make_node("Identity", ["cond"], ["c2"])],
        "body", [vi("i", T.INT64, []), vi("cond", T.BOOL, []), vi("acc", F, [3])],
        [vi("c2", T.BOOL, []), vi("acc2", F, [3])])
    inits = {"z": np.zeros(3, np.float32), "two": np.int64(2), "zero": np.int64(0)}
    nodes = []
    if trips_from == "const":
        inits["M"] = np.int64(5)
    else:
        nodes = [helper.make_node("ReduceMax", ["x"], ["mx"], keepdims=0),
                 helper.make_node("Cast", ["mx"], ["M"], to=T.INT64)]
    nodes.append(helper.make_node("Loop", ["M", "", "z"], ["y"], body=body))
    return model(nodes, [vi("x", F, [3])], [vi("y", F, None)], inits)


@pytest.mark.parametrize("trips_from", ["const", "data"])
def test_if_nested_in_a_loop(trips_from) -> None:
    m = nested_loop(trips_from)
    ctx = ctxrt.compile(m)
    for top in (1.0, 4.0, 7.0):
        x = np.array([0.5, top, 2.0], np.float32)
        ops = check(m, {"x": x}, ctx)
    assert ("Loop" in ops) == (trips_from == "data")


def test_context_binary_with_subgraphs_round_trips(tmp_path) -> None:
    from ctxrt.backends import get_backend
    from ctxrt.compiler import compile_graphs, save_context
    from ctxrt.runtime.loader import context_from_binary

    be = get_backend("cpu")
    cases = [(data_if(), RNG.standard_normal((3, 4)).astype(np.float32)),
             (nested_loop("data"), np.array([0.5, 6.0, 2.0], np.float32))]
    for m, x in cases:
        graphs, weights = compile_graphs([(m, None, "main")], be)
        path = save_context(tmp_path / "cf.ctx", graphs, weights, be, ["cf.onnx"])
        loaded = context_from_binary(path)
        assert loaded.graph().compiled.steps == graphs[0].steps  # bodies decoded as they were written
        check(m, {"x": x}, loaded)
        check(m, {"x": -x}, loaded)
        loaded.free()


def test_bodies_report_their_unsupported_nodes_with_the_rest() -> None:
    then = helper.make_graph([helper.make_node("Frob", ["x"], ["t"], name="frob_in_then", domain="org.example")],
                             "then", [], [vi("t", F, [])])
    other = helper.make_graph([helper.make_node("ReduceSum", ["x"], ["e"], keepdims=0)], "else", [], [vi("e", F, [])])
    m = model([helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
               helper.make_node("Greater", ["s", "zero"], ["c"]),
               helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)],
              [vi("x", F, [2, 2])], [vi("y", F, None)], {"zero": np.float32(0)})
    m.opset_import.append(helper.make_opsetid("org.example", 1))  # a domain ctxrt does not implement
    with pytest.raises(UnsupportedOpError, match=r"org\.example\.Frob \(frob_in_then\)"):
        ctxrt.compile(m)


def _ranged_control_flow(kind: str):
    """Dynamic batch N through data-dependent control flow. "if": y = relu(x @ w) if sum(x) > 0 else
    (x * x) @ v, the branches reading outer values of N rows; "loop": acc (N, 3) carried through max(x) iterations
    (a data trip count), each adding or subtracting x by an If nested in the body."""
    n = "N"
    if kind == "if":
        then = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["t0"]),
                                  helper.make_node("Relu", ["t0"], ["t"])], "then", [], [vi("t", F, [n, 8])])
        other = helper.make_graph([helper.make_node("Mul", ["x", "x"], ["e0"]),
                                   helper.make_node("MatMul", ["e0", "v"], ["e"])], "else", [], [vi("e", F, [n, 8])])
        nodes = [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
                 helper.make_node("Greater", ["s", "zero"], ["c"]),
                 helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other, name="if0")]
        return model(nodes, [vi("x", F, [n, 4])], [vi("y", F, [n, 8])],
                     {"zero": np.float32(0), "w": RNG.standard_normal((4, 8)).astype(np.float32),
                      "v": RNG.standard_normal((4, 8)).astype(np.float32)})
    add = helper.make_graph([helper.make_node("Add", ["acc", "x"], ["a"])], "add", [], [vi("a", F, [n, 3])])
    sub = helper.make_graph([helper.make_node("Sub", ["acc", "x"], ["b"])], "sub", [], [vi("b", F, [n, 3])])
    body = helper.make_graph(
        [helper.make_node("Mod", ["i", "two"], ["r"]), helper.make_node("Equal", ["r", "zero"], ["even"]),
         helper.make_node("If", ["even"], ["acc2"], then_branch=add, else_branch=sub, name="inner"),
         helper.make_node("Identity", ["cond"], ["c2"])],
        "body", [vi("i", T.INT64, []), vi("cond", T.BOOL, []), vi("acc", F, [n, 3])],
        [vi("c2", T.BOOL, []), vi("acc2", F, [n, 3])])
    nodes = [helper.make_node("ReduceMax", ["x"], ["mx"], keepdims=0),
             helper.make_node("Cast", ["mx"], ["M"], to=T.INT64), helper.make_node("Mul", ["x", "zf"], ["z"]),
             helper.make_node("Loop", ["M", "", "z"], ["y"], body=body, name="loop")]
    return model(nodes, [vi("x", F, [n, 3])], [vi("y", F, [n, 3])],
                 {"zf": np.float32(0), "two": np.int64(2), "zero": np.int64(0)})


def _ranged_feeds(kind: str, rows: int, sign: float) -> dict[str, np.ndarray]:
    x = np.abs(np.random.default_rng(rows).standard_normal((rows, 4 if kind == "if" else 3))).astype(np.float32)
    return {"x": sign * x if kind == "if" else np.clip(x * 3, 0, 5).astype(np.float32) * (1 if sign > 0 else 0.5)}


@pytest.mark.parametrize("kind", ["if", "loop"])
def test_data_dependent_control_flow_is_one_range_program(kind, tmp_path) -> None:
    """Bodies whose shapes follow the ranged dims are fitted with the program (their integers are entries of the
    If/Loop step): one compile for every batch size, both branches, the context binary's ranges included."""
    from ctxrt.backends import get_backend
    from ctxrt.compiler import compile_graphs, save_context
    from ctxrt.runtime.loader import context_from_binary

    m = _ranged_control_flow(kind)
    ctx = ctxrt.compile(m, dims={"N": (1, 12)})
    graphs, weights = compile_graphs([(m, None, "main")], get_backend("cpu"), dims={"N": (1, 12)})
    assert any(w[0] == "attr" and len(w) > 4 for w, _ in graphs[0].ranges.entries)  # places inside a body
    loaded = context_from_binary(save_context(tmp_path / "cf.ctx", graphs, weights, get_backend("cpu"), ["cf.onnx"]))
    for rows in (12, 1, 5, 12, 7):
        for sign in (1.0, -1.0):
            feeds = _ranged_feeds(kind, rows, sign)
            for c in (ctx, loaded):
                check(m, feeds, c)
    with pytest.raises(ShapeError, match=r"\(dim 'N'\) is 13, outside the range 1\.\.12"):
        ctx.graph().run(_ranged_feeds(kind, 13, 1.0))
    loaded.free()
    with ctxrt.InferenceSession(m.SerializeToString()) as sess:  # a batch cycle: one compile
        for _ in range(2):
            for rows in range(1, 13):
                feeds = _ranged_feeds(kind, rows, 1.0 if rows % 3 else -1.0)
                for got, want in zip(sess.run(None, feeds), ort_run(m, feeds), strict=True):
                    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        assert sess.stats["shape_variants_compiled"] == 1 and sess.stats["range_programs_compiled"] == 1


@pytest.mark.parametrize("edit, needle", [
    (lambda r, k: r["entries"].append([["attr", k, "then_branch", "in", 99, 0, 0], [0, 1]]), "no integer"),
    (lambda r, k: r["entries"].append([["attr", k, "then_branch", "I", 0, 7], [0, 1]]), "no integer"),
    (lambda r, k: [e[1].__setitem__(1, 2) for e in r["entries"] if e[0][:3] == ["attr", k, "then_branch"]],
     "upper bound"),
])
def test_hostile_body_entries_of_a_range_program_are_a_format_error(edit, needle) -> None:
    """Places inside a body that name nothing, or that would size a body tensor past its place at the upper
    bound: refused when the binary is read."""
    from types import SimpleNamespace

    from ctxrt.backends import get_backend
    from ctxrt.compiler import compile_graphs
    from ctxrt.errors import FormatError
    from ctxrt.format import context_bytes

    graphs, weights = compile_graphs([(_ranged_control_flow("if"), None, "main")], get_backend("cpu"),
                                     dims={"N": (1, 12)})
    meta = graphs[0].ranges.to_meta()
    edit(meta, next(k for k, s in enumerate(graphs[0].steps) if s.op == "If"))
    graphs[0].ranges = SimpleNamespace(to_meta=lambda: meta)
    with pytest.raises(FormatError, match=needle):
        ctxrt.InferenceSession(context_bytes(graphs, weights, {"backend": "cpu", "hardware": "x86_64",
                                                               "producer": "test", "alignment": 64}))


@pytest.mark.parametrize("kind", ["if", "loop"])
def test_data_dependent_control_flow_range_program_on_opencl(kind, opencl) -> None:
    """On OpenCL the If/Loop runs in a CPU partition; each new batch size specializes its bodies too."""
    m = _ranged_control_flow(kind)
    g = ctxrt.compile(m, backend=opencl, dims={"N": (1, 12)}).graph()
    assert g.compiled.steps[-1].backend == "cpu"
    for rows in (12, 3, 7):
        for sign in (1.0, -1.0):
            feeds = _ranged_feeds(kind, rows, sign)
            np.testing.assert_allclose(g.run(feeds)["y"], ort_run(m, feeds)[0], rtol=1e-5, atol=1e-5)


def test_a_clamping_slice_inside_a_branch_is_refused_in_a_range_program() -> None:
    """x[:8] inside an If's branch over N in 1..32 clamps at N below 8 only: the range is refused (the If's body
    is checked as the graph is), and a session compiles exact shapes with the right outputs."""
    from ctxrt.compiler.ranges import RangeError

    inits = {"zero": np.float32(0), "s0": np.array([0], np.int64), "s8": np.array([8], np.int64)}
    then = helper.make_graph([helper.make_node("Slice", ["x", "s0", "s8", "s0"], ["t"])], "then", [],
                             [vi("t", F, [None, 4])])
    other = helper.make_graph([helper.make_node("Slice", ["x", "s0", "s8", "s0"], ["e0"]),
                               helper.make_node("Neg", ["e0"], ["e"])], "else", [], [vi("e", F, [None, 4])])
    m = model([helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
               helper.make_node("Greater", ["s", "zero"], ["c"]),
               helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)],
              [vi("x", F, ["N", 4])], [vi("y", F, [None, 4])], inits)
    with pytest.raises(RangeError, match="Slice node .* clamps its bounds differently"):
        ctxrt.compile(m, dims={"N": (1, 32)})
    with ctxrt.InferenceSession(m.SerializeToString()) as sess:
        for n in (32, 5, 1):
            feeds = {"x": RNG.standard_normal((n, 4)).astype(np.float32)}
            np.testing.assert_allclose(sess.run(None, feeds)[0], ort_run(m, feeds)[0], rtol=1e-6)
