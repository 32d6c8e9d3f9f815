"""LSTM, GRU and RNN vs onnxruntime (onnx.reference ignores activations, clip, sequence_lens and input_forget;
onnxruntime refuses layout 1, which is checked against onnxruntime on the transposed layout-0 model), with every
direction, layout, optional input and output; torch's own exports; steady runs allocate nothing."""

from __future__ import annotations

import io

import numpy as np
import onnx
import pytest
from harness import ITERATOR_BUFFER, allocated, bind, make_model, run_ctxrt, steady_state_allocation
from onnx import helper

import ctxrt
from ctxrt.errors import UnsupportedOpError

GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
NAMES = ["X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P"]
RNG = np.random.default_rng(7)


def assert_close(got: np.ndarray, want: np.ndarray, name: str = "") -> None:
    """The project's bar: within 1e-4 * max|want| + 1e-5."""
    assert got.shape == want.shape and got.dtype == want.dtype, (name, got.shape, want.shape, got.dtype, want.dtype)
    bound = 1e-4 * float(np.abs(want).max(initial=0)) + 1e-5
    err = float(np.abs(got.astype(np.float64) - want).max(initial=0))
    assert err <= bound, f"{name}: max error {err} > {bound}"


def arrays(op: str, t: int, n: int, i: int, h: int, d: int, dtype=np.float32, lens=None) -> dict[str, np.ndarray]:
    """Every input of the op in layout 0, weights scaled so that activations stay in their interesting range."""
    g = GATES[op]
    return {
        "X": RNG.standard_normal((t, n, i)).astype(dtype),
        "W": (RNG.standard_normal((d, g * h, i)) / np.sqrt(i)).astype(dtype),
        "R": (RNG.standard_normal((d, g * h, h)) / np.sqrt(h)).astype(dtype),
        "B": (RNG.standard_normal((d, 2 * g * h)) * 0.3).astype(dtype),
        "sequence_lens": np.array(lens if lens is not None else [t] * n, np.int32),
        "initial_h": RNG.standard_normal((d, n, h)).astype(dtype),
        "initial_c": RNG.standard_normal((d, n, h)).astype(dtype),
        "P": (RNG.standard_normal((d, 3 * h)) * 0.5).astype(dtype),
    }


def run_case(op: str, values: dict[str, np.ndarray], used: list[str], outputs: list[str], consts=(),
             layout: int = 0, **attrs) -> list[np.ndarray]:
    """Run one node in ctxrt and in onnxruntime; inputs in `consts` are initializers, the rest graph inputs.
    With layout 1 the node reads and writes batch-first tensors; onnxruntime runs the layout-0 equivalent."""
    attrs.setdefault("hidden_size", values["R"].shape[-1])
    names = [n if n in used else "" for n in NAMES[:max(NAMES.index(u) for u in used) + 1]]
    node0 = helper.make_node(op, names, outputs, **attrs)
    feeds0 = {n: values[n] for n in used if n not in consts}
    inits0 = {n: values[n] for n in used if n in consts}
    want = _onnxruntime(_model(node0, feeds0, inits0), feeds0)
    if layout:
        batch_first = {"X": (1, 0, 2), "initial_h": (1, 0, 2), "initial_c": (1, 0, 2)}
        values = {k: v.transpose(batch_first[k]).copy() if k in batch_first else v for k, v in values.items()}
        out_perm = {0: (2, 0, 1, 3), 1: (1, 0, 2), 2: (1, 0, 2)}
        present = [k for k, o in enumerate(outputs) if o]
        want = [w.transpose(out_perm[k]) for k, w in zip(present, want, strict=True)]
    node = helper.make_node(op, names, outputs, layout=layout, **attrs) if layout else node0
    feeds = {n: values[n] for n in used if n not in consts}
    inits = {n: values[n] for n in used if n in consts}
    got = run_ctxrt(_model(node, feeds, inits), feeds)
    for name, g, w in zip([o for o in outputs if o], got, want, strict=True):
        assert_close(g, w, f"{op} {name}")
    return got


