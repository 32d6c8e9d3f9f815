"""ctxrt.Generator and `ctxrt generate`: greedy tokens equal a plain onnxruntime loop on GPT-2 exports (legacy and
dynamo) and onnxruntime-genai's on builder Llama folders (fp32, int4), prompts batched with padding give each
prompt's own tokens, a seed reproduces sampled tokens, eos and stop ids end a prompt, a prompt that fills the
context is one error, tokens stream as they come, the CLI's --json fields and its one-line errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from cli_helpers import assert_one_line_error, cli
from gen_models import (
    GPT_DIM,
    GPT_LAYERS,
    LLAMA_CONTEXT,
    builder_llama,
    builder_model,
    decoder_export,
    genai_greedy,
    gpt2_export,
    ort_greedy,
)
from onnx import TensorProto, helper

import ctxrt
from ctxrt.generation.sampling import Sampling, choose

GPT_PROMPTS = [[5, 9, 17, 33], [7, 8]]
LLAMA_PROMPTS = [[5, 9, 17, 33], [7, 8, 40]]
N = 8
FULL = 32  # the tokens the oracle tests compare (eos, id 2, may end a builder model's prompt earlier)
FULL_GPT = 28  # GPT-2's: its 32 positions hold the 4-token prompt and 28 more


@pytest.fixture(scope="module", params=["legacy", "dynamo"])
def gpt2(request: pytest.FixtureRequest) -> Path:
    pytest.importorskip("transformers")
    if request.param == "dynamo":
        pytest.importorskip("onnxscript")
    return gpt2_export(request.param)


@pytest.fixture(scope="module")
def llama() -> Path:
    pytest.importorskip("onnxruntime_genai")
    pytest.importorskip("transformers")
    return builder_llama("fp32")


@pytest.fixture(scope="module")
def llama_greedy(llama: Path) -> list[list[int]]:
    """onnxruntime-genai's greedy tokens for LLAMA_PROMPTS (it stops at eos, id 2, as ctxrt does)."""
    return [genai_greedy(llama, p, N) for p in LLAMA_PROMPTS]


def until(tokens: list[int], stops: set[int]) -> list[int]:
    """The tokens up to the first stop id, included."""
    k = next((k for k, t in enumerate(tokens) if t in stops), len(tokens) - 1)
    return tokens[:k + 1]


def test_gpt2_greedy_equals_onnxruntime_loop(gpt2: Path) -> None:
    """Two prompts of different lengths in one batch (left padding) give each the tokens of onnxruntime's loop
    on that prompt alone."""
    want = [ort_greedy(gpt2, p, FULL_GPT) for p in GPT_PROMPTS]
    with ctxrt.Generator(gpt2) as gen:
        assert gen.batching == "batch, left padding"
        got = gen.generate(GPT_PROMPTS, FULL_GPT)
    assert got.tokens == want
    assert got.finish_reasons == ["length", "length"]
    assert len({t for row in want for t in row}) > 4  # random weights that say something


