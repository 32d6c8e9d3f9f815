"""LSTM, GRU and RNN on oneDNN's fused RNN primitives (backends/cpu/rnn/rnn_onednn.py) vs onnxruntime: which nodes
take that path and which stay on the NumPy cells, every direction, layout, state input and output combination,
sequences cut into chunks, the brgemm weights format of larger batches, context binaries, runs on fewer threads
than the primitives were made for, and no allocation in the launch."""

from __future__ import annotations

import harness
import numpy as np
import onnx
import pytest
from harness import ITERATOR_BUFFER, allocated, bind
from onnx import helper
from test_recurrent import NAMES, _model, _onnxruntime, arrays, assert_close, outputs_of

import ctxrt
from ctxrt.backends.cpu.onednn import api
from ctxrt.backends.cpu.rnn import rnn_onednn

pytestmark = pytest.mark.skipif(not api.available(), reason="oneDNN is not installed")

BATCH_FIRST = {"X": (1, 0, 2), "initial_h": (1, 0, 2), "initial_c": (1, 0, 2)}


@pytest.fixture(autouse=True)
def _onednn_for_small_lstms(monkeypatch: pytest.MonkeyPatch) -> None:
    """oneDNN's primitive for every node here: small LSTMs otherwise compile for the native kernel
    (rnn_native.py, tested in test_recurrent.py)."""
    from ctxrt.backends.cpu.rnn import rnn_native

    monkeypatch.setattr(rnn_native, "usable", lambda spec: False)
OUT_PERM = {0: (2, 0, 1, 3), 1: (1, 0, 2), 2: (1, 0, 2)}


def compare(op: str, values: dict[str, np.ndarray], used: list[str], outputs: list[str], consts=("W", "R", "B", "P"),
            layout: int = 0, prefer: str = "speed", num_threads: int | None = None, binary=None,
            **attrs) -> list:
    """Compile the node in ctxrt (through a context binary in the folder `binary`), run it twice and compare
    with onnxruntime (layout 1: against the layout-0 node, transposed). Returns the compiled steps."""
    attrs.setdefault("hidden_size", values["R"].shape[-1])
    names = [n if n in used else "" for n in NAMES[:max(NAMES.index(u) for u in used) + 1]]
    feeds0 = {n: values[n] for n in used if n not in consts}
    want = _onnxruntime(_model(helper.make_node(op, names, outputs, **attrs), feeds0,
                               {n: values[n] for n in used if n in consts}), feeds0)
    if layout:
        values = {k: v.transpose(BATCH_FIRST[k]).copy() if k in BATCH_FIRST else v for k, v in values.items()}
        present = [k for k, o in enumerate(outputs) if o]
        want = [w.transpose(OUT_PERM[k]) for k, w in zip(present, want, strict=True)]
        attrs["layout"] = 1
    feeds = {n: values[n] for n in used if n not in consts}
    model = _model(helper.make_node(op, names, outputs, **attrs), feeds, {n: values[n] for n in used if n in consts})
    ctx = ctxrt.compile(model, backend=harness.BACKEND, prefer=prefer)
    if binary is not None:  # through a context binary and back
        onnx.save(model, binary / "rnn.onnx")
        from ctxrt.cli import main as cli

        ctx.free()
        args = ["compile", str(binary / "rnn.onnx"), "-o", str(binary / "rnn.ctx"), "--backend", harness.BACKEND]
        assert cli(args + (["--prefer", prefer] if prefer != "speed" else [])) == 0
        ctx = ctxrt.context_from_binary(binary / "rnn.ctx")
    try:
        ctx.num_threads = num_threads
        g = ctx.graph()
        for _ in range(2):  # twice: the second run must not start from what the first left in scratch
            got = g.run(feeds)
        steps = g.compiled.steps
    finally:
        ctx.free()
    for name, w in zip([o for o in outputs if o], want, strict=True):
        assert_close(got[name], w, f"{op} {name}")
    return steps


def fused(steps) -> bool:
    (step,) = [s for s in steps if s.op in ("LSTM", "GRU", "RNN")]
    return step.algorithm.startswith("onednn:")


