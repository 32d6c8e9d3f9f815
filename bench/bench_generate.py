"""Text generation, ctxrt's `Generator` against onnxruntime-genai on the same builder folder (issue 21):

A random-weight Llama-style model (hidden 768, 8 layers, 12 heads, 4 kv heads, intermediate 2048, vocab 32000:
~420 MB in fp32) written by onnxruntime-genai's model builder for the CPU, fp32 and int4 (block 32). One prompt of
128 tokens, 128 new tokens, greedy, eos ignored (the tokens are compared). Engines: ctxrt's Generator on the
folder (its compile counted in the time to first token), on the folder's model compiled ahead (`ctxrt compile
FOLDER --generate`: loading it compiles nothing), on it compiled as 4 parts (`--split 4`: a chain of range
programs sharing one spill-fill buffer; its peak RSS is compared with weights + the largest part's spill-fill + the
KV cache) and onnxruntime-genai. Per engine and precision: generation
tokens/s (token steps only), prompt tokens/s, time to first token (model load excluded), load time, peak RSS
and peak RSS beyond the weights (the peak resident set, VmHWM reset after the imports, in a fresh process, minus the one
after imports, minus the weight bytes of model.onnx and its data file; negative where pages are never touched,
e.g. an embedding's unused rows).

    .venv/bin/python bench/bench_generate.py [--rounds R] [--precisions fp32,int4,export] [--json]

`export`: the same Llama exported by torch (legacy exporter, KV cache as inputs and outputs, fp32): ctxrt's
Generator on the .onnx (the KV cache appended in place) against onnxruntime with IO binding (presents bound as the
next pasts), the time to first token there the prompt's run.

Each run is a fresh child process; rounds alternate which engine goes first; figures are medians over rounds.
The folders are built once into .cache/bench (the builder takes about a minute per precision). The machine is
shared: say what else ran.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
CACHE = Path(os.environ.get("CTXRT_BENCH_CACHE", ROOT / ".cache" / "bench"))
CONFIG = {"vocab_size": 32000, "hidden_size": 768, "intermediate_size": 2048, "num_hidden_layers": 8,
          "num_attention_heads": 12, "num_key_value_heads": 4, "max_position_embeddings": 2048}
PROMPT, NEW = 128, 128
SPLIT = 4  # parts of the split engine (`ctxrt compile FOLDER --generate --split 4`)
ENGINES = ("ctxrt", "ctxrt .ctx", f"ctxrt split {SPLIT}", "onnxruntime-genai")
EXPORT_ENGINES = ("ctxrt", "onnxruntime")  # on the transformers export ("export" in --precisions)


def engines(precision: str) -> tuple[str, ...]:
    return EXPORT_ENGINES if precision == "export" else ENGINES


def baseline(precision: str) -> str:
    return "onnxruntime" if precision == "export" else "onnxruntime-genai"


def export() -> Path:
    """The same random Llama (seed 0) exported by torch's legacy exporter with its KV cache as inputs and outputs
    (`past_key_values.N.key/value`, `present.N.key/value`, as gen_models.py's decoders) and its config.json beside
    it (the context), built on first use."""
    out = CACHE / "llama_h768_l8_export"
    if (out / "model.onnx").is_file():
        return out / "model.onnx"
    import onnx
    import torch
    import transformers

    sys.path.insert(0, str(ROOT / "tests" / "models"))
    from gen_models import export_with_cache

    torch.manual_seed(0)
    config = transformers.LlamaConfig(**CONFIG)
    lm = transformers.LlamaForCausalLM(config).eval()
    head = CONFIG["hidden_size"] // CONFIG["num_attention_heads"]
    proto = export_with_cache(lm, "legacy", CONFIG["num_hidden_layers"], CONFIG["num_key_value_heads"], head,
                              CONFIG["vocab_size"])
    work = Path(tempfile.mkdtemp(dir=CACHE, prefix=out.name + "."))
    onnx.save(proto, str(work / "model.onnx"))
    config.save_pretrained(work)  # config.json: the context (max_position_embeddings)
    os.replace(work, out)
    return out / "model.onnx"


def folder(precision: str) -> Path:
    """The builder's folder for `precision`, built on first use (a random Llama saved with transformers)."""
    out = CACHE / f"genai_llama_h768_l8_{precision}"
    if (out / "genai_config.json").is_file():
        return out
    import torch
    import transformers

    CACHE.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=CACHE, prefix=out.name + "."))
    try:
        from tokenizers import Tokenizer, models, pre_tokenizers

        torch.manual_seed(0)
        hf = work / "hf"
        transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG)).save_pretrained(hf)
        words = Tokenizer(models.WordLevel({f"t{i}": i for i in range(CONFIG["vocab_size"])}, unk_token="t0"))
        words.pre_tokenizer = pre_tokenizers.Whitespace()
        transformers.PreTrainedTokenizerFast(tokenizer_object=words, unk_token="t0", eos_token="t2").save_pretrained(hf)
        done = subprocess.run([sys.executable, "-m", "onnxruntime_genai.models.builder", "-m", str(hf), "-i", str(hf),
                               "-o", str(work / "out"), "-p", precision, "-e", "cpu", "-c", str(work / "cache")],
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"the model builder failed:\n{done.stderr[-3000:]}")
        os.replace(work / "out", out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out


def _rss_now() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def _hwm() -> int:
    """The process's peak resident set since the last reset (Linux: VmHWM)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))


def _weights(path: Path) -> int:
    return sum(p.stat().st_size for p in path.iterdir() if p.suffix == ".onnx" or p.name.endswith(".data"))


def _prompt() -> list[int]:
    import numpy as np

    return [int(t) for t in np.random.default_rng(0).integers(3, CONFIG["vocab_size"], PROMPT)]


def _run_genai(path: Path) -> dict[str, Any]:
    import numpy as np
    import onnxruntime_genai as og

    t = time.perf_counter()
    model = og.Model(str(path))
    load = time.perf_counter() - t
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=PROMPT + NEW, do_sample=False)
    t = time.perf_counter()
    gen = og.Generator(model, params)
    gen.append_tokens(np.array([_prompt()], np.int32))  # runs the prompt
    prompt_s = time.perf_counter() - t
    gen.generate_next_token()  # picks the first token from the prompt's logits
    first = time.perf_counter() - t
    t = time.perf_counter()
    while not gen.is_done():
        gen.generate_next_token()  # runs the model on the last token, then picks
    decode = time.perf_counter() - t
    tokens = [int(x) for x in gen.get_sequence(0)[PROMPT:]]
    return {"load_s": load, "ttft_ms": first * 1e3, "prompt_tok_s": PROMPT / prompt_s,
            "tok_s": (len(tokens) - 1) / decode, "tokens": tokens}


def _run_ort_export(path: Path) -> dict[str, Any]:
    """onnxruntime on the export as its docs advise for decoders: IO binding, each step's presents (OrtValues
    onnxruntime allocated) bound as the next step's pasts, nothing copied to NumPy but the last logits row."""
    import numpy as np
    import onnxruntime as ort

    t = time.perf_counter()
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    load = time.perf_counter() - t
    outs = [o.name for o in sess.get_outputs()]
    pasts = [i for i in sess.get_inputs() if i.name.startswith("past_key_values")]
    head = CONFIG["hidden_size"] // CONFIG["num_attention_heads"]
    state = {i.name: ort.OrtValue.ortvalue_from_numpy(np.zeros((1, CONFIG["num_key_value_heads"], 0, head),
                                                               np.float32)) for i in pasts}
    ids, total, tokens = np.array([_prompt()], np.int64), PROMPT, []
    binding = sess.io_binding()
    times = []
    for _ in range(NEW):
        t = time.perf_counter()
        binding.clear_binding_inputs()
        binding.clear_binding_outputs()
        binding.bind_cpu_input("input_ids", ids)
        binding.bind_cpu_input("attention_mask", np.ones((1, total), np.int64))
        binding.bind_cpu_input("position_ids", np.arange(total - ids.shape[1], total, dtype=np.int64)[None])
        for name, value in state.items():
            binding.bind_ortvalue_input(name, value)
        for name in outs:
            binding.bind_output(name)
        sess.run_with_iobinding(binding)
        got = binding.get_outputs()
        tokens.append(int(np.argmax(got[0].numpy()[0, -1])))
        state = {n.replace("present", "past_key_values"): v for n, v in zip(outs[1:], got[1:], strict=True)}
        ids, total = np.array([[tokens[-1]]], np.int64), total + 1
        times.append(time.perf_counter() - t)
    return {"load_s": load, "ttft_ms": times[0] * 1e3, "prompt_tok_s": PROMPT / times[0],
            "tok_s": (len(times) - 1) / sum(times[1:]), "tokens": tokens}


