"""ctxrt: ahead-of-time compiled ONNX inference with planned memory."""

__version__ = "0.1.0"
