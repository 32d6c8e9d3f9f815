"""com.microsoft GroupQueryAttention on the CPU, as onnxruntime's CPU kernel computes it.

Inputs: query (B, S, num_heads * H), or packed QKV (B, S, (num_heads + 2 kv_num_heads) * H) when key and value
are absent; past_key/past_value (B, kv_num_heads, P, H) or absent; seqlens_k (B,) int32 (each sequence's total
length - 1); total_sequence_length (int32 scalar); cos_cache/sin_cache (max positions, rotary dim / 2) when
do_rotary; head_sink (num_heads,). Outputs: attention (B, S, num_heads * H) and present_key/present_value in BNSH.

The step is the first prompt when S == total_sequence_length: every sequence starts at position 0 and row s
attends to columns [0, min(s + 1, T)) (T = seqlens_k[b] + 1; rows past T are padding). Otherwise sequence b
has past = T - S tokens before these (S > 1 only for batch 1, as in onnxruntime). Present rows [0, past) are
copied from the past (the rest of a longer past buffer, onnxruntime-genai's shared buffer, is not read), rows
[past, past + S) are the new keys and values (keys rotated at positions past, past + 1, ...), later rows are
zero. Present is planned at P + S rows (at P for a past named in the compile's `kv_shared`: the shared buffer of
the context's length); its real length, max(total_sequence_length, P), is the node's extra output
(ir/dynamic.py). When past and present are one buffer (bound so by ctxrt.Generator, as onnxruntime-genai's
past_present_share_buffer), only the new rows are written: the KV cache is updated in place. Scores are scaled
(default 1/sqrt(H)), soft-capped (softcap * tanh(x / softcap)), limited to the last local_window_size positions,
and softmaxed with exp(head_sink) (or 1, smooth_softmax) added
to the denominator. Each block of kv heads is one batched GEMM per product; scratch holds one block's scores.
Steps of up to NATIVE_TOKENS new tokens (a generation's) run the native kernel instead (csrc/genai.c, where it was
built): rotation, the cache update and every head's attention in one call, heads shared among the threads of ctxrt's
pool (csrc/pool.c).
"""

from __future__ import annotations

import ctypes
import math
from typing import Any

import numpy as np

from ctxrt.backends.cpu import native, threads
from ctxrt.backends.cpu.genai.rotary import rotate
from ctxrt.backends.kernel import Kernel, Launch, NodeSpec, scratch_view
from ctxrt.errors import ShapeError, UnsupportedOpError

NATIVE_TOKENS = 16  # new tokens up to which the native kernel runs (a prompt's batched GEMMs are faster in NumPy)
_SCORES_BYTES = 1 << 25  # kv heads are taken in blocks whose scores fit this many bytes
_F32 = np.dtype(np.float32)
_UNSUPPORTED_INPUTS = {9: "position_ids", 10: "attention_bias", 12: "k_scale", 13: "v_scale", 14: "q_norm_weight",
                       15: "k_norm_weight", 16: "query_seqlens"}


def _fail(spec: NodeSpec, what: str) -> UnsupportedOpError:
    return UnsupportedOpError(f"GroupQueryAttention node {spec.name!r}: {what} is not supported")


