"""The three cells on the machinery of recurrent.py: RNN, GRU and LSTM. Each `cell` returns its per-step
launch (gates in place on the gate-major scratch), what else padded steps must carry, and its final states."""

from __future__ import annotations

import numpy as np

from ctxrt.backends.cpu.rnn import rnn_onednn
from ctxrt.backends.cpu.rnn.recurrent import INITIAL_C, B, P, R, Recurrent, Scratch
from ctxrt.backends.kernel import Kernel, KernelFactory, NodeSpec
from ctxrt.errors import CtxrtError, UnsupportedOpError


def _no_carry(s: int, invalid: np.ndarray) -> None:
    pass


class RNN(Recurrent):
    """Ht = f(Xt·Wᵀ + Ht-1·Rᵀ + Wb + Rb)."""

    def cell(self, ins, v, xs, prev, hs):
        g, tmp = v["gates"], v["tmp"]
        rt, gt = self.recurrence(ins[R]), g.transpose(1, 0, 2, 3)
        hp4 = [a[:, None] for a in prev]
        clip = self.clipper()
        groups = [(g[0, gs], tmp[0, gs], self.acts[gs.start][0], [a[gs] for a in hs]) for gs in self.groups]

        def step(s: int) -> None:
            np.matmul(hp4[s], rt, out=gt)
            np.add(g, xs[s], out=g)
            clip(g)
            for gg, tg, f, hcs in groups:
                f(gg, hcs[s], tg)
        return step, _no_carry, []


class GRU(Recurrent):
    """Gates z, r, h: zt = f(.z), rt = f(.r), ht = g(Xt·Whᵀ + (rt ⊙ Ht-1)·Rhᵀ + Rbh + Wbh), or with
    linear_before_reset g(Xt·Whᵀ + rt ⊙ (Ht-1·Rhᵀ + Rbh) + Wbh); Ht = ht + zt ⊙ (Ht-1 - ht)."""

    GATES = 3
    DEFAULTS = ("Sigmoid", "Tanh")

    def __init__(self, spec: NodeSpec) -> None:
        self.lbr = int(spec.attr("linear_before_reset", 0))
        if self.lbr not in (0, 1):
            raise UnsupportedOpError(f"GRU node {spec.name!r}: attribute 'linear_before_reset' value {self.lbr} "
                                     "is not supported")
        super().__init__(spec)

    def declare(self, plan: Scratch) -> None:
        plan.add("hr", (self.GATES if self.lbr else 1, self.D, self.N, self.H), self.dt)

    def bias_sum(self, b: np.ndarray) -> np.ndarray:
        out = super().bias_sum(b)
        if self.lbr:  # Rbh is added to Ht-1·Rhᵀ before the reset gate scales it
            out[2] = b[:, 2 * self.H:3 * self.H]
        return out

    def bias_at_run(self, b: np.ndarray, out: np.ndarray) -> None:
        super().bias_at_run(b, out)
        if self.lbr:
            np.copyto(out[2], b[:, 2 * self.H:3 * self.H])

    def cell(self, ins, v, xs, prev, hs):
        h = self.H
        g, tmp, hr = v["gates"], v["tmp"], v["hr"]
        zr, z, r, hh, t = g[:2], g[0], g[1], g[2], tmp[0]
        rt, gt = self.recurrence(ins[R]), g.transpose(1, 0, 2, 3)
        hp4 = [a[:, None] for a in prev]
        clip = self.clipper()
        # per group: (z r, h~, scratch for them, f, g, Ht-1 per step, Ht per step)
        groups = [(zr[:, gs], hh[gs], tmp[:2, gs], t[gs], *self.acts[gs.start], [a[gs] for a in prev],
                   [a[gs] for a in hs]) for gs in self.groups]
        xzr, xh = [a[:2] for a in xs], [a[2] for a in xs]
        b = ins[B] if len(ins) > B else None
        if self.lbr:
            hrt = hr.transpose(1, 0, 2, 3)
            rbh = None if b is None else b[:, None, 5 * h:6 * h]

            def gates(s: int) -> None:
                np.matmul(hp4[s], rt, out=hrt)
                np.add(hr[:2], xzr[s], out=zr)
                clip(zr)
                if rbh is not None:
                    np.add(hr[2], rbh, out=hr[2])
                for gzr, _, tzr, _, f, _, _, _ in groups:
                    f(gzr, gzr, tzr)
                np.multiply(hr[2], r, out=hh)
                np.add(hh, xh[s], out=hh)
        else:
            rzt, rht, zrt = rt[:, :2], rt[:, 2], gt[:, :2]

            def gates(s: int) -> None:
                np.matmul(hp4[s], rzt, out=zrt)
                np.add(zr, xzr[s], out=zr)
                clip(zr)
                for gzr, _, tzr, _, f, _, _, _ in groups:
                    f(gzr, gzr, tzr)
                np.multiply(r, prev[s], out=t)
                np.matmul(t, rht, out=hr[0])
                np.add(hr[0], xh[s], out=hh)

        def step(s: int) -> None:
            gates(s)
            clip(hh)
            for _, ghh, _, th, _, gact, hps, _ in groups:
                gact(ghh, ghh, th)
                np.subtract(hps[s], ghh, out=th)
            np.multiply(t, z, out=t)
            for _, ghh, _, th, _, _, _, hcs in groups:
                np.add(ghh, th, out=hcs[s])
        return step, _no_carry, []