def compiled(path: Path) -> Path:
    """The folder's model compiled ahead for generation (`ctxrt compile FOLDER --generate`), once."""
    from ctxrt.cli import main as cli

    out = path / "model.ctx"
    if not out.exists() and cli(["compile", str(path), "--generate", "--context", str(PROMPT + NEW), "-o", str(out),
                                 "-q"]) != 0:
        raise SystemExit("ctxrt compile --generate failed")
    parts = path / f"split{SPLIT}"
    if not (parts / "genai_config.json").exists():
        if cli(["compile", str(path), "--generate", "--split", str(SPLIT), "--context", str(PROMPT + NEW), "-o",
                str(parts), "-q"]) != 0:
            raise SystemExit(f"ctxrt compile --generate --split {SPLIT} failed")
        shutil.copy(path / "genai_config.json", parts)
    return out


def split_bound(parts: Path, kv_bytes: int) -> int:
    """What the issue bounds a split model's peak memory by: its weights (the parts' weight blocks), one part's
    spill-fill (the largest: the shared buffer) and the KV cache."""
    from ctxrt.format import read_metadata

    metas = [read_metadata(p) for p in parts.glob("*_part*.ctx")]
    return sum(m["weights_size"] for m in metas) + max(m["max_spillfill_size"] for m in metas) + kv_bytes


