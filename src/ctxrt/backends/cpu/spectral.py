"""Fourier transforms: DFT (opsets 17, 20) and STFT (17), on NumPy's pocketfft in the input's precision (complex64
for float32, as onnx.reference computes them with NumPy 2).

Signals are real ([..., 1]) or complex ([..., 2], real and imaginary parts interleaved in the last axis), and so
are the results. `dft_length`, DFT-20's `axis` and STFT's `frame_step` and `frame_length` decide the output's
shape: compile-time inputs (ir/canonical.py PARAM_INPUTS); STFT's window is read at each run.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ctxrt.backends.cpu.elementwise import BoundKernel
from ctxrt.backends.kernel import Kernel, Launch, NodeSpec
from ctxrt.errors import UnsupportedOpError


def _fail(spec: NodeSpec, what: str) -> UnsupportedOpError:
    return UnsupportedOpError(f"{spec.op} node {spec.name!r}: {what} is not supported")


def _scalar(spec: NodeSpec, key: str) -> int | None:
    value = spec.attr(key)
    if value is None:
        return None
    value = np.asarray(value).reshape(-1)
    if value.size != 1:
        raise _fail(spec, f"{key} {value.tolist()} (not one value)")
    return int(value[0])


def _complex(x: np.ndarray) -> np.ndarray:
    """[..., 1] or [..., 2] -> the signal without its last axis: real, or complex of the input's precision."""
    if x.shape[-1] == 1:
        return x[..., 0]
    z = np.empty(x.shape[:-1], np.result_type(x.dtype, np.complex64))
    z.real, z.imag = x[..., 0], x[..., 1]
    return z


def _store(y: np.ndarray, z: np.ndarray) -> None:
    np.copyto(y[..., 0], z.real, casting="unsafe")
    if y.shape[-1] == 2:
        np.copyto(y[..., 1], z.imag, casting="unsafe")


def dft(spec: NodeSpec) -> Kernel:
    """Along `axis` (opset 17: an attribute, default 1; opset 20: an input, default -2), of `dft_length` points
    (the signal zero-padded or cut; by default its length, or 2 (length - 1) for an inverse one-sided one).
    Forward: the full spectrum, or its first length // 2 + 1 bins with `onesided` (real signals only). Inverse:
    NumPy's ifft (1/n scaled); with `onesided` the input is a one-sided spectrum and the output a real signal of
    dft_length points ([..., 1], as onnx.reference and onnxruntime)."""
    x_spec, out = spec.inputs[0], spec.outputs[0]
    shape, dt = tuple(x_spec.shape), np.dtype(out.dtype)
    rank = len(shape)
    if dt.kind != "f" or rank < 2 or shape[-1] not in (1, 2):
        raise _fail(spec, f"an input of shape {list(shape)} and type {x_spec.dtype}")
    axis = _scalar(spec, "axis")
    axis = (1 if spec.opset < 20 else -2) if axis is None else axis
    if not -rank <= axis < rank or axis % rank == rank - 1:
        raise _fail(spec, f"axis {axis} for an input of rank {rank}")
    axis %= rank
    inverse, onesided = bool(spec.attr("inverse", 0)), bool(spec.attr("onesided", 0))
    n = _scalar(spec, "dft_length")
    if n is None:
        n = 2 * (shape[axis] - 1) if inverse and onesided else shape[axis]
    if n < 1:
        raise _fail(spec, f"dft_length {n}")
    if onesided and not inverse and shape[-1] == 2:
        raise _fail(spec, "a one-sided transform of a complex signal (no conjugate symmetry; the spec excludes it)")
    if inverse and onesided:
        want = (*shape[:axis], n, *shape[axis + 1:-1], 1)
    else:
        want = (*shape[:axis], n // 2 + 1 if onesided else n, *shape[axis + 1:-1], 2)
    if tuple(out.shape) != want:
        raise _fail(spec, f"an output of shape {list(out.shape)} (expected {list(want)})")
    bins = want[axis]

    def make(ins: list[Any], outs: list[Any], _s: list[Any]) -> Launch:
        x, y = ins[0], outs[0]

        def run() -> None:
            if y.size == 0:
                return
            z = _complex(x)
            if not inverse:
                z = np.fft.fft(z, n=n, axis=axis)
                if onesided:
                    z = np.take(z, np.arange(bins), axis=axis)
            elif onesided:
                z = np.fft.irfft(z, n=n, axis=axis)
            else:
                z = np.fft.ifft(z, n=n, axis=axis)
            _store(y, z)
        return run
    return BoundKernel(make)


def stft(spec: NodeSpec) -> Kernel:
    """signal [batch, length, 1 or 2] -> [batch, frames, bins, 2]: frames of frame_length samples every frame_step
    (1 + (length - frame_length) // frame_step of them), each multiplied by the window (ones when absent) and
    transformed; `onesided` keeps frame_length // 2 + 1 bins. frame_length defaults to the window's length; a window
of another length than frame_length is refused."""
    x_spec, out = spec.inputs[0], spec.outputs[0]
    shape, dt = tuple(x_spec.shape), np.dtype(out.dtype)
    if dt.kind != "f" or len(shape) != 3 or shape[-1] not in (1, 2):
        raise _fail(spec, f"a signal of shape {list(shape)} and type {x_spec.dtype}")
    step, length = _scalar(spec, "frame_step"), _scalar(spec, "frame_length")
    window = spec.inputs[2] if len(spec.inputs) > 2 else None
    if window is not None and len(window.shape) != 1:
        raise _fail(spec, f"a window of shape {list(window.shape)}")
    if length is None:  # the window's length, else the whole signal (onnx.reference)
        length = window.shape[0] if window is not None else shape[1]
    if window is not None and window.shape[0] != length:
        raise _fail(spec, f"a window of {window.shape[0]} samples for frames of {length}")
    if step is None or step < 1 or length < 1 or length > shape[1]:
        raise _fail(spec, f"frame_step {step} and frame_length {length} on a signal of {shape[1]} samples")
    onesided = bool(spec.attr("onesided", 1))  # STFT's default is one-sided
    frames = 1 + (shape[1] - length) // step
    bins = length // 2 + 1 if onesided else length
    if tuple(out.shape) != (shape[0], frames, bins, 2):
        raise _fail(spec, f"an output of shape {list(out.shape)} (expected {[shape[0], frames, bins, 2]})")
    at = np.arange(frames)[:, None] * step + np.arange(length)  # [frames, frame_length] sample indices

    def make(ins: list[Any], outs: list[Any], _s: list[Any]) -> Launch:
        x, y = ins[0], outs[0]
        w = ins[2] if window is not None else None

        def run() -> None:
            if y.size == 0:
                return
            z = _complex(x)[:, at]
            if w is not None:
                z = z * w
            z = np.fft.fft(z, axis=-1)
            _store(y, z[..., :bins])
        return run
    return BoundKernel(make)


KERNELS = {"DFT": dft, "STFT": stft}
