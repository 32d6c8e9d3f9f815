"""A KV cache appended in place (docs/generate.md): `Tensor.window`, strided memory handles, the range program's
Concat writing only the new rows when its past and present are windows of one tensor, and the misuses refused."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import ctxrt
from ctxrt.backends.cpu.extents import _concat
from ctxrt.errors import RegistrationError, ShapeError

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
import decoders  # noqa: E402

LAYERS, DIM, HEADS = 2, 64, 4
RANGES = {"past_sequence": (0, 32), "sequence": (1, 4), "batch": (1, 1)}


@pytest.fixture(scope="module")
def session():
    path = decoders.gpt2_decoder("dynamo", layers=LAYERS, dim=DIM, heads=HEADS)
    with ctxrt.InferenceSession(path, dim_ranges=RANGES) as sess:
        yield sess


def _names() -> tuple[list[str], list[str]]:
    ins, outs = decoders.names(LAYERS)
    return ins[1:], outs[1:]


def _run(sess, ids: np.ndarray, pasts: dict, presents: dict) -> np.ndarray:
    b = sess.io_binding()
    b.bind_input("input_ids", ids)
    for name, t in pasts.items():
        b.bind_input(name, t)
    for name in [o.name for o in sess.get_outputs()]:
        b.bind_output(name, presents.get(name))
    sess.run_with_iobinding(b)
    return b.get_outputs()[0].numpy()


def test_windows_of_one_cache_give_the_loop_of_copies(session) -> None:
    """Pasts and presents bound as windows of one cache tensor per slot: the same logits as feeding arrays, the
    Concat counts only the new rows as written, and the cache holds every row."""
    pasts, presents = _names()
    feeds = decoders.empty_past(LAYERS, seq=3, dim=DIM, heads=HEADS)
    ref = session.run(None, feeds)
    cache = {p: ctxrt.Tensor.empty((1, HEADS, 16, DIM // HEADS), np.float32, session) for p in pasts}
    win = {p: cache[p].window(2, 0) for p in pasts}
    out = {o: cache[p].window(2, 3) for p, o in zip(pasts, presents, strict=True)}
    np.testing.assert_allclose(_run(session, feeds["input_ids"], win, out), ref[0], rtol=1e-5, atol=1e-5)
    before = dict(session.stats)
    ids = np.array([[7]], np.int64)
    ref2 = session.run(None, {"input_ids": ids, **dict(zip(pasts, ref[1:], strict=True))})
    win = {p: cache[p].window(2, 3) for p in pasts}
    out = {o: cache[p].window(2, 4) for p, o in zip(pasts, presents, strict=True)}
    np.testing.assert_allclose(_run(session, ids, win, out), ref2[0], rtol=1e-5, atol=1e-5)
    for p, want in zip(pasts, ref2[1:], strict=True):
        np.testing.assert_allclose(cache[p].numpy()[:, :, :4], want, rtol=1e-5, atol=1e-5)
    row = HEADS * (DIM // HEADS) * 4
    assert session.stats["kv_bytes_appended"] - before.get("kv_bytes_appended", 0) == len(pasts) * row
    assert session.stats["kv_bytes_kept_in_place"] - before.get("kv_bytes_kept_in_place", 0) == 3 * len(pasts) * row
    assert session.kv_appends() == dict(zip(pasts, presents, strict=True))
    for t in cache.values():
        t.destroy()
        assert not t.windows


def test_windows_that_are_not_a_past_and_its_present_are_refused(session) -> None:
    """A present window over another slot's past rows overlaps what the run reads: refused before anything runs."""
    pasts, presents = _names()
    feeds = decoders.empty_past(LAYERS, seq=2, dim=DIM, heads=HEADS)
    cache = {p: ctxrt.Tensor.empty((1, HEADS, 8, DIM // HEADS), np.float32, session) for p in pasts}
    win = {p: cache[p].window(2, 2) for p in pasts}
    out = {o: cache[p].window(2, 3) for p, o in zip(pasts, presents, strict=True)}
    out[presents[0]], out[presents[1]] = out[presents[1]], out[presents[0]]  # key and value swapped
    with pytest.raises(RegistrationError, match="overlapping"):
        _run(session, np.array([[1]], np.int64), win, out)
    del feeds
    for t in cache.values():
        t.destroy()


def test_window_arguments_and_fixed_programs(session, tmp_path) -> None:
    t = ctxrt.Tensor.empty((1, HEADS, 8, 16), np.float32, session)
    with pytest.raises(ShapeError, match="axis"):
        t.window(4, 1)
    with pytest.raises(ShapeError, match="length"):
        t.window(2, 9)
    with pytest.raises(ShapeError, match="of a window"):
        t.window(2, 4).window(2, 1)
    t.destroy()
    assert t.destroyed and not t.windows
    # a program of fixed shapes binds whole tensors only (its kernels are bound to addresses)
    path = decoders.gpt2_decoder("dynamo", layers=LAYERS, dim=DIM, heads=HEADS)
    feeds = decoders.empty_past(LAYERS, seq=2, dim=DIM, heads=HEADS)
    pasts, _ = _names()
    shape = (1, HEADS, 2, DIM // HEADS)
    feeds.update({p: np.zeros(shape, np.float32) for p in pasts})
    with ctxrt.compile(path, shapes={k: v.shape for k, v in feeds.items()}) as ctx:
        buf = ctx.backend.alloc_shared(HEADS * 8 * (DIM // HEADS) * 4, 64)
        h = ctx.mem_register(buf, 0, shape, np.float32, strides=(HEADS * 8 * 64, 8 * 64, 64, 4))
        assert h.strides is not None and h.span < buf.nbytes
        with pytest.raises(RegistrationError, match="strided window"):
            ctx.graph().execute({**feeds, pasts[0]: h})
        with pytest.raises(RegistrationError, match="overlap"):
            ctx.mem_register(buf, 0, shape, np.float32, strides=(64, 64, 64, 4))
        with pytest.raises(RegistrationError, match="out of bounds"):
            ctx.mem_register(buf, 64, (1, HEADS, 8, DIM // HEADS), np.float32, strides=(HEADS * 8 * 64, 8 * 64, 64, 4))
        ctx.mem_deregister(h)


def test_concat_appends_only_the_new_rows() -> None:
    """The Concat launch over a past that is the output's leading rows copies the new rows alone."""
    cache = np.zeros((2, 3, 10, 4), np.float32)
    past, out = cache[:, :, :6], cache[:, :, :7]
    past[...] = np.arange(past.size, dtype=np.float32).reshape(past.shape)
    new = np.full((2, 3, 1, 4), -1, np.float32)
    step = type("S", (), {"attrs": {"axis": 2}})()
    run = _concat(step, [past, new], [out])
    assert run.kept_bytes == past.nbytes and run.appended_bytes == new.nbytes
    run()
    np.testing.assert_array_equal(out, np.concatenate([np.arange(past.size, dtype=np.float32).reshape(past.shape),
                                                       new], axis=2))
    other = np.zeros((2, 3, 7, 4), np.float32)  # not in place: the whole concatenation
    full = _concat(step, [past, new], [other])
    assert not hasattr(full, "kept_bytes")
    full()
    np.testing.assert_array_equal(other, out)
