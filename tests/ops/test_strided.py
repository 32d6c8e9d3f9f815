"""csrc/strided.c through backends/cpu/strided.py: copies of transposed, sliced (negative steps too) and broadcast
views, float32 arithmetic with NumPy's broadcasting, Where, in place, against NumPy's bytes; a batch of native
launches runs them in order, and a failing one raises its own error."""

from __future__ import annotations

import numpy as np
import pytest

from ctxrt.backends.cpu import native, strided

needs_native = pytest.mark.skipif(native.library() is None, reason="the native extension is not built here")
RNG = np.random.default_rng(7)


def _native(launch) -> bool:
    return strided.natives(launch, None) is not None


def _run(launch) -> None:
    """The launch's native calls (a launch called alone runs NumPy's code: see strided._Ew)."""
    assert _native(launch)
    batch = strided.Batch([launch])
    batch()


@needs_native
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.float16, np.uint8, np.bool_])
def test_copies_of_views(dtype) -> None:
    x = (RNG.standard_normal((2, 3, 4, 5)) * 10).astype(dtype)
    views = [x.transpose(0, 2, 1, 3), x.transpose(3, 1, 0, 2), x[:, 1:, ::2, ::-1], x[::-1, :, 3:0:-2],
             x[:, :1], np.broadcast_to(x[:, :1, :, :1], (2, 3, 4, 5)), x]
    for v in views:
        y = np.zeros(v.shape, dtype)
        launch = strided.copy(y, v)
        assert _native(launch)
        _run(launch)
        np.testing.assert_array_equal(y, v)


@needs_native
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int64, np.uint8])
def test_large_transposing_copies_in_tiles(dtype) -> None:
    """From strided.TRANSPOSE_MIN elements a transposing copy (SegFormer's (C, HW) -> (HW, C)) runs csrc/strided.c's
    tiled copy even alone (rows and columns not multiples of a tile, batch dims around it, 1-, 2- and 8-byte
    elements go through the row loop); a broadcast source of another rank (Expand of a scalar or a row, torch's
    causal mask) is no transposition: NumPy's bytes either way, alone and in a batch."""
    x = (RNG.standard_normal((3, 131, 257)) * 100).astype(dtype)
    views = [x.transpose(0, 2, 1), x.transpose(2, 1, 0), x.transpose(1, 0, 2)[:, :, ::2], x[0].T,
             np.broadcast_to(x[0, :1], (300, 257)), np.broadcast_to(x[0, 0, 0], (200, 100)),
             np.broadcast_to(x[0, :, :1], (131, 300))]
    pairs = [(v.shape, v) for v in views] + [((300, 257), x[0, 0]), ((200, 100), x[0, 0, 0].copy()),
                                             ((2, 131, 257), x[0])]  # (sources of fewer dims, broadcast)
    for shape, v in pairs:
        for alone in (True, False):
            y = np.zeros(shape, dtype)
            launch = strided.copy(y, v)
            launch() if alone else _run(launch)
            np.testing.assert_array_equal(y, np.broadcast_to(v, shape))


@needs_native
@pytest.mark.parametrize("f", [np.add, np.subtract, np.multiply, np.divide])
@pytest.mark.parametrize("shapes", [((), ()), ((1, 1), (1,)), ((2, 3, 4), (2, 3, 4)), ((2, 3, 4), (4,)),
                                    ((2, 3, 4), (3, 1)), ((1, 4), (3, 1)), ((2, 1, 4, 1), (1, 3, 1, 5)), ((5,), ()),
                                    ((), (7,)),
                                    ((1, 2, 1, 3, 1, 2, 1, 2), (2, 1, 2, 1, 2, 1, 2, 1))])
def test_arithmetic_broadcasts_as_numpy(f, shapes) -> None:
    a = RNG.standard_normal(shapes[0]).astype(np.float32)
    b = RNG.standard_normal(shapes[1]).astype(np.float32)
    b[b == 0] = 1
    want = f(a, b)
    y = np.empty(want.shape, np.float32)
    launch = strided.ufunc(f, y, a, b)
    _run(launch) if _native(launch) else launch()
    np.testing.assert_array_equal(y, want)
    # rank 8 with no mergeable dims would pass csrc/strided.h's EW_RANK: NumPy's launch then
    assert _native(launch) == (len(shapes[0]) < 8)