def _model(node: onnx.NodeProto, feeds: dict, inits: dict) -> onnx.ModelProto:
    model = make_model(node, feeds, inits, opset=17)
    dtype = (feeds.get("X") if "X" in feeds else inits["X"]).dtype
    for out in model.graph.output:  # every output has X's type
        out.type.tensor_type.elem_type = helper.np_dtype_to_tensor_dtype(dtype)
    return model


def _onnxruntime(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    import onnxruntime as ort

    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def outputs_of(op: str) -> list[str]:
    return ["Y", "Y_h", "Y_c"] if op == "LSTM" else ["Y", "Y_h"]


DIRECTIONS = ["forward", "reverse", "bidirectional"]


@pytest.mark.parametrize("op", list(GATES))
@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("full", [False, True])
def test_directions_and_optional_inputs(op: str, direction: str, full: bool) -> None:
    d = 2 if direction == "bidirectional" else 1
    values = arrays(op, 5, 3, 4, 6, d, lens=[5, 3, 1])
    used = ["X", "W", "R"] + (["B", "sequence_lens", "initial_h"] + (["initial_c", "P"] if op == "LSTM" else [])
                              if full else [])
    # weights as initializers in one case, as graph inputs (known only at run time) in the other
    consts = ("W", "R", "B", "P") if full else ()
    run_case(op, values, used, outputs_of(op), consts, direction=direction)


@pytest.mark.parametrize("op", list(GATES))
@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("lens_const", [False, True])
def test_sequence_lens_pad_with_zeros_and_keep_the_last_valid_state(op: str, direction: str,
                                                                    lens_const: bool) -> None:
    d = 2 if direction == "bidirectional" else 1
    values = arrays(op, 6, 4, 3, 5, d, lens=[6, 2, 0, 4])  # full, short, empty (zeros), mid
    used = NAMES[:7] if op == "LSTM" else NAMES[:6]
    got = run_case(op, values, used, outputs_of(op), ("sequence_lens",) if lens_const else (), direction=direction)
    assert not got[0][2:, :, 1].any() and not got[0][:, :, 2].any()
    assert not got[1][:, 2].any()


@pytest.mark.parametrize("op", list(GATES))
@pytest.mark.parametrize("direction", DIRECTIONS)
def test_layout_1_batch_first(op: str, direction: str) -> None:
    d = 2 if direction == "bidirectional" else 1
    values = arrays(op, 4, 3, 5, 4, d, lens=[4, 1, 3])
    used = NAMES[:8] if op == "LSTM" else NAMES[:6]
    run_case(op, values, used, outputs_of(op), ("W", "R"), layout=1, direction=direction)


@pytest.mark.parametrize("lbr", [0, 1])
@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("bias_const", [False, True])
def test_gru_linear_before_reset(lbr: int, direction: str, bias_const: bool) -> None:
    d = 2 if direction == "bidirectional" else 1
    values = arrays("GRU", 5, 2, 3, 7, d)
    run_case("GRU", values, NAMES[:6], ["Y", "Y_h"], ("B",) if bias_const else (), direction=direction,
             linear_before_reset=lbr)


@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("input_forget", [0, 1])
@pytest.mark.parametrize("clip", [None, 0.5])
def test_lstm_peepholes_input_forget_clip(direction: str, input_forget: int, clip) -> None:
    d = 2 if direction == "bidirectional" else 1
    values = arrays("LSTM", 5, 3, 4, 5, d, lens=[5, 2, 4])
    attrs = {} if clip is None else {"clip": clip}
    run_case("LSTM", values, NAMES, ["Y", "Y_h", "Y_c"], ("W", "R", "P"), direction=direction,
             input_forget=input_forget, **attrs)


@pytest.mark.parametrize("op", ["RNN", "GRU"])
def test_clip(op: str) -> None:
    values = arrays(op, 5, 2, 3, 4, 2)
    values["X"] *= 4
    run_case(op, values, NAMES[:6], ["Y", "Y_h"], direction="bidirectional", clip=0.3)


ACTIVATIONS = [("Relu", [], []), ("Tanh", [], []), ("Sigmoid", [], []), ("Affine", [0.7], [0.2]),
               ("LeakyRelu", [0.3], []), ("ThresholdedRelu", [0.2], []), ("ScaledTanh", [1.3], [0.6]),
               ("HardSigmoid", [0.3], [0.4]), ("Elu", [0.8], []), ("Softsign", [], []), ("Softplus", [], []),
               ("LeakyRelu", [], []), ("HardSigmoid", [], []), ("Elu", [], [])]  # the last three: defaults


@pytest.mark.parametrize("name, alpha, beta", ACTIVATIONS)
def test_rnn_activations(name: str, alpha: list, beta: list) -> None:
    values = arrays("RNN", 4, 2, 3, 5, 1)
    attrs = {"activations": [name]}
    if alpha:
        attrs["activation_alpha"] = alpha
    if beta:
        attrs["activation_beta"] = beta
    run_case("RNN", values, NAMES[:6], ["Y", "Y_h"], ("W", "R", "B"), **attrs)


def test_activations_per_direction_consume_alpha_beta_in_order() -> None:
    values = arrays("LSTM", 4, 2, 3, 5, 2)
    run_case("LSTM", values, NAMES[:7], ["Y", "Y_h", "Y_c"], ("W", "R", "B"), direction="bidirectional",
             activations=["HardSigmoid", "tanh", "Softsign", "sigmoid", "ScaledTanh", "Elu"],
             activation_alpha=[0.25, 0.9, 0.5], activation_beta=[0.45, 1.1])
    values = arrays("GRU", 4, 2, 3, 5, 2)
    run_case("GRU", values, NAMES[:6], ["Y", "Y_h"], ("W", "R"), direction="bidirectional",
             activations=["Sigmoid", "Affine", "HardSigmoid", "ThresholdedRelu"],
             activation_alpha=[0.5, 0.3, 0.1], activation_beta=[0.1, 0.6])


def test_lstm_activations_with_peepholes_and_clip() -> None:
    values = arrays("LSTM", 4, 2, 3, 5, 1, lens=[4, 2])
    run_case("LSTM", values, NAMES, ["Y", "Y_h", "Y_c"], ("W", "R"), activations=["HardSigmoid", "Relu", "Softplus"],
             clip=1.5)


LSTM_OUTPUTS = [["Y"], ["", "Y_h"], ["", "", "Y_c"], ["Y", "", "Y_c"], ["", "Y_h", "Y_c"], ["Y", "Y_h"]]


@pytest.mark.parametrize("outputs", LSTM_OUTPUTS)
@pytest.mark.parametrize("padded", [False, True])
def test_lstm_optional_outputs_in_any_combination(outputs: list[str], padded: bool) -> None:
    values = arrays("LSTM", 4, 3, 3, 4, 2, lens=[4, 2, 3] if padded else None)
    used = NAMES[:7] if padded else ["X", "W", "R", "B"]
    run_case("LSTM", values, used, outputs, ("W", "R"), direction="bidirectional")


@pytest.mark.parametrize("op", ["GRU", "RNN"])
@pytest.mark.parametrize("outputs", [["Y"], ["", "Y_h"]])
def test_gru_rnn_optional_outputs(op: str, outputs: list[str]) -> None:
    direction = "reverse" if op == "RNN" else "bidirectional"
    values = arrays(op, 4, 2, 3, 4, 2 if direction == "bidirectional" else 1, lens=[4, 1])
    run_case(op, values, NAMES[:6], outputs, ("W", "R"), direction=direction)


@pytest.mark.parametrize("op", list(GATES))
def test_float64(op: str) -> None:
    """onnxruntime has no double GRU: onnx.reference is the oracle (it has no sequence_lens)."""
    from harness import reference

    v = arrays(op, 5, 2, 3, 4, 2, dtype=np.float64)
    used = ["X", "W", "R", "B", "", "initial_h"]
    node = helper.make_node(op, used, outputs_of(op)[:2], hidden_size=4, direction="bidirectional")
    model = _model(node, {"X": v["X"], "initial_h": v["initial_h"]}, {k: v[k] for k in "WRB"})
    feeds = {"X": v["X"], "initial_h": v["initial_h"]}
    for name, g, w in zip(["Y", "Y_h"], run_ctxrt(model, feeds), reference(model, feeds), strict=True):
        assert_close(g, w, name)


def test_matches_onnx_reference_on_its_layout_1() -> None:
    """onnx.reference implements layout 1 itself (without the extras): a second oracle for it."""
    from harness import reference

    values = arrays("LSTM", 3, 2, 4, 5, 2)
    x = values["X"].transpose(1, 0, 2).copy()
    node = helper.make_node("LSTM", ["X", "W", "R", "B"], ["Y", "Y_h", "Y_c"], hidden_size=5, layout=1,
                            direction="bidirectional")
    model = _model(node, {"X": x}, {k: values[k] for k in "WRB"})
    for name, g, w in zip(["Y", "Y_h", "Y_c"], run_ctxrt(model, {"X": x}), reference(model, {"X": x}), strict=True):
        assert_close(g, w, name)


@pytest.mark.parametrize("attrs, needle", [
    ({"activations": ["Gelu"]}, "'activations' value 'Gelu'"),
    ({"activations": ["Tanh", "Tanh"]}, "'activations' has 2 names"),
    ({"linear_before_reset": 2}, "'linear_before_reset' value 2"),
])
def test_unsupported_attribute_values_are_named(attrs: dict, needle: str) -> None:
    op = "GRU" if "linear_before_reset" in attrs else "RNN"
    values = arrays(op, 3, 1, 2, 3, 1)
    node = helper.make_node(op, ["X", "W", "R"], ["Y"], name="rec", hidden_size=3, **attrs)
    with pytest.raises(UnsupportedOpError, match="rec") as e:
        ctxrt.compile(_model(node, {"X": values["X"]}, {"W": values["W"], "R": values["R"]}))
    assert op in str(e.value) and needle in str(e.value)


@pytest.mark.parametrize("attrs, needle", [({"direction": "sideways"}, "'direction' value 'sideways'"),
                                           ({"layout": 2}, "'layout' value 2")])
def test_kernel_refuses_attribute_values_shape_inference_lets_through(attrs: dict, needle: str) -> None:
    v = arrays("RNN", 3, 1, 2, 3, 1)
    with pytest.raises(UnsupportedOpError, match=needle):
        bind("RNN", [v["X"], v["W"], v["R"]], [np.empty((3, 1, 1, 3), np.float32)], attrs)


# --- no allocation in steady runs ---------------------------------------------------------------------

@pytest.mark.parametrize("op", list(GATES))
@pytest.mark.parametrize("padded", [False, True])
def test_launch_allocates_nothing(op: str, padded: bool) -> None:
    t, n, h, d = 12, 3, 16, 2
    v = arrays(op, t, n, 8, h, d, lens=[12, 5, 0] if padded else None)
    ins = [v[k] for k in NAMES[:7 if op == "LSTM" else 6]]
    outs = [np.empty((t, d, n, h), np.float32), np.empty((d, n, h), np.float32)]
    outs += [np.empty((d, n, h), np.float32)] if op == "LSTM" else []
    if not padded:
        ins[4] = None
    consts = [None, v["W"], v["R"], None] + [None] * (len(ins) - 4)
    launch = bind(op, ins, outs, {"direction": "bidirectional", "hidden_size": h}, consts)
    assert allocated(launch) < ITERATOR_BUFFER


def test_compiled_graph_steady_state_allocates_nothing() -> None:
    v = arrays("LSTM", 10, 2, 6, 8, 2, lens=[10, 4])
    node = helper.make_node("LSTM", NAMES[:7], ["Y", "Y_h", "Y_c"], hidden_size=8, direction="bidirectional")
    feeds = {k: v[k] for k in ("X", "sequence_lens", "initial_h", "initial_c")}
    ctx = ctxrt.compile(_model(node, feeds, {k: v[k] for k in "WRB"}))
    try:
        g = ctx.graph()
        outs = {o.name: np.empty(o.shape, np.dtype(o.dtype)) for o in g.outputs}
        peak, growth = steady_state_allocation(lambda: g.execute(feeds, outs))
        assert growth < 1024 and peak < ITERATOR_BUFFER
    finally:
        ctx.free()


# --- torch's exports ------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_torch_two_layer_bidirectional_batch_first_export(kind: str) -> None:
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)

    class Tagger(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rnn = getattr(torch.nn, kind)(12, 16, num_layers=2, bidirectional=True, batch_first=True)
            self.head = torch.nn.Linear(32, 5)

        def forward(self, x):
            return self.head(self.rnn(x)[0])

    model = Tagger().eval()
    buf = io.BytesIO()
    torch.onnx.export(model, (torch.randn(1, 7, 12),), buf, dynamo=False, opset_version=17, input_names=["x"],
                      output_names=["y"], dynamic_axes={"x": {0: "batch", 1: "time"}, "y": {0: "batch", 1: "time"}})
    proto = onnx.load_from_string(buf.getvalue())
    assert kind in {n.op_type for n in proto.graph.node}
    import onnxruntime as ort

    sess = ort.InferenceSession(buf.getvalue(), providers=["CPUExecutionProvider"])
    for batch, time in ((1, 7), (3, 9)):
        x = RNG.standard_normal((batch, time, 12)).astype(np.float32)
        ctx = ctxrt.compile(proto, shapes={"x": x.shape})
        try:
            got = ctx.graph().run({"x": x})["y"]
        finally:
            ctx.free()
        assert_close(got, sess.run(None, {"x": x})[0], f"{kind} batch {batch}")


def test_context_binary_round_trip_keeps_which_outputs_exist(tmp_path) -> None:
    """A node with Y_c only: the slots travel in the step's attributes through `ctxrt compile` and back."""
    from ctxrt.cli import main as cli

    v = arrays("LSTM", 6, 2, 3, 4, 2, lens=[6, 3])
    node = helper.make_node("LSTM", NAMES[:7], ["", "", "Y_c"], hidden_size=4, direction="bidirectional")
    feeds = {k: v[k] for k in ("X", "sequence_lens", "initial_h", "initial_c")}
    model = _model(node, feeds, {k: v[k] for k in "WRB"})
    onnx.save(model, tmp_path / "lstm.onnx")
    assert cli(["compile", str(tmp_path / "lstm.onnx"), "-o", str(tmp_path / "lstm.ctx")]) == 0
    ctx = ctxrt.context_from_binary(tmp_path / "lstm.ctx")
    try:
        got = ctx.graph().run(feeds)
    finally:
        ctx.free()
    assert list(got) == ["Y_c"]
    assert_close(got["Y_c"], _onnxruntime(model, feeds)[0], "Y_c")


@pytest.mark.parametrize("hidden", [16, 24, 12])  # 24: 16 lanes then 8 (AVX-512, AVX2); 12: the scalar tail
@pytest.mark.parametrize("layout", [0, 1])
@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("batch", [3, 7])  # 7: four rows sharing R's loads, then two, then one
def test_lstm_at_small_batches_runs_the_native_kernel(direction: str, layout: int, hidden: int, batch: int,
                                                      monkeypatch, tmp_path) -> None:
    """Constant weights, the default activations, a few batch rows: csrc/genai.c's LSTM runs it (every step's
    recurrent products and gates in one call a direction), with peepholes, initial states and every output, against
    onnxruntime; its binary loads where the extension is not built (NumPy's cells in the same scratch) with the same
    outputs."""
    from ctxrt.backends.cpu import native

    if native.library() is None:
        pytest.skip("the native extension is not built")
    from ctxrt.backends.cpu.onednn import api

    monkeypatch.setattr(api, "has_avx512", lambda: False)  # where oneDNN has AVX-512 its primitive runs instead
    d = 2 if direction == "bidirectional" else 1
    values = arrays("LSTM", 7, batch, 5, hidden, d)
    used = ["X", "W", "R", "B", "initial_h", "initial_c", "P"]
    consts = ("W", "R", "B", "P")
    got = run_case("LSTM", values, used, ["Y", "Y_h", "Y_c"], consts, layout=layout, direction=direction)
    if layout:
        values = {k: v.transpose(1, 0, 2).copy() if k in ("X", "initial_h", "initial_c") else v
                  for k, v in values.items()}
    node = helper.make_node("LSTM", NAMES[:3] + ["B", "", "initial_h", "initial_c", "P"], ["Y", "Y_h", "Y_c"],
                            hidden_size=hidden, direction=direction, layout=layout)
    feeds = {n: values[n] for n in used if n not in consts}
    model = _model(node, feeds, {n: values[n] for n in consts})
    native_out, numpy_out = _native_then_numpy(model, feeds, "native_lstm", tmp_path, monkeypatch)
    for name, want in zip(["Y", "Y_h", "Y_c"], got, strict=True):
        assert_close(native_out[name], want, name)
        assert_close(numpy_out[name], want, name)


def _native_then_numpy(model: onnx.ModelProto, feeds: dict, algorithm: str, tmp_path, monkeypatch
                       ) -> tuple[dict, dict]:
    """The model compiled by `ctxrt compile` to a binary whose one node runs `algorithm`: its outputs, then the
    binary's loaded where the extension is not built (NumPy's cells in the same planned scratch)."""
    from ctxrt.backends.cpu import native
    from ctxrt.cli import main as cli

    onnx.save(model, tmp_path / "rnn.onnx")
    assert cli(["compile", str(tmp_path / "rnn.onnx"), "-o", str(tmp_path / "rnn.ctx"), "-q"]) == 0
    with ctxrt.context_from_binary(tmp_path / "rnn.ctx") as ctx:
        assert [s.algorithm for s in ctx.graph().compiled.steps] == [algorithm]
        native_out = ctx.graph().run(feeds)
    with monkeypatch.context() as m:
        m.setitem(native._STATE, "lib", None)
        with ctxrt.context_from_binary(tmp_path / "rnn.ctx") as ctx:
            return native_out, ctx.graph().run(feeds)


@pytest.mark.parametrize("projection", ["onednn", "numpy"])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("layout", [0, 1])
def test_native_lstm_projects_every_step_and_direction_in_one_gemm(projection: str, bias: bool, layout: int,
                                                                   monkeypatch, op_backend) -> None:
    """The native LSTM's input projections: oneDNN's one GEMM for every step and both directions (the directions'
    gates side by side in each row, both biases as its bias) or, without oneDNN, NumPy's per direction; with and
    without B, in both layouts, against onnxruntime."""
    from ctxrt.backends.cpu import native
    from ctxrt.backends.cpu.onednn import api
    from ctxrt.backends.cpu.rnn import rnn_native

    if op_backend != "cpu" or native.library() is None:
        pytest.skip("the CPU's native kernel")
    if projection == "onednn" and not api.available():
        pytest.skip("oneDNN is not installed")
    monkeypatch.setattr(api, "has_avx512", lambda: False)
    if projection == "numpy":
        monkeypatch.setattr(rnn_native, "_projection", lambda *a: (None, None))
    values = arrays("LSTM", 6, 2, 5, 16, 2)
    consts = ("W", "R", "B") if bias else ("W", "R")
    x = values["X"].transpose(1, 0, 2).copy() if layout else values["X"]
    node = helper.make_node("LSTM", NAMES[:3] + (["B"] if bias else []), ["Y", "Y_h", "Y_c"], hidden_size=16,
                            direction="bidirectional", layout=layout)
    model = _model(node, {"X": x}, {n: values[n] for n in consts})
    with ctxrt.compile(model, backend="cpu") as ctx:
        g = ctx.graph()
        assert g.compiled.steps[0].algorithm == "native_lstm"
        project = g._kernels[0].project
        assert (project is not None) == (projection == "onednn")
        if project is not None:  # W stored in the format its GEMM prefers, where that is not ONNX's
            blocked = project.prim.md(api.Q_WEIGHTS_MD) != api.Desc.make((5, 2 * 4 * 16), "ba")
            assert (rnn_native.PACKED_W in g.compiled.steps[0].attrs) == blocked
        got = g.run({"X": x})
    theirs = helper.make_node("LSTM", NAMES[:3] + (["B"] if bias else []), ["Y", "Y_h", "Y_c"], hidden_size=16,
                              direction="bidirectional")  # onnxruntime runs layout 0 only
    want = _onnxruntime(_model(theirs, {"X": values["X"]}, {n: values[n] for n in consts}), {"X": values["X"]})
    if layout:  # Y (t, d, n, h) -> (n, t, d, h); Y_h, Y_c (d, n, h) -> (n, d, h)
        want = [want[0].transpose(2, 0, 1, 3), want[1].transpose(1, 0, 2), want[2].transpose(1, 0, 2)]
    for name, w in zip(["Y", "Y_h", "Y_c"], want, strict=True):
        assert_close(got[name], np.ascontiguousarray(w), name)


@pytest.mark.parametrize(("rows", "native_kernel"), [(1, True), (2, True), (3, False)])
def test_lstm_on_avx512_runs_onednns_primitive_from_three_rows(monkeypatch, op_backend, rows: int,
                                                               native_kernel: bool) -> None:
    """Where oneDNN runs AVX-512, its fused LSTM primitive beats the native kernel from 3 batch rows (torch's tagger
    at 4 and 8 rows: 1.06x and 1.03x onnxruntime against 1.24x); at one or two rows the native kernel, its
    projections one oneDNN GEMM, is faster (1 row 1.05-1.10x against 1.17-1.20x)."""
    from ctxrt.backends.cpu import native
    from ctxrt.backends.cpu.onednn import api

    if op_backend != "cpu" or not api.available() or native.library() is None:
        pytest.skip("the CPU's oneDNN and native kernels")
    monkeypatch.setattr(api, "has_avx512", lambda: True)
    values = arrays("LSTM", 7, rows, 5, 16, 2)
    node = helper.make_node("LSTM", NAMES[:3] + ["B"], ["Y"], hidden_size=16, direction="bidirectional")
    model = _model(node, {"X": values["X"]}, {n: values[n] for n in ("W", "R", "B")})
    with ctxrt.compile(model, backend="cpu") as ctx:
        assert (ctx.graph().compiled.steps[0].algorithm == "native_lstm") is native_kernel
        got = ctx.graph().run({"X": values["X"]})["Y"]
    assert_close(got, _onnxruntime(model, {"X": values["X"]})[0], "Y")


@pytest.mark.parametrize("hidden", [16, 24, 12])  # 16 lanes; 16 then 8; the scalar tail
@pytest.mark.parametrize("layout", [0, 1])
@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize(("rows", "full"), [(1, True), (2, False)])
def test_gru_at_one_or_two_rows_runs_the_native_kernel(direction: str, layout: int, hidden: int, rows: int,
                                                       full: bool, monkeypatch, op_backend, tmp_path) -> None:
    """A GRU with linear_before_reset (torch's export) at one or two batch rows: csrc/lstm_kernel.h's `gru` (the
    projections one oneDNN GEMM; `full`: with B and initial_h, else neither), Y and Y_h against onnxruntime; its
    binary loads where the extension is not built (NumPy's cells in the same scratch) with the same outputs; with
    linear_before_reset = 0 the node stays on oneDNN's primitive."""
    from ctxrt.backends.cpu import native
    from ctxrt.backends.cpu.onednn import api

    if op_backend != "cpu" or native.library() is None or not api.available():
        pytest.skip("the CPU's native kernel and oneDNN")
    d = 2 if direction == "bidirectional" else 1
    values = arrays("GRU", 6, rows, 5, hidden, d)
    consts = ("W", "R", "B") if full else ("W", "R")
    feeds = {"X": values["X"], **({"initial_h": values["initial_h"]} if full else {})}
    names = NAMES[:3] + (["B", "", "initial_h"] if full else [])
    theirs = helper.make_node("GRU", names, ["Y", "Y_h"], hidden_size=hidden, direction=direction,
                              linear_before_reset=1)
    want = _onnxruntime(_model(theirs, feeds, {n: values[n] for n in consts}), feeds)
    if layout:  # batch-first: X (n, t, i), initial_h (n, d, h); Y (n, t, d, h), Y_h (n, d, h)
        feeds = {"X": values["X"].transpose(1, 0, 2).copy(),
                 **({"initial_h": values["initial_h"].transpose(1, 0, 2).copy()} if full else {})}
        want = [want[0].transpose(2, 0, 1, 3), want[1].transpose(1, 0, 2)]
    node = helper.make_node("GRU", names, ["Y", "Y_h"], hidden_size=hidden, direction=direction,
                            linear_before_reset=1, layout=layout)
    model = _model(node, feeds, {n: values[n] for n in consts})
    native_out, numpy_out = _native_then_numpy(model, feeds, "native_gru", tmp_path, monkeypatch)
    for name, w in zip(["Y", "Y_h"], want, strict=True):
        assert_close(native_out[name], np.ascontiguousarray(w), name)
        assert_close(numpy_out[name], np.ascontiguousarray(w), name)
    lbr0 = helper.make_node("GRU", names, ["Y", "Y_h"], hidden_size=hidden, direction=direction, layout=layout)
    with ctxrt.compile(_model(lbr0, feeds, {n: values[n] for n in consts}), backend="cpu") as ctx:
        assert ctx.graph().compiled.steps[0].algorithm != "native_gru"


@pytest.mark.parametrize("bias", [True, False])
def test_native_gru_projects_on_numpy_without_onednn(bias: bool, monkeypatch, op_backend) -> None:
    """The native GRU where its projections cannot run on oneDNN (a binary loaded without it): NumPy's GEMM a
    direction, the summed biases added after; Y and Y_h against onnxruntime."""
    from ctxrt.backends.cpu import native
    from ctxrt.backends.cpu.onednn import api
    from ctxrt.backends.cpu.rnn import rnn_native

    if op_backend != "cpu" or native.library() is None or not api.available():
        pytest.skip("the CPU's native kernel and oneDNN")
    monkeypatch.setattr(rnn_native, "_projection", lambda *a: (None, None))
    values = arrays("GRU", 6, 1, 5, 16, 2)
    consts = ("W", "R", "B") if bias else ("W", "R")
    node = helper.make_node("GRU", NAMES[:3] + (["B"] if bias else []), ["Y", "Y_h"], hidden_size=16,
                            direction="bidirectional", linear_before_reset=1)
    model = _model(node, {"X": values["X"]}, {n: values[n] for n in consts})
    with ctxrt.compile(model, backend="cpu") as ctx:
        g = ctx.graph()
        assert g.compiled.steps[0].algorithm == "native_gru" and g._kernels[0].project is None
        got = g.run({"X": values["X"]})
    for name, want in zip(["Y", "Y_h"], _onnxruntime(model, {"X": values["X"]}), strict=True):
        assert_close(got[name], want, name)
