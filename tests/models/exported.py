"""Architectures people export themselves, defined here as small torch modules with random weights and
exported by `torch.onnx.export` (legacy TorchScript and dynamo exporters). Nothing here was tuned for ctxrt:
the modules are written as their papers and torchvision write them.

`exported_model(name, exporter)` returns a cached `.onnx` path; `exported_feeds(name, batch)` seeded inputs.
Every model has a dynamic batch axis.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path

import decoders
import numpy as np
import onnx
import zoo

SALT = "x1"


def _torch():  # imported lazily: collecting tests must not pay for torch
    import torch

    return torch


# ---- modules ------------------------------------------------------------------------------------------

def _mobilenet_v3():
    torch = _torch()
    nn = torch.nn

    class SE(nn.Module):
        def __init__(self, c: int, r: int = 4) -> None:
            super().__init__()
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.fc1, self.fc2 = nn.Conv2d(c, c // r, 1), nn.Conv2d(c // r, c, 1)

        def forward(self, x):
            s = self.pool(x)
            return x * nn.functional.hardsigmoid(self.fc2(torch.relu(self.fc1(s))))

    class Block(nn.Module):
        def __init__(self, cin: int, exp: int, cout: int, k: int, stride: int, se: bool, hs: bool) -> None:
            super().__init__()
            act = nn.Hardswish if hs else nn.ReLU
            self.res = stride == 1 and cin == cout
            layers = [nn.Conv2d(cin, exp, 1, bias=False), nn.BatchNorm2d(exp), act(),
                      nn.Conv2d(exp, exp, k, stride, k // 2, groups=exp, bias=False), nn.BatchNorm2d(exp), act()]
            if se:
                layers.append(SE(exp))
            layers += [nn.Conv2d(exp, cout, 1, bias=False), nn.BatchNorm2d(cout)]
            self.body = nn.Sequential(*layers)

        def forward(self, x):
            y = self.body(x)
            return x + y if self.res else y

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16), nn.Hardswish())
            self.blocks = nn.Sequential(
                Block(16, 16, 16, 3, 2, True, False), Block(16, 72, 24, 3, 2, False, False),
                Block(24, 88, 24, 3, 1, False, False), Block(24, 96, 40, 5, 2, True, True),
                Block(40, 240, 40, 5, 1, True, True))
            self.head = nn.Sequential(nn.Conv2d(40, 96, 1, bias=False), nn.BatchNorm2d(96), nn.Hardswish(),
                                      nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(96, 128), nn.Hardswish(),
                                      nn.Dropout(0.2), nn.Linear(128, 10))

        def forward(self, x):
            return self.head(self.blocks(self.stem(x)))

    return Net(), {"image": (3, 64, 64)}


def _efficientnet():
    torch = _torch()
    nn = torch.nn

    class MBConv(nn.Module):
        def __init__(self, cin: int, cout: int, expand: int, k: int, stride: int) -> None:
            super().__init__()
            mid = cin * expand
            self.res = stride == 1 and cin == cout
            self.expand = nn.Sequential(nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid), nn.SiLU()) \
                if expand != 1 else nn.Identity()
            self.dw = nn.Sequential(nn.Conv2d(mid, mid, k, stride, k // 2, groups=mid, bias=False),
                                    nn.BatchNorm2d(mid), nn.SiLU())
            sq = max(1, cin // 4)
            self.se = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(mid, sq, 1), nn.SiLU(), nn.Conv2d(sq, mid, 1),
                                    nn.Sigmoid())
            self.project = nn.Sequential(nn.Conv2d(mid, cout, 1, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x):
            y = self.dw(self.expand(x))
            y = self.project(y * self.se(y))
            return x + y if self.res else y

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, 24, 3, 2, 1, bias=False), nn.BatchNorm2d(24), nn.SiLU())
            self.blocks = nn.Sequential(MBConv(24, 16, 1, 3, 1), MBConv(16, 24, 4, 3, 2), MBConv(24, 24, 4, 3, 1),
                                        MBConv(24, 40, 4, 5, 2))
            self.head = nn.Sequential(nn.Conv2d(40, 128, 1, bias=False), nn.BatchNorm2d(128), nn.SiLU(),
                                      nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 10))

        def forward(self, x):
            return self.head(self.blocks(self.stem(x)))

    return Net(), {"image": (3, 64, 64)}


def _unet():
    torch = _torch()
    nn = torch.nn

    def double(cin: int, cout: int):
        return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(),
                             nn.Conv2d(cout, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU())

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.d1, self.d2, self.d3 = double(3, 8), double(8, 16), double(16, 32)
            self.pool = nn.MaxPool2d(2)
            self.up1 = nn.ConvTranspose2d(32, 16, 2, stride=2)  # learned upsampling
            self.u1 = double(32, 16)
            self.up2 = nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False)  # fixed upsampling
            self.u2 = double(24, 8)
            self.out = nn.Conv2d(8, 2, 1)

        def forward(self, x):
            a = self.d1(x)
            b = self.d2(self.pool(a))
            c = self.d3(self.pool(b))
            y = self.u1(torch.cat([self.up1(c), b], 1))
            y = self.u2(torch.cat([self.up2(y), a], 1))
            return self.out(y)

    return Net(), {"image": (3, 32, 48)}


def _vit():
    """timm's ViT layout: patch-embedding conv, class token, pre-norm blocks with fused qkv and
    scaled_dot_product_attention, exact GELU."""
    torch = _torch()
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self, dim: int, heads: int) -> None:
            super().__init__()
            self.heads = heads
            self.norm1, self.norm2 = nn.LayerNorm(dim, eps=1e-6), nn.LayerNorm(dim, eps=1e-6)
            self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
            self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

        def forward(self, x):
            b, n, c = x.shape
            qkv = self.qkv(self.norm1(x)).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
            y = nn.functional.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2])
            x = x + self.proj(y.transpose(1, 2).reshape(b, n, c))
            return x + self.mlp(self.norm2(x))

    class Net(nn.Module):
        def __init__(self, size: int = 32, patch: int = 8, dim: int = 64, depth: int = 2, heads: int = 4) -> None:
            super().__init__()
            self.embed = nn.Conv2d(3, dim, patch, patch)
            n = (size // patch) ** 2
            self.cls = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
            self.pos = nn.Parameter(torch.randn(1, n + 1, dim) * 0.02)
            self.blocks = nn.Sequential(*[Block(dim, heads) for _ in range(depth)])
            self.norm = nn.LayerNorm(dim, eps=1e-6)
            self.head = nn.Linear(dim, 10)

        def forward(self, x):
            x = self.embed(x).flatten(2).transpose(1, 2)
            x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], 1) + self.pos
            return self.head(self.norm(self.blocks(x))[:, 0])

    return Net(), {"image": (3, 32, 32)}


GPT_SEQ, GPT_PAST, GPT_DIM, GPT_HEADS, GPT_VOCAB = 8, 4, 64, 4, 100


def _gpt():
    torch = _torch()
    nn = torch.nn
    hd = GPT_DIM // GPT_HEADS

    Block = decoders.block(GPT_DIM, GPT_HEADS)  # noqa: N806 - a class

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tok, self.pos = nn.Embedding(GPT_VOCAB, GPT_DIM), nn.Embedding(64, GPT_DIM)
            self.blocks = nn.ModuleList([Block(), Block()])
            self.ln = nn.LayerNorm(GPT_DIM)
            self.lm = nn.Linear(GPT_DIM, GPT_VOCAB, bias=False)

        def forward(self, ids, past_k, past_v):
            t, p = ids.shape[1], past_k.shape[3]
            x = self.tok(ids) + self.pos(torch.arange(p, p + t))
            ks, vs = [], []
            for i, blk in enumerate(self.blocks):
                x, k, v = blk(x, past_k[i], past_v[i])
                ks.append(k)
                vs.append(v)
            return self.lm(self.ln(x)), torch.stack(ks), torch.stack(vs)

    kv = (2, GPT_HEADS, GPT_PAST, hd)  # (layers, heads, past, head_dim) after the batch axis moved in
    return Net(), {"input_ids": ("ids", GPT_SEQ), "past_key": kv, "past_value": kv}


def _tagger(cell: str):
    torch = _torch()
    nn = torch.nn

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(50, 32)
            rnn = nn.LSTM if cell == "lstm" else nn.GRU
            self.rnn = rnn(32, 24, num_layers=2, bidirectional=True, batch_first=True)
            self.out = nn.Linear(48, 9)

        def forward(self, ids):
            y, _ = self.rnn(self.emb(ids))
            return self.out(y)

    return Net(), {"tokens": ("ids", 12)}


def _audio():
    torch = _torch()
    nn = torch.nn

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = nn.Sequential(
                nn.Conv1d(1, 16, 80, stride=4, padding=38), nn.BatchNorm1d(16), nn.ReLU(), nn.MaxPool1d(4),
                nn.Conv1d(16, 32, 3, padding=2, dilation=2), nn.BatchNorm1d(32), nn.ReLU(), nn.MaxPool1d(4),
                nn.Conv1d(32, 32, 3, padding=1, groups=4), nn.ReLU(), nn.AvgPool1d(2, ceil_mode=True),
                nn.Conv1d(32, 64, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(64, 12))

        def forward(self, x):
            return self.body(x)

    return Net(), {"waveform": (1, 2000)}


def _branchy():
    """A branch on the data: the dynamo exporter writes torch.cond as an ONNX If."""
    torch = _torch()
    nn = torch.nn

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(16, 16), nn.Linear(16, 16)

        def forward(self, x):
            def yes(x):
                return torch.relu(self.a(x))

            def no(x):
                return torch.tanh(self.b(x)) * 2.0

            return torch.cond(x.sum() > 0, yes, no, (x,))

    return Net(), {"x": (16,)}


MODELS: dict[str, Callable] = {
    "mobilenet_v3": _mobilenet_v3, "efficientnet": _efficientnet, "unet": _unet, "vit": _vit, "gpt": _gpt,
    "lstm_tagger": lambda: _tagger("lstm"), "gru_tagger": lambda: _tagger("gru"), "audio1d": _audio,
    "branchy": _branchy,
}
# (model, exporter) pairs that the exporter itself cannot write
UNEXPORTABLE = {("branchy", "legacy")}  # the TorchScript exporter has no torch.cond


# ---- export ---------------------------------------------------------------------------------------------

def exported_feeds(name: str, batch: int = 1, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded inputs for `name` at `batch`: normal floats, token ids in range."""
    _, spec = _spec(name)
    rng = np.random.default_rng(seed + batch)
    feeds = {}
    for key, shape in spec.items():
        if shape[0] == "ids":
            vocab = GPT_VOCAB if name == "gpt" else 50
            feeds[key] = rng.integers(0, vocab, size=(batch, shape[1]), dtype=np.int64)
        else:
            feeds[key] = rng.standard_normal((batch, *shape)).astype(np.float32)
    if name == "gpt":  # past key/value: (layers, batch, heads, past, head_dim) as the model reads them
        for key in ("past_key", "past_value"):
            feeds[key] = np.ascontiguousarray(feeds[key].transpose(1, 0, 2, 3, 4))
    return feeds


