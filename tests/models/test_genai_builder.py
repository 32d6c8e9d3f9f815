"""A decoder written by onnxruntime-genai's model builder (pip install onnxruntime-genai; skipped without it) from
a small random-weight Hugging Face Llama: SimplifiedLayerNormalization, GroupQueryAttention with rotary,
SkipSimplifiedLayerNormalization, the attention-mask subgraph. A prompt (batch 2, one sequence padded) then
token steps, each feeding present back as past, from an empty past or through the shared max-length buffer,
equal onnxruntime's outputs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import ctxrt

pytest.importorskip("onnxruntime_genai")
VOCAB, MAX_LENGTH = 128, 24


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer, models, pre_tokenizers

    hf, out = tmp_path_factory.mktemp("hf"), tmp_path_factory.mktemp("genai")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    transformers.LlamaForCausalLM(config).save_pretrained(hf)
    words = Tokenizer(models.WordLevel({f"t{i}": i for i in range(VOCAB)}, unk_token="t0"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    transformers.PreTrainedTokenizerFast(tokenizer_object=words, unk_token="t0", eos_token="t2").save_pretrained(hf)
    subprocess.run([sys.executable, "-m", "onnxruntime_genai.models.builder", "-m", str(hf), "-i", str(hf), "-o",
                    str(out), "-p", "fp32", "-e", "cpu", "-c", str(out / "cache")], check=True, capture_output=True)
    return out / "model.onnx"


@pytest.mark.parametrize("shared_buffer", [False, True], ids=["growing-past", "shared-buffer"])
def test_genai_llama_prompt_then_tokens(llama: Path, shared_buffer: bool) -> None:
    import onnxruntime as ort

    theirs = ort.InferenceSession(str(llama), providers=["CPUExecutionProvider"])
    ours = ctxrt.InferenceSession(str(llama))
    pasts = [i.name for i in theirs.get_inputs() if i.name.startswith("past_key_values")]
    outputs = [o.name for o in theirs.get_outputs()]
    present = [outputs.index(p.replace("past_key_values", "present")) for p in pasts]
    empty = np.zeros((2, 2, MAX_LENGTH if shared_buffer else 0, 16), np.float32)
    state = [{p: empty for p in pasts}, {p: empty for p in pasts}]
    rng = np.random.default_rng(0)
    ids = rng.integers(3, VOCAB, (2, 6)).astype(np.int64)
    mask = np.ones((2, 6), np.int64)
    mask[1, 4:] = 0
    for step in range(5):
        feeds = {"input_ids": ids, "attention_mask": mask}
        got = ours.run(None, {**feeds, **state[0]})
        want = theirs.run(None, {**feeds, **state[1]})
        for name, g, w in zip(outputs, got, want, strict=True):
            assert g.shape == w.shape, f"step {step} {name}: {g.shape} != {w.shape}"
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5, err_msg=f"step {step} {name}")
        state = [{p: result[k] for p, k in zip(pasts, present, strict=True)} for result in (got, want)]
        ids = np.argmax(want[0][:, -1], axis=-1)[:, None].astype(np.int64)
        mask = np.concatenate([mask, np.ones((2, 1), np.int64)], axis=1)


def test_shared_buffer_is_written_in_place(llama: Path) -> None:
    """`kv_shared`: one Tensor of the context's length bound as each past input and as its present output (what
    ctxrt.Generator does with onnxruntime-genai's past_present_share_buffer). Per step only the new rows are
    written (rows past the sequence stay as they were: NaN here; nothing is zeroed or copied), logits equal
    onnxruntime's, and one range program runs every step."""
    import onnxruntime as ort

    theirs = ort.InferenceSession(str(llama), providers=["CPUExecutionProvider"])
    pasts = [i.name for i in theirs.get_inputs() if i.name.startswith("past_key_values")]
    with ctxrt.InferenceSession(llama, dim_ranges={"past_sequence_length": (MAX_LENGTH, MAX_LENGTH),
                                                   "total_sequence_length": (1, MAX_LENGTH),
                                                   "sequence_length": (1, 8), "batch_size": (1, 1),
                                                   "kv_cache_dim": (16, 16)}) as ours:
        ours.kv_shared = pasts
        cache = {p: ctxrt.Tensor.from_numpy(np.full((1, 2, MAX_LENGTH, 16), np.nan, np.float32), ours)
                 for p in pasts}
        state = {p: np.zeros((1, 2, MAX_LENGTH, 16), np.float32) for p in pasts}
        ids, total = np.array([[5, 9, 17, 33, 4, 8]], np.int64), 6
        for step in range(4):
            feeds = {"input_ids": ids, "attention_mask": np.ones((1, total), np.int64)}
            binding = ours.io_binding()
            for name, value in {**feeds, **cache}.items():
                binding.bind_input(name, value)
            for o in ours.get_outputs():
                binding.bind_output(o.name, cache.get(o.name.replace("present", "past_key_values")))
            ours.run_with_iobinding(binding)
            want = theirs.run(None, {**feeds, **state})
            state = {p: want[1 + k] for k, p in enumerate(pasts)}
            np.testing.assert_allclose(binding.get_outputs()[0].numpy(), want[0], rtol=1e-4, atol=1e-5,
                                       err_msg=f"step {step}")
            for p in pasts:
                rows = cache[p].numpy()
                np.testing.assert_allclose(rows[:, :, :total], state[p][:, :, :total], rtol=1e-5, atol=1e-6)
                assert np.isnan(rows[:, :, total:]).all(), f"step {step}: rows past {total} were written"
            ids, total = np.argmax(want[0][:, -1], axis=-1)[:, None].astype(np.int64), total + 1
        assert ours.stats["shape_variants_compiled"] == 1
