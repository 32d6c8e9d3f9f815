"""The activation functions of LSTM, GRU and RNN (their `activations` attribute), applied into preallocated views.

Each is `f(x, out, tmp)`: out may be x; tmp is a scratch view of x's shape for the functions that need one.
Names are matched without regard to case and alpha/beta are consumed in order by the functions that take them,
with onnxruntime's defaults (LeakyRelu 0.01, HardSigmoid 0.2/0.5, Elu 1.0, else 0), as onnxruntime does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ctxrt.backends.kernel import NodeSpec
from ctxrt.errors import UnsupportedOpError

Act = Callable[[np.ndarray, np.ndarray, np.ndarray], None]


def _sigmoid(x: np.ndarray, out: np.ndarray, _t: np.ndarray) -> None:
    # 1/2 + tanh(x/2)/2: no overflow (exp(-x) overflows for x < -88 in float32), four passes like 1/(1+exp(-x))
    np.multiply(x, 0.5, out=out)
    np.tanh(out, out=out)
    np.multiply(out, 0.5, out=out)
    np.add(out, 0.5, out=out)


def _tanh(x: np.ndarray, out: np.ndarray, _t: np.ndarray) -> None:
    np.tanh(x, out=out)


def _relu(x: np.ndarray, out: np.ndarray, _t: np.ndarray) -> None:
    np.maximum(x, 0, out=out)


def _softsign(x: np.ndarray, out: np.ndarray, t: np.ndarray) -> None:
    np.abs(x, out=t)
    np.add(t, 1, out=t)
    np.divide(x, t, out=out)


def _softplus(x: np.ndarray, out: np.ndarray, _t: np.ndarray) -> None:
    np.logaddexp(x, 0, out=out)  # log(1 + e^x) without overflow


def _affine(alpha: float, beta: float) -> Act:
    def f(x: np.ndarray, out: np.ndarray, _t: np.ndarray) -> None:
        np.multiply(x, alpha, out=out)
        np.add(out, beta, out=out)
    return f


def _leaky_relu(alpha: float, _beta: float) -> Act:
    def f(x: np.ndarray, out: np.ndarray, t: np.ndarray) -> None:
        np.multiply(x, alpha, out=t)
        (np.maximum if alpha <= 1 else np.minimum)(x, t, out=out)  # x >= 0 ? x : alpha x
    return f


def _thresholded_relu(alpha: float, _beta: float) -> Act:
    def f(x: np.ndarray, out: np.ndarray, t: np.ndarray) -> None:
        below = t.view(np.uint8)[..., :x.shape[-1]].view(np.bool_)  # x > alpha ? x : 0
        np.less_equal(x, alpha, out=below)
        if out is not x:
            np.copyto(out, x)
        np.copyto(out, 0, where=below)
    return f


def _scaled_tanh(alpha: float, beta: float) -> Act:
    def f(x: np.ndarray, out: np.ndarray, _t: np.ndarray) -> None:
        np.multiply(x, beta, out=out)
        np.tanh(out, out=out)
        np.multiply(out, alpha, out=out)
    return f


def _hard_sigmoid(alpha: float, beta: float) -> Act:
    def f(x: np.ndarray, out: np.ndarray, _t: np.ndarray) -> None:
        np.multiply(x, alpha, out=out)
        np.add(out, beta, out=out)
        np.clip(out, 0, 1, out=out)
    return f


def _elu(alpha: float, _beta: float) -> Act:
    def f(x: np.ndarray, out: np.ndarray, t: np.ndarray) -> None:
        np.minimum(x, 0, out=t)  # x >= 0 ? x : alpha (e^x - 1)
        np.expm1(t, out=t)
        np.multiply(t, alpha, out=t)
        np.maximum(x, 0, out=out)
        np.add(out, t, out=out)
    return f


# lower-case name -> (takes alpha, takes beta, default alpha, default beta, factory)
_PARAMETRIC: dict[str, tuple[bool, bool, float, float, Callable[[float, float], Act]]] = {
    "affine": (True, True, 0.0, 0.0, _affine), "leakyrelu": (True, False, 0.01, 0.0, _leaky_relu),
    "thresholdedrelu": (True, False, 0.0, 0.0, _thresholded_relu),
    "scaledtanh": (True, True, 0.0, 0.0, _scaled_tanh), "hardsigmoid": (True, True, 0.2, 0.5, _hard_sigmoid),
    "elu": (True, False, 1.0, 0.0, _elu),
}
_PLAIN: dict[str, Act] = {"sigmoid": _sigmoid, "tanh": _tanh, "relu": _relu, "softsign": _softsign,
                          "softplus": _softplus}


@dataclass(frozen=True)
class Activation:
    """One activation with its parameters; equal activations let directions share one pass over their gates."""

    name: str
    alpha: float = 0.0
    beta: float = 0.0

    def fn(self, dtype: np.dtype) -> Act:
        if self.name in _PLAIN:
            return _PLAIN[self.name]
        return _PARAMETRIC[self.name][4](dtype.type(self.alpha), dtype.type(self.beta))


def activations(spec: NodeSpec, defaults: tuple[str, ...], directions: int) -> list[tuple[Activation, ...]]:
    """Per direction, the node's activations (`defaults` per direction when the attribute is absent)."""
    names = [str(n) for n in spec.attr("activations") or defaults * directions]
    if len(names) != len(defaults) * directions:
        raise UnsupportedOpError(f"{spec.op} node {spec.name!r}: attribute 'activations' has {len(names)} names, "
                                 f"expected {len(defaults)} per direction ({len(defaults) * directions})")
    alphas = list(spec.attr("activation_alpha") or [])
    betas = list(spec.attr("activation_beta") or [])
    acts = []
    for name in names:
        key = name.lower()
        if key in _PLAIN:
            acts.append(Activation(key))
            continue
        if key not in _PARAMETRIC:
            raise UnsupportedOpError(f"{spec.op} node {spec.name!r}: attribute 'activations' value {name!r} is not "
                                     f"one of {sorted(_PLAIN) + sorted(_PARAMETRIC)}")
        takes_a, takes_b, da, db, _ = _PARAMETRIC[key]
        a = float(alphas.pop(0)) if takes_a and alphas else da
        b = float(betas.pop(0)) if takes_b and betas else db
        acts.append(Activation(key, a, b))
    k = len(defaults)
    return [tuple(acts[d * k:(d + 1) * k]) for d in range(directions)]
