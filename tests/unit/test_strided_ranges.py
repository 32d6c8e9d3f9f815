"""Range programs over dims that strided convs and pools read (compiler/floors.py): a length through them is
floor((n + a) / S), fitted as a derived dim; one compile for every length, equal to onnxruntime."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import ctxrt
from ctxrt.compiler import floors
from ctxrt.errors import CtxrtWarning, FormatError, ShapeError


def _audio(pool: bool = True) -> onnx.ModelProto:
    """wav[batch, n] -> Unsqueeze -> Conv 1 -> 8 (k 10, stride 5) -> Relu -> Conv 8 -> 8 (k 3, stride 2, pads 1)
    -> MaxPool (k 3, stride 2, ceil_mode) -> Transpose -> frames x frames attention (MatMul, Softmax, MatMul) ->
    Reshape by a Shape chain: an audio front end's lengths floor((n - 10) / 5) + 1 ... through a transformer layer."""
    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array((rng.standard_normal((8, 1, 10)) / 3).astype(np.float32), "w1"),
             numpy_helper.from_array((rng.standard_normal((8, 8, 3)) / 4).astype(np.float32), "w2"),
             numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "b2"),
             numpy_helper.from_array(np.array([1], np.int64), "one"),
             numpy_helper.from_array(np.array([0, -1], np.int64), "flat")]
    nodes = [helper.make_node("Unsqueeze", ["wav", "one"], ["x"]),
             helper.make_node("Conv", ["x", "w1"], ["c1"], strides=[5]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], strides=[2], pads=[1, 1])]
    last = "c2"
    if pool:
        nodes.append(helper.make_node("MaxPool", ["c2"], ["p"], kernel_shape=[3], strides=[2], ceil_mode=1))
        last = "p"
    nodes += [helper.make_node("Transpose", [last], ["t"], perm=[0, 2, 1]),
              helper.make_node("Transpose", [last], ["tt"], perm=[0, 1, 2]),
              helper.make_node("MatMul", ["t", "tt"], ["s"]),
              helper.make_node("Softmax", ["s"], ["a"], axis=-1),
              helper.make_node("MatMul", ["a", "t"], ["o"]),
              helper.make_node("Reshape", ["o", "flat"], ["y"])]
    io = [helper.make_tensor_value_info("wav", TensorProto.FLOAT, ["batch", "n"]),
          helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "m"])]
    return helper.make_model(helper.make_graph(nodes, "audio", io[:1], io[1:], inits),
                             opset_imports=[helper.make_opsetid("", 17)])


SIZES = [(1, 400), (2, 333), (1, 1001), (3, 57), (1, 24), (2, 777), (1, 512), (4, 129), (1, 1023), (2, 250)]


@pytest.mark.parametrize("pool", [False, True])
def test_an_audio_front_end_is_one_program_for_every_length(pool: bool) -> None:
    """Batch and length through strided convs (and a ceil_mode pool): one range program whose lengths are derived
    dims, every output equal to onnxruntime's at lengths of every residue, no warning, one compile."""
    data = _audio(pool).SerializeToString()
    theirs = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CtxrtWarning)
        with ctxrt.InferenceSession(data, dim_ranges={"batch": (1, 4), "n": (1, 1024)}) as sess:
            for b, n in SIZES:
                x = rng.standard_normal((b, n)).astype(np.float32)
                (got,), (want,) = sess.run(None, {"wav": x}), theirs.run(None, {"wav": x})
                assert got.shape == want.shape
                np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
            assert sess.stats["shape_variants_compiled"] == 1
            # the native 1-D convs and MaxPool bind every length (live, the upper bound's scratch): no kernel made
            # for a new length
            from ctxrt.backends.cpu import native
            if native.library() is not None:
                assert sess.stats["range_kernels_built"] == 0
            ranges = sess._current.ranged.ranges
            # floor(n / 5) - 1 frames, floor(n / 10) after the stride-2 conv (and the pool's)
            assert ranges.floors[:2] == ((1, 0, 5), (1, 0, 10))
            assert len(ranges.floors) == (3 if pool else 2)


