"""Models people export themselves (tests/models/exported.py), run as a user runs them: one
InferenceSession per export, two batch sizes, against onnxruntime; and the arena against its lower bound."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from exported import MODELS, UNEXPORTABLE, exported_feeds, exported_model

import ctxrt

# legacy (TorchScript) at opset 17 and dynamo at its native opset 18 for every model; a few more opsets
CASES = [(m, e, o) for m in MODELS for e, o in (("legacy", 17), ("dynamo", 18)) if (m, e) not in UNEXPORTABLE]
CASES += [("mobilenet_v3", "legacy", 13), ("audio1d", "legacy", 15), ("unet", "dynamo", 20), ("vit", "dynamo", 20),
          ("gru_tagger", "legacy", 20)]
BATCHES = (1, 3)


def _close(got: np.ndarray, want: np.ndarray, what: str) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype, \
        f"{what}: {got.dtype}{got.shape} vs {want.dtype}{want.shape}"
    err, scale = float(np.max(np.abs(got - want))), float(np.max(np.abs(want)))
    assert err <= 1e-4 * scale + 1e-5, f"{what}: max |ctxrt - ort| = {err:.3g}, max |ort| = {scale:.3g}"


@pytest.mark.parametrize(("name", "exporter", "opset"), CASES, ids=[f"{m}-{e}-op{o}" for m, e, o in CASES])
def test_exported_model_matches_onnxruntime_at_two_batch_sizes(name: str, exporter: str, opset: int) -> None:
    path = exported_model(name, exporter, opset)
    ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    with ctxrt.InferenceSession(str(path)) as sess:
        assert [i.name for i in sess.get_inputs()] == [i.name for i in ref.get_inputs()]
        for batch in BATCHES:
            feeds = exported_feeds(name, batch)
            want = ref.run(None, feeds)
            got = sess.run(None, feeds)
            for o, g, w in zip(ref.get_outputs(), got, want, strict=True):
                _close(g, w, f"{o.name} at batch {batch}")


@pytest.mark.parametrize("name", sorted(MODELS))
def test_exported_model_arena_within_5_percent_of_lower_bound(name: str) -> None:
    exporter = "dynamo" if (name, "legacy") in UNEXPORTABLE else "legacy"
    path = exported_model(name, exporter, 17 if exporter == "legacy" else 18)
    feeds = exported_feeds(name, 2)
    with ctxrt.compile(path, shapes={k: v.shape for k, v in feeds.items()}) as ctx:
        g = ctx.graph()
        assert g.lower_bound <= g.spillfill_size <= 1.05 * g.lower_bound, \
            f"arena {g.spillfill_size} B vs lower bound {g.lower_bound} B"


def test_a_model_the_onnx_checker_rejects_is_reported_as_such() -> None:
    # torch's dynamo exporter writes Split's opset-18 attribute num_outputs into an opset-17 model
    path = exported_model("gpt", "dynamo", 17)
    with pytest.raises(ctxrt.errors.ModelError, match="num_outputs"):
        ctxrt.compile(path, shapes={k: v.shape for k, v in exported_feeds("gpt", 1).items()})


def _spatial(name: str, axes: dict[int, str], tmp_path) -> tuple[str, int, ort.InferenceSession]:
    """The exported model with more of its input's axes dynamic (their names `axes`), saved under `tmp_path`:
    (its path, the input's channels, onnxruntime's session)."""
    import onnx

    model = onnx.load(exported_model(name, "legacy"))
    dims = model.graph.input[0].type.tensor_type.shape.dim
    for axis, dim in axes.items():
        dims[axis].dim_param = dim
    del model.graph.value_info[:]
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, path)
    return str(path), dims[1].dim_value, ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def test_the_audio_net_is_one_program_for_every_clip_length(tmp_path) -> None:
    """The exported 1-D audio net (convs of stride 4, pools of 4, 4 and a ceil_mode 2) with its samples axis
    dynamic, fed clips of 10 lengths and two batch sizes: one range program (its lengths derived dims,
    compiler/floors.py), every output equal to onnxruntime's (each length compiled apart before)."""
    path, _, ref = _spatial("audio1d", {2: "samples"}, tmp_path)
    rng = np.random.default_rng(0)
    with ctxrt.InferenceSession(path) as sess:
        for n in (7777, 2000, 4001, 1234, 517, 3999, 6000, 2048, 1025, 5003):  # (the first sets the bound)
            x = rng.standard_normal((1 + n % 2, 1, n)).astype(np.float32)
            _close(sess.run(None, {"waveform": x})[0], ref.run(None, {"waveform": x})[0], f"{n} samples")
        assert sess.stats["shape_variants_compiled"] == 1 and sess._current.ranged.ranges.floors


@pytest.mark.parametrize("name", ["mobilenet_v3", "efficientnet"])
def test_an_image_net_is_one_program_for_every_image_size(name: str, tmp_path) -> None:
    """An exported image net with its height and width dynamic (strided convs, SAME-like pads, squeeze-excitation's
    global pools) at 6 image sizes and two batch sizes: one range program, its map sizes derived dims
    (compiler/floors.py), every output equal to onnxruntime's (each size compiled apart before)."""
    path, channels, ref = _spatial(name, {2: "height", 3: "width"}, tmp_path)
    name_in = ref.get_inputs()[0].name
    rng = np.random.default_rng(1)
    with ctxrt.InferenceSession(path) as sess:
        for n, h, w in ((1, 120, 90), (2, 64, 64), (1, 33, 101), (2, 97, 47), (1, 17, 128), (2, 80, 21)):
            x = rng.standard_normal((n, channels, h, w)).astype(np.float32)
            _close(sess.run(None, {name_in: x})[0], ref.run(None, {name_in: x})[0], f"{n}x{h}x{w}")
        assert sess.stats["shape_variants_compiled"] == 1 and sess._current.ranged.ranges.floors
