"""Mid-size encoders (tests/models/encoders.py: transformers' configs, random weights) through InferenceSession as a
user opens them, against onnxruntime: the sizes where the CPU's large-GEMM paths run (a speech encoder's
feature-extractor convs and attention over 1500 frames on oneDNN's GEMM, activations on OpenMP's team, planar
depthwise convs and transposing copies natively). A second input size where the model has a dynamic length."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from encoders import encoder_feeds, encoder_model

import ctxrt

CASES = ["wav2vec2", "whisper_encoder", "segformer"]


@pytest.mark.parametrize("name", CASES)
def test_encoder_matches_onnxruntime(name: str) -> None:
    path = encoder_model(name)
    ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feeds = [encoder_feeds(name)]
    if name == "wav2vec2":  # another clip length: the same range program
        feeds.append({"x": np.random.default_rng(1).standard_normal((1, 23456)).astype(np.float32)})
    with ctxrt.InferenceSession(str(path)) as sess:
        for f in feeds:
            (want,), (got,) = ref.run(None, f), sess.run(None, f)
            assert got.shape == want.shape
            err, scale = float(np.max(np.abs(got - want))), float(np.max(np.abs(want)))
            assert err <= 1e-4 * scale + 1e-5, f"{name} at {f['x'].shape}: max |ctxrt - ort| = {err:.3g}"
        assert sess.stats["shape_variants_compiled"] == 1