def test_the_least_length_is_where_onnxruntime_has_a_graph(tmp_path, capsys) -> None:
    """The range's lower bound is raised to the least length every strided output has a frame at (onnxruntime
    refuses a conv's input below it, or gives no frame); a feed below it is one ShapeError saying so, with nothing
    compiled for it. The program as a context binary (its derived dims and monomials stored) runs every length."""
    data = _audio().SerializeToString()
    theirs = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    with ctxrt.InferenceSession(data, dim_ranges={"batch": (1, 4), "n": (1, 1024)}) as sess:
        sess.run(None, {"wav": np.zeros((1, 500), np.float32)})
        least = sess.dim_ranges["n"][0]
        assert theirs.run(None, {"wav": np.ones((1, least), np.float32)})[0].size
        try:  # below it, onnxruntime refuses the conv's input or gives no frame
            below = theirs.run(None, {"wav": np.ones((1, least - 1), np.float32)})[0].size
        except Exception:  # noqa: BLE001
            below = 0
        assert below == 0
        with pytest.raises(ShapeError, match=f"is {least - 1}: the model's strided convs and pools leave no output "
                                             f"below {least}"):
            sess.run(None, {"wav": np.ones((1, least - 1), np.float32)})
        assert sess.stats["shape_variants_compiled"] == 1
    from ctxrt.cli import main as cli

    onnx.save(_audio(), tmp_path / "audio.onnx")
    assert cli(["compile", str(tmp_path / "audio.onnx"), "-o", str(tmp_path / "audio.ctx"), "--dim", "batch=1:4",
                "--dim", "n=1:1024"]) == 0
    assert f"note: dim 'n' starts at {least}, not 1" in capsys.readouterr().out
    g = ctxrt.context_from_binary(tmp_path / "audio.ctx").graph()
    assert g.ranges.floors and g.ranges.basis and g.ranges.dims[1][1] == least
    rng = np.random.default_rng(1)
    for b, n in SIZES[:6]:
        if n < least:
            continue
        x = rng.standard_normal((b, n)).astype(np.float32)
        np.testing.assert_allclose(g.run({"wav": x})["y"], theirs.run(None, {"wav": x})[0], rtol=1e-5, atol=1e-5)