def _run_ctxrt(path: Path) -> dict[str, Any]:
    import ctxrt

    t = time.perf_counter()
    gen = ctxrt.Generator(path, context_length=PROMPT + NEW)
    load = time.perf_counter() - t
    result = gen.generate([_prompt()], NEW, use_eos=False)
    return {"load_s": load, "ttft_ms": result.time_to_first_token_ms, "prompt_tok_s": result.prompt_tokens_per_s,
            "tok_s": result.tokens_per_s, "tokens": result.tokens[0], "ctxrt_memory": result.memory}


def child(engine: str, precision: str) -> None:
    """One generation in this process; prints one JSON line."""
    import onnxruntime  # noqa: F401  both runtimes' libraries loaded before the baseline
    import onnxruntime_genai  # noqa: F401

    import ctxrt  # noqa: F401
    from ctxrt.backends import get_backend
    from ctxrt.backends.cpu.onednn import api

    api.library()
    get_backend("cpu")  # the kernels' modules, imported on first use, as onnxruntime's are by its import
    path = export() if precision == "export" else folder(precision)
    base = _rss_now()
    with open("/proc/self/clear_refs", "w") as f:  # the peak resident set (VmHWM) starts again from here: no
        f.write("5")  # sampling thread, which would take the GIL from the engine measured
    if precision == "export":
        out = _run_ort_export(path) if engine == "onnxruntime" else _run_ctxrt(path)
        path = path.parent
    else:
        out = _run_genai(path) if engine == "onnxruntime-genai" else _run_ctxrt(
            path / "model.ctx" if engine == "ctxrt .ctx" else path / f"split{SPLIT}" if "split" in engine else path)
    peak_rss = _hwm() - base
    if "split" in engine:
        out["split_bound_mib"] = split_bound(path / f"split{SPLIT}", out["ctxrt_memory"]["kv_cache"]) / 2 ** 20
    out.update(peak_rss_mib=peak_rss / 2 ** 20, beyond_weights_mib=(peak_rss - _weights(path)) / 2 ** 20,
               weights_mib=_weights(path) / 2 ** 20)
    print(json.dumps(out))