_SPECS: dict[str, tuple[object, dict]] = {}


def _spec(name: str):
    if name not in _SPECS:
        _SPECS[name] = MODELS[name]()
    return _SPECS[name]


def exported_model(name: str, exporter: str = "dynamo", opset: int = 18, seed: int = 0) -> Path:
    """`name` exported by `exporter` ("dynamo" or "legacy") at `opset`, cached by its parameters."""
    path = zoo.cache_dir() / f"exported_{name}_{exporter}_op{opset}_s{seed}_{SALT}.onnx"
    return zoo._cached(path, lambda: _export(name, exporter, opset, seed))


def _export(name: str, exporter: str, opset: int, seed: int) -> onnx.ModelProto:
    torch = _torch()
    torch.manual_seed(seed)
    _SPECS.pop(name, None)
    module, spec = _spec(name)
    module = module.eval()
    with torch.no_grad():  # BatchNorm statistics that are not the identity
        for m in module.modules():
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 1.5)
    feeds = exported_feeds(name, batch=2, seed=seed)
    names = list(spec)
    args = tuple(torch.from_numpy(feeds[k]) for k in names)
    axes = {k: {1 if k.startswith("past_") else 0: "batch"} for k in names}
    with zoo._quiet(), torch.no_grad():
        if exporter == "legacy":
            buf = io.BytesIO()
            torch.onnx.export(module, args, buf, opset_version=opset, dynamo=False, input_names=names,
                              dynamic_axes=axes)
            return onnx.load_from_string(buf.getvalue())
        program = torch.onnx.export(module, args, opset_version=opset, dynamo=True, input_names=names,
                                    dynamic_axes=axes)
        return program.model_proto
