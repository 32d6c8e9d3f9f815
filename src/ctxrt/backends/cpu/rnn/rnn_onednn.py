"""LSTM, GRU and RNN as oneDNN's fused RNN primitives: the input projection of a chunk of steps as one GEMM, then
per step the recurrent GEMM and the gates in one jitted pass, all inside one call (no Python per step).

Used for float32 nodes with constant W, R (and B, P) and the attributes those primitives compute: the default
activations (an RNN may take Tanh, Relu or Sigmoid per direction), no clip, no input_forget, no sequence_lens
shorter than the sequence. Every other node runs the NumPy cells of rnn_cells.py.

One primitive per direction (left to right, or right to left for reverse) reads and writes the ONNX tensors in
place through strided descriptors, so layout 0 and 1 and both directions need no copy. The weights are
transposed into oneDNN's gate order at compile time and stored instead of the ONNX ones (`rnn_weights` names
their formats): plain `ldigo` at small batches, where oneDNN's GEMM cell is fastest, else the format its brgemm
cell chooses. oneDNN's scratchpad grows with the steps of a call (~29 floats per hidden unit, step and batch row
for its GEMM cell), so a long sequence runs in chunks that keep it within `SCRATCH_BUDGET`, each chunk starting
from the state the previous one left in scratch: the scratch is bounded whatever the sequence length.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

import numpy as np

from ctxrt.backends.cpu import threads
from ctxrt.backends.cpu.onednn import api, kernels
from ctxrt.backends.cpu.rnn.recurrent import INITIAL_C, INITIAL_H, SEQ_LENS, B, P, R, Scratch, W, X
from ctxrt.backends.cpu.rnn.rnn_act import activations
from ctxrt.backends.kernel import Kernel, NodeSpec
from ctxrt.errors import CtxrtError, UnsupportedOpError
from ctxrt.ir.canonical import output_slots

PACKED = "rnn_weights"  # attribute: the formats of the prepacked weights (layer, iter); its presence marks the node
# oneDNN's scratchpad per call at most (by the compile option `prefer`), unless that leaves fewer than MIN_CHUNK
# steps per call. Measured at one thread: LSTM, hidden 256, 64 steps, batch 1 took 2.7 ms in one call (1.9 MB of
# scratchpad), 2.2 ms in 2 chunks (0.97 MB), 2.8 in 4, 3.5 in 8; at hidden 128, 50 steps (0.75 MB), one call.
SCRATCH_BUDGET = {"speed": 1 << 20, "memory": 1 << 18}
MIN_CHUNK = 4
# Fewer rows: plain ldigo weights (one LSTM step at batch 1: 8.1 us vs brgemm's 10.0; at batch 8 62 vs 43).
SMALL_BATCH = 4
# Multiply-adds of a step's recurrent GEMM (batch x gates x hidden^2) below which a node runs on one thread
# whatever the run has: every step ends in a barrier of OpenMP's threads, and a step this small gains little from
# a second thread, while a thread another process holds stalls every step (a bidirectional LSTM, hidden 128,
# 50 steps, batch 1 on a loaded 2-core machine: 120 ms on two threads, 2 ms on one).
SMALL_STEP = 1 << 21
LDIGO = "abcde"
ARG_SRC_LAYER, ARG_SRC_ITER, ARG_SRC_ITER_C = 1, 2, 3
ARG_DST_LAYER, ARG_DST_ITER, ARG_DST_ITER_C = 17, 18, 19
ARG_WEIGHTS_LAYER, ARG_WEIGHTS_ITER, ARG_WEIGHTS_PEEPHOLE, ARG_BIAS, ARG_SCRATCHPAD = 33, 34, 35, 41, 80
LEFT2RIGHT, RIGHT2LEFT = 1, 2
ELTWISE = {"relu": 0x20, "tanh": 0x21, "sigmoid": 0x29}  # dnnl_eltwise_relu, _tanh, _logistic


class Cell:
    """What differs between the three ops: the primitive, ONNX's gates in oneDNN's order, the bias rows."""

    def __init__(self, fn: str, order: tuple[int, ...], defaults: tuple[str, ...], extra_bias: bool = False) -> None:
        self.fn, self.order, self.defaults, self.extra_bias = fn, order, defaults, extra_bias
        self.gates = len(order)


def cell_of(spec: NodeSpec) -> Cell:
    if spec.op == "LSTM":  # ONNX i o f c, oneDNN i f c o
        return Cell("lstm_forward", (0, 2, 3, 1), ("sigmoid", "tanh", "tanh"))
    if spec.op == "GRU":  # z r h = oneDNN's u r o; linear_before_reset adds Rbh as a fourth bias row
        lbr = bool(spec.attr("linear_before_reset", 0))
        return Cell("lbr_gru_forward" if lbr else "gru_forward", (0, 1, 2), ("sigmoid", "tanh"), lbr)
    return Cell("vanilla_rnn_forward", (0,), ("tanh",))


_SIGNATURES = {"lstm_forward": 11, "gru_forward": 7, "lbr_gru_forward": 7}  # memory descriptors after direction


def _prototypes(lib: ctypes.CDLL) -> None:
    vp, i, pp = ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_void_p)
    for name, mds in _SIGNATURES.items():
        fn = getattr(lib, f"dnnl_{name}_primitive_desc_create")
        fn.argtypes, fn.restype = [pp, vp, i, i] + [vp] * mds + [ctypes.c_uint, vp], i
    fn = lib.dnnl_vanilla_rnn_forward_primitive_desc_create
    fn.argtypes = [pp, vp, i, i, i] + [vp] * 7 + [ctypes.c_uint, ctypes.c_float, ctypes.c_float, vp]
    fn.restype = i


def _input(spec: NodeSpec, k: int) -> Any:
    return spec.inputs[k] if k < len(spec.inputs) else None


def _const(spec: NodeSpec, k: int) -> np.ndarray | None:
    return spec.consts[k] if k < len(spec.consts) else None


def refusal(spec: NodeSpec, need_onednn: bool = True) -> str | None:
    """Why this node runs on the NumPy cells instead (None: oneDNN's primitive runs it). Attribute values no
    kernel accepts are refused too: the NumPy kernel names them in its error. `need_onednn=False`: whether the
    node is one the primitive computes, installed or not (rnn_native.py takes the same ones)."""
    if need_onednn and not api.available():
        return "oneDNN is not installed"
    if any(t is not None and np.dtype(t.dtype) != np.float32 for t in spec.inputs[:4] + spec.outputs):
        return "not float32"
    if int(spec.attr("layout", 0)) not in (0, 1):
        return "layout"
    direction = spec.attr("direction", "forward")
    if direction not in ("forward", "reverse", "bidirectional"):
        return "direction"
    if spec.attr("clip") is not None or int(spec.attr("input_forget", 0)):
        return "clip or input_forget"
    if int(spec.attr("linear_before_reset", 0)) not in (0, 1):
        return "linear_before_reset"
    for k in (W, R, B, P):
        if _input(spec, k) is not None and _const(spec, k) is None:
            return "weights known only at run time"
    d, cell = 2 if direction == "bidirectional" else 1, cell_of(spec)
    x, r = _input(spec, X).shape, _input(spec, R).shape
    if len(x) != 3 or len(r) != 3 or 0 in x or 0 in r or int(spec.attr("hidden_size", r[2])) != r[2]:
        return "shapes"
    g, h = cell.gates, r[2]
    want = {W: (d, g * h, x[2]), R: (d, g * h, h), B: (d, 2 * g * h), P: (d, 3 * h)}
    if any(_input(spec, k) is not None and tuple(_input(spec, k).shape) != s for k, s in want.items()):
        return "shapes"
    if _input(spec, SEQ_LENS) is not None:
        lens, t = _const(spec, SEQ_LENS), _input(spec, X).shape[1 if spec.attr("layout", 0) else 0]
        if lens is None or (lens < t).any():
            return "sequence_lens"
    try:
        acts = activations(spec, cell.defaults, d)
    except UnsupportedOpError:
        return "activations"
    if spec.op == "RNN":
        if any(a.name not in ELTWISE for per_dir in acts for a in per_dir):
            return "activations"
    elif any(tuple(a.name for a in per_dir) != cell.defaults for per_dir in acts):
        return "activations"
    return None


class FusedRecurrent(Kernel):
    """One node as oneDNN RNN primitives: per direction, one per chunk length, run chunk after chunk."""

    algorithm = "onednn:rnn"

    def __init__(self, spec: NodeSpec) -> None:
        api.require(f"{spec.op} {spec.name!r}")
        _prototypes(api.library())
        self.spec, self.cell = spec, cell_of(spec)
        self.layout = layout = int(spec.attr("layout", 0))
        self.reverse = {"forward": [False], "reverse": [True], "bidirectional": [False, True]}[
            spec.attr("direction", "forward")]
        d = self.D = len(self.reverse)
        xs = spec.inputs[X].shape
        t, n, i = self.T, self.N, self.I = (xs[0], xs[1], xs[2]) if layout == 0 else (xs[1], xs[0], xs[2])
        packed = spec.attr(PACKED)
        h = self.H = int(spec.attr("hidden_size")) if packed else spec.inputs[R].shape[-1]
        self.acts = [ELTWISE[a[0].name] for a in activations(spec, self.cell.defaults, d)]
        self.slots = output_slots(spec.attrs, len(spec.outputs), 3 if spec.op == "LSTM" else 2)
        self.has_bias = _input(spec, B) is not None
        self.has_peep = spec.op == "LSTM" and _input(spec, P) is not None
        self.wdims = ((1, 1, i, self.cell.gates, h), (1, 1, h, self.cell.gates, h))
        self.bias_rows = self.cell.gates + self.cell.extra_bias
        # strides (elements) of a time step and a batch row in X and Y; the offset of direction 1 in Y, Y_h, Y_c,
        # initial_h and initial_c
        self.x_strides = (n * i, i) if layout == 0 else (i, t * i)
        self.y_strides = (d * n * h, h) if layout == 0 else (d * h, t * d * h)
        self.y_dir = n * h if layout == 0 else h
        self.state = api.Desc.strided((1, 1, n, h), (n * h, n * h, h, 1))
        self.bias = api.Desc.make((1, 1, self.bias_rows, h), "abcd")  # the primitives need one: zeros in scratch
        self.peep = api.Desc.make((1, 1, 3, h), "abcd") if self.has_peep else None
        self.src: dict[int, api.Desc] = {}
        self.dst: dict[int, api.Desc] = {}
        self.fmts: tuple[str, ...] = (LDIGO, LDIGO)
        if packed:
            self.fmts = tuple(packed)
            self._chunking(int(spec.attr("rnn_chunk")))
            self.prims = self._primitives(None)
            self.constants = {}
        else:
            self.prims = self._primitives(None, self._choose(spec.options.get("prefer", "speed"),
                                                             bool(spec.options.get("ranges"))))
            self.constants = self._pack(spec)
        self.threads = kernels.creation_threads(spec)
        self._variants = {self.threads: self.prims}
        self.attrs = {PACKED: list(self.fmts), "hidden_size": h, "rnn_chunk": self.lens[0]}
        if not spec.attr("threads"):
            self.attrs["threads"] = self.threads
        self.algorithm = f"onednn:{spec.op.lower()}:{self.prims[(self.lens[0], 0)].impl}"
        self.plan = Scratch()
        self.pad = max(p.scratchpad_bytes for p in self.prims.values())
        self.plan.add("pad", (self.pad,), np.uint8)
        self.plan.add("states", (2, 2 if spec.op == "LSTM" else 1, n, h), np.float32)
        if self.slots[0] is None:
            self.plan.add("y", (self.lens[0], n, h), np.float32)
        if not self.has_bias:
            self.plan.add("bias", (d, self.bias_rows, h), np.float32)
        self.scratch = self.plan.sizes()

    def _make(self, c: int, k: int, fmts: tuple[int | str, ...], nthr: int | None = None) -> api.Primitive:
        """Direction k's primitive over `c` steps, its weights in formats `fmts`, for `nthr` OpenMP threads."""
        n, h, lstm = self.N, self.H, self.spec.op == "LSTM"
        if c not in self.src:
            self.src[c] = api.Desc.strided((c, n, self.I), (*self.x_strides, 1))
            y = (n * h, h) if self.slots[0] is None else self.y_strides  # no Y: each chunk's output to scratch
            self.dst[c] = api.Desc.strided((c, n, h), (*y, 1))
        wl, wi = (api.Desc.make(dims, f) for dims, f in zip(self.wdims, fmts, strict=True))
        h_c = [self.state] if lstm else []
        mds = [self.src[c], self.state, *h_c, wl, wi] + ([self.peep, None] if lstm else [])  # no projection
        mds += [self.bias, self.dst[c], self.state, *h_c]
        handles = [m.handle if m is not None else None for m in mds]
        way = RIGHT2LEFT if self.reverse[k] else LEFT2RIGHT
        if self.spec.op == "RNN":
            return kernels.create(self.spec, self.cell.fn, api.FORWARD_INFERENCE, self.acts[k], way, *handles, 0,
                                  0.0, 0.0, nthr=nthr)
        return kernels.create(self.spec, self.cell.fn, api.FORWARD_INFERENCE, way, *handles, 0, nthr=nthr)

    def _choose(self, prefer: str, ranges: bool = False) -> api.Primitive:
        """The weights formats and the chunks (at compile time); the primitive of the first chunk forward. A range
        program's node keeps plain weights: its batch changes run to run, one format must serve every batch."""
        t, first = self.T, None
        if self.N >= SMALL_BATCH and prefer != "memory" and not ranges:
            chosen = self._make(t, 0, (api.TAG_ANY, api.TAG_ANY))
            names = tuple(chosen.md(api.Q_WEIGHTS_MD, j).tag_name(dims) for j, dims in enumerate(self.wdims))
            if None not in names:  # else a format no tag names (oneDNN's packed RNN weights): plain ones
                first, self.fmts = chosen, names
        first = first or self._make(t, 0, self.fmts)
        budget = SCRATCH_BUDGET.get(prefer, SCRATCH_BUDGET["speed"])
        if first.scratchpad_bytes > budget and t > MIN_CHUNK:  # it grows with the steps: fewer per call
            return self._make(self._chunking(max(MIN_CHUNK, budget * t // first.scratchpad_bytes)), 0, self.fmts)
        self._chunking(t)
        return first

    def _chunking(self, most: int) -> int:
        """Cut the sequence into chunks of at most `most` steps, as even as may be; the longest chunk's steps."""
        k = -(-self.T // most)
        c = -(-self.T // k)
        self.chunks = [(t0, min(c, self.T - t0)) for t0 in range(0, self.T, c)]  # (first step, steps)
        self.lens = sorted({c for _, c in self.chunks}, reverse=True)
        return c

    def _primitives(self, nthr: int | None, first: Any = None) -> dict[tuple[int, int], Any]:
        """(chunk length, direction) -> the primitive, made for `nthr` OpenMP threads (None: the node's count)."""
        made = {}
        for c in self.lens:
            for k in range(self.D):
                if first is not None and (c, k) == (self.lens[0], 0):
                    made[(c, k)] = first
                else:
                    made[(c, k)] = _recreate(self.spec, lambda fmts, c=c, k=k: self._make(c, k, fmts, nthr),
                                             self.wdims, self.fmts)
        return made

    def variant(self, n: int) -> dict[tuple[int, int], Any]:
        """The primitives for runs with `n` OpenMP threads (made once): a primitive made for more threads runs
        several times slower on fewer (brgemm LSTM at batch 8: 24 ms made for 2, 4.6 ms made for 1). The first
        ones where `n` is not fewer, or where the variant would need more scratch."""
        if n <= 0 or n >= self.threads:
            return self.prims
        if n not in self._variants:
            try:
                prims = self._primitives(n)
            except CtxrtError:
                prims = self.prims
            if max(p.scratchpad_bytes for p in prims.values()) > self.pad:
                prims = self.prims
            self._variants[n] = prims
        return self._variants[n]

    # -- compile time: the ONNX weights in oneDNN's order and formats --------------------------------------
    def _pack(self, spec: NodeSpec) -> dict[int, np.ndarray | None]:
        d, h, g, order = self.D, self.H, self.cell.gates, list(self.cell.order)

        def weights(k: int, j: int) -> np.ndarray:
            onnx = np.asarray(spec.consts[k], np.float32)  # [D, G*H, I or H]
            plain = onnx.reshape(d, g, h, -1)[:, order].transpose(0, 3, 1, 2)  # [D, I, G, H]: ldigo
            md = self.prims[(self.lens[0], 0)].md(api.Q_WEIGHTS_MD, j)
            if self.fmts[j] == LDIGO:
                return np.ascontiguousarray(plain).reshape(-1)
            return np.concatenate([kernels.prepack(plain[q:q + 1][None], self.wdims[j], LDIGO, md)
                                   for q in range(d)])

        packed: dict[int, np.ndarray | None] = {W: weights(W, 0), R: weights(R, 1)}
        if self.has_bias:
            b = np.asarray(spec.consts[B], np.float32).reshape(d, 2, g, h)[:, :, order]
            bias = b[:, 0] + b[:, 1]
            if self.cell.extra_bias:  # linear_before_reset: Wbh in the gate's row, Rbh in a row of its own
                bias = np.concatenate([bias[:, :2], b[:, 0, 2:], b[:, 1, 2:]], axis=1)
            packed[B] = np.ascontiguousarray(bias, np.float32)
        if self.has_peep:  # ONNX i o f, oneDNN i f o
            packed[P] = np.ascontiguousarray(np.asarray(spec.consts[P], np.float32).reshape(d, 3, h)[:, [0, 2, 1]])
        return packed

    # -- binding ---------------------------------------------------------------------------------------------
    def bind(self, ins: list[Any], outs: list[Any], scratch: list[Any]) -> Callable[[], None]:
        def get(k: int) -> np.ndarray | None:
            if k in self.constants:  # bound without the compiler recording them: this kernel's own
                return self.constants[k]
            return ins[k] if k < len(ins) else None

        v = self.plan.views(scratch)
        d, h = self.D, self.H
        states, pad = v["states"], v["pad"]
        x, y = get(X), outs[self.slots[0]] if self.slots[0] is not None else v["y"]
        wl, wi, bias, peep = get(W), get(R), get(B) if self.has_bias else v["bias"], get(P)
        wl_bytes, wi_bytes = wl.nbytes // d, wi.nbytes // d

        def launches(prims: dict[tuple[int, int], Any]) -> list[Callable[[], None]]:
            steps: list[Callable[[], None] | None] = []
            for k in range(d):
                order = self.chunks[::-1] if self.reverse[k] else self.chunks
                first, last = self._copies(ins, outs, states, k, len(order))
                steps.append(first)
                for j, (t0, c) in enumerate(order):
                    prim = prims[(c, k)]
                    y_at = y.ctypes.data + (k * self.y_dir + t0 * self.y_strides[0]) * 4 if self.slots[0] is not None \
                        else y.ctypes.data
                    args = [(ARG_SRC_LAYER, self.src[c], x.ctypes.data + t0 * self.x_strides[0] * 4),
                            (ARG_SRC_ITER, self.state, states[j % 2, 0].ctypes.data),
                            (ARG_WEIGHTS_LAYER, prim.md(api.Q_WEIGHTS_MD, 0), wl.ctypes.data + k * wl_bytes),
                            (ARG_WEIGHTS_ITER, prim.md(api.Q_WEIGHTS_MD, 1), wi.ctypes.data + k * wi_bytes),
                            (ARG_DST_LAYER, self.dst[c], y_at),
                            (ARG_DST_ITER, self.state, states[(j + 1) % 2, 0].ctypes.data)]
                    if self.spec.op == "LSTM":
                        args += [(ARG_SRC_ITER_C, self.state, states[j % 2, 1].ctypes.data),
                                 (ARG_DST_ITER_C, self.state, states[(j + 1) % 2, 1].ctypes.data)]
                    args.append((ARG_BIAS, self.bias, bias.ctypes.data + k * self.bias_rows * h * 4))
                    if peep is not None:
                        args.append((ARG_WEIGHTS_PEEPHOLE, self.peep, peep.ctypes.data + k * 3 * h * 4))
                    if prim.scratchpad_bytes:
                        args.append((ARG_SCRATCHPAD, prim.md(api.Q_SCRATCHPAD_MD), pad.ctypes.data))
                    steps.append(prim.launch([(a, api.Memory(md, at)) for a, md, at in args]))
                steps.append(last)
            if not self.has_bias:
                steps.insert(0, lambda: bias.fill(0))
            return [s for s in steps if s is not None]

        held = (ins, outs, scratch, x, y, wl, wi, bias, peep)  # what the primitives read and write by address
        if self.threads <= 1:  # no run has fewer threads: no lookup per launch
            return _Steps(launches(self.prims), held)
        if self.N * self.cell.gates * self.H * self.H < SMALL_STEP:
            return _one_thread(_Steps(launches(self.variant(1)), held))
        table = {self.threads: _Steps(launches(self.prims), held)}
        now = threads.openmp_now

        def run_variant() -> None:
            n = now()
            steps = table.get(n)
            if steps is None:
                steps = table[n] = _Steps(launches(self.variant(n)), held)
            steps()
        return run_variant

    def _copies(self, ins: list[Any], outs: list[Any], states: np.ndarray, k: int, chunks: int
                ) -> tuple[Callable[[], None], Callable[[], None] | None]:
        """(before direction k's chunks: its initial state into scratch; after: its final state out, or None)."""
        def state(a: np.ndarray | None) -> np.ndarray | None:  # [D, N, H] or [N, D, H] -> direction k's [N, H]
            return None if a is None else a[k] if self.layout == 0 else a[:, k]

        lstm = self.spec.op == "LSTM"
        h0 = state(ins[INITIAL_H] if len(ins) > INITIAL_H else None)
        c0 = state(ins[INITIAL_C] if lstm and len(ins) > INITIAL_C else None)
        start = [(states[0, 0], h0)] + ([(states[0, 1], c0)] if lstm else [])
        end = states[chunks % 2]
        finals = [(state(outs[s]), end[j]) for j, s in enumerate(self.slots[1:]) if s is not None]

        def first() -> None:
            for dst, src in start:
                if src is None:
                    dst.fill(0)
                else:
                    np.copyto(dst, src)

        def last() -> None:
            for dst, src in finals:
                np.copyto(dst, src)
        return first, last if finals else None


class _Steps:
    """A launch: its steps in order, holding the arrays their primitives read and write by address."""

    def __init__(self, steps: list[Callable[[], None]], held: tuple[Any, ...]) -> None:
        self.steps, self.held = steps, held

    def __call__(self) -> None:
        for step in self.steps:
            step()


def _one_thread(steps: _Steps) -> Callable[[], None]:
    """The launch of `steps` made for one thread, OpenMP held to one thread while they run (outside a run too:
    a primitive made for fewer threads than OpenMP gives it overruns its scratchpad)."""
    now = threads.openmp_now

    def run() -> None:
        if now() == 1:
            steps()
            return
        pools = [(p, p.get()) for p in threads.pools() if p.openmp]
        for pool, _ in pools:
            pool.set(1)
        try:
            steps()
        finally:
            for pool, n in pools:
                pool.set(n)
    return run


def _recreate(spec: NodeSpec, make: Callable[[tuple[int | str, ...]], Any], wdims: tuple[tuple[int, ...], ...],
              fmts: tuple[str, ...]) -> Any:
    """The primitive of a compiled node, reading weights stored in the formats `fmts`: given by name, else
    oneDNN's own choice if that is the same (some implementations take their formats only from "any")."""
    want = [api.Desc.make(dims, f) for dims, f in zip(wdims, fmts, strict=True)]
    for ask in (fmts, (api.TAG_ANY, api.TAG_ANY)):
        try:
            prim = make(ask)
        except CtxrtError:
            continue
        if all(prim.md(api.Q_WEIGHTS_MD, j) == w for j, w in enumerate(want)):
            return prim
    raise UnsupportedOpError(f"{spec.op} {spec.name!r}: oneDNN here does not read weights in the formats the context "
                             f"was compiled with ({', '.join(fmts)}): another CPU or oneDNN version; compile it again")
