"""A GPT-2-style decoder with a KV cache, exported by both torch exporters with every axis that changes during
generation dynamic (batch, sequence, past sequence): what a generation loop feeds one step at a time, from an
empty past on. Random weights; nothing here was written for ctxrt.

Inputs `input_ids` [batch, seq] and `past_key_values.{i}.key|value` [batch, heads, past, head_dim]; outputs
`logits` [batch, seq, vocab] and `present.{i}.key|value` [batch, heads, past + seq, head_dim].
"""

from __future__ import annotations

import io
import math
from pathlib import Path

import numpy as np
import onnx
import zoo

SALT = "d1"
LAYERS, DIM, HEADS, VOCAB, POSITIONS = 2, 64, 4, 128, 256


def block(dim: int, heads: int):
    """A GPT-2 block (pre-LayerNorm attention with a KV cache and a causal mask over (new, past + new) positions,
    then the tanh-GELU MLP): forward(x, past_k, past_v) -> (x, k, v)."""
    import torch
    from torch import nn

    hd = dim // heads

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
            self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
            self.fc, self.out = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

        def forward(self, x, past_k, past_v):
            b, t, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(dim, dim=2)
            q, k, v = (z.view(b, t, heads, hd).transpose(1, 2) for z in (q, k, v))
            k, v = torch.cat([past_k, k], 2), torch.cat([past_v, v], 2)
            s = k.shape[2]
            att = (q @ k.transpose(-2, -1)) / math.sqrt(hd)
            mask = torch.triu(torch.ones(t, s, dtype=torch.bool), diagonal=s - t + 1)
            att = torch.softmax(att.masked_fill(mask, float("-inf")), -1)
            y = (att @ v).transpose(1, 2).reshape(b, t, dim)
            x = x + self.proj(y)
            x = x + self.out(nn.functional.gelu(self.fc(self.ln2(x)), approximate="tanh"))
            return x, k, v

    return Block


def _module(layers: int, dim: int, heads: int, vocab: int, positions: int):
    import torch
    from torch import nn

    Block = block(dim, heads)  # noqa: N806 - a class

    class Decoder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tok, self.pos = nn.Embedding(vocab, dim), nn.Embedding(positions, dim)
            self.blocks = nn.ModuleList([Block() for _ in range(layers)])
            self.ln = nn.LayerNorm(dim)
            self.lm = nn.Linear(dim, vocab, bias=False)

        def forward(self, ids, *past):
            t, p = ids.shape[1], past[0].shape[2]
            x = self.tok(ids) + self.pos(torch.arange(p, p + t))
            present = []
            for i, blk in enumerate(self.blocks):
                x, k, v = blk(x, past[2 * i], past[2 * i + 1])
                present += [k, v]
            return (self.lm(self.ln(x)), *present)

    return Decoder()


def names(layers: int = LAYERS) -> tuple[list[str], list[str]]:
    past = [f"past_key_values.{i}.{kv}" for i in range(layers) for kv in ("key", "value")]
    present = [f"present.{i}.{kv}" for i in range(layers) for kv in ("key", "value")]
    return ["input_ids", *past], ["logits", *present]


def gpt2_decoder(exporter: str = "dynamo", layers: int = LAYERS, seed: int = 0, dim: int = DIM,
                 heads: int = HEADS) -> Path:
    """The decoder exported by `exporter` ("dynamo" or "legacy"), cached by its parameters."""
    path = zoo.cache_dir() / f"gpt2kv_{exporter}_L{layers}_D{dim}_H{heads}_V{VOCAB}_s{seed}_{SALT}.onnx"
    return zoo._cached(path, lambda: _export(exporter, layers, seed, dim, heads))


def _export(exporter: str, layers: int, seed: int, dim: int, heads: int) -> onnx.ModelProto:
    import torch

    torch.manual_seed(seed)
    module = _module(layers, dim, heads, VOCAB, POSITIONS).eval()
    ins, outs = names(layers)
    feeds = empty_past(layers, batch=2, seq=3, dim=dim, heads=heads)
    feeds = {k: (v if k == "input_ids" else np.zeros((2, heads, 5, dim // heads), np.float32))
             for k, v in feeds.items()}
    args = tuple(torch.from_numpy(feeds[k]) for k in ins)
    past_axes = {0: "batch", 2: "past_sequence"}
    axes = {"input_ids": {0: "batch", 1: "sequence"}, **{k: past_axes for k in ins[1:]},
            "logits": {0: "batch", 1: "sequence"}, **{k: {0: "batch", 2: "total_sequence"} for k in outs[1:]}}
    with zoo._quiet(), torch.no_grad():
        if exporter == "legacy":
            buf = io.BytesIO()
            torch.onnx.export(module, args, buf, opset_version=17, dynamo=False, input_names=ins,
                              output_names=outs, dynamic_axes=axes)
            return onnx.load_from_string(buf.getvalue())
        batch, seq = torch.export.Dim("batch", max=1024), torch.export.Dim("sequence", max=4096)
        past = torch.export.Dim("past_sequence", max=4096)
        shapes = ({0: batch, 1: seq}, ({0: batch, 2: past},) * (len(ins) - 1))  # (ids, *past)
        program = torch.onnx.export(module, args, opset_version=18, dynamo=True, input_names=ins,
                                    output_names=outs, dynamic_shapes=shapes)
        return program.model_proto


def empty_past(layers: int = LAYERS, batch: int = 1, seq: int = 4, seed: int = 0, dim: int = DIM,
               heads: int = HEADS) -> dict[str, np.ndarray]:
    """A prompt of `seq` random ids and an empty past (past length 0), as a generation loop starts."""
    ins, _ = names(layers)
    rng = np.random.default_rng(seed)
    feeds = {"input_ids": rng.integers(0, VOCAB, size=(batch, seq), dtype=np.int64)}
    for k in ins[1:]:
        feeds[k] = np.zeros((batch, heads, 0, dim // heads), np.float32)
    return feeds


def generate(run, feeds: dict[str, np.ndarray], steps: int, layers: int = LAYERS) -> list[list[int]]:
    """Greedy tokens from `run(feeds) -> [logits, *present]` (a session's run with output_names None)."""
    ins, _ = names(layers)
    tokens: list[list[int]] = [[] for _ in range(feeds["input_ids"].shape[0])]
    for _ in range(steps):
        logits, *present = run(feeds)
        nxt = logits[:, -1].argmax(-1).astype(np.int64)
        for b, t in enumerate(nxt):
            tokens[b].append(int(t))
        feeds = {"input_ids": nxt[:, None], **dict(zip(ins[1:], present, strict=True))}
    return tokens