def test_a_stored_fit_that_mixes_a_dim_with_its_derived_dim_is_refused() -> None:
    """A context binary's integer over n * floor(n / 5) (not monotone between the box's corners: a view could
    leave the arena), or its derived dims and monomials badly listed: a FormatError, nothing run."""
    import copy

    from ctxrt.format.schema import _ranges

    g = ctxrt.compile(_audio().SerializeToString(), dims={"batch": (1, 4), "n": (1, 1024)}).graph()
    meta = g.ranges.to_meta()
    assert _ranges(copy.deepcopy(meta), g.compiled, "graph").floors == g.ranges.floors
    k = len(meta["dims"])

    def mix(r) -> None:  # n times its first derived dim
        r["basis"] = [*r["basis"], (1 << 1) | (1 << k)]
        for e in r["entries"]:
            e[1] = [*e[1], 0]
        r["entries"][-1][1][-1] = 1
    def oscillate(r) -> None:  # floor(n / 5) - 2 floor(n / 10) in one integer: 0 or 1, not monotone
        fl = {(a, s): i for i, (_, a, s) in enumerate(r["floors"])}
        ones = [1 << (k + fl[(0, 5)]), 1 << (k + fl[(0, 10)])]
        for m in ones:
            if m not in r["basis"]:
                r["basis"].append(m)
                for e in r["entries"]:
                    e[1].append(0)
        out = next(e for e in r["entries"] if e[0][0] == "out")
        top = r["dims"][1][2]
        out[1] = [0] * len(r["basis"])  # (the program's extent at the upper bound, to pass every other check)
        out[1][r["basis"].index(ones[0])], out[1][r["basis"].index(ones[1])] = 1, -2
        out[1][r["basis"].index(0)] = g.compiled.steps[out[0][1]].outputs[out[0][2]].shape[out[0][3]] - \
            (top // 5 - 2 * (top // 10))
    for change in (mix, oscillate, lambda r: r.update(basis=r["basis"][:-1]),  # (coefficients no longer match)
                   lambda r: r.update(basis=[0, 0, *r["basis"][2:]]), lambda r: r["floors"].append([7, 0, 2]),
                   lambda r: r.update(basis=[]), lambda r: r["floors"][0].__setitem__(2, 0)):
        bad = copy.deepcopy(meta)
        change(bad)
        with pytest.raises(FormatError):
            _ranges(bad, g.compiled, "graph")


def test_check_points_tell_every_two_candidate_lengths_apart() -> None:
    """Off the lattice, the two check points make any two candidate forms of a dim (itself, floor((n + a) / S) for
    each derived dim) differ in their rounding at one of them at least, and the first lies far below the bound."""
    spec = [("n", 1, 1024)]
    forms = {0: [(0, 5), (5, 10), (15, 20), (3, 4)]}
    points = floors.check_points(spec, [1024], {0: 20}, forms, [(342,)])
    assert len(points) == 2 and all((1024 - p[0]) % 20 for p in points)
    assert points[0][0] < 1024 - 40 <= points[1][0]
    cands = [(0, 1), *forms[0]]
    for (a1, s1), (a2, s2) in [(x, y) for i, x in enumerate(cands) for y in cands[i + 1:]]:
        def shift(n: int, a: int, s: int) -> int:
            return (n + a) % s - (1024 + a) % s
        assert any(shift(p[0], a1, s1) != shift(p[0], a2, s2) for p in points)
    # SegFormer's width: seven derived dims, (3, 32) and (7, 32) alike but where n + 7 wraps alone: more points
    segformer = {0: [(3, 4), (3, 32), (7, 8), (7, 32), (15, 16), (15, 32), (31, 32)]}
    points = floors.check_points([("w", 1, 128)], [128], {0: 32}, segformer, [(43,)])
    assert 2 < len(points) <= floors.MAX_CHECKS
    cands = [(0, 1), *segformer[0]]
    for (a1, s1), (a2, s2) in [(x, y) for i, x in enumerate(cands) for y in cands[i + 1:]]:
        assert any((p[0] + a1) % s1 - (128 + a1) % s1 != (p[0] + a2) % s2 - (128 + a2) % s2 for p in points)
        assert all(min((p[0] + a) // s for a, s in segformer[0]) >= 2 for p in points)


def test_an_integer_is_written_over_the_candidate_its_check_values_agree_with() -> None:
    """t = (n - r) / L on the lattice; 2 t + 1 is 2 floor((n + 3) / 20) + 1 where that form holds at the check
    points, and no candidate at all where none does (the fit refuted, the session compiles per size)."""
    k, lattice, forms = 1, {0: (20, 4)}, [(0, 3, 20), (0, 0, 10)]
    coeffs = np.array([[1], [2]], np.int64)  # 1 + 2 t
    point = 997
    want = 2 * ((point + 3) // 20) + 1 - 2 * ((4 + 3) // 20)
    ext = (point, (point + 3) // 20, point // 10)
    polys, bad = floors.convert(coeffs, k, lattice, forms, [(ext, np.array([want]))])
    assert bad is None and floors.value(polys[0], ext) == want and set(polys[0]) <= {0, 2}
    _, bad = floors.convert(coeffs, k, lattice, forms, [(ext, np.array([want + 1]))])
    assert bad == 0
    # two forms a check point cannot tell apart (n = 33: floor(36 / 32) = floor(40 / 32)), which differ at n = 25..28
    # mod 32: refused, not the first taken; told apart at n = 90
    two, lattice = [(0, 3, 32), (0, 7, 32)], {0: (32, 0)}
    coeffs = np.array([[5], [1]], np.int64)  # 5 + t
    for n, ok in ((33, False), (90, True)):
        ext = (n, (n + 3) // 32, (n + 7) // 32)
        polys, bad = floors.convert(coeffs, k, lattice, two, [(ext, np.array([5 + (n + 7) // 32]))], (128,))
        assert (bad is None) == ok and (not ok or floors.value(polys[0], (91, 2, 3)) == 8)


def _chain(seed: int) -> tuple[bytes, bool]:
    """A random chain of 1-4 Convs and pools (kernel 1-5, stride 1-3, dilation, explicit, SAME_UPPER, SAME_LOWER or
    VALID padding, ceil_mode) over a 1-D or 2-D input, flattened by Reshape: (the model, whether 2-D)."""
    rng = np.random.default_rng(seed)
    two_d = rng.random() < 0.4
    sp = 2 if two_d else 1
    nodes, inits, last, ch = [], [], "x", 2
    for i in range(int(rng.integers(1, 5))):
        k, s = int(rng.integers(1, 6)), int(rng.integers(1, 4))
        d = int(rng.integers(1, 3)) if rng.random() < 0.3 else 1
        kind = rng.choice(["conv", "conv", "maxpool", "avgpool"])
        auto = str(rng.choice(["NOTSET", "NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"]))
        attrs: dict = {"strides": [s] * sp}
        if auto != "NOTSET":
            attrs["auto_pad"] = auto
        else:
            attrs["pads"] = [int(rng.integers(0, k))] * sp + [int(rng.integers(0, k))] * sp
        if kind == "conv":
            w = (rng.standard_normal((4, ch) + (k,) * sp) / 3).astype(np.float32)
            inits.append(numpy_helper.from_array(w, f"w{i}"))
            if d > 1:
                attrs["dilations"] = [d] * sp
            nodes.append(helper.make_node("Conv", [last, f"w{i}"], [f"c{i}"], **attrs))
            ch = 4
        else:
            attrs["kernel_shape"] = [k] * sp
            if rng.random() < 0.5:
                attrs["ceil_mode"] = 1
            if "pads" in attrs:
                attrs["pads"] = [min(p, k - 1) for p in attrs["pads"]]
            nodes.append(helper.make_node("MaxPool" if kind == "maxpool" else "AveragePool", [last], [f"c{i}"],
                                          **attrs))
        last = f"c{i}"
    inits.append(numpy_helper.from_array(np.array([0, -1], np.int64), "flat"))
    nodes.append(helper.make_node("Reshape", [last, "flat"], ["y"]))
    shape = ["b", 2, "h", "w"] if two_d else ["b", 2, "n"]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString(), two_d


@pytest.mark.parametrize("seed", [0, 1, 3, 5, 6, 8, 124, 127])
def test_random_strided_chains_match_onnxruntime_at_every_size(seed: int) -> None:
    """Random conv and pool chains (1 a ceil_mode pool that drops its last window, 124 a SAME conv whose first
    points all had one residue, 127 a SAME_LOWER conv whose pads follow the size's parity: each gave wrong outputs
    before it was fixed) at 14 random sizes: every output of onnxruntime's shape and values, or (at sizes where a
    kernel exceeds its input, onnxruntime's truncating division gives a frame) a ShapeError; never a wrong one."""
    data, two_d = _chain(seed)
    try:
        theirs = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    except Exception:  # noqa: BLE001  (a chain onnxruntime refuses)
        pytest.skip("onnxruntime refuses this chain")
    rng = np.random.default_rng(1000 + seed)
    ran = theirs_ran = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CtxrtWarning)
        sess = ctxrt.InferenceSession(data)
        for _ in range(14):
            size = (int(rng.integers(3, 90)), int(rng.integers(3, 90))) if two_d else (int(rng.integers(3, 300)),)
            x = rng.standard_normal((int(rng.integers(1, 4)), 2, *size)).astype(np.float32)
            try:
                want = theirs.run(None, {"x": x})[0]
            except Exception:  # noqa: BLE001
                continue
            theirs_ran += 1
            try:
                got = sess.run(None, {"x": x})[0]
            except ShapeError:
                assert min(size) < 12, size  # (only where a kernel can exceed the input)
                continue
            except ctxrt.errors.UnsupportedOpError:
                continue  # (a ceil_mode window starting in the end padding: refused at any compile)
            assert got.shape == want.shape, (size, got.shape, want.shape)
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
            ran += 1
    assert ran >= theirs_ran // 2 and theirs_ran >= 8


def test_two_lengths_of_one_stride_apart_by_their_offset_are_told_apart() -> None:
    """SegFormer's shape in 1-D: a k7 s4 p3 patch conv (floor((n + 3) / 4)), reduced by a k8 s8 conv (floor((n + 3)
    / 32)), and by a k3 s2 p1 conv then a k4 s4 one (floor((n + 7) / 32)): two derived dims of one stride that
    differ only where n + 7 wraps and n + 3 does not (n = 25..28 mod 32). An integer must not take the wrong one
    (SegFormer's outputs were wrong at those widths): equal to onnxruntime at every length of two lattice steps."""
    rng = np.random.default_rng(5)

    def w(name: str, *shape: int) -> onnx.TensorProto:
        return numpy_helper.from_array((rng.standard_normal(shape) / 3).astype(np.float32), name)
    nodes = [helper.make_node("Conv", ["x", "w0"], ["a"], strides=[4], pads=[3, 3]),
             helper.make_node("Conv", ["a", "w1"], ["r1"], strides=[8]),
             helper.make_node("Conv", ["a", "w2"], ["b"], strides=[2], pads=[1, 1]),
             helper.make_node("Conv", ["b", "w3"], ["r2"], strides=[4]),
             helper.make_node("Reshape", ["r1", "flat"], ["y1"]), helper.make_node("Reshape", ["r2", "flat"], ["y2"])]
    inits = [w("w0", 4, 2, 7), w("w1", 4, 4, 8), w("w2", 4, 4, 3), w("w3", 4, 4, 4),
             numpy_helper.from_array(np.array([0, -1], np.int64), "flat")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 2, "n"])],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y1", "y2")], inits)
    data = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    theirs = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    g = ctxrt.compile(data, dims={"b": (1, 2), "n": (32, 256)}).graph()
    assert {(a, s) for _, a, s in g.ranges.floors} >= {(3, 32), (7, 32)}
    for n in range(192, 257):
        x = rng.standard_normal((1, 2, n)).astype(np.float32)
        got, want = g.run({"x": x}), theirs.run(None, {"x": x})
        for name, ref in zip(("y1", "y2"), want, strict=True):
            assert got[name].shape == ref.shape, (n, name)
            np.testing.assert_allclose(got[name], ref, rtol=1e-4, atol=1e-4)


def test_a_length_no_strided_node_gives_is_not_taken_for_a_derived_dim() -> None:
    """Beside a stride-2 conv (a derived dim, the dim probed on a lattice of 2), x[:, :, : n // 3] from a Shape
    chain: floor(n / 3) is no derived dim; the session refuses the range over n (one program per length, every
    output equal to onnxruntime's), never fits it as floor((n + 1) / 2) or n."""
    rng = np.random.default_rng(9)
    inits = [numpy_helper.from_array((rng.standard_normal((4, 2, 3)) / 3).astype(np.float32), "w"),
             *(numpy_helper.from_array(np.array(v, np.int64), n) for n, v in
               (("two", [2]), ("three", [3]), ("zero", [0]), ("flat", [0, -1])))]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], strides=[2], pads=[1, 1]),
             helper.make_node("Reshape", ["c", "flat"], ["y1"]),
             helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Gather", ["s", "two"], ["n"]),
             helper.make_node("Div", ["n", "three"], ["third"]),
             helper.make_node("Slice", ["x", "zero", "third", "two"], ["y2"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 2, "n"])],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y1", "y2")], inits)
    data = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    theirs = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CtxrtWarning)
        sess = ctxrt.InferenceSession(data)
        for n in (200, 97, 150, 31, 64, 121):
            x = rng.standard_normal((1, 2, n)).astype(np.float32)
            for got, want in zip(sess.run(None, {"x": x}), theirs.run(None, {"x": x}), strict=True):
                assert got.shape == want.shape, n
                np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