def measure(precisions: list[str], rounds: int) -> dict[str, dict[str, Any]]:
    results: dict[str, dict[str, list[dict[str, Any]]]] = {p: {e: [] for e in engines(p)} for p in precisions}
    for p in precisions:
        if p == "export":
            export()
        else:
            compiled(folder(p))
    for r in range(rounds):
        for p in precisions:
            for engine in engines(p) if r % 2 == 0 else engines(p)[::-1]:
                done = subprocess.run([sys.executable, __file__, "--child", engine, p], capture_output=True,
                                      text=True)
                if done.returncode != 0:
                    raise SystemExit(f"{engine} {p} failed:\n{done.stderr[-3000:]}")
                results[p][engine].append(json.loads(done.stdout.strip().splitlines()[-1]))
    summary: dict[str, dict[str, Any]] = {}
    for p in precisions:
        summary[p] = {}
        for engine, runs in results[p].items():
            row = {k: statistics.median(run[k] for run in runs) for k in runs[0] if isinstance(runs[0][k], float)}
            row["tokens"] = runs[0]["tokens"]
            summary[p][engine] = row
        theirs = summary[p][baseline(p)]["tokens"]
        ours = [summary[p][e]["tokens"] for e in engines(p) if e != baseline(p)]
        summary[p]["tokens_equal"] = all(t == theirs for t in ours)
        summary[p]["tokens_equal_prefix"] = min(next((k for k, (a, b) in enumerate(zip(t, theirs, strict=True))
                                                      if a != b), len(t)) for t in ours)
    return summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--precisions", default="fp32,int4")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(*args.child)
        return
    summary = measure(args.precisions.split(","), args.rounds)
    if args.json:
        print(json.dumps(summary))
        return
    from bench_latency import machine_line

    print(machine_line())
    c = CONFIG
    print(f"Llama-style, hidden {c['hidden_size']}, {c['num_hidden_layers']} layers, vocab {c['vocab_size']}; "
          f"prompt {PROMPT}, {NEW} new tokens, greedy; medians of {args.rounds} rounds")
    print(f"  {'model':<6}{'engine':<19}{'tok/s':>8}{'ratio':>7}{'prompt tok/s':>14}{'ratio':>7}{'TTFT ms':>9}"
          f"{'load s':>8}{'peak RSS MiB':>14}{'ratio':>7}")
    for p, rows in summary.items():
        o = rows[baseline(p)]
        for engine in engines(p):
            v = rows[engine]
            print(f"  {p:<6}{engine:<19}{v['tok_s']:>8.1f}{v['tok_s'] / o['tok_s']:>7.2f}"
                  f"{v['prompt_tok_s']:>14.1f}{v['prompt_tok_s'] / o['prompt_tok_s']:>7.2f}{v['ttft_ms']:>9.1f}"
                  f"{v['load_s']:>8.2f}{v['peak_rss_mib']:>14.1f}{v['peak_rss_mib'] / o['peak_rss_mib']:>7.2f}")
        beyond = ", ".join(f"{e} {rows[e]['beyond_weights_mib']:.1f}" for e in engines(p))
        print(f"  {p}: weights {o['weights_mib']:.1f} MiB; peak RSS beyond them (MiB): {beyond}; tokens equal: "
              f"{rows['tokens_equal']} "
              f"(first difference at {rows['tokens_equal_prefix']})")
        split = rows.get(f"ctxrt split {SPLIT}", {})
        if "split_bound_mib" in split:
            print(f"  {p}: split {SPLIT} peak RSS {split['peak_rss_mib']:.1f} MiB against weights + the largest part's "
                  f"spill-fill + the KV cache = {split['split_bound_mib']:.1f} MiB "
                  f"({split['peak_rss_mib'] / split['split_bound_mib']:.2f}x)")


if __name__ == "__main__":
    main()
