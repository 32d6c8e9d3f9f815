"""`Generator`: a decoder's token loop over `InferenceSession`'s public API (get_inputs/get_outputs, io_binding).

Every dim is ranged before the first run (one range program for the whole generation); prompts run in chunks of
the prompt window. A builder model with genai_config's past_present_share_buffer keeps its KV cache in one Tensor
per past input, the context's length, bound as that past and as its present (written in place, only the new
rows); other models bind each step's present tensors as the next step's pasts (session tensors: not copied
between steps). Only the logits rows sampled from are read (docs/generate.md)."""

from __future__ import annotations

import os
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ctxrt.errors import CtxrtWarning, GenerationError
from ctxrt.generation.sampling import Sampling, choose
from ctxrt.generation.spec import DecoderSpec, describe, locate, mask_only_counts
from ctxrt.runtime.session import InferenceSession, IOBinding
from ctxrt.runtime.tensor import Tensor

Tokens = list[int | None]  # per prompt, the token it made at a step (None: none)
# The most prompt tokens one run takes: longer prompts run in chunks of this many (the arena is planned for it)
PROMPT_WINDOW = 128
# The past's range when the model does not say its context length (a longer past widens it: one compile more)
UNKNOWN_CONTEXT = 512


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
    what genai_config.json (or a Hugging Face config.json beside an export) says; `prompt_window`: the most prompt
    tokens one run takes (longer prompts run in chunks; the arena is planned for it). docs/generate.md."""

    def __init__(self, model: str | os.PathLike, backend: str = "cpu", *, sess_options: Any = None,
                 context_length: int | None = None, prompt_window: int = PROMPT_WINDOW) -> None:
        for name, value in (("context_length", context_length), ("prompt_window", prompt_window)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise GenerationError(f"{name} must be a whole number >= 1, got {value!r}")
        self.prompt_window = prompt_window
        self.files = locate(model)
        # the past only grows: an exact-shape variant (or a range program outgrown) is not run again
        self.session = InferenceSession(self.files.model, backend, sess_options=sess_options, max_shape_variants=2)
        self._batch_dim: str | None = None
        self._kv: tuple[int, dict[str, Tensor]] | None = None  # the shared KV buffer: (batch, past -> tensor)
        # a torch export's KV cache appended in place (None: not known before the first run; then True or False)
        self._append: bool | None = None
        self._rows_wanted = 0  # the rows of KV cache the running generation will fill (prompt and new tokens)
        self._made: dict[tuple[str, int], Tensor] = {}  # the cache's windows by (past input, rows), reused
        try:
            self.spec: DecoderSpec = describe(self.files, self.session.get_inputs(), self.session.get_outputs(),
                                              context_length)
        except BaseException:
            self.session.close()
            raise
        if self.spec.share_buffer:  # an ONNX model compiles its presents as its pasts' buffers; a .ctx as it was
            if self.session._compiler is not None:
                self.session.kv_shared = [s.past for s in self.spec.kv]
            elif not _presents_are_pasts(self.spec, self.session):
                self.spec = replace(self.spec, share_buffer=False)
        # tokens fed a mask of the context's length: every token step runs at the same shapes (spec.mask_only_counts)
        self._static_mask = self.spec.share_buffer and self.spec.attention_mask is not None and \
            self.spec.position_ids is None and mask_only_counts(self.files, self.spec.attention_mask)
        self._range_the_past()
        self._outputs = [o.name for o in self.session.get_outputs()]
        self._logits_at = self._outputs.index(self.spec.logits)
        self._presents_at = [self._outputs.index(s.present) for s in self.spec.kv]
        self._tokenizer: Any = None

    def _range_the_past(self) -> None:
        """One range program for the whole generation, compiled at the prompt (`generation_ranges`); the batch
        is set at the first prompt; the session widens what the feeds outgrow."""
        shapes = {i.name: i.shape for i in self.session.get_inputs()}
        ranges, self._batch_dim = generation_ranges(self.spec, shapes, self.prompt_window)
        self.session.dim_ranges = {**ranges, **self.session.dim_ranges}

    def _cover_batch(self, batch: int) -> None:
        """Before the first run: the batch range is the first batch's (generation_ranges; a larger one later
        widens it)."""
        if self._batch_dim is not None and self.session.stats["shape_variants_compiled"] == 0:
            ranges = self.session.dim_ranges
            lo, hi = ranges.get(self._batch_dim, (1, 1))
            self.session.dim_ranges = {**ranges, self._batch_dim: (min(lo, batch), max(hi, _batch_max(batch)))}

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

    def _cache(self, batch: int, rows: int = 0) -> dict[str, Tensor]:
        """The KV cache: one tensor per past input, the context's length for a shared buffer, else the rows the
        generation needs within it (doubled when `rows` outgrow it, what it holds kept), made once per batch
        size. A shared-buffer model binds it as that past input and as its present output at every step
        (GroupQueryAttention writes only the new rows); a torch export binds windows of it (`_windows`)."""
        length = self.spec.context_length or UNKNOWN_CONTEXT
        if not self.spec.share_buffer:  # windows: what this generation needs, within the context
            length = min(length, max(rows, self._rows_wanted)) if self.spec.context_length else \
                max(rows, self._rows_wanted)
        old = self._kv
        if old is not None and old[0] == batch:
            length = next(iter(old[1].values())).shape[self.spec.kv[0].seq_axis]
            if rows <= length:
                return old[1]
            length = max(2 * length, rows)
        made = {}
        for slot in self.spec.kv:
            shape = [length if a == slot.seq_axis else batch if a == slot.batch_axis else d
                     for a, d in enumerate(slot.shape)]
            made[slot.past] = Tensor.from_numpy(np.zeros(shape, slot.dtype), self.session)
            if old is not None and old[0] == batch:  # outgrown: what it holds carried over
                kept = old[1][slot.past].shape[slot.seq_axis]
                made[slot.past].array[(slice(None),) * slot.seq_axis + (slice(0, kept),)] = old[1][slot.past].array
        if old is not None:
            for t in old[1].values():
                t.destroy()
        self._kv = (batch, made)
        return made

    def _appends(self) -> bool:
        """After the first run: whether a torch export's presents append to their pasts in place, each pair bound
        as windows of one cache tensor of the context's length (InferenceSession.kv_appends: a Concat makes each
        present, and only launch makers read them)."""
        if self._append is None:
            pairs = self.session.kv_appends()
            self._append = not self.spec.share_buffer and bool(self.spec.kv) and \
                all(pairs.get(s.past) == s.present for s in self.spec.kv)
        return self._append

    def _windows(self, batch: int, past: int, new: int) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        """The pasts (the cache's first `past` rows) and presents (`past + new` rows) of an in-place KV cache.
        A step's present windows are the next step's pasts, the same tensors (one handle registered a token, not
        two); those shorter than this past are let go."""
        cache = self._cache(batch, past + new)
        for key in [k for k, w in self._made.items() if k[1] < past or w.destroyed]:
            self._made.pop(key).destroy()

        def window(slot: Any, rows: int) -> Tensor:
            w = self._made.get((slot.past, rows))
            if w is None or w.owner is not cache[slot.past]:
                w = self._made[(slot.past, rows)] = cache[slot.past].window(slot.seq_axis, rows)
            return w
        return ({s.past: window(s, past) for s in self.spec.kv},
                {s.present: window(s, past + new) for s in self.spec.kv})

    def _drop_windows(self) -> None:
        for w in self._made.values():
            w.destroy()
        self._made.clear()

    def _run(self, feeds: dict[str, np.ndarray | Tensor], presents: Mapping[str, Tensor] | None = None
             ) -> IOBinding:
        binding = self.session.io_binding()
        for name, value in feeds.items():
            binding.bind_input(name, value)
        shared = {s.present: feeds[s.past] for s in self.spec.kv} if self.spec.share_buffer else dict(presents or {})
        for name in self._outputs:
            # session tensors (presents become the next step's pasts in place), or the shared KV buffer
            binding.bind_output(name, shared.get(name))
        with warnings.catch_warnings():  # its advice (bind one input shape) does not apply to a growing cache
            warnings.filterwarnings("ignore", "InferenceSession compiled", CtxrtWarning)
            self.session.run_with_iobinding(binding)
        return binding

    def _rerun(self, binding: IOBinding, feeds: dict[str, np.ndarray]) -> None:
        """Run `binding` again with these inputs bound anew (the rest as they were)."""
        for name, value in feeds.items():
            binding.bind_input(name, value)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "InferenceSession compiled", CtxrtWarning)
            self.session.run_with_iobinding(binding)

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
        alive = list(range(len(rows)))
        self._gen._cover_batch(len(rows))
        self._gen._rows_wanted = ids.shape[1] + self._max_new
        tic = time.perf_counter()
        binding, new = self._prompt(ids, mask, last)
        self._times["prompt"] += time.perf_counter() - tic
        if not self._times["first"]:
            self._times["first"] = time.perf_counter() - start
        running, first_row = np.ones(len(rows), bool), np.zeros(len(rows), np.int64)
        one = np.ones((len(rows), 1), np.int64)
        fed, counts = None, None
        windows = self._gen._windows(len(rows), mask.shape[1], 1) if self._gen._append else ({}, {})
        if self._gen._static_mask:  # zeros after the tokens so far: the same shapes at every token
            fed = np.zeros((len(rows), spec.context_length), spec.dtypes[spec.attention_mask])
            fed[:, :mask.shape[1]] = mask
            counts = mask.sum(axis=1)  # each row's tokens: its next one is marked at that column
        while True:
            yield self._emit(rows, alive, new, budget)
            alive = [b for b in alive if not self.finish_reasons[rows[b]]]
            if not alive:
                break
            tic = time.perf_counter()
            running[:] = False
            running[alive] = True
            ids = np.where(running, new, spec.pad_id)[:, None]  # a prompt that stopped is fed padding
            if fed is not None:  # only the rows still generating advance: a row that filled the context stops
                fed[alive, counts[alive]] = 1
                counts[alive] += 1
                # the same binding: its pasts and presents are the shared KV buffers; only ids and mask change
                self._gen._rerun(binding, self._inputs(ids, fed))
            elif self._gen._append:  # the cache's windows: the Concats write only the new rows
                mask = np.concatenate([mask, one], axis=1)
                previous = binding
                binding = self._gen._run({**self._inputs(ids, mask), **windows[0]}, windows[1])
                del previous
                windows = self._gen._windows(len(rows), mask.shape[1], 1)
            else:
                mask = np.concatenate([mask, one], axis=1)
                past = dict(zip((s.past for s in spec.kv), self._gen._presents(binding), strict=True))
                previous, binding = binding, self._gen._run({**self._inputs(ids, mask), **past})
                del previous  # its tensors go back to the session's cache only now: they were this run's pasts
            new = self._choose(binding, first_row)
            self._times["decode"] += time.perf_counter() - tic
            self._decoded += len(alive)
        held = self._gen._kv[1].values() if self._gen._append and self._gen._kv else self._gen._presents(binding)
        self._kv_bytes = max(self._kv_bytes, sum(t.nbytes for t in held))
        self._gen._drop_windows()

    def _prompt(self, ids: np.ndarray, mask: np.ndarray, last: np.ndarray) -> tuple[IOBinding, np.ndarray]:
        """Run the prompts, in chunks of the prompt window where the model allows it (a right-padded batch of
        prompts of different lengths runs whole: its attention takes several new tokens only for batch 1), and
        choose each prompt's first token from the logits of its last token's chunk."""
        spec, window, width = self._gen.spec, self._gen.prompt_window, ids.shape[1]
        if spec.padding == "right" and len(ids) > 1 and not mask.all():
            window = width
        binding: IOBinding | None = None
        past = self._gen._cache(len(ids)) if spec.share_buffer else {slot.past: slot.empty(len(ids))
                                                                      for slot in spec.kv}
        rows: np.ndarray | None = None
        for start in range(0, width, window):
            end = min(width, start + window)
            presents: dict[str, Tensor] = {}
            if start and self._gen._append:  # the cache's windows (the first chunk's presents copied in once)
                past, presents = self._gen._windows(len(ids), start, end - start)
            previous, binding = binding, self._gen._run({**self._inputs(ids[:, start:end], mask[:, :end]), **past},
                                                        presents)
            if not start and self._gen._appends():
                cache = self._gen._cache(len(ids), end)
                for slot, t in zip(spec.kv, self._gen._presents(binding), strict=True):
                    cache[slot.past].array[(slice(None),) * slot.seq_axis + (slice(0, end),)] = t.array
            del previous  # its presents were this run's pasts
            here = np.flatnonzero((last >= start) & (last < end))
            if len(here):
                logits = self._gen._logits(binding)
                got = logits.array if logits.array is not None else logits.numpy()
                rows = np.empty((len(ids), got.shape[-1]), got.dtype) if rows is None else rows
                rows[here] = got[here, last[here] - start]
            if not self._gen._append:
                past = dict(zip((s.past for s in spec.kv), self._gen._presents(binding), strict=True))
        assert binding is not None and rows is not None
        return binding, choose(rows, self._sampling, self._rng)

    def _inputs(self, ids: np.ndarray, mask: np.ndarray) -> dict[str, np.ndarray]:
        spec = self._gen.spec
        feeds = {spec.input_ids: ids.astype(spec.dtypes[spec.input_ids])}
        if spec.attention_mask:
            feeds[spec.attention_mask] = mask.astype(spec.dtypes[spec.attention_mask], copy=False)
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


def _presents_are_pasts(spec: DecoderSpec, session: InferenceSession) -> bool:
    """Whether a context binary was compiled with shared KV buffers (`ctxrt compile --generate`): each present
    output of its past input's shape."""
    ins = {i.name: i.shape for i in session.get_inputs()}
    outs = {o.name: o.shape for o in session.get_outputs()}
    return all(outs.get(s.present) == ins.get(s.past) for s in spec.kv)


def generation_ranges(spec: DecoderSpec, shapes: Mapping[str, Sequence[int | str | None]], window: int,
                      batch: int | None = None) -> tuple[dict[str, Any], str | None]:
    """(the ranges of one program for a whole generation, the batch dim's name): the past from 0 to the context
    length (the context's length itself for a shared KV buffer), the new tokens from 1 to the prompt window, a
    mask's length as past + sequence (1 to the context with a shared buffer), the batch 1..`batch` when given (at
    least 1..4 for a batch of several: narrower ranges are fitted from programs at batches that some ops compile
    differently, in-place broadcasts; measured on a GPT-2 export, 1..2 and 1..3 refused), and the cache's other
    symbolic axes (a builder model's `kv_cache_dim`) fixed from the config (docs/generate.md)."""
    if not spec.kv:
        return {}, None
    past = shapes[spec.kv[0].past][spec.kv[0].seq_axis]
    if not isinstance(past, str):
        return {}, None
    context = spec.context_length or UNKNOWN_CONTEXT
    ranges: dict[str, Any] = {past: (context, context) if spec.share_buffer else (0, context)}
    ids = list(shapes[spec.input_ids])
    seq = ids[1] if len(ids) > 1 else None
    if isinstance(seq, str) and seq.isidentifier():
        ranges[seq] = (1, min(window, context))
    mask_shape = shapes[spec.attention_mask] if spec.attention_mask else []
    mask = mask_shape[1] if len(mask_shape) > 1 else None
    if isinstance(mask, str) and isinstance(seq, str) and mask not in (past, seq) and mask.isidentifier():
        ranges[mask] = (1, context) if spec.share_buffer else f"{past} + {seq}"
    for slot in spec.kv:
        for axis, d in enumerate(shapes[slot.past]):
            fixed = slot.shape[axis]
            if isinstance(d, str) and d.isidentifier() and d not in ranges and isinstance(fixed, int):
                ranges[d] = (fixed, fixed)
    batch_dim = ids[0] if ids and isinstance(ids[0], str) and ids[0].isidentifier() else None
    if batch_dim is not None and batch is not None:
        ranges[batch_dim] = (1, _batch_max(batch))
    return ranges, batch_dim


def _batch_max(batch: int) -> int:
    """The batch range's upper bound for batches of up to `batch` prompts (generation_ranges)."""
    return max(batch, 4 if batch > 1 else 1)


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