def state_inputs(op: str, states: str) -> tuple[list[str], tuple[str, ...]]:
    """Inputs used and constants for: no initial state, states as graph inputs, states as initializers."""
    used = ["X", "W", "R", "B"]
    if states == "none":
        return used, ("W", "R", "B")
    used += ["initial_h"] + (["initial_c", "P"] if op == "LSTM" else [])
    return used, ("W", "R", "B", "P") + (("initial_h", "initial_c") if states == "const" else ())


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("layout", [0, 1])
@pytest.mark.parametrize("states", ["none", "inputs", "const"])
def test_directions_layouts_and_states(op: str, direction: str, layout: int, states: str) -> None:
    d = 2 if direction == "bidirectional" else 1
    values = arrays(op, 7, 3, 5, 6, d)
    used, consts = state_inputs(op, states)
    assert fused(compare(op, values, used, outputs_of(op), consts, layout=layout, direction=direction))


@pytest.mark.parametrize("outputs", [["Y"], ["", "Y_h"], ["", "", "Y_c"], ["Y", "", "Y_c"], ["", "Y_h", "Y_c"]])
@pytest.mark.parametrize("layout", [0, 1])
def test_lstm_outputs_in_any_combination(outputs: list[str], layout: int) -> None:
    values = arrays("LSTM", 6, 2, 3, 4, 2)
    assert fused(compare("LSTM", values, ["X", "W", "R", "B", "initial_h", "initial_c"], outputs,
                         layout=layout, direction="bidirectional"))


@pytest.mark.parametrize("lbr", [0, 1])
@pytest.mark.parametrize("outputs", [["Y", "Y_h"], ["", "Y_h"]])
def test_gru_linear_before_reset(lbr: int, outputs: list[str]) -> None:
    values = arrays("GRU", 5, 2, 3, 7, 2)
    assert fused(compare("GRU", values, ["X", "W", "R", "B", "initial_h"], outputs, direction="bidirectional",
                         linear_before_reset=lbr))


def test_gru_without_bias_and_rnn_activations_per_direction() -> None:
    assert fused(compare("GRU", arrays("GRU", 4, 2, 3, 5, 1), ["X", "W", "R"], ["Y", "Y_h"],
                         linear_before_reset=1))
    values = arrays("RNN", 4, 2, 3, 5, 2)
    assert fused(compare("RNN", values, NAMES[:4], ["Y", "Y_h"], direction="bidirectional",
                         activations=["Relu", "Sigmoid"]))


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("direction", ["reverse", "bidirectional"])
def test_long_sequences_run_in_chunks_of_unequal_lengths(op: str, direction: str) -> None:
    """prefer="memory" keeps oneDNN's scratchpad within 256 KiB: 97 steps of hidden 128 take several calls (of
    unequal lengths: 97 is prime), each starting from the state the one before left."""
    d = 2 if direction == "bidirectional" else 1
    values = arrays(op, 97, 1, 8, 128, d)
    used, consts = state_inputs(op, "inputs")
    steps = compare(op, values, used, outputs_of(op), consts, layout=1, prefer="memory", direction=direction)
    (step,) = [s for s in steps if s.op == op]
    assert step.algorithm.startswith("onednn:") and 1 < step.attrs["rnn_chunk"] < 97


@pytest.mark.parametrize("op", ["LSTM", "GRU"])
def test_larger_batches_use_onednn_weights_format_through_a_binary(op: str, tmp_path) -> None:
    """From batch SMALL_BATCH the weights are stored in the format oneDNN chooses, recorded by name: for an LSTM
    (oneDNN 3.2, AVX2 or better) its brgemm cell's blocked format, which must survive the binary."""
    values = arrays(op, 6, rnn_onednn.SMALL_BATCH, 5, 16, 2)
    used, consts = state_inputs(op, "inputs")
    attrs = {"linear_before_reset": 1} if op == "GRU" else {}
    steps = compare(op, values, used, outputs_of(op), consts, direction="bidirectional", binary=tmp_path, **attrs)
    (step,) = [s for s in steps if s.op == op]
    assert step.algorithm.startswith("onednn:")
    if op == "LSTM" and "brgemm" in step.algorithm:
        assert step.attrs["rnn_weights"] != [rnn_onednn.LDIGO] * 2


def test_plain_weights_through_a_binary(tmp_path) -> None:
    values = arrays("LSTM", 5, 1, 3, 4, 2)
    steps = compare("LSTM", values, ["X", "W", "R", "B", "initial_h", "initial_c", "P"], ["", "Y_h", "Y_c"],
                    direction="bidirectional", layout=1, binary=tmp_path)
    assert fused(steps)


