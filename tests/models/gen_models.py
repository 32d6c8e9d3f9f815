"""Small decoders with a KV cache for the generation tests, cached like zoo's models: a transformers GPT-2
exported by torch (legacy or dynamo) with `past_key_values.N.key/value` inputs and `present.N.key/value`
outputs, and a folder written by onnxruntime-genai's model builder from a random-weight Llama, and the plain
onnxruntime greedy loop they are compared with."""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
from zoo import SALT, _cached, _quiet, cache_dir

GPT_LAYERS, GPT_HEADS, GPT_DIM, GPT_VOCAB, GPT_POSITIONS = 2, 2, 32, 96, 32
LLAMA_VOCAB, LLAMA_CONTEXT = 128, 64
HEAD_SIZE = 16  # of both


def gpt2_export(exporter: str) -> Path:
    """A random GPT-2 (2 layers; weights drawn wider than transformers' default so that greedy tokens vary)
    with inputs input_ids, attention_mask, position_ids, past_key_values.N.key/value (batch, heads, past, 16)
    and outputs logits, present.N.key/value."""
    return decoder_export("gpt2", exporter)


def decoder_export(kind: str, exporter: str) -> Path:
    """A random transformers GPT-2, Llama (4 heads sharing 2 KV heads, RoPE, RMS norm, SiLU MLP) or Qwen2 (the
    same with biased QKV) of 2 layers, exported as gpt2_export says (the KV heads: the past's axis 1)."""
    suffix = "" if kind == "gpt2" else f"{kind}_"
    path = cache_dir() / f"gen_gpt2_{suffix}{exporter}_{SALT}.onnx"
    return _cached(path, lambda: _export_decoder(kind, exporter))


def _export_decoder(kind: str, exporter: str) -> onnx.ModelProto:
    import torch
    import transformers

    if kind == "gpt2":
        config = transformers.GPT2Config(vocab_size=GPT_VOCAB, n_positions=GPT_POSITIONS, n_embd=GPT_DIM,
                                         n_layer=GPT_LAYERS, n_head=GPT_HEADS, initializer_range=0.2,
                                         bos_token_id=0, eos_token_id=0)
        make = transformers.GPT2LMHeadModel
    else:
        cls = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config}[kind]
        config = cls(vocab_size=GPT_VOCAB, hidden_size=2 * GPT_DIM, intermediate_size=4 * GPT_DIM,
                     num_hidden_layers=GPT_LAYERS, num_attention_heads=4, num_key_value_heads=2,
                     max_position_embeddings=GPT_POSITIONS, initializer_range=0.2, bos_token_id=0,
                     eos_token_id=0, tie_word_embeddings=False)
        make = {"llama": transformers.LlamaForCausalLM, "qwen2": transformers.Qwen2ForCausalLM}[kind]
    torch.manual_seed(0)
    lm = make(config).eval()
    kv_heads = GPT_HEADS if kind == "gpt2" else 2

    return export_with_cache(lm, exporter, GPT_LAYERS, kv_heads, GPT_DIM // GPT_HEADS, GPT_VOCAB)


def export_with_cache(lm, exporter: str, layers: int, kv_heads: int, head: int, vocab: int) -> onnx.ModelProto:  # noqa: ANN001
    """A transformers causal LM exported by torch (legacy or dynamo) with its KV cache as flat inputs and outputs:
    input_ids, attention_mask, position_ids, past_key_values.N.key/value (batch, kv_heads, past, head) -> logits,
    present.N.key/value (bench/bench_generate.py exports its Llama with it too)."""
    import torch
    import transformers

    class Flat(torch.nn.Module):  # the cache as flat tensors in and out, as exported decoders take it
        def __init__(self) -> None:
            super().__init__()
            self.lm = lm

        def forward(self, input_ids, attention_mask, position_ids, *past):  # noqa: ANN001, ANN002
            cache = transformers.DynamicCache()
            for i in range(layers):
                cache.update(past[2 * i], past[2 * i + 1], i)
            out = self.lm(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                          past_key_values=cache, use_cache=True)
            kv = [t for layer in out.past_key_values.layers[:layers] for t in (layer.keys, layer.values)]
            return (out.logits, *kv)

    batch, seq, past = 2, 3, 4
    args = (torch.randint(0, vocab, (batch, seq)), torch.ones(batch, past + seq, dtype=torch.int64),
            torch.arange(past, past + seq).expand(batch, seq),
            *(torch.randn(batch, kv_heads, past, head) for _ in range(2 * layers)))
    kv = [f"{i}.{k}" for i in range(layers) for k in ("key", "value")]
    names = {"input_names": ["input_ids", "attention_mask", "position_ids", *(f"past_key_values.{n}" for n in kv)],
             "output_names": ["logits", *(f"present.{n}" for n in kv)]}
    with _quiet(), torch.no_grad():
        if exporter == "legacy":
            axes = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "total"},
                    "position_ids": {0: "batch", 1: "seq"}, "logits": {0: "batch", 1: "seq"},
                    **{f"past_key_values.{n}": {0: "batch", 2: "past"} for n in kv},
                    **{f"present.{n}": {0: "batch", 2: "total"} for n in kv}}
            buf = io.BytesIO()
            torch.onnx.export(Flat(), args, buf, opset_version=17, dynamo=False, dynamic_axes=axes, **names)
            return onnx.load_from_string(buf.getvalue())
        dim = torch.export.Dim
        b, s, t, p = dim("batch"), dim("seq"), dim("total"), dim("past")
        shapes = {"input_ids": {0: b, 1: s}, "attention_mask": {0: b, 1: t}, "position_ids": {0: b, 1: s},
                  "past": tuple({0: b, 2: p} for _ in kv)}
        return torch.onnx.export(Flat(), args, opset_version=18, dynamo=True, dynamic_shapes=shapes,
                                 **names).model_proto


