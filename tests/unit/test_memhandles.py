"""Memory handles (DESIGN.md §1, reference/004_*): registration rules, the multi-tensor shared buffer,
execution without copies, and re-recording only when a binding changes; on every backend."""

import numpy as np
import pytest
from harness import read, run_in_threads, write
from test_lifecycle import WANT, X, _model

import ctxrt
from ctxrt.errors import RegistrationError, ShapeError
from ctxrt.runtime.memhandle import MemHandle


@pytest.fixture
def ctx(backend):
    c = ctxrt.compile(_model(), io_mem_type="memhandle", backend=backend)
    yield c
    c.free()


def _io(ctx, buf, x_off=0, y_off=128):
    return ctx.mem_register(buf, x_off, (4, 8), np.float32), ctx.mem_register(buf, y_off, (4, 8), np.float32)


def test_one_buffer_per_tensor_runs_without_copies(ctx) -> None:
    be = ctx.backend
    xb, yb = be.alloc_shared(128, 64), be.alloc_shared(128, 64)
    x, y = ctx.mem_register(xb, 0, (4, 8), np.float32), ctx.mem_register(yb, 0, (4, 8), np.float32)
    write(be, be.view(xb, 0, (4, 8), np.float32), X)
    ctx.graph().execute({"x": x}, {"y": y})
    np.testing.assert_allclose(read(be, be.view(yb, 0, (4, 8), np.float32)), WANT, rtol=1e-5)
    assert ctx.stats["copies_in"] == ctx.stats["copies_out"] == 0
    assert ctx.stats["alloc_io_bytes"] == 0 and ctx.stats["lazy_allocs"] == 0


def test_multi_tensor_shared_buffer_with_handles_at_offsets(ctx) -> None:
    """One buffer, several tensors at packed offsets, each with its own handle (reference/004_* figure)."""
    be = ctx.backend
    buf = be.alloc_shared(3 * 128, 64)
    handles = [ctx.mem_register(buf, k * 128, (4, 8), np.float32) for k in range(3)]
    g = ctx.graph()
    for k in range(2):  # input at slot k, output at slot k + 1: the output of one run feeds the next
        if k == 0:
            write(be, be.view(buf, 0, (4, 8), np.float32), X)
        g.execute({"x": handles[k]}, {"y": handles[k + 1]})
    first = np.maximum(X @ _w(), 0) @ _w()
    np.testing.assert_allclose(read(be, be.view(buf, 128, (4, 8), np.float32)), first, rtol=1e-5)
    np.testing.assert_allclose(read(be, be.view(buf, 256, (4, 8), np.float32)), np.maximum(first @ _w(), 0) @ _w(),
                               rtol=1e-5)
    assert ctx.stats["copies_in"] == 0


def _w():
    return np.arange(1, 65, dtype=np.float32).reshape(8, 8)


def test_same_descriptor_returns_the_cached_handle(ctx) -> None:
    buf = ctx.backend.alloc_shared(256, 64)
    a = ctx.mem_register(buf, 0, (4, 8), np.float32)
    assert ctx.mem_register(buf, 0, [4, 8], "float32") is a
    assert ctx.mem_register(buf, 128, (4, 8), np.float32) is not a
    assert ctx.stats["mem_register_cached"] == 1 and ctx.stats["mem_handles_registered"] == 2


def test_registration_errors(ctx) -> None:
    be = ctx.backend
    buf = be.alloc_shared(256, 64)
    with pytest.raises(RegistrationError, match="out of bounds"):
        ctx.mem_register(buf, 200, (4, 8), np.float32)
    with pytest.raises(RegistrationError, match="misaligned"):
        ctx.mem_register(buf, 2, (4, 8), np.float32)
    with pytest.raises(RegistrationError, match="non-negative"):
        ctx.mem_register(buf, -4, (4, 8), np.float32)
    with pytest.raises(RegistrationError, match="not a dtype"):
        ctx.mem_register(buf, 0, (4, 8), "nonsense")
    with pytest.raises(RegistrationError, match="SharedBuffer"):
        ctx.mem_register(np.zeros(64, np.uint8), 0, (4, 8), np.float32)
    released = be.alloc_shared(256, 64)
    released.release()
    with pytest.raises(RegistrationError, match="released"):
        ctx.mem_register(released, 0, (4, 8), np.float32)


def test_handle_not_matching_the_graph_tensor(ctx) -> None:
    buf = ctx.backend.alloc_shared(512, 64)
    y = ctx.mem_register(buf, 256, (4, 8), np.float32)
    with pytest.raises(ShapeError, match=r"expects float32\[4, 8\], memory handle is float32\[8, 4\]"):
        ctx.graph().execute({"x": ctx.mem_register(buf, 0, (8, 4), np.float32)}, {"y": y})
    with pytest.raises(ShapeError, match="memory handle is float64"):
        ctx.graph().execute({"x": ctx.mem_register(buf, 0, (4, 8), np.float64)}, {"y": y})


def test_handle_of_another_context(ctx, backend) -> None:
    other = ctxrt.compile(_model(), io_mem_type="memhandle", backend=backend)
    try:
        buf = ctx.backend.alloc_shared(256, 64)
        theirs = other.mem_register(buf, 0, (4, 8), np.float32)
        mine = ctx.mem_register(buf, 128, (4, 8), np.float32)
        with pytest.raises(RegistrationError, match="another context"):
            ctx.graph().execute({"x": theirs}, {"y": mine})
        with pytest.raises(RegistrationError, match="another context"):
            ctx.mem_deregister(theirs)
    finally:
        other.free()


