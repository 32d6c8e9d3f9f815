"""`Generator`: a decoder's token loop over `InferenceSession`'s public API (get_inputs/get_outputs, io_binding).

Each step binds the previous step's present tensors as this step's past inputs (session tensors: no copy of the
KV cache between steps) and reads only the logits rows it samples from. Feeds change shape every token (the
past grows by one); how much that costs is the session's business, so this loop gets faster as the session
does.
"""

from __future__ import annotations

import os
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ctxrt.errors import CtxrtWarning, GenerationError
from ctxrt.generation.sampling import Sampling, choose
from ctxrt.generation.spec import DecoderSpec, describe, locate
from ctxrt.runtime.session import InferenceSession, IOBinding
from ctxrt.runtime.tensor import Tensor

Tokens = list[int | None]  # per prompt, the token it made at a step (None: none)


@dataclass
class GenerationResult:
    """What a generation made: per prompt the new tokens (the prompt not repeated; a stop token that ended it
    included) and why it ended ("stop", "length": max_new_tokens, "context": the context is full); timings
    (milliseconds and tokens per second, compile time included); memory in bytes."""

    tokens: list[list[int]]
    finish_reasons: list[str]
    batching: str
    prompt_tokens: int = 0
    time_to_first_token_ms: float = 0.0
    prompt_tokens_per_s: float = 0.0
    tokens_per_s: float = 0.0
    memory: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"tokens": self.tokens, "finish_reasons": self.finish_reasons, "batching": self.batching,
                "prompt_tokens": self.prompt_tokens, "time_to_first_token_ms": self.time_to_first_token_ms,
                "prompt_tokens_per_s": self.prompt_tokens_per_s, "tokens_per_s": self.tokens_per_s,
                "memory": self.memory}


