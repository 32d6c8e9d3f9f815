"""LSTM, GRU and RNN (opsets 7-22) for the NumPy backend: the machinery the cells (rnn_cells.py) share.

One run: the input projection X·Wᵀ of every time step, gate and direction as one batched GEMM into planned scratch
(biases added in one pass), then per step one batched GEMM h·Rᵀ and the gate math in place. Gates are stored
gate-major, [gate, direction, batch, hidden], so every gate of every direction is one contiguous block and each
NumPy call covers all directions (a strided view costs a call ~3x more on these small blocks). Step s is time s
forward and time T-1-s in reverse; the views of both directions at one step are stacked into one strided view
(`_stack`) of the projection and of Y. Without sequence_lens the hidden state lives in Y itself; with them it lives
in scratch, padded steps carry the state and write zeros to Y, and Y_h/Y_c hold the last valid step (zeros for a
length of 0, as onnxruntime). Layout 1 (batch first) is read and written through transposed views.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ctxrt.backends.cpu.rnn.rnn_act import activations
from ctxrt.backends.kernel import Kernel, Launch, NodeSpec, TensorSpec, scratch_view
from ctxrt.errors import UnsupportedOpError
from ctxrt.ir.canonical import output_slots

X, W, R, B, SEQ_LENS, INITIAL_H, INITIAL_C, P = range(8)
Step = Callable[[int], None]
Carry = Callable[[int, np.ndarray], None]


def _stack(views: list[np.ndarray], axis: int = 0) -> np.ndarray:
    """Views of equal shape and strides into one buffer as one view with a new axis (no copy)."""
    a = views[0]
    if len(views) == 1:
        return np.expand_dims(a, axis)
    b = views[1]
    assert a.shape == b.shape and a.strides == b.strides and a.dtype == b.dtype
    step = b.ctypes.data - a.ctypes.data
    return as_strided(a, a.shape[:axis] + (2,) + a.shape[axis:], a.strides[:axis] + (step,) + a.strides[axis:])


class Scratch:
    """Named scratch buffers: declared at construction, typed views at bind."""

    def __init__(self) -> None:
        self.items: list[tuple[str, tuple[int, ...], np.dtype]] = []

    def add(self, name: str, shape: tuple[int, ...], dtype: Any) -> None:
        self.items.append((name, shape, np.dtype(dtype)))

    def sizes(self) -> tuple[int, ...]:
        return tuple(max(1, int(np.prod(s)) * dt.itemsize) for _, s, dt in self.items)

    def views(self, bufs: list[Any]) -> dict[str, np.ndarray]:
        return {n: scratch_view(b, s, dt) for (n, s, dt), b in zip(self.items, bufs, strict=True)}


class Recurrent(Kernel):
    """The machinery shared by the three cells; a subclass sets GATES, DEFAULTS, SLOTS and `cell`."""

    GATES = 1
    DEFAULTS: tuple[str, ...] = ("Tanh",)
    SLOTS = 2  # Y, Y_h (LSTM: Y_c too)
    algorithm = "projected_gemm"

    def __init__(self, spec: NodeSpec) -> None:
        self.spec = spec
        self.dt = dt = np.dtype(spec.inputs[X].dtype)
        if dt.kind != "f":
            raise self.fail(f"dtype {dt}")
        layout = int(spec.attr("layout", 0))
        if layout not in (0, 1):
            raise self.fail(f"attribute 'layout' value {layout}")
        self.layout = layout
        direction = spec.attr("direction", "forward")
        if direction not in ("forward", "reverse", "bidirectional"):
            raise self.fail(f"attribute 'direction' value {direction!r}")
        self.reverse = {"forward": [False], "reverse": [True], "bidirectional": [False, True]}[direction]
        self.D = d = len(self.reverse)
        xs = spec.inputs[X].shape
        if len(xs) != 3:
            raise self.fail(f"input X of shape {xs} (rank 3 expected)")
        self.T, self.N, self.I = (xs[0], xs[1], xs[2]) if layout == 0 else (xs[1], xs[0], xs[2])
        self.H = h = spec.inputs[R].shape[-1]
        hidden = spec.attr("hidden_size")
        if hidden is not None and int(hidden) != h:
            raise self.fail(f"attribute 'hidden_size' value {hidden} with R of shape {spec.inputs[R].shape}")
        gh = self.GATES * h
        for k, want in ((W, (d, gh, self.I)), (R, (d, gh, h)), (B, (d, 2 * gh)), (P, (d, 3 * h))):
            got = self.input(k)
            if got is not None and tuple(got.shape) != want:
                raise self.fail(f"input {k} of shape {got.shape} (expected {want} for direction {direction!r})")
        clip = spec.attr("clip")
        self.clip = None if clip is None else dt.type(clip)
        acts = activations(spec, self.DEFAULTS, d)
        self.acts = [tuple(a.fn(dt) for a in per_dir) for per_dir in acts]
        # Directions with the same activations share every gate pass; else each has its own.
        self.groups = [slice(0, d)] if all(a == acts[0] for a in acts) else [slice(k, k + 1) for k in range(d)]
        slots = output_slots(spec.attrs, len(spec.outputs), self.SLOTS)
        self.out_slot = slots
        self._masks(spec)
        self.direct = slots[0] is not None and not self.masked  # the hidden state lives in Y
        self.plan = Scratch()
        g = self.GATES
        self.plan.add("xw", (self.T * self.N, g, d, h), dt)
        self.plan.add("gates", (g, d, self.N, h), dt)
        self.plan.add("tmp", (g, d, self.N, h), dt)
        if not self.direct:
            self.plan.add("h", (2, d, self.N, h), dt)
        if self.masked and self.seq_const is None:
            self.plan.add("valid", (self.T, d, self.N, 1), np.bool_)
            self.plan.add("invalid", (self.T, d, self.N, 1), np.bool_)
            self.plan.add("validf", (self.T, d, self.N, 1), dt)
            self.plan.add("alive", (1, self.N, 1), np.bool_)
            self.plan.add("alivef", (1, self.N, 1), dt)
        if self.input(B) is not None and spec.consts[B] is None:
            self.plan.add("bias", (self.GATES, d, h), dt)
        self.declare(self.plan)
        self.scratch = self.plan.sizes()

    # -- construction helpers ------------------------------------------------------------------------
    def fail(self, what: str) -> UnsupportedOpError:
        return UnsupportedOpError(f"{self.spec.op} node {self.spec.name!r}: {what} is not supported")

    def input(self, k: int) -> TensorSpec | None:
        return self.spec.inputs[k] if k < len(self.spec.inputs) else None

    def const(self, k: int) -> np.ndarray | None:
        return self.spec.consts[k] if k < len(self.spec.consts) else None

    def declare(self, plan: Scratch) -> None:
        """Cell-specific scratch (LSTM: the cell state)."""

    def _masks(self, spec: NodeSpec) -> None:
        """Which (step, direction, batch) positions are real: per step s, direction d reads time s or T-1-s."""
        self.masked = self.input(SEQ_LENS) is not None
        self.seq_const = None
        t, n = self.T, self.N
        self.steps = np.array([[s if not rev else t - 1 - s for rev in self.reverse] for s in range(t)],
                              np.int64).reshape(t, self.D, 1, 1)
        if not self.masked:
            return
        if self.input(SEQ_LENS).shape != (n,):
            raise self.fail(f"sequence_lens of shape {self.input(SEQ_LENS).shape} for batch {n}")
        lens = self.const(SEQ_LENS)
        if lens is not None:
            lens = lens.astype(np.int64).reshape(1, 1, n, 1)
            if (lens >= t).all():
                self.masked = False  # every sequence is full: the plain loop
                return
            valid = self.steps < lens
            self.seq_const = (~valid, valid.astype(self.dt), (lens[0] > 0).astype(self.dt))
        else:
            self.steps = self.steps.astype(np.dtype(self.input(SEQ_LENS).dtype))

    def bias_sum(self, b: np.ndarray) -> np.ndarray:
        """The bias added to the input projection, gate-major [G, D, H]: Wb + Rb (GRU overrides)."""
        g, h = self.GATES, self.H
        return (b[:, :g * h] + b[:, g * h:]).reshape(self.D, g, h).transpose(1, 0, 2)

    # -- binding ---------------------------------------------------------------------------------------
    def time_major(self, a: np.ndarray | None, shape4: bool = True) -> np.ndarray | None:
        """An IO tensor as a [T, D, N, H] (Y) or [D, N, H] (states) view whatever the layout."""
        if a is None:
            return None
        if self.layout == 0:
            return a
        return a.transpose(1, 2, 0, 3) if shape4 else a.transpose(1, 0, 2)

    def bind(self, ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        def get(k: int) -> np.ndarray | None:
            return ins[k] if k < len(ins) else None

        d, t, n, h, g = self.D, self.T, self.N, self.H, self.GATES
        v = self.plan.views(scratch)
        y = self.time_major(outs[self.out_slot[0]]) if self.out_slot[0] is not None else None
        xw = v["xw"]
        x2 = get(X).reshape(-1, self.I)
        wtg = get(W).reshape(d, g, h, self.I).transpose(0, 1, 3, 2)  # [D, G, I, H]: NT GEMMs, no copy
        xw_out = xw.transpose(2, 1, 0, 3)  # [D, G, rows, H]
        bconst, bsrc = self.const(B), get(B)
        bias = None if bsrc is None else self.bias_sum(bconst.astype(self.dt)) if bconst is not None else v["bias"]
        if bconst is not None:
            bsrc = None
        h0 = self.time_major(get(INITIAL_H), False)
        h0 = np.zeros((d, n, h), self.dt) if h0 is None else h0
        time = [[s if not rev else t - 1 - s for rev in self.reverse] for s in range(t)]
        xw5 = xw.reshape(t, n, g, d, h) if self.layout == 0 else xw.reshape(n, t, g, d, h).transpose(1, 0, 2, 3, 4)
        xs = [_stack([xw5[time[s][k], :, :, k].transpose(1, 0, 2) for k in range(d)], 1) for s in range(t)]
        ys = [_stack([y[time[s][k], k] for k in range(d)]) for s in range(t)] if y is not None else None
        hs = ys if self.direct else [v["h"][s % 2] for s in range(t)]
        prev = [h0] + hs[:-1]
        step, carry, finals = self.cell(ins, v, xs, prev, hs)
        k = self.out_slot[1]
        finals = ([] if k is None else [(self.time_major(outs[k], False), hs[-1])]) + [
            (self.time_major(outs[j], False), src) for j, src in finals]
        masks = self._bind_masks(get(SEQ_LENS), v)

        def project() -> None:
            np.matmul(x2, wtg, out=xw_out)
            if bsrc is not None:
                self.bias_at_run(bsrc, bias)
            if bias is not None:
                np.add(xw, bias, out=xw)

        if masks is None:
            def run() -> None:
                project()
                for s in range(t):
                    step(s)
                for dst, src in finals:
                    np.copyto(dst, src)
            return run

        refresh, invalid, validf, alive = masks

        def run_masked() -> None:
            project()
            refresh()
            for s in range(t):
                step(s)
                np.copyto(hs[s], prev[s], where=invalid[s])  # padded positions keep the state
                carry(s, invalid[s])
                if ys is not None:
                    np.multiply(hs[s], validf[s], out=ys[s])  # and write zeros
            for dst, src in finals:
                np.copyto(dst, src)
                np.multiply(dst, alive, out=dst)  # a sequence of length 0 ends in zeros
        return run_masked

    def _bind_masks(self, lens: np.ndarray | None, v: dict[str, np.ndarray]) -> tuple | None:
        """(per-run refresh, invalid[s], validf[s], alive [1, N, 1]) or None when nothing is padded."""
        if not self.masked:
            return None
        if self.seq_const is not None:
            invalid, validf, alive = self.seq_const
            return (lambda: None), invalid, validf, alive
        steps = self.steps
        valid, invalid, validf, alive, alivef = v["valid"], v["invalid"], v["validf"], v["alive"], v["alivef"]
        lens4 = lens.reshape(1, 1, self.N, 1)

        def refresh() -> None:
            np.less(steps, lens4, out=valid)
            np.logical_not(valid, out=invalid)
            np.copyto(validf, valid)
            np.greater(lens4[0], 0, out=alive)
            np.copyto(alivef, alive)
        return refresh, invalid, validf, alivef

    def bias_at_run(self, b: np.ndarray, out: np.ndarray) -> None:
        """`bias_sum` of a bias known only at run time, into scratch."""
        g, h = self.GATES, self.H
        wb = b[:, :g * h].reshape(self.D, g, h).transpose(1, 0, 2)
        rb = b[:, g * h:].reshape(self.D, g, h).transpose(1, 0, 2)
        np.add(wb, rb, out=out)

    def cell(self, ins: list[Any], v: dict[str, np.ndarray], xws: list[np.ndarray], prev: list[np.ndarray],
             hs: list[np.ndarray]) -> tuple[Step, Carry, list[tuple[int, np.ndarray]]]:
        """(step(s), carry(s, invalid) for state besides h, [(output slot, final state)] besides Y_h)."""
        raise NotImplementedError

    # -- helpers for the cells -----------------------------------------------------------------------------
    def clipper(self) -> Callable[[np.ndarray], None]:
        c = self.clip
        if c is None:
            return lambda a: None
        return lambda a: np.clip(a, -c, c, out=a)

    def recurrence(self, r: np.ndarray) -> np.ndarray:
        """R as [D, G, H, H] transposed views: hp[:, None] [D, 1, N, H] times it is every gate's h·Rᵀ at once,
        written gate-major through `gates.transpose(1, 0, 2, 3)` (NT GEMMs, no copy)."""
        return r.reshape(self.D, self.GATES, self.H, self.H).transpose(0, 1, 3, 2)
