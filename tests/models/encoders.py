"""Mid-size encoders of the architectures people export, from transformers' configs with random weights (no model
hub here), exported by torch's TorchScript exporter with a dynamic batch axis (and the sequence or sample axis where
the model has one), cached under zoo.cache_dir(): the sizes where kernels, not per-op overhead, decide the latency
(bench/bench_models.py `--models encoders`; a speech encoder's feature extractor, attention over 1500 frames, an
image net's planar depthwise convs).

    encoder_model("wav2vec2") -> Path;  encoder_feeds("wav2vec2") -> {"x": ...}
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from zoo import _cached, _quiet, cache_dir

SALT = "v1"


def _wav2vec2(t: Any) -> Any:  # hidden 256, 4 layers, the 7-conv feature extractor at 256 channels
    return t.Wav2Vec2Model(t.Wav2Vec2Config(vocab_size=32, hidden_size=256, num_hidden_layers=4,
                                            num_attention_heads=4, intermediate_size=1024, conv_dim=(256,) * 7))


def _whisper(t: Any) -> Any:  # Whisper's encoder, d_model 384 (tiny's), 4 layers, 30 s of 80 mel bins
    cfg = t.WhisperConfig(d_model=384, encoder_layers=4, decoder_layers=1, encoder_attention_heads=6,
                          decoder_attention_heads=6, encoder_ffn_dim=1536, decoder_ffn_dim=1536, num_mel_bins=80)
    return t.WhisperModel(cfg).get_encoder()


def _segformer(t: Any) -> Any:  # MiT-b0's widths and depths 2, 2, 2, 2
    return t.SegformerModel(t.SegformerConfig(hidden_sizes=[32, 64, 160, 256], depths=[2, 2, 2, 2]))


def _convnext(t: Any) -> Any:  # ConvNeXt-T's depths halved, its widths / 2
    return t.ConvNextModel(t.ConvNextConfig(hidden_sizes=[48, 96, 192, 384], depths=[2, 2, 4, 2]))


def _vit(t: Any) -> Any:  # ViT-S's width, 4 layers, 224 x 224 by 16 x 16 patches
    return t.ViTModel(t.ViTConfig(hidden_size=384, num_hidden_layers=4, num_attention_heads=6,
                                  intermediate_size=1536, image_size=224, patch_size=16))


def _distilbert(t: Any) -> Any:
    return t.DistilBertModel(t.DistilBertConfig(dim=384, n_layers=4, n_heads=6, hidden_dim=1536, vocab_size=1000))


def _t5(t: Any) -> Any:  # T5's encoder (relative position buckets, RMS norms, ReLU feed-forwards)
    return t.T5EncoderModel(t.T5Config(d_model=384, num_layers=4, num_heads=6, d_ff=1536, d_kv=64, vocab_size=1000))


# name -> (builder, input shape, its dynamic axes by name, whether the input is token ids)
SPECS: dict[str, tuple[Callable[[Any], Any], tuple[int, ...], dict[int, str], bool]] = {
    "wav2vec2": (_wav2vec2, (1, 40000), {0: "batch", 1: "samples"}, False),
    "whisper_encoder": (_whisper, (1, 80, 3000), {0: "batch"}, False),
    "segformer": (_segformer, (1, 3, 256, 256), {0: "batch"}, False),
    "convnext": (_convnext, (1, 3, 224, 224), {0: "batch"}, False),
    "vit_small": (_vit, (1, 3, 224, 224), {0: "batch"}, False),
    "distilbert": (_distilbert, (1, 128), {0: "batch", 1: "sequence"}, True),
    "t5_encoder": (_t5, (1, 128), {0: "batch", 1: "sequence"}, True),
}
ENCODERS = list(SPECS)


def encoder_model(name: str) -> Path:
    """The exported encoder `name` (one of ENCODERS), exported on first use."""
    if name not in SPECS:
        raise ValueError(f"unknown encoder {name!r}; one of {ENCODERS}")
    return _cached(cache_dir() / f"encoder_{name}_{SALT}.onnx", lambda: _export(name))


def encoder_feeds(name: str, seed: int = 0) -> dict[str, np.ndarray]:
    _, shape, _, ids = SPECS[name]
    rng = np.random.default_rng(seed)
    if ids:
        return {"x": rng.integers(0, 1000, size=shape, dtype=np.int64)}
    return {"x": rng.standard_normal(shape).astype(np.float32)}


def _export(name: str) -> onnx.ModelProto:
    import torch
    import transformers

    build, shape, axes, _ = SPECS[name]
    torch.manual_seed(0)
    model = build(transformers).eval()

    class Wrapper(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.m = model

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out = self.m(x)
            return out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]

    x = torch.from_numpy(encoder_feeds(name)["x"])
    buf = io.BytesIO()
    with _quiet(), torch.no_grad():
        torch.onnx.export(Wrapper(), (x,), buf, input_names=["x"], output_names=["y"], dynamic_axes={"x": axes},
                          opset_version=17, dynamo=False)
    return onnx.load_from_string(buf.getvalue())


if __name__ == "__main__":  # export them all (a CI cache warm-up)
    for n in ENCODERS:
        print(n, encoder_model(n), os.path.getsize(encoder_model(n)))
