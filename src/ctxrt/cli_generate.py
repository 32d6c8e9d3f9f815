"""`ctxrt generate`: tokens from a decoder, printed as they come (docs/generate.md).

Tokens go to stdout as they are made: with one prompt on one line (text pieces for a --prompt), with several
one line per step (a token per prompt, "-" for one that has stopped). The timing and memory summary goes to
stderr. `--json` prints one JSON object instead, at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from ctxrt.cli_args import (
    UsageError,
    fraction,
    model_kind,
    naming,
    non_negative_float,
    non_negative_int,
    positive_int,
    token_ids,
)


def add_generate(sub: Any) -> None:
    g = sub.add_parser("generate", help="generate tokens with a decoder: a torch export with past_key_values "
                                        "inputs, or a folder of onnxruntime-genai's model builder")
    g.add_argument("model", metavar="MODEL", help="an .onnx model, a folder with genai_config.json (or one model), "
                                                  "or a context binary compiled from one")
    g.add_argument("--prompt-ids", action="append", type=token_ids, default=[], metavar="ID,ID,...",
                   help="a prompt as token ids; repeat for a batch")
    g.add_argument("--prompt", action="append", default=[], metavar="TEXT",
                   help="a prompt as text (needs tokenizer.json beside the model); repeat for a batch")
    g.add_argument("--max-new-tokens", type=positive_int, default=32, metavar="N", help="per prompt (default 32)")
    g.add_argument("--temperature", type=non_negative_float, default=0.0, metavar="T",
                   help="0 (default): greedy; above 0: sample")
    g.add_argument("--top-k", type=non_negative_int, default=0, metavar="K",
                   help="sample from the K most likely tokens (0: all)")
    g.add_argument("--top-p", type=fraction, default=1.0, metavar="P",
                   help="sample from the most likely tokens whose probabilities reach P (default 1: all)")
    g.add_argument("--seed", type=non_negative_int, metavar="S", help="seed of the sampler (the same tokens again)")
    g.add_argument("--stop-id", action="append", type=non_negative_int, default=[], metavar="ID",
                   help="stop a prompt at this token too (the model's eos ids already stop it)")
    g.add_argument("--ignore-eos", action="store_true", help="do not stop at the model's eos ids")
    g.add_argument("--context-length", type=positive_int, metavar="N",
                   help="the model's context, where neither genai_config.json nor config.json gives it")
    g.add_argument("--prompt-window", type=positive_int, default=128, metavar="N",
                   help="the most prompt tokens one run takes; longer prompts run in chunks (default 128)")
    g.add_argument("--backend", default="cpu", help="cpu (default), opencl or opencl:N")
    g.add_argument("--threads", type=non_negative_int, default=0, metavar="N",
                   help="threads of every pool (BLAS, OpenMP); 0: the cores other processes leave idle")
    g.add_argument("--json", action="store_true", help="print one JSON object at the end (tokens, timings, memory)")
    g.set_defaults(func=cmd_generate)


def cmd_generate(args: argparse.Namespace) -> int:
    from ctxrt.generation import Generator, Sampling
    from ctxrt.runtime.options import SessionOptions

    if args.prompt and args.prompt_ids:
        raise UsageError("give prompts either as --prompt-ids or as --prompt, not both")
    if not (args.prompt or args.prompt_ids):
        raise UsageError("give at least one prompt: --prompt-ids 1,2,3 or --prompt TEXT")
    if any(not p for p in args.prompt):
        raise UsageError("--prompt: an empty prompt")
    if not os.path.isdir(args.model):
        model_kind("", args.model)  # a readable .onnx or context binary (a folder is read by the Generator)
    sampling = Sampling(args.temperature, args.top_k, args.top_p, args.seed)
    options = SessionOptions(args.threads) if args.threads else None
    with naming(args.model), Generator(args.model, args.backend, sess_options=options,
                                       context_length=args.context_length, prompt_window=args.prompt_window) as gen:
        tokenizer = gen.tokenizer if args.prompt else None
        prompts = [tokenizer.encode(p).ids for p in args.prompt] if tokenizer else args.prompt_ids
        run = gen.stream(prompts, args.max_new_tokens, sampling=sampling, stop_ids=args.stop_id,
                         use_eos=not args.ignore_eos)
        show = _Printer(tokenizer, len(prompts)) if not args.json else None
        for step in run:
            if show is not None:
                show.step(step, run.tokens)
        result = run.result()
    texts = [tokenizer.decode(t) for t in result.tokens] if tokenizer else None
    if args.json:
        report = result.to_json()
        if texts is not None:
            report["text"] = texts
        print(json.dumps(report))
        return 0
    assert show is not None
    show.end(texts)
    m = result.memory
    how = f" ({result.batching})" if len(prompts) > 1 else ""
    print(f"{sum(map(len, result.tokens))} tokens{how}: {result.tokens_per_s:.1f} tokens/s, prompt "
          f"{result.prompt_tokens_per_s:.1f} tokens/s, first token {result.time_to_first_token_ms:.1f} ms; memory: "
          f"weights {_size(m['weights'])}, KV cache {_size(m['kv_cache'])}, spill-fill {_size(m['spillfill'])}, "
          f"peak RSS {_size(m['peak_rss'])}", file=sys.stderr)
    return 0


class _Printer:
    """Tokens to stdout as they come: one prompt's on one line (as text pieces for a text prompt), several
    prompts' one line per step."""

    def __init__(self, tokenizer: Any, n: int) -> None:
        self.tokenizer, self.n, self.shown = tokenizer, n, ""

    def step(self, new: list[int | None], tokens: list[list[int]]) -> None:
        if self.n > 1:
            print(" ".join("-" if t is None else str(t) for t in new), flush=True)
        elif self.tokenizer is None:
            print(("" if len(tokens[0]) == 1 else " ") + str(new[0]), end="", flush=True)
        else:
            text = self.tokenizer.decode(tokens[0])
            print(text[len(self.shown):], end="", flush=True)
            self.shown = text

    def end(self, texts: list[str] | None) -> None:
        if self.n == 1:
            print(flush=True)
        elif texts is not None:
            for k, text in enumerate(texts):
                print(f"[{k}] {text}")


def _size(n: int) -> str:
    return f"{n / 2 ** 20:.2f} MiB" if n >= 2 ** 20 else f"{n / 1024:.1f} KiB"