class Generator:
    """Generate tokens with a decoder: a torch export with `past_key_values.*` inputs and `present.*` outputs,
    a folder (or its model) written by onnxruntime-genai's model builder (read through its genai_config.json),
    or a context binary compiled from either. `generate` returns a `GenerationResult`; `stream` yields the
    tokens step by step. `sess_options` and `backend` go to the InferenceSession; `context_length` overrides
    what genai_config.json (or a Hugging Face config.json beside an export) says."""

    def __init__(self, model: str | os.PathLike, backend: str = "cpu", *, sess_options: Any = None,
                 context_length: int | None = None) -> None:
        if context_length is not None and (isinstance(context_length, bool) or not isinstance(context_length, int)
                                           or context_length < 1):
            raise GenerationError(f"context_length must be a whole number >= 1, got {context_length!r}")
        self.files = locate(model)
        # the past only grows: an exact-shape variant (or a range program outgrown) is not run again
        self.session = InferenceSession(self.files.model, backend, sess_options=sess_options, max_shape_variants=2)
        try:
            self.spec: DecoderSpec = describe(self.files, self.session.get_inputs(), self.session.get_outputs(),
                                              context_length)
        except BaseException:
            self.session.close()
            raise
        self._range_the_past()
        self._outputs = [o.name for o in self.session.get_outputs()]
        self._logits_at = self._outputs.index(self.spec.logits)
        self._presents_at = [self._outputs.index(s.present) for s in self.spec.kv]
        self._tokenizer: Any = None

    def _range_the_past(self) -> None:
        """One range program for the whole generation: the past from 0 to the context length, a mask's length
        as past + sequence (docs/shapes-and-control-flow.md); the session widens what the feeds outgrow."""
        spec, shapes = self.spec, {i.name: i.shape for i in self.session.get_inputs()}
        if spec.context_length is None or not spec.kv:
            return
        past = shapes[spec.kv[0].past][spec.kv[0].seq_axis]
        seq = shapes[spec.input_ids][1] if len(shapes[spec.input_ids]) > 1 else None
        if not isinstance(past, str):
            return
        ranges: dict[str, Any] = {past: (0, spec.context_length)}
        mask = shapes[spec.attention_mask][1] if spec.attention_mask and len(shapes[spec.attention_mask]) > 1 \
            else None
        if isinstance(mask, str) and isinstance(seq, str) and mask not in (past, seq) and mask.isidentifier():
            ranges[mask] = f"{past} + {seq}"
        self.session.dim_ranges = {**ranges, **self.session.dim_ranges}

    @property
    def batching(self) -> str:
        """How several prompts run: "batch, left padding", "batch, right padding" or "one at a time"."""
        return self.spec.batching

    @property
    def tokenizer(self) -> Any:
        """The `tokenizers.Tokenizer` of the model's tokenizer.json (GenerationError without one)."""
        if self._tokenizer is None:
            from ctxrt.generation.text import load_tokenizer

            self._tokenizer = load_tokenizer(self.files.tokenizer, self.files.model)
        return self._tokenizer

    def stream(self, prompts: Sequence[Sequence[int]], max_new_tokens: int = 32, *, sampling: Sampling | None = None,
               stop_ids: Sequence[int] = (), use_eos: bool = True) -> Generation:
        """An iterator over steps: each yields a list with the token each prompt made (None where it made none);
        `.result()` after the last step. Stop ids are `stop_ids` plus the model's eos ids (unless `use_eos` is
        False)."""
        stops = frozenset(_ids(stop_ids, "stop_ids")) | (frozenset(self.spec.eos_ids) if use_eos else frozenset())
        return Generation(self, self._check(prompts, max_new_tokens), max_new_tokens, sampling or Sampling(), stops)

    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int = 32, *,
                 sampling: Sampling | None = None, stop_ids: Sequence[int] = (), use_eos: bool = True,
                 on_token: Callable[[Tokens], None] | None = None) -> GenerationResult:
        """Generate for every prompt (lists of token ids); `on_token` is called at each step as `stream` yields."""
        run = self.stream(prompts, max_new_tokens, sampling=sampling, stop_ids=stop_ids, use_eos=use_eos)
        for tokens in run:
            if on_token is not None:
                on_token(tokens)
        return run.result()

    def close(self) -> None:
        self.session.close()

    def __enter__(self) -> Generator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals ----------------------------------------------------------------------------------
    def _check(self, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> list[list[int]]:
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise GenerationError(f"max_new_tokens must be a whole number >= 1, got {max_new_tokens!r}")
        if isinstance(prompts, str | bytes) or not prompts:
            raise GenerationError("prompts must be a non-empty list of token id lists")
        checked = [_ids(p, f"prompt {k}") for k, p in enumerate(prompts)]
        vocab, context = self.spec.vocab_size, self.spec.context_length
        for k, p in enumerate(checked):
            if not p:
                raise GenerationError(f"prompt {k} is empty")
            if vocab is not None and max(p) >= vocab:
                raise GenerationError(f"prompt {k}: token id {max(p)} is outside the vocabulary of {vocab}")
            if context is not None and len(p) >= context:
                raise GenerationError(f"prompt {k} has {len(p)} tokens; the model's context is {context} tokens, "
                                      "so it leaves no room for a new token")
        return checked

    def _run(self, feeds: dict[str, np.ndarray | Tensor]) -> IOBinding:
        binding = self.session.io_binding()
        for name, value in feeds.items():
            binding.bind_input(name, value)
        for name in self._outputs:
            binding.bind_output(name)  # session tensors: presents become the next step's pasts in place
        with warnings.catch_warnings():  # its advice (bind one input shape) does not apply to a growing cache
            warnings.filterwarnings("ignore", "InferenceSession compiled", CtxrtWarning)
            self.session.run_with_iobinding(binding)
        return binding

    def _logits(self, binding: IOBinding) -> Tensor:
        return binding.get_outputs()[self._logits_at]  # in the order bound: every output, as _run binds them

    def _presents(self, binding: IOBinding) -> list[Tensor]:
        outs = binding.get_outputs()
        return [outs[k] for k in self._presents_at]

    def _memory(self, kv_bytes: int) -> dict[str, int]:
        stats = self.session.stats
        return {"weights": stats["weights_bytes"],
                "kernel_constants": stats["weights_prepacked_bytes"] + stats["alloc_kernel_bytes"],
                "kv_cache": kv_bytes, "spillfill": stats["alloc_spillfill_bytes"],
                "io_tensors": stats["tensor_cache_bytes_held"],
                "peak_rss": _peak_rss()}


class Generation:
    """The steps of one `Generator.stream` call (iterate it once); `tokens` and `finish_reasons` grow as it
    runs, `result()` is complete after the last step."""

    def __init__(self, gen: Generator, prompts: list[list[int]], max_new: int, sampling: Sampling,
                 stops: frozenset[int]) -> None:
        self._gen, self._prompts, self._max_new, self._sampling, self._stops = gen, prompts, max_new, sampling, stops
        self.tokens: list[list[int]] = [[] for _ in prompts]
        self.finish_reasons: list[str] = ["" for _ in prompts]
        self._rng = sampling.rng()
        self._times = {"first": 0.0, "prompt": 0.0, "decode": 0.0}
        self._decoded = 0
        self._kv_bytes = 0
        self._steps = self._all()
        self._done = False

    def __iter__(self) -> Iterator[Tokens]:
        return self

    def __next__(self) -> Tokens:
        try:
            return next(self._steps)
        except StopIteration:
            self._done = True
            raise

    def result(self) -> GenerationResult:
        if not self._done:
            raise GenerationError("the generation has not finished: iterate it to the end first")
        t = self._times
        prompt_tokens = sum(len(p) for p in self._prompts)
        return GenerationResult(self.tokens, self.finish_reasons, self._gen.batching, prompt_tokens,
                                t["first"] * 1e3, prompt_tokens / t["prompt"] if t["prompt"] else 0.0,
                                self._decoded / t["decode"] if t["decode"] else 0.0,
                                self._gen._memory(self._kv_bytes))

    def _all(self) -> Iterator[Tokens]:
        start = time.perf_counter()
        rows = range(len(self._prompts))
        for group in ([[r] for r in rows] if self._gen.spec.padding == "none" else [list(rows)]):
            yield from self._group(group, start)

    def _group(self, rows: list[int], start: float) -> Iterator[Tokens]:
        spec = self._gen.spec
        ids, mask, last = _pad([self._prompts[r] for r in rows], spec)
        budget = [self._budget(len(self._prompts[r])) for r in rows]
        feeds = {slot.past: slot.empty(len(rows)) for slot in spec.kv}
        alive = list(range(len(rows)))
        tic = time.perf_counter()
        binding = self._gen._run({**self._inputs(ids, mask), **feeds})
        new = self._choose(binding, last)
        self._times["prompt"] += time.perf_counter() - tic
        if not self._times["first"]:
            self._times["first"] = time.perf_counter() - start
        running, first_row = np.ones(len(rows), bool), np.zeros(len(rows), np.int64)
        one = np.ones((len(rows), 1), np.int64)
        while True:
            yield self._emit(rows, alive, new, budget)
            alive = [b for b in alive if not self.finish_reasons[rows[b]]]
            if not alive:
                break
            tic = time.perf_counter()
            running[:] = False
            running[alive] = True
            ids = np.where(running, new, spec.pad_id)[:, None]  # a prompt that stopped is fed padding
            mask = np.concatenate([mask, one], axis=1)
            past = dict(zip((s.past for s in spec.kv), self._gen._presents(binding), strict=True))
            previous, binding = binding, self._gen._run({**self._inputs(ids, mask), **past})
            del previous  # its tensors go back to the session's cache only now: they were this run's pasts
            new = self._choose(binding, first_row)
            self._times["decode"] += time.perf_counter() - tic
            self._decoded += len(alive)
        self._kv_bytes = max(self._kv_bytes, sum(t.nbytes for t in self._gen._presents(binding)))

    def _inputs(self, ids: np.ndarray, mask: np.ndarray) -> dict[str, np.ndarray]:
        spec = self._gen.spec
        feeds = {spec.input_ids: ids.astype(spec.dtypes[spec.input_ids])}
        if spec.attention_mask:
            feeds[spec.attention_mask] = mask.astype(spec.dtypes[spec.attention_mask])
        if spec.position_ids:  # the real tokens before each one (padding on the left: 1, as transformers has it)
            count = np.cumsum(mask, axis=1)[:, -ids.shape[1]:] - 1
            feeds[spec.position_ids] = np.where(mask[:, -ids.shape[1]:] == 0, 1, count).astype(
                spec.dtypes[spec.position_ids])
        return feeds

    def _choose(self, binding: IOBinding, last: np.ndarray) -> np.ndarray:
        logits = self._gen._logits(binding)
        rows = logits.array if logits.array is not None else logits.numpy()
        return choose(rows[np.arange(rows.shape[0]), last], self._sampling, self._rng)

    def _budget(self, prompt_len: int) -> tuple[int, str]:
        context = self._gen.spec.context_length
        if context is not None and context - prompt_len < self._max_new:
            return context - prompt_len, "context"
        return self._max_new, "length"

    def _emit(self, rows: list[int], alive: list[int], new: np.ndarray, budget: list[tuple[int, str]]) -> Tokens:
        out: Tokens = [None] * len(self._prompts)
        for b in alive:
            r, token = rows[b], int(new[b])
            out[r] = token
            self.tokens[r].append(token)
            if token in self._stops:
                self.finish_reasons[r] = "stop"
            elif len(self.tokens[r]) >= budget[b][0]:
                self.finish_reasons[r] = budget[b][1]
        return out


def _pad(prompts: list[list[int]], spec: DecoderSpec) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Input ids and attention mask of the prompts padded to one length, and the row of each one's last token."""
    lens = np.array([len(p) for p in prompts])
    width = int(lens.max())
    ids = np.full((len(prompts), width), spec.pad_id, np.int64)
    mask = np.zeros((len(prompts), width), np.int64)
    for b, p in enumerate(prompts):
        cols = slice(0, len(p)) if spec.padding == "right" else slice(width - len(p), width)
        ids[b, cols], mask[b, cols] = p, 1
    return ids, mask, lens - 1 if spec.padding == "right" else np.full(len(prompts), width - 1)


def _ids(values: Sequence[int], what: str) -> list[int]:
    try:
        ids = [int(v) for v in values]
        if any(i != v for i, v in zip(ids, values, strict=True)):
            raise ValueError
    except (TypeError, ValueError):
        raise GenerationError(f"{what} must be a list of whole numbers, got {values!r}"[:200]) from None
    if any(i < 0 for i in ids):
        raise GenerationError(f"{what}: token ids must be >= 0, got {min(ids)}")
    return ids


def _peak_rss() -> int:
    """The process's peak resident set in bytes (0 where the platform does not say)."""
    try:
        import resource
    except ImportError:  # Windows
        return 0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, KiB on Linux
