"""Text in and out through the model's tokenizer.json (the `tokenizers` package)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ctxrt.errors import GenerationError, ModelError
from ctxrt.generation.spec import TOKENIZER


def load_tokenizer(path: Path | None, model: Path) -> Any:
    if path is None:
        raise GenerationError(f"{model}: no {TOKENIZER} beside the model, so text cannot be tokenized (give token "
                              "ids instead)")
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise GenerationError("text prompts need the tokenizers package: pip install tokenizers") from None
    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:  # the Rust library raises plain Exceptions
        raise ModelError(f"{path}: not a tokenizer ({' '.join(str(e).split())[:200]})") from None