@needs_native
def test_in_place_and_special_values() -> None:
    a = np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, 1e38, 3.0], np.float32)
    b = np.array([np.inf, 1.0, 2.0, -0.0, 0.0, 1e38, 0.0], np.float32)
    with np.errstate(all="ignore"):
        for f in (np.add, np.subtract, np.multiply, np.divide):
            want = f(a, b)
            y = a.copy()
            launch = strided.ufunc(f, y, y, b)  # in place on the first operand
            _run(launch)
            np.testing.assert_array_equal(y.view(np.uint32), want.view(np.uint32))
    y = a.copy()
    _run(strided.ufunc(np.negative, y, y))
    np.testing.assert_array_equal(y.view(np.uint32), (-a).view(np.uint32))


@needs_native
def test_overlap_other_than_element_for_element_falls_back() -> None:
    x = np.arange(12, dtype=np.float32)
    launch = strided.copy(x[1:], x[:-1])  # a shifted overlap: NumPy buffers it
    assert not _native(launch)
    launch()
    np.testing.assert_array_equal(x, np.r_[0, np.arange(11)].astype(np.float32))


@needs_native
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.bool_])
def test_where(dtype) -> None:
    c = RNG.random((2, 1, 4)) > 0.5
    a = RNG.integers(-5, 5, (3, 4)).astype(dtype)
    b = RNG.integers(-5, 5, (2, 3, 1)).astype(dtype)
    want = np.where(c, a, b)
    y = np.empty(want.shape, dtype)
    launch = strided.where(y, c, a, b, None)
    _run(launch)
    np.testing.assert_array_equal(y, want)


@needs_native
def test_batch_runs_in_order_and_raises_the_failing_launch() -> None:
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    t, u = np.empty((3, 2), np.float32), np.empty((3, 2), np.float32)
    calls = []
    python = lambda: calls.append(u.copy())  # noqa: E731
    launches = [strided.copy(t, x.T), strided.ufunc(np.multiply, u, t, t), python,
                strided.ufunc(np.add, u, u, t), strided.ufunc(np.negative, u, u)]
    plan = strided.batch(launches)
    assert [type(p).__name__ for p in plan] == ["Batch", "function", "Batch"]
    for run in range(3):
        for p in plan:
            p()
        np.testing.assert_array_equal(calls[run], x.T * x.T)
        np.testing.assert_array_equal(u, -(x.T * x.T + x.T))
    assert plan[0].tables and plan[2].tables

    bad = native.EwArgs(op=99, rank=1, size=4)
    bad.shape[0] = 1
    failing = native.launch("ctxrt_ew", bad, ())
    seen = []

    def raising() -> None:
        seen.append(1)
        raise RuntimeError("the launch's own error")
    raising.native = failing.native
    plan = strided.batch([strided.copy(t, x.T), raising])
    with pytest.raises(RuntimeError, match="own error"):  # the native call fails: its launch runs again, raising
        plan[0]()
    assert seen == [1]


