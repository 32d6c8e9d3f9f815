"""ctxrt: ahead-of-time compiled ONNX inference with planned memory."""

__version__ = "0.1.0"

from ctxrt.compiler import compile  # noqa: E402
from ctxrt.errors import (  # noqa: E402
    CtxrtError,
    FormatError,
    GenerationError,
    InvalidInputError,
    LifecycleError,
    ModelError,
    PlanError,
    RegistrationError,
    ShapeError,
    UnsupportedOpError,
)
from ctxrt.format import read_metadata  # noqa: E402
from ctxrt.generation import GenerationResult, Generator, Sampling  # noqa: E402
from ctxrt.runtime.context import Context  # noqa: E402
from ctxrt.runtime.graph import Graph  # noqa: E402
from ctxrt.runtime.group import ContextGroup  # noqa: E402
from ctxrt.runtime.loader import context_from_binary  # noqa: E402
from ctxrt.runtime.memhandle import MemHandle  # noqa: E402
from ctxrt.runtime.options import SessionOptions  # noqa: E402
from ctxrt.runtime.session import InferenceSession, IOBinding  # noqa: E402
from ctxrt.runtime.tensor import Tensor  # noqa: E402

__all__ = ["compile", "context_from_binary", "read_metadata", "Context", "ContextGroup", "Graph", "MemHandle",
           "InferenceSession", "IOBinding", "SessionOptions", "Tensor",
           "Generator", "GenerationResult", "Sampling",
           "CtxrtError", "FormatError", "GenerationError", "InvalidInputError",
           "LifecycleError", "ModelError",
           "PlanError", "RegistrationError", "ShapeError", "UnsupportedOpError", "__version__"]
