"""Softmax and LogSoftmax along any axis, the ReduceX family over any axes, ArgMax and ArgMin: row kernels of
kernels/rows.cl (geometry, space and launch in rows.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ctxrt.backends.cpu.reduce import _axis, _reduce_axes
from ctxrt.backends.kernel import Launch, NodeSpec
from ctxrt.backends.opencl.kernel import Space
from ctxrt.backends.opencl.rows import RowKernel
from ctxrt.errors import UnsupportedOpError


def _decline(spec: NodeSpec, what: str) -> UnsupportedOpError:
    return UnsupportedOpError(f"{spec.op} node {spec.name!r}: no OpenCL kernel for {what}")


class Softmax(RowKernel):
    """Softmax / LogSoftmax: opset >= 13 along `axis` (default -1); before 13 over the input coerced to 2-D at
    `axis` (default 1), i.e. every dim from `axis` on. Correct in place."""

    entry = "softmax"

    def __init__(self, spec: NodeSpec, backend: Any, params: Any = None) -> None:
        shape = spec.inputs[0].shape
        dt = np.dtype(spec.outputs[0].dtype)
        legacy = spec.opset < 13
        axis = _axis(spec, int(spec.attr("axis", 1 if legacy else -1)), len(shape))
        self.set_rows(spec, shape, range(axis, len(shape)) if legacy else (axis,), dt)
        super().__init__(spec, backend, params)
        if dt.kind != "f":
            raise _decline(spec, f"dtype {dt}")

    def defines(self) -> dict[str, Any]:
        return {**super().defines(), "LOG": int(self.spec.op == "LogSoftmax")}

    def bind(self, ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        return self.launch_rows(*self.tensor(ins[0]), *self.tensor(outs[0]))


# op -> (combine, element map, final map for floats, for integers (None: floats only)); LogSumExp has its own pass
_REDUCE: dict[str, tuple[str, str, str, str | None]] = {
    "ReduceSum": ("C_ADD", "IDENT", "P_ID", "P_ID"), "ReduceMean": ("C_ADD", "IDENT", "P_MEAN_F", "P_MEAN_I"),
    "ReduceMax": ("C_MAX", "IDENT", "P_ID", "P_ID"), "ReduceMin": ("C_MIN", "IDENT", "P_ID", "P_ID"),
    "ReduceProd": ("C_MUL", "IDENT", "P_ID", "P_ID"), "ReduceL1": ("C_ADD", "ABSV", "P_ID", "P_ID"),
    "ReduceL2": ("C_ADD", "SQUARE", "P_SQRT", None), "ReduceSumSquare": ("C_ADD", "SQUARE", "P_ID", "P_ID"),
    "ReduceLogSumExp": ("C_ADD", "IDENT", "P_ID", None),
}
# OpenCL C's limits.h names, per type: where max and min start
_LOWEST = {"char": "CHAR_MIN", "short": "SHRT_MIN", "int": "INT_MIN", "long": "LONG_MIN", "float": "-INFINITY",
           "double": "-INFINITY"}
_HIGHEST = {"char": "CHAR_MAX", "short": "SHRT_MAX", "int": "INT_MAX", "long": "LONG_MAX", "uchar": "UCHAR_MAX",
            "ushort": "USHRT_MAX", "uint": "UINT_MAX", "ulong": "ULONG_MAX", "float": "INFINITY", "double": "INFINITY"}


class Reduce(RowKernel):
    """ReduceSum/Mean/Max/Min/Prod/L1/L2/SumSquare/LogSumExp over attribute axes, keepdims either way (the
    output's bytes are the same). Integer means truncate, as the NumPy backend's. Declines empty reductions and
    `noop_with_empty_axes` with no axes (the NumPy backend runs them)."""

    entry = "reduce"

    def __init__(self, spec: NodeSpec, backend: Any, params: Any = None) -> None:
        shape = spec.inputs[0].shape
        dt = np.dtype(spec.outputs[0].dtype)
        axes = _reduce_axes(spec)
        if not axes:
            raise _decline(spec, "noop_with_empty_axes with no axes")
        self.set_rows(spec, shape, axes, dt)
        super().__init__(spec, backend, params)
        comb, pre, post_f, post_i = _REDUCE[spec.op]
        if dt.kind not in "fiu" or (dt.kind != "f" and post_i is None):
            raise _decline(spec, f"dtype {dt}")
        if self.geom.n == 0:
            raise _decline(spec, "an empty reduction")
        t = self.cl_type(dt)
        init = {"C_ADD": "0", "C_MUL": "1", "C_MAX": _LOWEST.get(t, "0"), "C_MIN": _HIGHEST[t]}[comb]
        self.macros = {"COMB": comb, "PRE": pre, "POST": post_f if dt.kind == "f" else post_i, "INIT": init,
                       "LSE": int(spec.op == "ReduceLogSumExp")}

    def defines(self) -> dict[str, Any]:
        return {**super().defines(), **self.macros}

    def bind(self, ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        return self.launch_rows(*self.tensor(ins[0]), *self.tensor(outs[0]))


class Arg(RowKernel):
    """ArgMax / ArgMin along `axis`, first or (select_last_index) last extreme; NaN is the extreme, as NumPy's.
    A work-item per output (GPUs and PoCL alike: the row is one scalar loop), WGS outputs per work-group."""

    entry = "arg"
    space = Space(params={"WGS": (16, 32, 64, 128, 256)}, defaults={"default": {"WGS": 64}},
                  work_group=lambda p: (p["WGS"],))

    def __init__(self, spec: NodeSpec, backend: Any, params: Any = None) -> None:
        shape = spec.inputs[0].shape
        dt = np.dtype(spec.inputs[0].dtype)
        axis = _axis(spec, int(spec.attr("axis", 0)), len(shape))
        self.set_rows(spec, shape, (axis,), dt)
        super().__init__(spec, backend, params)
        if dt.kind not in "fiu":
            raise _decline(spec, f"dtype {dt}")
        if self.geom.n == 0:
            raise _decline(spec, "an empty axis")

    def variant(self) -> str:
        return ""

    def defines(self) -> dict[str, Any]:
        return {**super().defines(), "ALG": 0, "VW": 1, "ARGMAX": int(self.spec.op == "ArgMax"),
                "LAST": int(bool(self.spec.attr("select_last_index", 0)))}

    def bind(self, ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        return self.launch_rows(*self.tensor(ins[0]), *self.tensor(outs[0]))


def _factory(cls: type[RowKernel]) -> Callable[..., RowKernel]:
    return lambda spec, backend: cls(spec, backend)


KERNELS = {"Softmax": _factory(Softmax), "LogSoftmax": _factory(Softmax), **{op: _factory(Reduce) for op in _REDUCE},
           "ArgMax": _factory(Arg), "ArgMin": _factory(Arg)}