@needs_native
def test_a_graph_of_small_ops_runs_in_batches_as_onnxruntime() -> None:
    """Transposes, slices, broadcast arithmetic, Where and Concat of a compiled graph: replayed as batches (fewer
    entries than launches), the same outputs as onnxruntime run after run."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    import ctxrt

    m = RNG.random((1, 1, 6, 6)) > 0.3
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 1, 3]),
             helper.make_node("Add", ["t", "bias"], ["a"]),
             helper.make_node("Mul", ["a", "t"], ["p"]),
             helper.make_node("Neg", ["p"], ["n"]),
             helper.make_node("Slice", ["n", "starts", "ends", "axes"], ["s"]),
             helper.make_node("Where", ["mask", "s", "minus"], ["w"]),
             helper.make_node("Concat", ["w", "s"], ["y"], axis=-1)]
    inits = {"bias": RNG.standard_normal(8).astype(np.float32), "starts": np.array([0], np.int64),
             "ends": np.array([6], np.int64), "axes": np.array([3], np.int64), "mask": m,
             "minus": np.array([-1e9], np.float32)}
    graph = helper.make_graph(nodes, "small", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 6, 4, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    x = RNG.standard_normal((1, 6, 4, 8)).astype(np.float32)
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    with ctxrt.compile(model) as ctx:
        g = ctx.graph()
        for _ in range(3):
            np.testing.assert_array_equal(g.run({"x": x})["y"], want)
        assert any(isinstance(p, strided.Batch) for p in g._plan) and len(g._plan) < len(g._launches)


@needs_native
def test_alternating_bindings_keep_no_batches_of_the_launches_replaced() -> None:
    """A graph re-recorded for handles that alternate (ping-pong buffers) replays its launches batched; the batches
    of the IO launches it replaced are dropped, not kept with the views they were bound to."""
    from onnx import TensorProto, helper, numpy_helper

    import ctxrt

    b, c = RNG.standard_normal(8).astype(np.float32), RNG.standard_normal((4, 8)).astype(np.float32)
    nodes = [helper.make_node("Add", ["x", "b"], ["s"]), helper.make_node("Neg", ["s"], ["n"]),
             helper.make_node("Mul", ["n", "c"], ["y"])]
    graph = helper.make_graph(nodes, "io", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])],
                              [numpy_helper.from_array(b, "b"), numpy_helper.from_array(c, "c")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    with ctxrt.compile(model, io_mem_type="memhandle") as ctx:
        be = ctx.backend
        buf = be.alloc_shared(4 * 128, 64)
        handles = [ctx.mem_register(buf, k * 128, (4, 8), np.float32) for k in range(4)]
        views = [be.view(buf, k * 128, (4, 8), np.float32) for k in range(4)]
        g = ctx.graph()
        for k in range(20):
            x = RNG.standard_normal((4, 8)).astype(np.float32)
            i = 2 * (k % 2)
            views[i][...] = x
            g.execute({"x": handles[i]}, {"y": handles[i + 1]})
            np.testing.assert_array_equal(views[i + 1], -(x + b) * c)
            if k == 1:
                kept = len(g._batches)
        assert kept and len(g._batches) == kept


@needs_native
def test_a_concats_part_copies_live_as_long_as_its_batch() -> None:
    """A Concat's part copies are made when a batch first lists it: their structs stay alive with it (freed, their
    memory reused by other objects, the batch would run garbage: a flaky wrong result seen under load)."""
    import gc

    from ctxrt.backends.cpu.shape import concat_launch

    xs = [RNG.standard_normal((2, k, 3)).astype(np.float32) for k in (1, 4, 2)]
    y = np.zeros((2, 7, 3), np.float32)
    z = np.empty((2, 7, 3), np.float32)
    plan = strided.batch([concat_launch(xs, y, 1), strided.ufunc(np.negative, z, y)])
    plan[0]()  # lists the calls: the part copies made now
    gc.collect()
    # freed structs' blocks reused by structs that copy nothing (op COPY, rank 1, size 4, no elements)
    junk = [bytearray(np.array([0, 1, 4] + [0] * 34, np.int64).tobytes()) for _ in range(4000)]
    y[...] = 0
    plan[0]()
    np.testing.assert_array_equal(y, np.concatenate(xs, axis=1))
    np.testing.assert_array_equal(z, -y)
    del junk


@needs_native
@pytest.mark.parametrize("a_shape, b_shape, trans_b", [
    ((3, 5), (5, 7), False),                  # one matrix
    ((1, 4, 1, 64), (1, 4, 70, 64), True),    # a token's Q.K^T, K read as stored
    ((1, 4, 1, 70), (1, 4, 70, 64), False),   # its weights times V
    ((2, 4, 16, 8), (2, 4, 9, 8), True),      # a prompt's
    ((3, 1, 5, 6), (1, 2, 6, 4), False),      # batch dims broadcast both ways
    ((2, 5, 6), (6, 3), False),               # a 2-D B broadcast over a's batch
    ((1, 2, 3, 4, 5, 6), (1, 2, 3, 4, 6, 2), False),  # four batch dims
    ((2, 3, 0), (2, 0, 4), False),            # k = 0: zeros
    ((2, 0, 5), (2, 5, 4), False),            # no rows
])
def test_batched_matmul_of_views(a_shape, b_shape, trans_b) -> None:
    """csrc/strided.c's ctxrt_bmm (a range program's attention MatMul) against NumPy's matmul: transposed,
    broadcast and strided operands, an output that is a strided window, empty dims."""
    from ctxrt.backends.cpu.extents import _matmul

    a = RNG.standard_normal(a_shape).astype(np.float32)
    b = RNG.standard_normal(b_shape).astype(np.float32)
    want = np.matmul(a, np.swapaxes(b, -1, -2) if trans_b else b)
    wide = np.full(want.shape[:-1] + (want.shape[-1] * 2,), np.nan, np.float32)
    bv = np.swapaxes(b, -1, -2) if trans_b else b
    for y in (np.empty_like(want), wide[..., ::2]):  # a whole tensor, a window of every other column
        step = type("S", (), {"attrs": {"transB": 1} if trans_b else {}})()
        launch = _matmul(step, [a, b], [y])
        # (the native loop for a token's products, one row each; more rows are NumPy's, BLAS's blocked GEMM)
        assert _native(launch) == bool(want.size and a.shape[-1] and want.shape[-2] == 1)
        _run(launch) if _native(launch) else launch()
        np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
        if want.size and a.shape[-1]:  # the native loop itself at any rows
            y[...] = np.nan
            _run(native.bmm(a, bv, y))
            np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
    # a sliced A (rows two apart), a B whose rows are a view of a wider buffer
    a2 = np.repeat(a, 2, axis=-2)[..., ::2, :]
    y = np.empty_like(want)
    launch = _matmul(type("S", (), {"attrs": {"transB": 1} if trans_b else {}})(), [a2, b], [y])
    launch()
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)


@needs_native
@pytest.mark.parametrize("shape", [(5, 7), (1, 7, 5), (2, 3, 4, 6), (3, 1), (1, 1)])
@pytest.mark.parametrize("upper", [1, 0])
@pytest.mark.parametrize("k", [None, 0, 2, -3, 100, -100, 2**62, -(2**62)])
@pytest.mark.parametrize("dtype", [np.float32, np.bool_, np.int64, np.float16])
def test_trilu(shape, upper, k, dtype) -> None:
    """csrc/strided.c's ctxrt_trilu (a range program's causal mask) against onnx's reference Trilu: both triangles,
    diagonals inside, beyond and far beyond the matrix (no overflow), batches, a strided input, in place."""
    from onnx import helper
    from onnx.reference import ReferenceEvaluator

    from ctxrt.backends.cpu.extents import _trilu

    x = (RNG.standard_normal(shape) * 3).astype(dtype)
    node = helper.make_node("Trilu", ["x"] + ([] if k is None else ["k"]), ["y"], upper=upper)
    ref = ReferenceEvaluator(node)
    want = ref.run(None, {"x": x} if k is None else {"x": x, "k": np.array(k, np.int64)})[0]
    step = type("S", (), {"attrs": {"upper": upper}})()
    wide = np.zeros(shape[:-1] + (shape[-1] * 2,), dtype)
    wide[..., ::2] = x
    cell = np.zeros(2, np.int64)  # k as a view of a buffer, read at each run; or a launch's own constant
    for src, dst, view in ((x, np.empty_like(x), True), (wide[..., ::2], np.empty_like(x), False),
                           (x.copy(), None, True)):
        y = src if dst is None else dst  # None: in place
        kk = None if k is None else cell[1:].reshape(()) if view else np.array(k, np.int64)
        if k is not None:
            cell[1] = k
        launch = _trilu(step, [src, kk], [y])
        assert _native(launch)
        _run(launch)
        np.testing.assert_array_equal(y, want)


@needs_native
@pytest.mark.parametrize(("dtype", "start", "delta", "n"), [
    (np.int64, 5, 1, 7), (np.int64, -3, -2, 4), (np.int64, 2**62, 2**62, 3), (np.int32, 7, -3, 5),
    (np.float32, 0.5, 0.25, 9), (np.float64, -1.0, 0.1, 6), (np.int64, 0, 1, 0)])
def test_range(dtype, start, delta, n) -> None:
    """csrc/strided.c's ctxrt_range (a range program's position ids) against NumPy's start + i delta in the
    output's type (int64 wrapping as NumPy's), start and delta read at run time."""
    from ctxrt.backends.cpu.extents import _range

    buf = np.array([start, delta], dtype)
    s, d = buf[:1].reshape(()), buf[1:].reshape(())  # views of a buffer (the arena's values): read at each run
    y = np.empty(n, dtype)
    launch = _range(None, [s, None, d], [y])
    assert _native(launch)
    _run(launch)
    with np.errstate(over="ignore"):
        want = (s.reshape(()) + d.reshape(()) * np.arange(n)).astype(dtype)
    np.testing.assert_array_equal(y, want)
    buf[0] += 1
    _run(launch)
    np.testing.assert_array_equal(y[:1], (want[:1] + 1).astype(dtype))
    own = np.array(start, dtype)  # a launch's own constant (a range program's value that follows the dims)
    launch = _range(None, [own, None, np.array(delta, dtype)], [y])
    own[...] = 0  # its value went into the struct: a word predicted with the rest
    _run(launch)
    np.testing.assert_array_equal(y, want)
