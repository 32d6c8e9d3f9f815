"""How a decoder's attention reads its tensors: K through MatMul's transB instead of a Transpose
(ir/passes/fold_transpose.py), a range program's array feeds read and outputs written where they lie when only
known native calls touch them (runtime/feeds.py), with the copy kept wherever that cannot hold, and the structs of
new past lengths predicted (runtime/slots.py)."""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from harness import make_model, onnxruntime_outputs, rand, skip_unless_available
from onnx import helper

import ctxrt
from ctxrt.backends.cpu import native, strided

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
import decoders  # noqa: E402

LAYERS, DIM, HEADS = 2, 64, 4
RANGES = {"past_sequence": (0, 32), "sequence": (1, 4), "batch": (1, 1)}


def _ort(model, feeds):
    return onnxruntime_outputs(model, feeds)


def _qk(perm, extra_reader=False, rank=4):
    """Q (.., S, D) times Transpose(K, perm), optionally the transposed K an output too."""
    q = rand(*([2, 3][:rank - 2]), 5, 8)
    k = rand(*([2, 3][:rank - 2]), 7, 8)
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=perm),
             helper.make_node("MatMul", ["q", "kt"], ["s"]),
             helper.make_node("Relu", ["s"], ["y"])]
    outs = ["y", "kt"] if extra_reader else ["y"]
    return make_model(nodes, {"q": q, "k": k}, outputs=outs), {"q": q, "k": k}


