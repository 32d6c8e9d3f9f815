"""ONNX models shipped inside PyPI packages (tests/models/field.py), run through InferenceSession at two
batch sizes against onnxruntime."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from field import FIELD, field_feeds, field_model

import ctxrt


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