class LSTM(Recurrent):
    """Gates i, o, f, c: it = f(.i + Pi ⊙ Ct-1), ft = f(.f + Pf ⊙ Ct-1) (1 - it with input_forget),
    ct = g(.c), Ct = ft ⊙ Ct-1 + it ⊙ ct, ot = f(.o + Po ⊙ Ct), Ht = ot ⊙ h(Ct); clip on each gate's input."""

    GATES = 4
    DEFAULTS = ("Sigmoid", "Tanh", "Tanh")
    SLOTS = 3

    def __init__(self, spec: NodeSpec) -> None:
        self.input_forget = int(spec.attr("input_forget", 0))
        if self.input_forget not in (0, 1):
            raise UnsupportedOpError(f"LSTM node {spec.name!r}: attribute 'input_forget' value "
                                     f"{self.input_forget} is not supported")
        super().__init__(spec)

    def declare(self, plan: Scratch) -> None:
        plan.add("c", (2, self.D, self.N, self.H), self.dt)

    def cell(self, ins, v, xs, prev_h, hs):
        h = self.H
        g, tmp = v["gates"], v["tmp"]
        rt, gt = self.recurrence(ins[R]), g.transpose(1, 0, 2, 3)
        hp4 = [a[:, None] for a in prev_h]
        c0 = self.time_major(ins[INITIAL_C] if len(ins) > INITIAL_C else None, False)
        cs = [v["c"][s % 2] for s in range(self.T)]
        prev_c = [np.zeros((self.D, self.N, h), self.dt) if c0 is None else c0] + cs[:-1]
        p = ins[P] if len(ins) > P else None
        peep = None if p is None else [p[:, None, k * h:(k + 1) * h] for k in range(3)]
        clip = self.clipper()
        forget = self.input_forget

        def group(gs: slice) -> tuple:
            pw = None if peep is None else [a[gs] for a in peep]
            return (g[0, gs], g[1, gs], g[2, gs], g[3, gs], g[:3, gs], tmp[:3, gs], tmp[0, gs], *self.acts[gs.start],
                    pw, [a[gs] for a in prev_c], [a[gs] for a in cs], [a[gs] for a in hs])
        groups = [group(gs) for gs in self.groups]

        def step(s: int) -> None:
            np.matmul(hp4[s], rt, out=gt)
            np.add(g, xs[s], out=g)
            if peep is None:
                clip(g)
            for gi, go, gf, gc, iof, t3, th, fa, ga, ha, pw, cps, ccs, hcs in groups:
                cp, cc = cps[s], ccs[s]
                if pw is None:
                    fa(iof, iof, t3)
                else:  # the peepholes feed Ct-1 into i and f before their clip and activation
                    for gate, w in ((gi, pw[0]), (gf, pw[2])):
                        np.multiply(cp, w, out=th)
                        np.add(gate, th, out=gate)
                    for gate in (gi, gf, gc):
                        clip(gate)
                    fa(gi, gi, th)
                    fa(gf, gf, th)
                if forget:
                    np.subtract(1, gi, out=gf)
                ga(gc, gc, th)
                np.multiply(gf, cp, out=cc)
                np.multiply(gi, gc, out=gi)
                np.add(cc, gi, out=cc)
                if pw is not None:  # and Ct into o
                    np.multiply(cc, pw[1], out=th)
                    np.add(go, th, out=go)
                    clip(go)
                    fa(go, go, th)
                ha(cc, gc, th)
                np.multiply(go, gc, out=hcs[s])

        def carry(s: int, invalid: np.ndarray) -> None:
            np.copyto(cs[s], prev_c[s], where=invalid)

        k = self.out_slot[2]
        return step, carry, [] if k is None else [(k, cs[-1])]


def _fused_or(cells: type[Recurrent]) -> KernelFactory:
    """oneDNN's fused primitive where it computes the node (or the node was compiled for it), else the NumPy cell."""
    def factory(spec: NodeSpec) -> Kernel:
        from ctxrt.backends.cpu.rnn import rnn_native

        if spec.attr(rnn_onednn.PACKED):
            return rnn_onednn.FusedRecurrent(spec)
        if spec.attr(rnn_native.MARK) == "native" or spec.attr(rnn_native.MARK) is None and rnn_native.usable(spec):
            return rnn_native.kernel(spec)
        if rnn_onednn.refusal(spec) is None:
            try:
                return rnn_onednn.FusedRecurrent(spec)
            except CtxrtError:
                pass  # a combination this oneDNN does not implement
        return cells(spec)
    return factory


KERNELS = {"RNN": _fused_or(RNN), "GRU": _fused_or(GRU), "LSTM": _fused_or(LSTM)}
