"""Choosing the next token from a step's logits: greedy, or sampled with temperature, top-k and top-p from a
seeded NumPy Generator (the same seed gives the same tokens)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ctxrt.errors import GenerationError


@dataclass(frozen=True)
class Sampling:
    """`temperature` 0 is greedy (the first largest logit). Otherwise a token is drawn from softmax(logits /
    temperature) restricted to the `top_k` most likely tokens (0: all) and then to the fewest most likely ones
    whose probabilities reach `top_p`; `seed` seeds numpy.random.default_rng (None: fresh entropy)."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if not (isinstance(self.temperature, int | float) and math.isfinite(self.temperature)
                and self.temperature >= 0):
            raise GenerationError(f"temperature must be a number >= 0 (0: greedy), got {self.temperature!r}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise GenerationError(f"top_k must be a whole number >= 0 (0: every token), got {self.top_k!r}")
        if not (isinstance(self.top_p, int | float) and 0 < self.top_p <= 1):
            raise GenerationError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0):
            raise GenerationError(f"seed must be a whole number >= 0, got {self.seed!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def rng(self) -> np.random.Generator:
        return np.random.default_rng(self.seed)


def choose(logits: np.ndarray, sampling: Sampling, rng: np.random.Generator) -> np.ndarray:
    """One token id per row of `logits` (rows, vocab); rows are drawn in order, one uniform number each."""
    if sampling.greedy:
        return np.argmax(logits, axis=-1)
    return np.array([_draw(row, sampling, rng) for row in logits], np.int64)


def _draw(logits: np.ndarray, s: Sampling, rng: np.random.Generator) -> int:
    x = logits.astype(np.float64) / s.temperature
    if 0 < s.top_k < x.size:
        keep = np.argpartition(-x, s.top_k - 1)[:s.top_k]
        kept = np.full_like(x, -np.inf)
        kept[keep] = x[keep]
        x = kept
    p = np.exp(x - x.max())
    if s.top_p < 1:
        order = np.argsort(-p, kind="stable")
        ranked = p[order] / p.sum()
        drop = np.cumsum(ranked) - ranked >= s.top_p  # the tokens ranked after the top_p mass is reached
        p[order[drop]] = 0
    cdf = np.cumsum(p)
    if not np.isfinite(cdf[-1]) or cdf[-1] <= 0:
        raise GenerationError("the model's logits are not finite numbers: nothing to sample from")
    return int(min(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"), x.size - 1))
