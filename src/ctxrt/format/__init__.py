"""Context binaries: write compiled graphs and their weights to one file, read them back safely.

The layout is described in docs/format.md.
"""

from ctxrt.format.layout import FORMAT_VERSION, KERNELS, META, PROGRAMS, WEIGHTS, Section
from ctxrt.format.reader import ContextFile, Head, read_head, read_metadata
from ctxrt.format.writer import ContextWriter, context_bytes, write_context

__all__ = ["FORMAT_VERSION", "META", "PROGRAMS", "WEIGHTS", "KERNELS", "Section", "ContextFile", "Head",
           "read_head", "read_metadata", "ContextWriter", "context_bytes", "write_context"]
