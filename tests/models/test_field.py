"""ONNX models shipped inside PyPI packages (tests/models/field.py), run through InferenceSession at two
batch sizes against onnxruntime."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from field import FIELD, field_feeds, field_model

import ctxrt
from ctxrt.errors import CtxrtWarning


@pytest.mark.parametrize("name", list(FIELD))
def test_shipped_model_matches_onnxruntime(name: str) -> None:
    path = field_model(name)
    ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    with ctxrt.InferenceSession(str(path)) as sess:
        for batch in (1, 2):
            feeds = field_feeds(name, batch)
            want = ref.run(None, feeds)
            got = sess.run(None, feeds)
            for o, g, w in zip(ref.get_outputs(), got, want, strict=True):
                assert g.shape == w.shape and g.dtype == w.dtype, f"{o.name}: {g.dtype}{g.shape} vs {w.dtype}{w.shape}"
                err, scale = float(np.max(np.abs(g - w))), float(np.max(np.abs(w)))
                assert err <= 1e-4 * scale + 1e-5, f"{o.name} at batch {batch}: max |ctxrt - ort| = {err:.3g}"


@pytest.mark.parametrize("name, shapes", [("ppocr_det", [(1, 3, 64, 96), (1, 3, 32, 64), (2, 3, 96, 64)]),
                                          ("ppocr_rec", [(1, 3, 48, 160), (2, 3, 48, 320), (1, 3, 48, 96)])])
def test_images_of_other_sizes_match_onnxruntime(name: str, shapes) -> None:
    """PP-OCR's detector has no graph at odd image sizes (its feature pyramid adds maps of different heights): no
    program for ranges of the image size. The session ranges the batch at the first size (a range program was
    taken over H and W once, and answered a 32 x 64 image with a 64 x 96 map); the second size met, both multiples
    of 32, one program over the multiples of 32 (the step they share): the third size runs on it. The
    recognizer's output width is its strided convs' and pool's width / 8 rounded, a derived dim
    (compiler/floors.py): one program over the batch and every width (its height fixed at the size met), widened
    once for 320."""
    path = field_model(name)
    ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    with pytest.warns(CtxrtWarning, match="range of"), ctxrt.InferenceSession(str(path)) as sess:
        for shape in shapes:
            feeds = {ref.get_inputs()[0].name: rng.standard_normal(shape).astype(np.float32)}
            (want, *_), (got, *_) = ref.run(None, feeds), sess.run(None, feeds)
            assert got.shape == want.shape, f"{shape}: {got.shape} vs {want.shape}"
            assert float(np.max(np.abs(got - want))) <= 1e-4 * float(np.max(np.abs(want))) + 1e-5
        assert sess.stats["shape_variants_compiled"] == 2
        assert {k: v[-1] for k, v in sess.dim_ranges.items() if len(v) == 3} == \
            ({"p2o.DynamicDimension.1": 32, "p2o.DynamicDimension.2": 32} if name == "ppocr_det" else {})
    if name == "ppocr_rec":
        assert sess.dim_ranges["p2o.DynamicDimension.1"][1] >= 320


def test_silero_vad_ranges_its_batch_in_audio_and_state_at_once() -> None:
    """Silero VAD's STFT frames round its samples (no range over them); its batch is two symbolic dims, the audio's
    and the state's: ranged together (one range and one size in the first feeds), every batch size runs one
    program, as onnxruntime's outputs."""
    path = field_model("silero_vad")
    ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    with pytest.warns(CtxrtWarning, match="range of 'input:0' and 'state:1' only"), \
            ctxrt.InferenceSession(str(path)) as sess:
        for batch in (1, 3, 2, 5):
            feeds = field_feeds("silero_vad", batch)
            for g, w in zip(sess.run(None, feeds), ref.run(None, feeds), strict=True):
                assert g.shape == w.shape
                assert float(np.max(np.abs(g - w))) <= 1e-4 * float(np.max(np.abs(w))) + 1e-5
        assert sess.stats["shape_variants_compiled"] == 1