class GroupQueryAttention(Kernel):
    def __init__(self, spec: NodeSpec) -> None:
        ins = list(spec.inputs) + [None] * (17 - len(spec.inputs))
        self.name = spec.name
        q = ins[0]
        self.n, self.kv = int(spec.attr("num_heads", 0)), int(spec.attr("kv_num_heads", 0))
        if self.n <= 0 or self.kv <= 0 or self.n % self.kv:
            raise _fail(spec, f"num_heads={self.n} with kv_num_heads={self.kv} (a multiple is needed)")
        for k, what in _UNSUPPORTED_INPUTS.items():
            if ins[k] is not None:
                raise _fail(spec, f"input {what}")
        for key, ok in (("causal", 1), ("qk_output", 0), ("sliding_window_cache", 0)):
            if int(spec.attr(key, ok)) != ok:
                raise _fail(spec, f"attribute {key}={spec.attr(key)}")
        for key in ("k_quant_type", "v_quant_type"):
            if spec.attr(key, "NONE") not in ("NONE", ""):
                raise _fail(spec, f"attribute {key}={spec.attr(key)!r} (a quantized cache)")
        if len(spec.outputs) != 4:  # output, present key, present value, their real length
            raise _fail(spec, "output output_qk")
        dts = {np.dtype(t.dtype) for k, t in enumerate(ins[:12]) if t is not None and k not in (5, 6)}
        if dts != {_F32}:
            raise _fail(spec, f"dtypes {sorted(str(d) for d in dts)} (float32 only)")
        self.packed = ins[1] is None
        if (ins[1] is None) != (ins[2] is None) or (ins[3] is None) != (ins[4] is None) or len(q.shape) != 3:
            raise _fail(spec, "query of rank other than 3, or only one of key/value (past_key/past_value)")
        self.b, self.s, d = q.shape
        self.heads = self.n + 2 * self.kv if self.packed else self.n
        self.h = d // self.heads
        if d % self.heads:
            raise _fail(spec, f"query width {d} for {self.heads} heads")
        for t in ins[1:3]:
            if t is not None and t.shape != (self.b, self.s, self.kv * self.h):
                raise _fail(spec, f"key/value of shape {list(t.shape)} for query {list(q.shape)}")
        self.past = ins[3].shape[2] if ins[3] is not None else 0
        for t in ins[3:5]:
            if t is not None and t.shape != (self.b, self.kv, self.past, self.h):
                raise _fail(spec, f"past key/value of shape {list(t.shape)}")
        self.rows = spec.outputs[1].shape[2]  # past + S: the planned present length
        self.half = 0
        if int(spec.attr("do_rotary", 0)):
            cos, sin = ins[7], ins[8]
            if cos is None or sin is None or len(cos.shape) != 2 or sin.shape != cos.shape or 2 * cos.shape[1] > self.h:
                raise _fail(spec, "do_rotary=1 without cos_cache and sin_cache of shape (positions, <= head size / 2)")
            self.half, self.positions = cos.shape[1], cos.shape[0]
        self.interleaved = bool(spec.attr("rotary_interleaved", 0))
        self.scale = float(spec.attr("scale", 0.0)) or 1.0 / math.sqrt(self.h)
        self.softcap = float(spec.attr("softcap", 0.0))
        self.window = int(spec.attr("local_window_size", -1))
        self.sink = ins[11] is not None or bool(int(spec.attr("smooth_softmax", 0)))
        if ins[11] is not None and int(np.prod(ins[11].shape)) != self.n:
            raise _fail(spec, f"head_sink of shape {list(ins[11].shape)}")
        self.group = self.n // self.kv
        per_head = self.group * self.s * self.rows * 4
        self.block = max(1, min(self.kv, _SCORES_BYTES // max(per_head, 1)))
        rows = self.block * self.group * self.s
        self.scratch = (self.n * self.s * self.h * 4, rows * self.rows * 4, self.s * self.rows, self.s * self.rows,
                        rows * 4, rows * 4, rows * self.h * 4, self.n * self.s * max(self.half, 1) * 4,
                        2 * self.s * 8)
        # the native kernel's work (a row of scores and a query per thread) is in every shape's scratch, whether
        # the extension is built or not: a range program's token steps fit the scratch planned at its upper
        # bound (a prompt window), and a binary compiled without it loads where it is built
        self.lib = native.library() if self.s <= NATIVE_TOKENS else None
        self.scratch += (native.gqa_work_bytes(self.rows, self.h),)
        self.columns = np.arange(self.rows, dtype=np.int64)
        self.steps = np.arange(self.s, dtype=np.int64)
        self.zero_sinks = np.zeros(self.n, _F32)

    def starts(self, seqlens: np.ndarray, total: np.ndarray) -> tuple[int, list[tuple[int, int]]]:
        """The present's real length, and each sequence's (first new position, columns) at this step's
        seqlens_k and total_sequence_length; a ShapeError where they do not fit the step."""
        s_, b_, half = self.s, self.b, self.half
        total_len = int(total[0])
        length = max(total_len, self.past)
        first = s_ == total_len
        if length > self.rows or (not first and s_ > 1 and b_ > 1):
            raise ShapeError(f"GroupQueryAttention node {self.name!r}: total_sequence_length {total_len} with "
                             f"{s_} new tokens, past length {self.past} and batch {b_}")
        at = []
        for b in range(b_):
            total_b = int(seqlens[b]) + 1
            start = 0 if first else total_b - s_
            if not (0 <= start <= self.past and 0 < total_b <= start + s_ <= length) or (
                    half and start + s_ > self.positions):
                raise ShapeError(f"GroupQueryAttention node {self.name!r}: seqlens_k[{b}] = {total_b - 1} with "
                                 f"{s_} new tokens, total_sequence_length {total_len} and past length "
                                 f"{self.past}" + (f" ({self.positions} rotary positions)" if half else ""))
            at.append((start, total_b))
        return length, at

    def bind(self, ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch:
        ins = list(ins) + [None] * (12 - len(ins))
        if self.lib is not None:
            launch = self._native(ins, outs, scratch)
            if launch is not None:
                return launch
        b_, s_, n, kv, h, g = self.b, self.s, self.n, self.kv, self.h, self.group
        qkv = ins[0].reshape(b_, s_, self.heads, h)
        q_src = qkv[:, :, :n]
        k_src = qkv[:, :, n:n + kv] if self.packed else ins[1].reshape(b_, s_, kv, h)
        v_src = qkv[:, :, n + kv:] if self.packed else ins[2].reshape(b_, s_, kv, h)
        past_k, past_v, seqlens, total = ins[3], ins[4], ins[5].reshape(-1), ins[6].reshape(-1)
        cos, sin = ins[7], ins[8]
        sinks = (ins[11].reshape(n) if ins[11] is not None else self.zero_sinks) if self.sink else None
        out, present_k, present_v, extent = outs
        out4 = out.reshape(b_, s_, n, h)
        qb = scratch_view(scratch[0], (n, s_, h), _F32)
        scores, ob = scratch[1].view(_F32), scratch[6].view(_F32)
        banned_buf, other_buf = scratch[2].view(np.bool_), scratch[3].view(np.bool_)
        mx_buf, den_buf = scratch[4].view(_F32), scratch[5].view(_F32)
        tmp_buf = scratch[7].view(_F32)
        ends, starts = (scratch_view(scratch[8], (2, s_), np.int64)[k][:, None] for k in (0, 1))
        half, interleaved, scale, softcap, window = self.half, self.interleaved, self.scale, self.softcap, self.window

        shared = _same_memory(past_k, present_k) and _same_memory(past_v, present_v)

        def fill(present: np.ndarray, past: np.ndarray | None, new: np.ndarray, b: int, start: int, rotary: bool
                 ) -> None:
            """Present rows of sequence b: past [0, start), new tokens [start, start + S), zeros after."""
            dst = present[b]
            _keep_past(present, past, b, start, s_, shared)
            rows = dst[:, start:start + s_]
            if rotary:
                tmp = tmp_buf[:kv * s_ * half].reshape(kv, s_, half)
                rotate(new[b].transpose(1, 0, 2), rows, cos[None, start:start + s_, :half],
                       sin[None, start:start + s_, :half], tmp, half, interleaved)
            else:
                np.copyto(rows, new[b].transpose(1, 0, 2))

        def attend(b: int, start: int, total_b: int) -> None:
            q = q_src[b].transpose(1, 0, 2)
            if half:
                tmp = tmp_buf[:n * s_ * half].reshape(n, s_, half)
                rotate(q, qb, cos[None, start:start + s_, :half], sin[None, start:start + s_, :half], tmp, half,
                       interleaved)
            else:
                np.copyto(qb, q)
            # row s sees columns [max(0, end - window), min(end, T)), end = start + s + 1 (a padding row of a
            # first prompt past its window sees none: zeros, as onnxruntime)
            np.add(self.steps[:, None], start + 1, out=ends)
            if window > 0:
                np.subtract(ends, window, out=starts)
                np.maximum(starts, 0, out=starts)
            else:
                starts.fill(0)
            np.minimum(ends, total_b, out=ends)
            cols = self.columns[:total_b]
            banned = banned_buf[:s_ * total_b].reshape(s_, total_b)
            other = other_buf[:s_ * total_b].reshape(s_, total_b)
            np.less(cols, starts, out=banned)
            np.greater_equal(cols, ends, out=other)
            np.logical_or(banned, other, out=banned)
            for g0 in range(0, kv, self.block):
                m = min(kv, g0 + self.block) - g0
                rows = m * g * s_
                sc = scores[:rows * total_b].reshape(m, g * s_, total_b)
                np.matmul(qb[g0 * g:(g0 + m) * g].reshape(m, g * s_, h),
                          present_k[b, g0:g0 + m, :total_b].transpose(0, 2, 1), out=sc)
                np.multiply(sc, scale, out=sc)
                if softcap > 0:
                    np.multiply(sc, 1.0 / softcap, out=sc)
                    np.tanh(sc, out=sc)
                    np.multiply(sc, softcap, out=sc)
                np.copyto(sc.reshape(m, g, s_, total_b), -np.inf, where=banned)
                mx, den = mx_buf[:rows].reshape(m, g * s_, 1), den_buf[:rows].reshape(m, g * s_, 1)
                np.max(sc, axis=2, keepdims=True, out=mx)
                if window > 0:  # rows with no column: exp(-inf) everywhere, divided by a tiny sum, not 0
                    np.maximum(mx, np.finfo(_F32).min, out=mx)
                np.subtract(sc, mx, out=sc)
                np.exp(sc, out=sc)
                np.sum(sc, axis=2, keepdims=True, out=den)
                if sinks is not None:  # + exp(sink - max)
                    mx4 = mx.reshape(m, g, s_, 1)
                    np.subtract(sinks[g0 * g:(g0 + m) * g].reshape(m, g, 1, 1), mx4, out=mx4)
                    np.exp(mx4, out=mx4)
                    np.add(den, mx, out=den)
                if window > 0:
                    np.maximum(den, np.finfo(_F32).tiny, out=den)
                np.divide(sc, den, out=sc)
                o = ob[:rows * h].reshape(m, g * s_, h)
                np.matmul(sc, present_v[b, g0:g0 + m, :total_b], out=o)
                np.copyto(out4[b, :, g0 * g:(g0 + m) * g], o.reshape(m * g, s_, h).transpose(1, 0, 2))

        def run() -> None:
            length, at = self.starts(seqlens, total)
            for b, (start, total_b) in enumerate(at):
                fill(present_k, past_k, k_src, b, start, bool(half))
                fill(present_v, past_v, v_src, b, start, False)
                attend(b, start, total_b)
            extent[...] = length
        return run

    def _native(self, ins: list[Any], outs: list[Any], scratch: list[Any]) -> Launch | None:
        """The launch running csrc/genai.c's kernel (None where a tensor is not contiguous): its arguments one
        struct, made here; per sequence only the positions and pointers change."""
        n, kv, h = self.n, self.kv, self.h
        # every array the struct points to, kept alive by the launch (scratch too: a caller's may be its own)
        arrays = [ins[0], *outs[:3], scratch[-1]] + [t for t in ins[1:3] + ins[7:9] + ins[11:12] if t is not None]
        if not all(t.flags.c_contiguous for t in arrays):
            return None
        f = 4  # bytes of a float32
        q0 = ins[0].ctypes.data
        if self.packed:
            q_stride = kv_stride = self.heads * h
            k0, v0 = q0 + n * h * f, q0 + (n + kv) * h * f
        else:
            q_stride, kv_stride = n * h, kv * h
            k0, v0 = ins[1].ctypes.data, ins[2].ctypes.data
        q_step, kv_step = self.s * q_stride * f, self.s * kv_stride * f
        out, present_k, present_v = outs[0], outs[1], outs[2]
        cache_step = kv * self.rows * h * f
        args = native.GqaArgs(s=self.s, n=n, kv=kv, h=h, rows=self.rows, window=self.window, half=self.half,
                              interleaved=int(self.interleaved), q_stride=q_stride, kv_stride=kv_stride,
                              cos=native.address(ins[7]) if self.half else None,
                              sin=native.address(ins[8]) if self.half else None,
                              sinks=native.address(ins[11]) if self.sink else None, sink=int(self.sink),
                              out_stride=n * h, scale=self.scale, softcap=self.softcap,
                              work=scratch[-1].ctypes.data)
        ref, fn, now = ctypes.byref(args), self.lib.ctxrt_gqa, threads.idle_now
        pk, pv, o0, o_step = present_k.ctypes.data, present_v.ctypes.data, out.ctypes.data, self.s * n * h * f

        seqlens, total, extent, s_ = ins[5].reshape(-1), ins[6].reshape(-1), outs[3], self.s
        past_k, past_v = ins[3], ins[4]
        shared = _same_memory(past_k, present_k) and _same_memory(past_v, present_v)

        def run(_keep: Any = arrays) -> None:
            length, at = self.starts(seqlens, total)
            args.threads = min(now() or 1, native.MAX_THREADS)
            for b, (start, total_b) in enumerate(at):
                if not shared:
                    _keep_past(present_k, past_k, b, start, s_, shared)
                    _keep_past(present_v, past_v, b, start, s_, shared)
                args.start, args.total = start, total_b
                args.q, args.k_new, args.v_new = q0 + b * q_step, k0 + b * kv_step, v0 + b * kv_step
                args.present_k, args.present_v, args.out = pk + b * cache_step, pv + b * cache_step, o0 + b * o_step
                fn(ref)
            extent[...] = length
        return run


def _keep_past(present: np.ndarray, past: np.ndarray | None, b: int, start: int, s_: int, shared: bool) -> None:
    """Present rows of sequence b but the s_ new ones: past [0, start), zeros after (nothing to do where past and
    present are one buffer: onnxruntime-genai's shared buffer, bound to both)."""
    if not shared:
        if start:
            np.copyto(present[b, :, :start], past[b, :, :start])
        present[b, :, start + s_:].fill(0)


def _same_memory(past: np.ndarray | None, present: np.ndarray) -> bool:
    """Whether a past input and a present output are one buffer (bound so by onnxruntime-genai's shared buffer
    and ctxrt's Generator): the same address and shape."""
    return past is not None and past.shape == present.shape and \
        past.__array_interface__["data"][0] == present.__array_interface__["data"][0]


def group_query_attention(spec: NodeSpec) -> Kernel:
    return GroupQueryAttention(spec)


KERNELS = {"com.microsoft.GroupQueryAttention": group_query_attention}