@pytest.mark.parametrize("backend", ["cpu", "opencl"])
@pytest.mark.parametrize("rank", [2, 3, 4])
def test_transpose_of_the_last_two_axes_is_read_by_matmul(backend, rank) -> None:
    skip_unless_available(backend)
    perm = [*range(rank - 2), rank - 1, rank - 2]
    model, feeds = _qk(perm, rank=rank)
    want = _ort(model, feeds)
    with ctxrt.compile(model, backend=backend) as ctx:
        steps = ctx.graph().compiled.steps
        assert "Transpose" not in [s.op for s in steps]
        assert [s.attrs.get("transB") for s in steps if s.op == "MatMul"] == [1]
        got = ctx.graph().run(feeds)
    np.testing.assert_allclose(got["y"], want[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", ["cpu", "opencl"])
def test_a_transposed_operand_of_another_rank(backend) -> None:
    # A of two dims against a transposed B of three (B's batch broadcast over A), and the other way round
    skip_unless_available(backend)
    for qs, ks in (((5, 8), (3, 7, 8)), ((2, 3, 5, 8), (7, 8))):
        q, k = rand(*qs), rand(*ks)
        perm = [*range(len(ks) - 2), len(ks) - 1, len(ks) - 2]
        model = make_model([helper.make_node("Transpose", ["k"], ["kt"], perm=perm),
                            helper.make_node("MatMul", ["q", "kt"], ["y"])], {"q": q, "k": k})
        with ctxrt.compile(model, backend=backend) as ctx:
            assert "Transpose" not in [s.op for s in ctx.graph().compiled.steps]
            got = ctx.graph().run({"q": q, "k": k})["y"]
        np.testing.assert_allclose(got, _ort(model, {"q": q, "k": k})[0], rtol=1e-5, atol=1e-5)


def test_other_transposes_and_readers_stay() -> None:
    # a transposed K read by something else too: the MatMul reads K as stored, the Transpose stays for the other
    model, feeds = _qk([0, 1, 3, 2], extra_reader=True)
    want = _ort(model, feeds)
    with ctxrt.compile(model) as ctx:
        ops = [s.op for s in ctx.graph().compiled.steps]
        got = ctx.graph().run(feeds)
    assert "Transpose" in ops
    for w, name in zip(want, ("y", "kt"), strict=True):
        np.testing.assert_allclose(got[name], w, rtol=1e-5, atol=1e-5)
    # a permutation that moves another axis is no transposed operand
    q, k = rand(2, 3, 5, 8), rand(8, 3, 2, 7)
    model = make_model([helper.make_node("Transpose", ["k"], ["kt"], perm=[2, 1, 0, 3]),
                        helper.make_node("MatMul", ["q", "kt"], ["y"])], {"q": q, "k": k})
    with ctxrt.compile(model) as ctx:
        assert "Transpose" in [s.op for s in ctx.graph().compiled.steps]
        np.testing.assert_allclose(ctx.graph().run({"q": q, "k": k})["y"], _ort(model, {"q": q, "k": k})[0],
                                   rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def decoder():
    path = decoders.gpt2_decoder("dynamo", layers=LAYERS, dim=DIM, heads=HEADS)
    return path, ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def _feeds(past: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    f = {"input_ids": rng.integers(0, decoders.VOCAB, size=(1, 1), dtype=np.int64)}
    for name in decoders.names(LAYERS)[0][1:]:
        f[name] = rng.standard_normal((1, HEADS, past, DIM // HEADS)).astype(np.float32)
    return f


def _close(got, want) -> None:
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def _pasts(sess) -> int:
    return sess.stats.get("feeds_read_in_place", 0)


@pytest.mark.skipif(native.library() is None, reason="the native kernels are not built")
def test_generation_reads_its_pasts_in_place(decoder) -> None:
    path, oracle = decoder
    with ctxrt.InferenceSession(path, dim_ranges=RANGES) as sess:
        start = decoders.empty_past(LAYERS, seq=3, dim=DIM, heads=HEADS)
        want = decoders.generate(lambda f: oracle.run(None, f), start, 12, LAYERS)
        for _ in range(3):  # the third generation runs batched lists: its pasts read where they lie
            assert decoders.generate(lambda f: sess.run(None, f), start, 12, LAYERS) == want
        read = _pasts(sess)
        assert read >= 2 * LAYERS * 8  # every past of (most) tokens of the last generation
        # and every present written into the array returned (Concat's copies and attention's products write and
        # read it in place): no copy out of the program's buffers
        assert sess.stats["outputs_written_in_place"] >= 2 * LAYERS * 8
        # every token's past length ran one list (runtime/slots.py): one for the prompt, one for the tokens
        assert sess.stats["range_shared_lists"] == 2 and sess.stats["range_shared_runs"] == 3 * 12
        # a past that is no C-contiguous array at a planned state: copied, and the calls that read the last
        # run's array (alive, other values) pointed back at the program's buffer
        f = _feeds(6, 1)
        for _ in range(3):
            _close(sess.run(None, f), oracle.run(None, f))
        before = _pasts(sess)
        f2 = _feeds(6, 2)
        name = decoders.names(LAYERS)[0][1]
        wide = np.zeros((1, HEADS, 6, 2 * (DIM // HEADS)), np.float32)
        wide[..., ::2] = f2[name]
        mixed = dict(f2)
        mixed[name] = wide[..., ::2]
        _close(sess.run(None, mixed), oracle.run(None, f2))
        assert _pasts(sess) - before == 2 * LAYERS - 1
        # the earlier feeds overwritten and gone: no call reads them
        for v in f.values():
            v[...] = np.nan if v.dtype == np.float32 else 0
        del f
        f3 = _feeds(6, 3)
        _close(sess.run(None, f3), oracle.run(None, f3))
        assert _pasts(sess) - before == 4 * LAYERS - 1


@pytest.mark.skipif(native.library() is None, reason="the native kernels are not built")
def test_a_failed_native_call_reruns_on_the_feeds(decoder) -> None:
    """A batch whose native call fails runs the rest of its launches through NumPy, which reads the program's
    input buffers: the feeds read in place are copied there first (strided.FALLBACK)."""
    path, oracle = decoder
    with ctxrt.InferenceSession(path, dim_ranges=RANGES) as sess:
        f = _feeds(5, 3)
        for _ in range(3):
            sess.run(None, f)
        assert _pasts(sess) > 0
        runner = next(iter(sess._variants.values())).ranged._extent
        st = runner.at(f)
        past = decoders.names(LAYERS)[0][1]
        readers = set(runner.users[past])
        shared = st.shared[1]  # the list every past length runs (runtime/slots.py)
        reading = {id(shared.template[k]) for k in readers}
        batch = next(b for b in shared.batched if isinstance(b, strided.Batch)
                     and any(id(x) in reading for x in b.launches))
        first = next(i for i, x in enumerate(batch.launches) if id(x) in reading)
        bad = native.EwArgs()  # rank 0: ctxrt_ew returns 1
        for table in batch.tables.values():
            for seg in table:
                if seg.__class__ is tuple:
                    owners, args = seg[3], seg[5]
                    for j, owner in enumerate(owners):
                        if owner == first:
                            args[j] = ctypes.addressof(bad)
                            break
        f2 = _feeds(5, 4)
        _close(sess.run(None, f2), oracle.run(None, f2))
        assert getattr(strided.FALLBACK, "prepare", None) is None


@pytest.mark.skipif(native.library() is None, reason="the native kernels are not built")
def test_structs_of_new_past_lengths_are_predicted_exactly(decoder) -> None:
    """A shared list fits its slots' struct words as polynomials in the dims that vary (runtime/slots.py): every
    prediction equals the structs the launches at those dims make; a word a made set contradicts is no longer
    predicted."""
    path, oracle = decoder
    with ctxrt.InferenceSession(path, dim_ranges=RANGES) as sess:
        for past in range(0, 12):  # past 0 and 1 are made (an empty or a one-row axis), never fitted
            f = _feeds(past, past)
            _close(sess.run(None, f), oracle.run(None, f))
        predicted = sess.stats["range_structs_predicted"]
        assert predicted > 0
        runner = next(iter(sess._variants.values())).ranged._extent
        st = runner.last[1]
        shared = st.shared[1]
        assert shared.fit is not None and [runner.g.ranges.dims[j][0] for j in shared.fit.varying] == ["past_sequence"]
        for past in (2, 7, 20, 31):
            dims = runner.at(_feeds(past, 0)).dims
            vals = runner.g.ranges.evaluate(dims).tolist()
            made = shared.state_block([x.at(vals) if hasattr(x, "at") else x for x in shared.recording])
            block, done = shared.predict(dims)
            assert done
            for k, calls in shared.layout:
                lo, hi = calls[0][1], calls[-1][1] + calls[-1][2]
                if k in done:
                    assert bytes(block[lo:hi]) == bytes(made[lo:hi]), (past, k)
        assert shared.predict(runner.at(_feeds(1, 0)).dims) is None  # a one-row past: made
        wrong = made.copy()
        k, lo, hi = shared.slot_words[0]
        wrong.view(np.int64)[lo] += 8
        shared.learn(dims, wrong)  # a word that is no polynomial: its slot is made from its launches from now on
        got = shared.predict(runner.at(_feeds(25, 0)).dims)
        assert got is None or k not in got[1]
        for past in (13, 14):
            f = _feeds(past, past)
            _close(sess.run(None, f), oracle.run(None, f))


@pytest.mark.skipif(native.library() is None, reason="the native kernels are not built")
def test_outputs_are_written_in_place_only_into_arrays_made_for_the_run(decoder) -> None:
    """Graph.run and InferenceSession.run make their output arrays: those are written in place. Arrays a caller
    gives `execute` may overlap its feeds (a past and its present as windows of one array): copied out after the
    run, as before."""
    path, oracle = decoder
    ctx = ctxrt.compile(path, dims=RANGES)
    try:
        g = ctx.graph()
        f = _feeds(9, 9)
        want = oracle.run(None, f)
        for _ in range(3):
            got = g.run(f)
        _close([got[o.name] for o in oracle.get_outputs()], want)
        written = ctx.stats["outputs_written_in_place"]
        assert written > 0
        # presents given as arrays whose leading rows are the pasts (one buffer each): appended in place
        names_in, names_out = decoders.names(LAYERS)
        bufs = {o: np.zeros((1, HEADS, 10, DIM // HEADS), np.float32) for o in names_out[1:]}
        feeds = dict(f)
        for i, o in zip(names_in[1:], names_out[1:], strict=True):
            bufs[o][:, :, :9] = f[i]
            feeds[i] = bufs[o][:, :, :9]
        outs = {names_out[0]: np.empty_like(want[0]), **bufs}
        g.execute(feeds, outs)
        _close([outs[o.name] for o in oracle.get_outputs()], want)
        assert ctx.stats["outputs_written_in_place"] == written
    finally:
        ctx.free()


@pytest.mark.skipif(native.library() is None, reason="the native kernels are not built")
def test_a_native_slot_alone_runs_its_structs(decoder, monkeypatch) -> None:
    """A native slot that no neighbour batches with runs as a batch of its own, on the structs of the run's dims
    (predicted or copied), not through its launch at those dims."""
    from ctxrt.runtime import extents, slots

    monkeypatch.setattr(extents, "batched", lambda backend, launches, cache: list(launches))  # nothing merged
    path, oracle = decoder
    with ctxrt.InferenceSession(path, dim_ranges=RANGES) as sess:
        start = decoders.empty_past(LAYERS, seq=3, dim=DIM, heads=HEADS)
        want = decoders.generate(lambda f: oracle.run(None, f), start, 12, LAYERS)
        assert decoders.generate(lambda f: sess.run(None, f), start, 12, LAYERS) == want
        runner = next(iter(sess._variants.values())).ranged._extent
        shared = runner.last[1].shared[1]
        alone = [x for x in shared.batched if isinstance(x, strided.Batch)]
        assert alone and all(len(b.launches) == 1 and isinstance(b.launches[0], slots.NativeSlot) for b in alone)
        assert sess.stats["range_structs_predicted"] > 0


@pytest.mark.parametrize("backend", ["cpu", "opencl"])
def test_a_quantized_unit_read_through_a_transpose_stays_float(backend) -> None:
    """Q.K^T of a QDQ model (DequantizeLinear -> Transpose -> MatMul): the Transpose folds into transB, and the
    unit then left to the float MatMul (QLinearMatMul has no transposed form), equal to onnxruntime."""
    skip_unless_available(backend)
    from onnx import numpy_helper

    q, k = rand(2, 3, 5, 8), rand(2, 3, 7, 8)
    scale = numpy_helper.from_array(np.array(0.02, np.float32), "s")
    zp = numpy_helper.from_array(np.array(0, np.int8), "z")
    nodes = [helper.make_node("QuantizeLinear", ["q", "s", "z"], ["qq"]),
             helper.make_node("DequantizeLinear", ["qq", "s", "z"], ["qd"]),
             helper.make_node("QuantizeLinear", ["k", "s", "z"], ["kq"]),
             helper.make_node("DequantizeLinear", ["kq", "s", "z"], ["kd"]),
             helper.make_node("Transpose", ["kd"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["qd", "kt"], ["m"]),
             helper.make_node("QuantizeLinear", ["m", "s2", "z"], ["mq"]),
             helper.make_node("DequantizeLinear", ["mq", "s2", "z"], ["y"])]
    model = make_model(nodes, {"q": q, "k": k})
    model.graph.initializer.extend([scale, zp, numpy_helper.from_array(np.array(0.05, np.float32), "s2")])
    want = _ort(model, {"q": q, "k": k})
    with ctxrt.compile(model, backend=backend) as ctx:
        steps = ctx.graph().compiled.steps
        assert "Transpose" not in [s.op for s in steps] and "QLinearMatMul" not in [s.op for s in steps]
        got = ctx.graph().run({"q": q, "k": k})
    np.testing.assert_allclose(got["y"], want[0], rtol=0, atol=0.05 + 1e-6)  # at most one step of the scale


@pytest.mark.skipif(native.library() is None, reason="the native kernels are not built")
def test_a_slice_is_never_predicted() -> None:
    """A live Slice's view comes from NumPy's clamped and wrapped bounds, no polynomial everywhere: its slot's
    structs are made at every set of dims while the others are predicted; every length matches onnxruntime, short
    ones after long ones included."""
    big = np.iinfo(np.int64).max
    nodes = [helper.make_node("Slice", ["x", "s", "e", "a"], ["t"]), helper.make_node("Add", ["t", "t"], ["u"]),
             helper.make_node("Concat", ["u", "x"], ["y"], axis=1)]
    from onnx import TensorProto, numpy_helper

    inits = [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in (("s", [1]), ("e", [big]), ("a", [1]))]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "rows", 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    with ctxrt.InferenceSession(model.SerializeToString(), dim_ranges={"rows": (1, 64)}) as sess:
        for rows in [*range(20, 40), 3, 2, 50, 5]:
            x = rand(1, rows, 8)
            np.testing.assert_allclose(sess.run(None, {"x": x})[0], ref.run(None, {"x": x})[0], rtol=1e-6)
        runner = next(iter(sess._variants.values())).ranged._extent
        shared = runner.last[1].shared[1]
        slices = {k for k, _ in shared.layout if runner.g.compiled.steps[k].op == "Slice"}
        assert slices and shared.fit is not None and shared.fit.done and not slices & shared.fit.done
        assert sess.stats["range_structs_predicted"] > 0