def builder_llama(precision: str) -> Path:
    """A folder of onnxruntime-genai's model builder (genai_config.json, model.onnx, tokenizer.json) for a random
    Llama of 2 layers, 4 heads, 2 kv heads, head size 16, context 64; the tokenizer maps the word tN to id N."""
    path = cache_dir() / f"gen_llama_{precision}_{SALT}"
    if not (path / "genai_config.json").is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(dir=path.parent, prefix=path.name + "."))
        try:
            _build_llama(work, precision)
            with contextlib.suppress(OSError):  # another process got there first: its folder is the same
                os.replace(work / "out", path)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return path


def builder_model(arch: str, precision: str) -> Path:
    """A folder of onnxruntime-genai's model builder for another architecture it supports ("qwen2", "phi3",
    "gemma", "phi", "mistral"), at builder_llama's sizes (Phi-2: 4 heads, no grouped KV)."""
    path = cache_dir() / f"gen_{arch}_{precision}_{SALT}"
    if not (path / "genai_config.json").is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(dir=path.parent, prefix=path.name + "."))
        try:
            _build_llama(work, precision, arch)
            with contextlib.suppress(OSError):
                os.replace(work / "out", path)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return path


def _hf_model(arch: str) -> object:
    import transformers

    common = {"vocab_size": LLAMA_VOCAB, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
              "num_attention_heads": 4, "max_position_embeddings": LLAMA_CONTEXT}
    grouped = {**common, "num_key_value_heads": 2}
    if arch == "llama":
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(**grouped))
    if arch == "qwen2":
        return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**grouped))
    if arch == "mistral":
        return transformers.MistralForCausalLM(transformers.MistralConfig(**grouped))
    if arch == "phi3":  # the short-context Phi-3 (no LongRoPE: the context is the original one)
        return transformers.Phi3ForCausalLM(transformers.Phi3Config(
            **grouped, original_max_position_embeddings=LLAMA_CONTEXT, pad_token_id=0, bos_token_id=1,
            eos_token_id=2))
    if arch == "gemma":  # tied embeddings: int4 writes GatherBlockQuantized for the lookup
        return transformers.GemmaForCausalLM(transformers.GemmaConfig(**grouped, head_dim=16))
    if arch == "phi":  # Phi-2: LayerNorm, GELU, parallel attention and MLP
        return transformers.PhiForCausalLM(transformers.PhiConfig(**common, partial_rotary_factor=1.0))
    raise ValueError(arch)


def _build_llama(work: Path, precision: str, arch: str = "llama") -> None:
    import torch
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    hf = work / "hf"
    torch.manual_seed(0)
    _hf_model(arch).save_pretrained(hf)
    words = Tokenizer(models.WordLevel({f"t{i}": i for i in range(LLAMA_VOCAB)}, unk_token="t0"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    transformers.PreTrainedTokenizerFast(tokenizer_object=words, unk_token="t0", eos_token="t2").save_pretrained(hf)
    subprocess.run([sys.executable, "-m", "onnxruntime_genai.models.builder", "-m", str(hf), "-i", str(hf), "-o",
                    str(work / "out"), "-p", precision, "-e", "cpu", "-c", str(work / "cache")], check=True,
                   capture_output=True)


def ort_greedy(model: Path, prompt: list[int], n: int) -> list[int]:
    """Greedy tokens of a plain onnxruntime loop: the prompt, then one token a step, presents fed back as pasts."""
    import onnxruntime as ort

    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    names = {i.name for i in sess.get_inputs()}
    outputs = [o.name for o in sess.get_outputs()]
    past = {i.name: np.zeros((1, i.shape[1], 0, HEAD_SIZE), np.float32)
            for i in sess.get_inputs() if i.name.startswith("past")}
    ids, total, tokens = np.array([prompt], np.int64), len(prompt), []
    for _ in range(n):
        feeds = {"input_ids": ids, **past}
        if "attention_mask" in names:
            feeds["attention_mask"] = np.ones((1, total), np.int64)
        if "position_ids" in names:
            feeds["position_ids"] = np.arange(total - ids.shape[1], total, dtype=np.int64)[None]
        logits, *presents = sess.run(None, feeds)
        tokens.append(int(np.argmax(logits[0, -1])))
        past = {n.replace("present", "past_key_values"): v for n, v in zip(outputs[1:], presents, strict=True)}
        ids, total = np.array([[tokens[-1]]], np.int64), total + 1
    return tokens


def genai_greedy(folder: Path, prompt: list[int], n: int) -> list[int]:
    """onnxruntime-genai's greedy tokens after the prompt."""
    import onnxruntime_genai as og

    model = og.Model(str(folder))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(prompt) + n, do_sample=False)
    gen = og.Generator(model, params)
    gen.append_tokens(np.array([prompt], np.int32))
    while not gen.is_done():
        gen.generate_next_token()
    return [int(t) for t in gen.get_sequence(0)[len(prompt):]]
