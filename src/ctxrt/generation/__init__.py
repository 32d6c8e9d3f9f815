"""Token generation with decoders (docs/generate.md)."""

from ctxrt.generation.generator import Generation, GenerationResult, Generator
from ctxrt.generation.sampling import Sampling

__all__ = ["Generation", "GenerationResult", "Generator", "Sampling"]
