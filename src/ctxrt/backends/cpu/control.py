"""If and Loop run at run time: their compiled bodies (compiler/program.py `Body`) execute over the step's
scratch, with kernels from the same kernel table, bound once like any launch list.

If: both branches are bound to the If's outputs; the condition picks which launch list runs.
Loop: the body reads the iteration number, the condition and the carried values from buffers in the
scratch, and writes the carried values straight into the Loop's outputs, which are copied back into
those buffers after each iteration; scan outputs are copied into their row of the output.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ctxrt.backends.kernel import Kernel, Launch, NodeSpec, TensorSpec
from ctxrt.compiler.program import ARENA, CONST, OUTPUT, Body, Ref, TensorInfo
from ctxrt.errors import FormatError, UnsupportedOpError

_ALIGN = 64


def _spec(t: TensorInfo | Ref) -> TensorSpec:
    return TensorSpec(tuple(t.shape), np.dtype(t.dtype))


class _Program:
    """A body's kernels, built from the kernel table with the step's constants."""

    def __init__(self, body: Body, consts: dict[str, np.ndarray | None], opset: int, where: str) -> None:
        from ctxrt.backends.cpu.registry import KERNELS

        self.body = body
        self.kernels: list[Kernel] = []
        for step in body.steps:
            factory = KERNELS.get(step.op)
            if factory is None:
                raise UnsupportedOpError(f"{where}: unsupported operator {step.op} ({step.name})")
            spec = NodeSpec(step.op, step.name, step.attrs, [_spec(r) if r else None for r in step.inputs],
                            [_spec(r) for r in step.outputs],
                            [consts.get(r.key) if r is not None and r.space == CONST else None for r in step.inputs],
                            opset)
            kernel = factory(spec)
            planned = [r.nbytes for r in step.scratch]
            if len(kernel.scratch) != len(planned) or any(n > p for n, p in zip(kernel.scratch, planned, strict=False)):
                raise FormatError(f"{where}, node {step.name!r} ({step.op}): its kernel needs scratch "
                                  f"{list(kernel.scratch)} bytes but the body plans {planned}; compile it again")
            self.kernels.append(kernel)

    def bind(self, named: dict[str, Any], outs: dict[str, Any], arena: np.ndarray) -> list[Launch]:
        """Launches over views: inputs and weights from `named`, outputs from `outs`, the rest in `arena`."""
        def view(r: Ref) -> Any:
            if r.space == ARENA:
                return arena[r.offset:r.offset + r.nbytes].view(np.dtype(r.dtype)).reshape(r.shape)
            source = outs if r.space == OUTPUT else named
            return source[r.key].reshape(r.shape)

        return [k.bind([view(r) if r else None for r in s.inputs], [view(r) for r in s.outputs],
                       [view(r) for r in s.scratch]) for k, s in zip(self.kernels, self.body.steps, strict=True)]


def _named_consts(spec: NodeSpec) -> tuple[list[str], int, dict[str, np.ndarray | None]]:
    captures = list(spec.attr("captures", []))
    first = len(spec.inputs) - len(captures)
    if first < 0:
        raise FormatError(f"{spec.op} node {spec.name!r}: {len(captures)} captures but {len(spec.inputs)} inputs")
    return captures, first, dict(zip(captures, spec.consts[first:], strict=False))


def _check_io(where: str, got: list[TensorInfo], want: list[TensorSpec | None]) -> None:
    have = [(tuple(t.shape), np.dtype(t.dtype)) for t in got]
    need = [(tuple(s.shape), np.dtype(s.dtype)) if s else None for s in want]
    if have != need:
        raise FormatError(f"{where}: body tensors {have} do not match the node's {need}")


def _check_captured(where: str, body: Body, captures: list[str], first: int, spec: NodeSpec, n_formal: int) -> None:
    for info in body.inputs[n_formal:]:
        if info.name not in captures:
            raise FormatError(f"{where}: body input {info.name!r} is not captured by the node")
        _check_io(where, [info], [spec.inputs[first + captures.index(info.name)]])


def _body(spec: NodeSpec, key: str) -> Body:
    body = spec.attr(key)
    if not isinstance(body, Body):
        raise FormatError(f"{spec.op} node {spec.name!r}: attribute {key!r} is not a compiled body")
    return body


class _IfKernel(Kernel):
    def __init__(self, branches: list[_Program], captures: list[str], first: int) -> None:
        self.branches, self.captures, self.first = branches, captures, first
        arena = max(p.body.arena_size for p in branches)
        self.scratch = (arena,) if arena else ()

    def bind(self, ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        named = dict(zip(self.captures, ins[self.first:], strict=True))
        arena = scratch[0] if scratch else np.empty(0, np.uint8)
        then, other = (p.bind(named, {t.name: outs[i] for i, t in enumerate(p.body.outputs)}, arena)
                       for p in self.branches)
        cond = ins[0].reshape(())

        def run() -> None:
            for launch in then if cond else other:
                launch()
        return run


def if_(spec: NodeSpec) -> Kernel:
    captures, first, consts = _named_consts(spec)
    if first != 1 or spec.inputs[0] is None or int(np.prod(spec.inputs[0].shape)) != 1:
        raise FormatError(f"If node {spec.name!r}: expects one condition element before its captures")
    branches = []
    for key in ("then_branch", "else_branch"):
        where = f"If node {spec.name!r} {key}"
        body = _body(spec, key)
        _check_captured(where, body, captures, first, spec, 0)
        _check_io(where, body.outputs, list(spec.outputs))
        branches.append(_Program(body, consts, spec.opset, where))
    return _IfKernel(branches, captures, first)


def _aligned(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


class _LoopKernel(Kernel):
    """Scratch: [body arena | iteration | condition | carried values | body's condition | scan rows]."""

    def __init__(self, prog: _Program, captures: list[str], n_state: int, n_scan: int, bounded: bool) -> None:
        self.prog, self.captures, self.n_state, self.n_scan, self.bounded = prog, captures, n_state, n_scan, bounded
        body = prog.body
        buffers = [body.inputs[0], body.inputs[1], *body.inputs[2:2 + n_state], body.outputs[0],
                   *body.outputs[1 + n_state:]]
        self.offsets, end = [], _aligned(body.arena_size)
        for t in buffers:
            self.offsets.append((end, t))
            end += _aligned(max(t.nbytes, 1))
        self.scratch = (end,)

    def bind(self, ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        n_state, n_scan, body = self.n_state, self.n_scan, self.prog.body
        buf = scratch[0]
        views = [buf[o:o + t.nbytes].view(np.dtype(t.dtype)).reshape(t.shape) for o, t in self.offsets]
        it, cond_in, carried, cond_out = views[0], views[1], views[2:2 + n_state], views[2 + n_state]
        rows = views[3 + n_state:]
        named = dict(zip(self.captures, ins[2 + n_state:], strict=True))
        named.update({t.name: v for t, v in zip(body.inputs[:2 + n_state], [it, cond_in, *carried], strict=True)})
        results = {body.outputs[0].name: cond_out}
        results.update({t.name: outs[k] for k, t in enumerate(body.outputs[1:1 + n_state])})
        results.update({t.name: v for t, v in zip(body.outputs[1 + n_state:], rows, strict=True)})
        launches = self.prog.bind(named, results, buf)
        m, cond = (None if x is None else x.reshape(()) for x in ins[:2])
        init = ins[2:2 + n_state]
        cond_out = cond_out.reshape(())
        finals = outs[:n_state]
        scans = [[out[i] for i in range(out.shape[0])] for out in outs[n_state:n_state + n_scan]]
        extent = outs[-1] if self.bounded else None
        limit = min((len(s) for s in scans), default=np.iinfo(np.int64).max)

        def run() -> None:
            trips = limit if m is None else min(limit, int(m))
            go = True if cond is None else bool(cond)
            for dst, src in zip(carried, init, strict=True):
                np.copyto(dst, src)
            i = 0
            while i < trips and go:
                it[...] = i
                cond_in[...] = go
                for launch in launches:
                    launch()
                for dst, src in zip(carried, finals, strict=True):
                    np.copyto(dst, src)
                for out, row in zip(scans, rows, strict=True):
                    np.copyto(out[i], row)
                go = bool(cond_out)
                i += 1
            if i == 0:
                for dst, src in zip(finals, init, strict=True):
                    np.copyto(dst, src)
            if extent is not None:
                extent[...] = i
        return run


def loop(spec: NodeSpec) -> Kernel:
    captures, first, consts = _named_consts(spec)
    where = f"Loop node {spec.name!r} body"
    body = _body(spec, "body")
    n_state = first - 2
    bounded = bool(spec.attr("bounded", False))
    n_scan = len(body.outputs) - 1 - n_state
    if n_state < 0 or n_scan < 0 or len(body.inputs) < 2 + n_state:
        raise FormatError(f"{where}: {len(body.inputs)} inputs and {len(body.outputs)} outputs do not fit "
                          f"{n_state} carried values")
    _check_captured(where, body, captures, first, spec, 2 + n_state)
    scalar = [TensorSpec((), np.dtype(np.int64)), TensorSpec((), np.dtype(bool))]
    _check_io(where, body.inputs[:2 + n_state], scalar + list(spec.inputs[2:first]))
    _check_io(where, body.outputs[1:1 + n_state], list(spec.inputs[2:first]))
    if np.dtype(body.outputs[0].dtype) != np.dtype(bool) or body.outputs[0].nbytes != 1:
        raise FormatError(f"{where}: its first output must be one boolean (the condition)")
    outs = list(spec.outputs)
    if bounded:
        _check_io(where, [TensorInfo("extent", (), "<i8")], [outs.pop()])
    if len(outs) != n_state + n_scan:
        raise FormatError(f"{where}: {len(outs)} outputs for {n_state} carried values and {n_scan} scan outputs")
    for t, s in zip(body.outputs[1 + n_state:], outs[n_state:], strict=True):
        if s.shape[1:] != tuple(t.shape) or np.dtype(s.dtype) != np.dtype(t.dtype):
            raise FormatError(f"{where}: scan output {t.name!r} {list(t.shape)} does not fit {list(s.shape)}")
    if n_scan and spec.inputs[0] is None:
        raise UnsupportedOpError(f"{where}: scan outputs need a trip count")
    return _LoopKernel(_Program(body, consts, spec.opset, where), captures, n_state, n_scan, bounded)


KERNELS = {"If": if_, "Loop": loop}