def test_deregistered_handle(ctx) -> None:
    buf = ctx.backend.alloc_shared(256, 64)
    x, y = _io(ctx, buf)
    ctx.mem_deregister(x)
    assert not x.registered
    with pytest.raises(RegistrationError, match="was deregistered"):
        ctx.graph().execute({"x": x}, {"y": y})
    with pytest.raises(RegistrationError, match="already deregistered"):
        ctx.mem_deregister(x)
    assert ctx.mem_register(buf, 0, (4, 8), np.float32) is not x  # a new handle, not the dead one


def test_buffer_with_registered_handles_cannot_be_freed(ctx) -> None:
    buf = ctx.backend.alloc_shared(256, 64)
    x, y = _io(ctx, buf)
    with pytest.raises(RegistrationError, match="still registered"):
        buf.release()
    ctx.mem_deregister(x)
    with pytest.raises(RegistrationError, match="still registered"):
        buf.release()
    ctx.mem_deregister(y)
    buf.release()
    assert buf.released


def test_free_deregisters_every_handle(backend) -> None:
    c = ctxrt.compile(_model(), backend=backend)
    buf = c.backend.alloc_shared(256, 64)
    x, y = _io(c, buf)
    c.free()
    assert not x.registered and not y.registered
    buf.release()


def test_io_buffer_cannot_be_a_spillfill_or_weights_buffer(backend) -> None:
    c = ctxrt.compile(_model(), defer_graph_init=True, backend=backend)
    try:
        buf = c.backend.alloc_shared(4096, 64)
        c.register_spillfill_buffer(buf)
        with pytest.raises(RegistrationError, match="registered as a spillfill buffer"):
            c.mem_register(buf, 0, (4, 8), np.float32)
    finally:
        c.free()
    c = ctxrt.compile(_model(), defer_graph_init=True, backend=backend)
    try:
        buf = c.backend.alloc_shared(4096, 64)
        c.mem_register(buf, 0, (4, 8), np.float32)
        with pytest.raises(RegistrationError, match="IO memory handles"):
            c.register_spillfill_buffer(buf)
    finally:
        c.free()


def test_recording_happens_only_when_a_binding_changes(backend) -> None:
    c = ctxrt.compile(_model(), backend=backend)  # raw: recorded once at finalize for the internal buffers
    try:
        g, be = c.graph(), c.backend
        assert c.stats["recordings"] == 1
        for _ in range(3):
            g.run({"x": X})
        assert c.stats["recordings"] == 1
        buf = be.alloc_shared(256, 64)
        x, y = _io(c, buf)
        write(be, be.view(buf, 0, (4, 8), np.float32), X)
        for _ in range(3):  # the same handles: recorded once, then replayed
            g.execute({"x": x}, {"y": y})
        assert c.stats["recordings"] == 2
        y2 = c.mem_register(buf, 192 - 64, (4, 8), np.float32)
        assert y2 is y  # same descriptor, same handle: still pinned
        g.execute({"x": x}, {"y": y2})
        assert c.stats["recordings"] == 2
        out = {"y": np.empty((4, 8), np.float32)}
        g.execute({"x": X}, out)  # back to raw: one more recording
        np.testing.assert_allclose(out["y"], WANT, rtol=1e-5)
        assert c.stats["recordings"] == 3
    finally:
        c.free()


def test_mixed_raw_input_and_handle_output(backend) -> None:
    c = ctxrt.compile(_model(), backend=backend)
    try:
        buf = c.backend.alloc_shared(128, 64)
        y = c.mem_register(buf, 0, (4, 8), np.float32)
        c.graph().execute({"x": X}, {"y": y})
        np.testing.assert_allclose(read(c.backend, c.backend.view(buf, 0, (4, 8), np.float32)), WANT, rtol=1e-5)
        assert (c.stats["copies_in"], c.stats["copies_out"]) == (1, 0)
    finally:
        c.free()


def test_register_and_execute_from_threads(ctx) -> None:
    """Each thread its own buffer and handles; the context lock serializes runs; every result is right."""
    be, g = ctx.backend, ctx.graph()
    def work(seed: int) -> None:
        x = np.random.default_rng(seed).standard_normal((4, 8)).astype(np.float32)
        buf = be.alloc_shared(256, 64)
        hx, hy = _io(ctx, buf)
        for _ in range(20):
            write(be, be.view(buf, 0, (4, 8), np.float32), x)
            g.execute({"x": hx}, {"y": hy})
            got = read(be, be.view(buf, 128, (4, 8), np.float32))
            np.testing.assert_allclose(got, np.maximum(x @ _w(), 0) @ _w(), rtol=1e-5)

    run_in_threads(work, 4)
    assert isinstance(_io(ctx, be.alloc_shared(256, 64))[0], MemHandle)


def test_output_overlapping_another_io_tensor_is_refused(ctx) -> None:
    buf = ctx.backend.alloc_shared(512, 64)
    x = ctx.mem_register(buf, 0, (4, 8), np.float32)
    with pytest.raises(RegistrationError, match="overlapping bytes"):
        ctx.graph().execute({"x": x}, {"y": x})  # in place: the second MatMul would read its own output
    with pytest.raises(RegistrationError, match="overlapping bytes"):
        ctx.graph().execute({"x": x}, {"y": ctx.mem_register(buf, 64, (4, 8), np.float32)})
    ctx.graph().execute({"x": x}, {"y": ctx.mem_register(buf, 128, (4, 8), np.float32)})  # adjacent: fine