@pytest.mark.parametrize("exporter", ["legacy", "dynamo"])
@pytest.mark.parametrize("kind", ["gpt2", "llama", "qwen2"])
def test_torch_exports_append_to_the_kv_cache_in_place(kind: str, exporter: str) -> None:
    """GPT-2, Llama and Qwen2 (grouped KV heads, RoPE) exports: one range program for two generations, whose
    Concats write only each token's new rows into one cache tensor (its windows bound as past and present);
    tokens equal onnxruntime's loop."""
    pytest.importorskip("transformers")
    if exporter == "dynamo":
        pytest.importorskip("onnxscript")
    model = decoder_export(kind, exporter)
    n = FULL_GPT if kind == "gpt2" else FULL
    want = [ort_greedy(model, p, n) for p in GPT_PROMPTS]
    with ctxrt.Generator(model) as gen:
        got = gen.generate(GPT_PROMPTS, n)
        again = gen.generate(GPT_PROMPTS[:1], n)
        stats = gen.session.stats
    assert got.tokens == want and again.tokens == want[:1]
    assert gen._append  # the windows path ran, not presents fed back as pasts
    assert stats["shape_variants_compiled"] == 1
    kv_heads = 2 if kind != "gpt2" else gen.spec.kv[0].shape[1]
    row = GPT_LAYERS * 2 * kv_heads * (GPT_DIM // 2 if kind == "gpt2" else 16) * 4  # one token's K and V, bytes
    tokens = 2 * (n - 1) + 1 * (n - 1)  # token steps: batch 2, then batch 1
    assert stats["kv_bytes_appended"] == tokens * row  # only the new rows, nothing of the past
    assert stats["kv_bytes_kept_in_place"] > 10 * stats["kv_bytes_appended"]
    assert got.memory["kv_cache"] == 2 * row * (max(map(len, GPT_PROMPTS)) + n)  # one cache: prompt + new rows


def test_a_decoder_without_mask_and_positions_runs_prompts_one_at_a_time() -> None:
    """decoders.py's GPT decoder takes input_ids and the past only: padding would shift its positions."""
    pytest.importorskip("transformers")
    from decoders import gpt2_decoder

    model = gpt2_decoder("legacy")
    with ctxrt.Generator(model) as gen:
        assert gen.batching == "one at a time"
        got = gen.generate(GPT_PROMPTS, 6)
    assert got.tokens == [ort_greedy(model, p, 6) for p in GPT_PROMPTS]


@pytest.mark.parametrize("precision", ["fp32", "int4"])
def test_builder_llama_greedy_equals_onnxruntime_genai(precision: str) -> None:
    """The builder's folder read through genai_config.json; a batch padded on the right (GroupQueryAttention
    takes the positions from the mask's row sums)."""
    pytest.importorskip("onnxruntime_genai")
    folder = builder_llama(precision)
    want = [genai_greedy(folder, p, FULL) for p in LLAMA_PROMPTS]
    with ctxrt.Generator(folder) as gen:
        assert (gen.batching, gen.spec.eos_ids, gen.spec.context_length) == ("batch, right padding", (2,), 64)
        got = gen.generate(LLAMA_PROMPTS, FULL)
        # one launch list for every past length, GroupQueryAttention's presents cut to their real length
        ranged = [v.ranged for v in gen.session._variants.values() if v.ranged is not None]
        assert ranged and all(g._extent is not None for g in ranged)
        # the tokens fed the mask padded to the context: one set of shapes for the prompt, one for every token,
        # and a launch list recorded for each (one binding serves every token: only ids and mask are bound anew)
        assert gen._static_mask
        stats = gen.session.stats
        assert (stats["range_specializations"], stats["recordings"]) == (2, 2)
    assert got.tokens == want


@pytest.mark.parametrize(("arch", "precision"), [("qwen2", "fp32"), ("mistral", "fp32"), ("phi3", "int4"),
                                                  ("gemma", "int4"), ("phi", "fp32")])
def test_other_builder_architectures_equal_onnxruntime_genai(arch: str, precision: str) -> None:
    """The builder's other architectures, each with what it writes: Qwen2 (attention biases), Mistral, Phi-3,
    Gemma (GELU, tied embeddings: int4 looks them up with GatherBlockQuantized), Phi-2 (LayerNorm,
    SkipLayerNormalization, GELU, no grouped KV heads): 32 greedy tokens of a padded batch equal
    onnxruntime-genai's."""
    pytest.importorskip("onnxruntime_genai")
    pytest.importorskip("transformers")
    folder = builder_model(arch, precision)
    want = [genai_greedy(folder, p, FULL) for p in LLAMA_PROMPTS]
    with ctxrt.Generator(folder) as gen:
        got = gen.generate(LLAMA_PROMPTS, FULL)
        assert gen.session.stats["shape_variants_compiled"] == 1
    assert got.tokens == want


def test_the_mask_is_padded_only_where_it_only_counts(llama: Path, tmp_path: Path) -> None:
    """A builder model's attention mask reaches nothing but GroupQueryAttention's seqlens_k and
    total_sequence_length: its tokens may be fed the mask padded to the context. Where it also reaches anything
    else (here a graph output), or nothing says (a .ctx not compiled by `--generate`, no ONNX model beside it), the
    mask grows with the past."""
    from ctxrt.generation.spec import ModelFiles, mask_only_counts

    model = onnx.load(str(llama / "model.onnx"), load_external_data=False)
    assert mask_only_counts(ModelFiles(llama / "model.onnx", None, None), "attention_mask")
    model.graph.node.append(helper.make_node("Cast", ["attention_mask"], ["mask_out"], to=TensorProto.FLOAT))
    model.graph.output.append(helper.make_tensor_value_info("mask_out", TensorProto.FLOAT, None))
    onnx.save(model, str(tmp_path / "model.onnx"))
    assert not mask_only_counts(ModelFiles(tmp_path / "model.onnx", None, None), "attention_mask")
    (tmp_path / "model.ctx").write_bytes(b"")
    assert not mask_only_counts(ModelFiles(tmp_path / "model.ctx", None, None), "attention_mask")


def _chunked(model: Path, prompts: list[list[int]], want: list[list[int]]) -> None:
    with ctxrt.Generator(model, prompt_window=5) as gen:
        got = gen.generate(prompts, N)
        assert gen.session.stats["shape_variants_compiled"] == 1
        seq = gen.session.get_inputs()[0].shape[1]
        assert gen.session.dim_ranges[seq] == (1, 5)
    assert [until(t, {2}) for t in got.tokens] == [until(t, {2}) for t in want]


def test_a_prompt_longer_than_the_window_runs_in_chunks(gpt2: Path) -> None:
    """Prompts longer than the prompt window (5 tokens here) run as chunks, the past growing between them (a
    batch padded on the left): the tokens of the whole prompt at once in onnxruntime, from ONE compile whose
    sequence range is the window (every dim ranged before the first run)."""
    prompts = [[5, 9, 17, 33, 4, 8, 11, 2, 19, 23, 6, 30], [7, 8, 13]]
    _chunked(gpt2, prompts, [ort_greedy(gpt2, p, N) for p in prompts])


def test_a_builder_prompt_longer_than_the_window_runs_in_chunks(llama: Path) -> None:
    """The same for a builder model (batch 1: GroupQueryAttention takes several new tokens after a past only
    there), its KV cache the shared buffer written in place."""
    prompts = [[5, 9, 17, 33, 4, 8, 11, 12, 19, 23, 6, 30]]
    _chunked(llama, prompts, [genai_greedy(llama, p, N) for p in prompts])


def test_builder_llama_on_opencl_with_the_shared_buffer(opencl: str, llama: Path,
                                                        llama_greedy: list[list[int]]) -> None:
    """The same tokens on the OpenCL backend (GroupQueryAttention in a CPU partition over the shared KV buffers
    bound as past and present), from one compile."""
    with ctxrt.Generator(llama, opencl) as gen:
        assert gen.spec.share_buffer
        assert gen.generate(LLAMA_PROMPTS, N).tokens == llama_greedy
        assert gen.session.stats["shape_variants_compiled"] == 1


def test_sampling_with_a_seed_is_reproducible(llama: Path, llama_greedy: list[list[int]]) -> None:
    sampled = Sampling(temperature=1.0, top_k=20, top_p=0.9, seed=7)
    with ctxrt.Generator(llama) as gen:
        first = gen.generate(LLAMA_PROMPTS, 6, sampling=sampled).tokens
        again = gen.generate(LLAMA_PROMPTS, 6, sampling=sampled).tokens
        other = gen.generate(LLAMA_PROMPTS, 6, sampling=Sampling(temperature=1.0, seed=8)).tokens
        top1 = gen.generate(LLAMA_PROMPTS[:1], 6, sampling=Sampling(temperature=1.0, top_k=1, seed=0)).tokens
    assert first == again
    assert first != other
    assert top1[0] == until(llama_greedy[0], {2})[:6]


def test_sampler_keeps_to_top_k_and_top_p() -> None:
    """Probabilities 0.5, 0.3, 0.15, 0.05: top_p 0.7 draws from the first two only, top_k 3 never the last, and
    plain sampling draws each about as often as its probability."""
    logits = np.log(np.array([[0.5, 0.3, 0.15, 0.05]] * 4000))
    rng = np.random.default_rng(0)
    counts = [np.bincount(choose(logits, s, rng), minlength=4) / 4000
              for s in (Sampling(1.0, top_p=0.7), Sampling(1.0, top_k=3), Sampling(1.0))]
    assert counts[0][2:].sum() == 0 and abs(counts[0][0] - 0.5 / 0.8) < 0.03
    assert counts[1][3] == 0
    np.testing.assert_allclose(counts[2], [0.5, 0.3, 0.15, 0.05], atol=0.03)


def test_eos_and_stop_ids_end_a_prompt(llama: Path, llama_greedy: list[list[int]], tmp_path: Path) -> None:
    """eos ids from genai_config.json (an int or a list) and stop_ids: each prompt of a batch stops at its own
    first one (included); use_eos=False goes on."""
    stop = next(t for k, t in enumerate(llama_greedy[0]) if k and t not in llama_greedy[0][:k])
    folder = tmp_path / "llama"
    shutil.copytree(llama, folder)
    config = json.loads((folder / "genai_config.json").read_text())
    config["model"]["eos_token_id"] = [120, stop]
    (folder / "genai_config.json").write_text(json.dumps(config))
    with ctxrt.Generator(folder) as gen:
        got = gen.generate(LLAMA_PROMPTS, N)
        assert got.tokens == [until(t, {stop, 120, 2}) for t in llama_greedy]
        assert got.finish_reasons[0] == "stop"
    with ctxrt.Generator(llama) as gen:
        assert gen.generate(LLAMA_PROMPTS[:1], N, stop_ids=[stop]).tokens == [until(llama_greedy[0], {stop, 2})]
        assert gen.generate(LLAMA_PROMPTS[:1], 4, use_eos=False).tokens == [llama_greedy[0][:4]]


def test_prompt_that_fills_the_context_is_one_error(llama: Path) -> None:
    with ctxrt.Generator(llama) as gen:
        with pytest.raises(ctxrt.GenerationError, match=f"prompt 1 has {LLAMA_CONTEXT} tokens; the model's "
                                                        f"context is {LLAMA_CONTEXT} tokens"):
            gen.generate([[3], [3] * LLAMA_CONTEXT], 4)
        near = gen.generate([[3] * (LLAMA_CONTEXT - 2)], N)  # room for two tokens
    assert len(near.tokens[0]) == 2 and near.finish_reasons == ["context"]
    with ctxrt.Generator(llama, context_length=4) as gen, pytest.raises(ctxrt.GenerationError, match="context is 4"):
        gen.generate([[1, 2, 3, 4]], 2)


def test_tokens_stream_as_they_come(llama: Path) -> None:
    """Each step yields one token per prompt still going (None for one that stopped), already in .tokens; the
    callback of generate() sees the same steps."""
    with ctxrt.Generator(llama) as gen:
        run = gen.stream(LLAMA_PROMPTS, 4)
        with pytest.raises(ctxrt.GenerationError, match="not finished"):
            run.result()
        steps = []
        for step in run:
            steps.append(step)
            assert [t[-1] for t in run.tokens if len(t) == len(steps)] == [t for t in step if t is not None]
        result = run.result()
        seen: list[list[int | None]] = []
        again = gen.generate(LLAMA_PROMPTS, 4, on_token=seen.append)
    assert [[t for t in column if t is not None] for column in zip(*steps, strict=True)] == result.tokens
    assert seen == steps and again.tokens == result.tokens


def test_context_binary_compiled_with_ranges(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A GPT-2 export compiled with --dim ranges generates what onnxruntime's loop does; past its ranges the
    session's error is one line (--context-length keeps inside them)."""
    pytest.importorskip("transformers")
    model, binary = gpt2_export("legacy"), tmp_path / "gpt2.ctx"
    dims = ["--dim", "batch=1:4", "--dim", "seq=1:8", "--dim", "total=1:16", "--dim", "past=0:16"]
    assert cli(capsys, "compile", model, "-o", binary, "-q", *dims)[0] == 0
    with ctxrt.Generator(binary) as gen:
        assert gen.generate(GPT_PROMPTS, N).tokens == [ort_greedy(model, p, N) for p in GPT_PROMPTS]
        assert gen._append and gen.session.stats["kv_bytes_appended"] > 0  # the loaded program appends in place
        with pytest.raises(ctxrt.ShapeError, match="'total'.* outside the range 1..16"):
            gen.generate(GPT_PROMPTS[:1], 20)
        assert gen.generate(GPT_PROMPTS[:1], 4).tokens == [ort_greedy(model, GPT_PROMPTS[0], 4)]  # after the error
    with ctxrt.Generator(binary, context_length=16) as gen:
        assert gen.generate(GPT_PROMPTS[:1], 20).finish_reasons == ["context"]


def test_compile_generate_then_generate_without_compiling(llama: Path, llama_greedy: list[list[int]],
                                                          gpt2: Path, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """`ctxrt compile FOLDER --generate` writes one range program for a whole generation (the ranges it chose are
    printed; the builder model's KV cache a shared buffer of the context's length): generating from it compiles
    nothing and gives onnxruntime-genai's tokens; a torch export the same against onnxruntime's loop."""
    shutil.copy(llama / "genai_config.json", tmp_path)
    code, out, err = cli(capsys, "compile", llama, "--generate", "--batch", 2, "-o", tmp_path / "model.ctx", "-q")
    assert code == 0, err
    assert f"past_sequence_length={LLAMA_CONTEXT}:{LLAMA_CONTEXT}" in out and "kv_cache_dim=16:16" in out
    with ctxrt.Generator(tmp_path / "model.ctx") as gen:
        assert gen.spec.share_buffer
        assert gen._static_mask  # no ONNX model beside it: the compile recorded that the mask only counts
        got = gen.generate(LLAMA_PROMPTS, N)
        assert gen.session.stats["shape_variants_compiled"] == 0
    assert got.tokens == llama_greedy
    code, out, err = cli(capsys, "compile", gpt2, "--generate", "--context", 32, "--prompt-window", 4, "-o",
                         tmp_path / "gpt2.ctx", "-q")
    assert code == 0, err
    with ctxrt.Generator(tmp_path / "gpt2.ctx", context_length=32) as gen:
        assert gen.generate(GPT_PROMPTS[:1], N).tokens == [ort_greedy(gpt2, GPT_PROMPTS[0], N)]
        assert gen.session.stats["shape_variants_compiled"] == 0
    assert_one_line_error(*cli(capsys, "compile", gpt2, "--generate", "--dim", "seq=1:4", "-o", tmp_path / "x.ctx"),
                          "--generate takes one model and chooses its ranges itself")


def test_cli_generate_json(llama: Path, llama_greedy: list[list[int]], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = cli(capsys, "generate", llama, "--prompt-ids", "5,9,17,33", "--prompt-ids", "7,8,40",
                         "--max-new-tokens", 3, "--ignore-eos", "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["tokens"] == [t[:3] for t in llama_greedy]
    assert report["batching"] == "batch, right padding" and report["prompt_tokens"] == 7
    for key in ("tokens_per_s", "prompt_tokens_per_s", "time_to_first_token_ms"):
        assert report[key] > 0, key
    memory = report["memory"]
    # the shared KV buffer (genai_config's past_present_share_buffer): 2 layers x (key, value) x batch 2 x 2 kv
    # heads x the context's 64 rows x 16 x float32
    assert memory["kv_cache"] == 4 * 2 * 2 * LLAMA_CONTEXT * 16 * 4
    assert memory["weights"] > 0 and memory["spillfill"] > 0 and memory["peak_rss"] > 2 ** 20


def test_cli_generate_text_prompt_streams(llama: Path, llama_greedy: list[list[int]],
                                          capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = cli(capsys, "generate", llama, "--prompt", "t5 t9 t17 t33", "--max-new-tokens", 3,
                         "--ignore-eos")
    assert code == 0, err
    assert out == " ".join(f"t{t}" for t in llama_greedy[0][:3]) + "\n"
    assert "tokens/s" in err and "KV cache" in err


@pytest.mark.parametrize(("args", "needle"), [
    (["--prompt-ids", "1,x"], "argument --prompt-ids"),
    (["--prompt-ids", "1", "--top-p", "0"], "argument --top-p"),
    (["--prompt-ids", "1", "--temperature", "-1"], "argument --temperature"),
    (["--prompt-ids", "1", "--max-new-tokens", "0"], "argument --max-new-tokens"),
    ([], "at least one prompt"),
    (["--prompt-ids", "1", "--prompt", "t1"], "not both"),
    (["--prompt-ids", ",".join(["3"] * LLAMA_CONTEXT)], "leaves no room"),
    (["--prompt-ids", "500"], "outside the vocabulary of 128"),
], ids=["bad-ids", "top-p", "temperature", "max-new-tokens", "no-prompt", "both", "too-long", "vocab"])
def test_cli_generate_bad_arguments(llama: Path, capsys: pytest.CaptureFixture[str], args: list[str],
                                    needle: str) -> None:
    assert_one_line_error(*cli(capsys, "generate", llama, *args), needle)


def test_cli_generate_bad_models(gpt2: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A missing model, text without a tokenizer, a context binary of fixed shapes (its past cannot grow), a broken
    genai_config.json."""
    assert_one_line_error(*cli(capsys, "generate", tmp_path / "none", "--prompt-ids", "1"), "none: no such file")
    assert_one_line_error(*cli(capsys, "generate", gpt2, "--prompt", "hello"), "no tokenizer.json")
    assert cli(capsys, "compile", gpt2, "-o", tmp_path / "m.ctx", "-q")[0] == 0
    assert_one_line_error(*cli(capsys, "generate", tmp_path / "m.ctx", "--prompt-ids", "1"),
                          "has the fixed shape [1, 2, 1, 16]: its KV cache cannot grow")
    (tmp_path / "genai_config.json").write_text("{not json")
    assert_one_line_error(*cli(capsys, "generate", tmp_path, "--prompt-ids", "1"), "cannot read it as JSON")


def test_a_batch_row_that_fills_the_context_stops_while_the_others_go_on(llama: Path) -> None:
    """A right-padded batch whose long prompt reaches the context while a short one still generates: the long one
    stops ('context'), the short one goes on with its own positions and gives the tokens it gives alone (the
    shared mask's width never passes the context; it did, and the step failed)."""
    long, short = list(range(3, 3 + LLAMA_CONTEXT - 4)), [5, 6]
    with ctxrt.Generator(llama) as gen:
        got = gen.generate([long, short], 20, use_eos=False)
        alone = gen.generate([short], 20, use_eos=False)
    assert got.finish_reasons == ["context", "length"]
    assert len(got.tokens[0]) == 4 and got.tokens[1] == alone.tokens[0]


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_the_range_compile_keeps_a_folded_chain_in_one_round(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The values a mask or position chain folds (Range -> Add -> Unsqueeze ...) that follow the dims are found
    from both probes' folded values at once: two rounds of probes, not one a link (19 lowerings before)."""
    pytest.importorskip("transformers")
    import ctxrt.compiler

    lowered = []
    real = ctxrt.compiler.lower
    monkeypatch.setattr(ctxrt.compiler, "lower", lambda *a, **k: lowered.append(1) or real(*a, **k))
    model = decoder_export(kind, "legacy")
    with ctxrt.Generator(model) as gen:
        assert gen.generate(GPT_PROMPTS[:1], 4).tokens == [ort_greedy(model, GPT_PROMPTS[0], 4)]
        assert gen.session.stats["shape_variants_compiled"] == 1
    assert len(lowered) <= 8


def _split_compile(capsys: pytest.CaptureFixture[str], model: Path, out: Path, k: int, *args: object) -> Path:
    """`ctxrt compile MODEL --generate --split K -o OUT`: the EPContext model chaining the K parts."""
    code, _, err = cli(capsys, "compile", model, "--generate", "--split", k, "-o", out, "-q", *args)
    assert code == 0, err
    assert len(list(out.glob("*_part*.ctx"))) == k
    (wrapper,) = out.glob("*_ctx.onnx")
    return wrapper


def _chain_memory(gen: ctxrt.Generator, wrapper: Path) -> None:
    """One spill-fill buffer for the chain, of its largest part's size; the weights held are the binaries'."""
    from ctxrt.format import read_metadata

    metas = [read_metadata(p) for p in sorted(wrapper.parent.glob("*_part*.ctx"))]
    stats = gen.session.stats
    assert stats["alloc_spillfill_bytes"] == max(m["max_spillfill_size"] for m in metas)
    assert stats["weights_bytes"] <= sum(m["weights_size"] for m in metas)
    assert stats["shape_variants_compiled"] == 0
    assert len(gen.session._current.stages) == len(metas)


@pytest.mark.parametrize(("kind", "exporter", "k", "backend"), [("gpt2", "legacy", 3, "cpu"),
                                                                ("llama", "dynamo", 2, "cpu"),
                                                                ("qwen2", "legacy", 2, "cpu"),
                                                                ("gpt2", "legacy", 2, "opencl")])
def test_split_export_generates_in_place(kind: str, exporter: str, k: int, backend: str, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str], request: pytest.FixtureRequest) -> None:
    """`--generate --split K` of a torch export: K range programs chained through one spill-fill buffer, each
    part at the dims its own inputs give; tokens equal onnxruntime's loop, the parts' Concats append to the KV
    cache windows in place on the CPU (strided windows are the CPU's: on OpenCL each step's presents are the next
    step's pasts), nothing compiles at run time."""
    pytest.importorskip("transformers")
    if exporter == "dynamo":
        pytest.importorskip("onnxscript")
    if backend == "opencl":
        request.getfixturevalue("opencl")
    model = gpt2_export(exporter) if kind == "gpt2" else decoder_export(kind, exporter)
    wrapper = _split_compile(capsys, model, tmp_path, k, "--context", 32, "--prompt-window", 4, "--batch", 2,
                             "--backend", backend)
    want = [ort_greedy(model, p, N) for p in GPT_PROMPTS]
    with ctxrt.Generator(wrapper, backend, context_length=32) as gen:
        got = gen.generate(GPT_PROMPTS, N)
        pairs = gen.session.kv_appends()
        stats = gen.session.stats
        _chain_memory(gen, wrapper)
    assert got.tokens == want
    if backend == "cpu":
        assert len(pairs) == len(gen.spec.kv)  # every layer's pair, whichever part holds it
        assert stats["kv_bytes_appended"] > 0 and stats["kv_bytes_kept_in_place"] > 5 * stats["kv_bytes_appended"]


@pytest.mark.parametrize(("precision", "k", "backend"), [("fp32", 2, "cpu"), ("int4", 3, "cpu"),
                                                         ("fp32", 3, "opencl")])
def test_split_builder_folder_generates(precision: str, k: int, backend: str, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str], request: pytest.FixtureRequest) -> None:
    """A builder folder compiled with `--generate --split K`: its shared KV buffers bound across the parts, the
    GroupQueryAttention totals the later parts need computed in the part that reads the mask; `ctxrt generate
    DIR` (genai_config.json beside the parts) gives onnxruntime-genai's tokens; int4 weights stay packed."""
    pytest.importorskip("onnxruntime_genai")
    pytest.importorskip("transformers")
    if backend == "opencl":
        request.getfixturevalue("opencl")
    folder = builder_llama(precision)
    wrapper = _split_compile(capsys, folder, tmp_path, k, "--batch", 2, "--backend", backend)
    shutil.copy(folder / "genai_config.json", tmp_path)
    want = [genai_greedy(folder, p, N) for p in LLAMA_PROMPTS]
    with ctxrt.Generator(tmp_path, backend) as gen:
        # the compile read from the ONNX model that the mask only counts (META generation): every token one shape
        assert gen.files.model == wrapper and gen.spec.share_buffer and gen._static_mask
        assert gen.generate(LLAMA_PROMPTS, N).tokens == want
        _chain_memory(gen, wrapper)
        if precision == "int4":  # no float copy of a 4-bit matrix (8x its packed bytes) is held
            packed = sum(int(np.prod(i.dims)) for i in onnx.load(folder / "model.onnx").graph.initializer
                         if i.data_type == TensorProto.UINT8)
            assert packed > 0 and gen.session.stats["weights_bytes"] < 2 * packed
    code, out, err = cli(capsys, "generate", tmp_path, "--prompt-ids", "5,9,17,33", "--max-new-tokens", N,
                         "--backend", backend, "--json")
    assert code == 0, err
    assert json.loads(out)["tokens"] == [want[0]]


def test_split_chain_runs_any_shape_inside_and_errors(gpt2: Path, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """The chain through InferenceSession.run, at shapes of every dim inside the ranges (an empty past too):
    onnxruntime's outputs; outside them the ShapeError naming the dim; a split compile with a file for -o: one
    line."""
    import onnxruntime as ort

    wrapper = _split_compile(capsys, gpt2, tmp_path / "d", 2, "--context", 16, "--prompt-window", 4, "--batch", 2)
    oracle = ort.InferenceSession(str(gpt2), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    with ctxrt.InferenceSession(wrapper) as sess:
        for b, q, p in [(1, 3, 0), (2, 1, 5), (2, 4, 9), (1, 1, 0)]:
            feeds = {"input_ids": rng.integers(0, 50, (b, q)), "attention_mask": np.ones((b, p + q), np.int64),
                     "position_ids": np.arange(p, p + q)[None].repeat(b, 0)}
            feeds.update({i.name: rng.standard_normal((b, 2, p, 16)).astype(np.float32)
                          for i in oracle.get_inputs() if i.name.startswith("past")})
            for got, want in zip(sess.run(None, feeds), oracle.run(None, feeds), strict=True):
                np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
        assert sess.stats["shape_variants_compiled"] == 0
    with ctxrt.Generator(wrapper) as gen:
        with pytest.raises(ctxrt.ShapeError, match="outside the range"):
            gen.generate(GPT_PROMPTS[:1], 20)
        assert gen.generate(GPT_PROMPTS[:1], 4).tokens == [ort_greedy(gpt2, GPT_PROMPTS[0], 4)]  # after the error
    (tmp_path / "f").write_text("x")
    assert_one_line_error(*cli(capsys, "compile", gpt2, "--generate", "--split", 2, "-o", tmp_path / "f"),
                          "must be a directory")
    other = _split_compile(capsys, gpt2, tmp_path / "e", 2, "--context", 32, "--prompt-window", 4)
    part = next(other.parent.glob("*_part1.ctx"))
    shutil.copy(part, wrapper.parent / part.name)  # a part of another compile (other ranges, another plan)
    with pytest.raises(ctxrt.FormatError):
        ctxrt.InferenceSession(wrapper)
    assert_one_line_error(*cli(capsys, "generate", wrapper, "--prompt-ids", "1,2", "--max-new-tokens", 2),
                          "part1")  # the part that does not fit, named
