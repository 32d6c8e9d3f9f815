"""Every error ctxrt raises on purpose derives from CtxrtError."""


class CtxrtError(Exception):
    """Base class: a user-facing error with a one-line message."""


class ModelError(CtxrtError):
    """The ONNX model cannot be read or is malformed."""


class ShapeError(CtxrtError):
    """A shape or dtype does not match what the graph expects, or cannot be made static."""


class ValueInputError(ShapeError):
    """Graph inputs decide shapes (value inputs, docs/shapes-and-control-flow.md) and no value was given for them."""

    def __init__(self, message: str, names: list[str] | None = None) -> None:
        super().__init__(message)
        self.names = names or []


class InvalidInputError(CtxrtError, ValueError):
    """A value a run computes with is outside what its op accepts (a Gather index past its table, a
    ReverseSequence length past its steps), as onnxruntime refuses it: the run stops there."""


class UnsupportedOpError(CtxrtError):
    """The model uses operators (or attributes) that ctxrt does not implement."""


class PlanError(CtxrtError):
    """The memory plan cannot be built or is inconsistent."""


class FormatError(CtxrtError):
    """A context binary is malformed, truncated or of an unknown version."""


class RegistrationError(CtxrtError):
    """Misuse of shared buffers, memory handles, or registered weights / spill-fill buffers."""


class LifecycleError(CtxrtError):
    """A context or graph is used in the wrong state (before finalize, after free, ...)."""


class GenerationError(CtxrtError):
    """A generation request the model cannot serve: a prompt longer than its context, token ids outside its
    vocabulary, bad sampling settings, a model path that names no model."""


class ConfigError(CtxrtError):
    """The compile configuration (tuning JSON or its keyword arguments) is invalid, or its performance cache
    directory cannot be used."""


class ServerError(CtxrtError):
    """The target server (`ctxrt serve`) could not be reached or answered a request with an error; `code` says
    which (e.g. "bad_token", "job_timeout", "device_error")."""

    def __init__(self, message: str, code: str = "error") -> None:
        super().__init__(message)
        self.code = code


class CtxrtWarning(UserWarning):
    """Something the user should know that is not an error (e.g. a dynamic dim bound to 1 by default, programs
    rebuilt for another device). `ctxrt` prints each as one line on stderr once the command succeeded."""
