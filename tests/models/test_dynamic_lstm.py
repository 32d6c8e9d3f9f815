"""LSTMs quantized by onnxruntime's quantize_dynamic (com.microsoft.DynamicQuantizeLSTM, 8-bit W and R), run by
ctxrt (backends/cpu/quant/lstm.py) against onnxruntime on the same file and against the float model.

Tolerance. ctxrt dequantizes the 8-bit weights and computes the LSTM in float32; onnxruntime's kernel also quantizes
X and H to uint8 at every step (per tensor, its dynamic range) and sums integer products. The two therefore differ
by that activation quantization, which is part of onnxruntime's own error against the float model's LSTM. Measured
(max |difference|) on the LSTM outputs here (|Y| 0.17 to 1.6): ctxrt - onnxruntime 6.3e-4 to 2.1e-2, at most
1.06x onnxruntime's own distance from the float model (8.4e-4 to 3.0e-2); ctxrt - float at most 0.90x that
distance. The taggers' Linear head (quantized by quantize_dynamic too: its input quantized per run, in both
runtimes, from inputs that differ slightly) raises the ratios on its output to 1.27x and 1.39x. So an LSTM
output of ctxrt must be within 1.5x onnxruntime's own distance from the float model, of onnxruntime's output and
of the float model's (the head's output: 2x; about 1.4x the largest ratio measured either way), and within 5% of
the output's largest magnitude.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import ctxrt
from ctxrt.backends import get_backend
from ctxrt.compiler import compile_graphs, save_context

ort = pytest.importorskip("onnxruntime")
quantization = pytest.importorskip("onnxruntime.quantization")
torch = pytest.importorskip("torch")

INPUT = 16


def _tagger(path: Path, layers: int, bidirectional: bool, hidden: int, seq: int, batch: int = 3,
            dynamic: bool = False) -> np.ndarray:
    """A torch.nn.LSTM tagger (batch first, a Linear head) exported to ONNX (`dynamic`: batch and sequence axes
    named); returns an input for it."""

    class Tagger(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lstm = torch.nn.LSTM(INPUT, hidden, layers, batch_first=True, bidirectional=bidirectional)
            self.head = torch.nn.Linear(hidden * (2 if bidirectional else 1), 5)

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            y, _ = self.lstm(x)
            return y, self.head(y)

    torch.manual_seed(layers * 100 + hidden)
    x = np.random.default_rng(seq).standard_normal((batch, seq, INPUT)).astype(np.float32)
    with warnings.catch_warnings(), torch.no_grad():  # the legacy exporter's deprecation and batch-size warnings
        warnings.simplefilter("ignore")
        torch.onnx.export(Tagger().eval(), torch.from_numpy(x), str(path), dynamo=False, opset_version=17,
                          input_names=["x"], output_names=["y", "tags"],
                          dynamic_axes={k: {0: "batch", 1: "seq"} for k in ("x", "y", "tags")} if dynamic else None)
    return x


def _quantize(src: Path, dst: Path, weight_type: str = "QInt8", per_channel: bool = False) -> Path:
    quantization.quantize_dynamic(str(src), str(dst), weight_type=getattr(quantization.QuantType, weight_type),
                                  per_channel=per_channel)
    ops = {(n.domain, n.op_type) for n in onnx.load(str(dst)).graph.node}
    assert ("com.microsoft", "DynamicQuantizeLSTM") in ops and ("", "LSTM") not in ops, ops
    return dst


def _ort(path: Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)


def _close(got: list[np.ndarray], want: list[np.ndarray], flt: list[np.ndarray], head: bool = False) -> None:
    """The module docstring's tolerance, output by output (`head`: the last output is the tagger's head)."""
    for k, (g, w, f) in enumerate(zip(got, want, flt, strict=True)):
        d_ort, d_own, d_flt = (float(np.abs(a - b).max()) for a, b in ((g, w), (w, f), (g, f)))
        factor = 2.0 if head and k == len(got) - 1 else 1.5
        assert d_ort <= factor * d_own + 1e-6, (k, d_ort, d_own)
        assert d_flt <= factor * d_own + 1e-6, (k, d_flt, d_own)
        assert d_ort <= 0.05 * float(np.abs(f).max()), (k, d_ort, float(np.abs(f).max()))


CASES = [(1, False, 32, 10), (2, True, 64, 20), (2, False, 48, 15), (1, True, 40, 12)]


@pytest.mark.parametrize("per_channel", [False, True], ids=["tensor", "channel"])
@pytest.mark.parametrize("layers,bidirectional,hidden,seq", CASES)
def test_dynamic_lstm_matches_onnxruntime(tmp_path: Path, layers: int, bidirectional: bool, hidden: int, seq: int,
                                          per_channel: bool) -> None:
    src = tmp_path / "f.onnx"
    x = _tagger(src, layers, bidirectional, hidden, seq)
    path = _quantize(src, tmp_path / "q.onnx", "QInt8", per_channel)
    feeds = {"x": x}
    got = ctxrt.InferenceSession(str(path)).run(None, feeds)
    _close(got, _ort(path, feeds), _ort(src, feeds), head=True)


def test_dynamic_axes(tmp_path: Path) -> None:
    """Batch and sequence axes named: a range program (its kernels made per shape), fed several shapes."""
    src = tmp_path / "f.onnx"
    _tagger(src, 1, True, 32, 8, dynamic=True)
    path = _quantize(src, tmp_path / "q.onnx")
    sess = ctxrt.InferenceSession(str(path))
    for shape in [(3, 8, INPUT), (1, 5, INPUT), (6, 13, INPUT)]:
        feeds = {"x": np.random.default_rng(shape[1]).standard_normal(shape).astype(np.float32)}
        got = sess.run(None, feeds)
        assert got[0].shape == (shape[0], shape[1], 64)
        _close(got, _ort(path, feeds), _ort(src, feeds), head=True)


def _to_uint8(src: Path, dst: Path) -> Path:
    """The quantized model with uint8 W and R (q + 128, zero points + 128): the same values, the other type."""
    model = onnx.load(str(src))
    lstm = [n for n in model.graph.node if n.op_type == "DynamicQuantizeLSTM"]
    names = {n.input[k] for n in lstm for k in (1, 2, 9, 11)}
    for init in model.graph.initializer:
        if init.name in names:
            a = numpy_helper.to_array(init)
            assert a.dtype == np.int8
            init.CopyFrom(numpy_helper.from_array((a.astype(np.int16) + 128).astype(np.uint8), init.name))
    onnx.save(model, str(dst))
    return dst


@pytest.mark.parametrize("per_channel", [False, True], ids=["tensor", "channel"])
def test_uint8_weights(tmp_path: Path, per_channel: bool) -> None:
    """quantize_dynamic writes int8 LSTM weights whatever weight_type says (QUInt8 here): uint8 W and R, which the
    op allows, by rewriting its model."""
    src = tmp_path / "f.onnx"
    x = _tagger(src, 2, True, 32, 12)
    path = _to_uint8(_quantize(src, tmp_path / "q.onnx", "QUInt8", per_channel), tmp_path / "u8.onnx")
    feeds = {"x": x}
    got = ctxrt.InferenceSession(str(path)).run(None, feeds)
    _close(got, _ort(path, feeds), _ort(src, feeds), head=True)
    # the same weight values as int8: the same result
    for a, b in zip(got, ctxrt.InferenceSession(str(tmp_path / "q.onnx")).run(None, feeds), strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)


def _lstm_node(path: Path, direction: str, hidden: int = 24, seq: int = 9, batch: int = 4, peepholes: bool = True,
               outputs: tuple[str, ...] = ("Y", "Y_h", "Y_c"), **attrs: object) -> None:
    """One LSTM node written by hand: sequence_lens, initial_h and initial_c as graph inputs, peepholes, the
    `outputs` named (an empty name: absent), `attrs`."""
    d = 2 if direction == "bidirectional" else 1
    rng = np.random.default_rng(7)

    def init(name: str, shape: tuple[int, ...], scale: float) -> onnx.TensorProto:
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)

    inits = [init("W", (d, 4 * hidden, INPUT), 0.25), init("R", (d, 4 * hidden, hidden), 0.2),
             init("B", (d, 8 * hidden), 0.1)] + ([init("P", (d, 3 * hidden), 0.1)] if peepholes else [])
    node = helper.make_node("LSTM", ["X", "W", "R", "B", "lens", "h0", "c0", "P" if peepholes else ""],
                            list(outputs), direction=direction, hidden_size=hidden, **attrs)
    f = onnx.TensorProto.FLOAT
    graph = helper.make_graph(
        [node], "lstm",
        [helper.make_tensor_value_info("X", f, [seq, batch, INPUT]),
         helper.make_tensor_value_info("lens", onnx.TensorProto.INT32, [batch]),
         helper.make_tensor_value_info("h0", f, [d, batch, hidden]),
         helper.make_tensor_value_info("c0", f, [d, batch, hidden])],
        [helper.make_tensor_value_info(n, f, [seq, d, batch, hidden] if n == "Y" else [d, batch, hidden])
         for n in outputs if n], initializer=inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_initial_state_and_sequence_lens(tmp_path: Path, direction: str) -> None:
    src = tmp_path / "f.onnx"
    _lstm_node(src, direction)
    path = _quantize(src, tmp_path / "q.onnx")
    d = 2 if direction == "bidirectional" else 1
    rng = np.random.default_rng(3)
    feeds = {"X": rng.standard_normal((9, 4, INPUT)).astype(np.float32),
             "lens": np.array([9, 5, 1, 7], np.int32),
             "h0": (rng.standard_normal((d, 4, 24)) * 0.5).astype(np.float32),
             "c0": (rng.standard_normal((d, 4, 24)) * 0.5).astype(np.float32)}
    got = ctxrt.InferenceSession(str(path)).run(None, feeds)
    want = _ort(path, feeds)
    _close(got, want, _ort(src, feeds))
    y = got[0]
    assert not y[5:, :, 1].any() and not y[1:, :, 2].any()  # padded steps: zeros, as onnxruntime's
    np.testing.assert_array_equal(y[5:, :, 1] == 0, want[0][5:, :, 1] == 0)


@pytest.mark.parametrize("attrs,outputs", [
    ({"clip": 0.8}, ("Y", "", "Y_c")),
    ({"input_forget": 1}, ("", "Y_h")),
    ({"activations": ["HardSigmoid", "Tanh", "Tanh"], "activation_alpha": [0.3], "activation_beta": [0.4]},
     ("Y",)),
], ids=["clip", "input_forget", "activations"])
def test_attributes_and_absent_outputs(tmp_path: Path, attrs: dict, outputs: tuple[str, ...]) -> None:
    """The LSTM attributes the op takes, and outputs left out (Y_h absent before a present Y_c)."""
    src = tmp_path / "f.onnx"
    _lstm_node(src, "forward", batch=20, outputs=outputs, **attrs)  # 20 rows: the NumPy cells even where native
    path = _quantize(src, tmp_path / "q.onnx")
    rng = np.random.default_rng(5)
    feeds = {"X": rng.standard_normal((9, 20, INPUT)).astype(np.float32), "lens": np.full(20, 9, np.int32),
             "h0": (rng.standard_normal((1, 20, 24)) * 0.5).astype(np.float32),
             "c0": (rng.standard_normal((1, 20, 24)) * 0.5).astype(np.float32)}
    got = ctxrt.InferenceSession(str(path)).run(None, feeds)
    assert len(got) == len([n for n in outputs if n])
    _close(got, _ort(path, feeds), _ort(src, feeds))


def test_context_binary_keeps_quantized_weights(tmp_path: Path) -> None:
    """W and R stay int8 in the context binary (dequantized into scratch at each run, never stored as float), and
    the binary runs as the session does."""
    src = tmp_path / "f.onnx"
    x = _tagger(src, 2, True, 128, 8, batch=2)
    path = _quantize(src, tmp_path / "q.onnx")
    backend = get_backend("cpu")
    sizes, dtypes = {}, {}
    for label, model in (("float", src), ("quantized", path)):
        graphs, weights = compile_graphs([(str(model), None, "main")], backend)
        meta = ctxrt.read_metadata(save_context(tmp_path / f"{label}.ctx", graphs, weights, backend, [str(model)]))
        sizes[label] = meta["weights_size"]
        dtypes[label] = {entry[2] for entry in meta["weights"].values()}
    assert sizes["quantized"] <= 0.3 * sizes["float"], sizes
    assert "|i1" in dtypes["quantized"], dtypes
    got = ctxrt.InferenceSession(str(path)).run(None, {"x": x})
    with ctxrt.context_from_binary(tmp_path / "quantized.ctx") as ctx:
        out = ctx.graph().run({"x": x})
        for name, want in zip(["y", "tags"], got, strict=True):
            np.testing.assert_array_equal(out[name], want)