@pytest.mark.parametrize("batch, hidden", [(1, 8), (8, 300)])
@pytest.mark.parametrize("num_threads", [1, 2])
def test_runs_on_one_thread_or_on_the_run_s_threads(batch: int, hidden: int, num_threads: int) -> None:
    """Small steps run on one thread whatever the run has (OpenMP held to one meanwhile); a step of batch 8,
    hidden 300 on the run's threads: with fewer than the primitives were made for, on primitives made for those."""
    values = arrays("GRU", 3, batch, 4, hidden, 2)
    assert fused(compare("GRU", values, NAMES[:4], ["Y", "Y_h"], direction="bidirectional", num_threads=num_threads,
                         linear_before_reset=1))


def test_sequence_lens_all_the_full_length_is_fused() -> None:
    values = arrays("LSTM", 6, 3, 4, 5, 2, lens=[6, 6, 6])
    assert fused(compare("LSTM", values, NAMES[:5], ["Y", "Y_h"], ("W", "R", "B", "sequence_lens"),
                         direction="bidirectional"))


@pytest.mark.parametrize("case", ["short sequence_lens", "run-time sequence_lens", "clip", "input_forget",
                                  "activations", "run-time weights", "float64"])
def test_what_oneDNN_does_not_compute_runs_on_the_numpy_cells(case: str) -> None:
    op = "GRU" if case == "activations" else "LSTM"
    dtype = np.float64 if case == "float64" else np.float32
    values = arrays(op, 6, 3, 4, 5, 2, dtype=dtype, lens=[6, 2, 4] if case == "short sequence_lens" else None)
    used, consts, attrs = ["X", "W", "R", "B"], ("W", "R", "B"), {"direction": "bidirectional"}
    if "sequence_lens" in case:
        used += ["sequence_lens"]
        consts += ("sequence_lens",) if case.startswith("short") else ()
    attrs.update({"clip": {"clip": 0.5}, "input_forget": {"input_forget": 1},
                  "activations": {"activations": ["HardSigmoid", "Tanh"] * 2}}.get(case, {}))
    if case == "run-time weights":
        consts = ("B",)
    if case == "float64":  # onnxruntime has no double LSTM: check only the path taken
        model = _model(helper.make_node(op, used, ["Y"], hidden_size=5, **attrs), {"X": values["X"]},
                       {n: values[n] for n in consts})
        with ctxrt.compile(model) as ctx:
            assert not fused(ctx.graph().compiled.steps)
        return
    assert not fused(compare(op, values, used, ["Y", "Y_h"], consts, **attrs))


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
def test_launch_allocates_nothing_and_reads_its_own_prepacked_weights(op: str) -> None:
    """Bound directly (not through the compiler, which would have swapped the weights for the prepacked ones)."""
    t, n, h, d = 12, 3, 16, 2
    v = arrays(op, t, n, 8, h, d)
    ins = [v[k] for k in NAMES[:4]] + [None, v["initial_h"]] + ([v["initial_c"], v["P"]] if op == "LSTM" else [])
    consts = [None, v["W"], v["R"], v["B"], None, None] + ([None, v["P"]] if op == "LSTM" else [])
    shapes = [(t, d, n, h), (d, n, h)] + ([(d, n, h)] if op == "LSTM" else [])
    fused_outs = [np.zeros(s, np.float32) for s in shapes]
    launch = bind(op, ins, fused_outs, {"direction": "bidirectional", "hidden_size": h}, consts)
    assert allocated(launch) < ITERATOR_BUFFER
    numpy_outs = [np.zeros(s, np.float32) for s in shapes]
    bind(op, ins, numpy_outs, {"direction": "bidirectional", "hidden_size": h})()  # W a run-time input: NumPy
    for got, want in zip(fused_outs, numpy_outs, strict=True):
        assert_close(got, want)


def test_scratch_stays_bounded_whatever_the_sequence_length() -> None:
    """oneDNN's scratchpad grows with the steps of a call: chunks keep it within the budget (plus the states)."""
    sizes = []
    for t in (64, 512):
        values = arrays("LSTM", t, 1, 8, 256, 1)
        node = helper.make_node("LSTM", ["X", "W", "R", "B"], ["Y", "Y_h", "Y_c"], hidden_size=256)
        with ctxrt.compile(_model(node, {"X": values["X"]}, {k: values[k] for k in "WRB"})) as ctx:
            (step,) = [s for s in ctx.graph().compiled.steps if s.op == "LSTM"]
            assert step.algorithm.startswith("onednn:")
            sizes.append(sum(r.nbytes for r in step.scratch))
    assert max(sizes) <= rnn_onednn.SCRATCH_BUDGET["speed"] + 64 * 1024
