"""Range programs (issue 19, docs/shapes-and-control-flow.md): one compile for every shape inside ranges of a model's
dynamic dims, checked against onnxruntime on a GPT-2-style decoder generating from an empty past (both torch exporters),
a batch loop, every exported architecture of tests/models; the ranges stored in the context binary and the EPContext
node; feeds outside the ranges refused with the dim, its value and its range; hostile range metadata refused."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from harness import spy
from onnx import TensorProto, helper, numpy_helper

import ctxrt
from ctxrt.compiler.program import CONST
from ctxrt.compiler.ranges import RangeError
from ctxrt.errors import CtxrtError, CtxrtWarning, FormatError, ShapeError
from ctxrt.runtime.graph import Graph

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
import decoders  # noqa: E402
import exported  # noqa: E402

PAST = {"past_sequence": (0, 128)}
TOKENS = 64


def _ort(path) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


_GENERATED: dict[str, list[list[int]]] = {}


@pytest.fixture(params=["dynamo", "legacy"])
def gpt2(request):
    """(the decoder exported by one exporter, a 4-token prompt with an empty past, onnxruntime's 64 tokens)."""
    path = decoders.gpt2_decoder(request.param)
    feeds = decoders.empty_past(batch=1, seq=4)
    if request.param not in _GENERATED:
        sess = _ort(path)
        _GENERATED[request.param] = decoders.generate(lambda f: sess.run(None, f), feeds, TOKENS)
    return path, feeds, _GENERATED[request.param]


def _binding_run(sess: ctxrt.InferenceSession):
    """A generation step through io_binding: feeds bound as arrays, outputs as session tensors."""
    def run(feeds):
        b = sess.io_binding()
        for k, v in feeds.items():
            b.bind_input(k, v)
        for o in sess.get_outputs():
            b.bind_output(o.name)
        sess.run_with_iobinding(b)
        return b.copy_outputs_to_cpu()
    return run


def test_gpt2_generates_onnxruntimes_tokens_from_one_compile(gpt2) -> None:
    _generate_once(gpt2, "cpu")


def test_gpt2_generates_onnxruntimes_tokens_on_opencl(opencl) -> None:
    path = decoders.gpt2_decoder("dynamo")  # the exporters differ in graph, not in what the backend does
    feeds = decoders.empty_past(batch=1, seq=4)
    sess = _ort(path)
    _generate_once((path, feeds, decoders.generate(lambda f: sess.run(None, f), feeds, TOKENS)), opencl)


def _generate_once(gpt2, backend: str) -> None:
    path, feeds, want = gpt2
    with ctxrt.InferenceSession(path, backend, dim_ranges=PAST) as sess:
        assert decoders.generate(lambda f: sess.run(None, f), feeds, TOKENS) == want  # from an empty past
        assert decoders.generate(_binding_run(sess), feeds, TOKENS) == want  # a second generation, io_binding
        s = sess.stats
        assert s["shape_variants_compiled"] == 1 and s["range_programs_compiled"] == 1
        weights = sum(onnx.numpy_helper.to_array(t).nbytes for t in onnx.load(str(path)).graph.initializer)
        assert s["weights_bytes"] <= 1.05 * weights  # held once: not per shape, not per token
        # per past length met: the changed steps' kernels, never a compile; on the CPU every length's state is kept
        # (extents.MAX_STATES), so the second generation makes none (OpenCL keeps the last 16 child graphs)
        assert TOKENS <= s["range_specializations"] <= 2 * TOKENS
        if backend == "cpu":
            assert s["range_specializations"] == TOKENS


def test_default_ranges_widen_instead_of_compiling_per_shape() -> None:
    """Without dim_ranges: each dim starts at max(16, twice its first size), a dim first met empty (a generation's
    past) at max(16, 256); an upper bound the model cannot run (this decoder's 256 positions at sequence 16) is
    halved until it compiles, and a feed past the bound compiles one range at least twice as wide: 64 tokens from
    an empty past take one compile; from a past of 4, four (16, 32, 64, 128), not 64."""
    from ctxrt.runtime import session as session_module

    path = decoders.gpt2_decoder("dynamo")
    theirs = _ort(path)
    feeds = decoders.empty_past(batch=1, seq=4)
    want = decoders.generate(lambda f: theirs.run(None, f), feeds, TOKENS)
    with ctxrt.InferenceSession(path) as sess:
        assert decoders.generate(lambda f: sess.run(None, f), feeds, TOKENS) == want
        assert sess.stats["range_programs_compiled"] == sess.stats["shape_variants_compiled"] == 1
        assert sess.dim_ranges["past_sequence"] == (0, session_module.DEFAULT_CACHE_MAX // 2)
    rng = np.random.default_rng(5)
    feeds = {k: rng.standard_normal((1, decoders.HEADS, 4, v.shape[-1])).astype(np.float32) if k != "input_ids"
             else v for k, v in feeds.items()}
    want = decoders.generate(lambda f: theirs.run(None, f), feeds, TOKENS)
    with ctxrt.InferenceSession(path) as sess:
        assert decoders.generate(lambda f: sess.run(None, f), feeds, TOKENS) == want
        assert sess.stats["range_programs_compiled"] == 4
        assert sess.stats["shape_variants_freed"] == 3  # each narrower range freed by the wider one
        # each wider one checked the narrower one's fit at its bound (two compiles) instead of fitting anew
        assert sess.stats["range_programs_widened"] == 3
        # a token's kernels are all small at batch 1, though not at the batch range's bound: one thread
        ctx = list(sess._variants.values())[-1].contexts[0]
        assert ctx.threads.cap == 1


def test_a_bound_past_the_position_table_fails_without_onnx_reference(tmp_path) -> None:
    """The default session's first upper bound (past 256 at sequence 16) is past the decoder's 256 positions: its
    folded Gather fails at once as the model's error, without importing onnx.reference's op modules (3 MiB resident
    and their import time), and the halved bound compiles (in a fresh process: this one has imported them)."""
    import subprocess
    import textwrap

    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).resolve().parents[1] / "models")!r})
        import ctxrt, decoders
        feeds = decoders.empty_past(batch=1, seq=4)
        with ctxrt.InferenceSession(decoders.gpt2_decoder("dynamo")) as sess:
            decoders.generate(lambda f: sess.run(None, f), feeds, 3)
            print(sess.stats["range_programs_compiled"], sess.dim_ranges["past_sequence"])
        print(sorted(m for m in sys.modules if m.startswith("onnx.reference.ops.")))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.split("\n")[:2] == ["1 (0, 128)", "[]"], out.stdout + out.stderr


def test_a_new_past_length_makes_no_kernel_and_no_tensor(gpt2) -> None:
    """On the CPU a decoder's token at a past length not seen before changes only its attention steps, whose
    launches take the new extents from views: after the first tokens no kernel is made and (runs on arrays) no
    session tensor either. A oneDNN GEMM at one row runs NumPy's GEMV on the same weights."""
    path, feeds, want = gpt2
    built = []
    with ctxrt.InferenceSession(path, dim_ranges=PAST) as sess:
        def run(f):
            built.append(sess.stats["range_kernels_built"])
            return sess.run(None, f)
        assert decoders.generate(run, feeds, TOKENS) == want
        s = sess.stats
        assert built[2] == built[-1] == s["range_kernels_built"]  # from the third token (seq 1) on: none made
        assert s["range_specializations"] == TOKENS and s["tensors_created"] == 0
        # one launch list for the prompt and one for the tokens: a new past length changes only live steps
        assert s["recordings"] == 2 and s["recordings_reused"] == TOKENS - 2
        # the attention steps are live: one launch each for every past length, its views made when it first meets
        # one (no per-step state per set of dims); a second generation over the same lengths makes none
        runner = next(iter(sess._variants.values())).ranged._extent
        live = set(runner.live_raw)
        assert {runner.g.compiled.steps[k].op for k in live} >= {"Concat", "MatMul", "Softmax"}
        assert not any(k in live for members in runner.groups_made.values() for k, _ in members)
        made = s["range_live_launches_made"]
        assert 0 < made <= len(live) * TOKENS
        assert decoders.generate(lambda f: sess.run(None, f), feeds, TOKENS) == want
        assert sess.stats["range_live_launches_made"] == made


def test_launches_that_take_extents_match_onnx(backend) -> None:
    """The makers of backends/cpu/extents.py against onnx's reference on the shapes a decoder's attention steps
    take at several past lengths, through one range program of a small attention block."""
    from onnx import TensorProto, helper
    from onnx.reference import ReferenceEvaluator

    d = 8
    nodes = [helper.make_node("Concat", ["past", "k"], ["kk"], axis=2),
             helper.make_node("Transpose", ["kk"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["s"]),
             helper.make_node("Div", ["s", "scale"], ["sd"]),
             helper.make_node("Shape", ["kk"], ["shp"]),
             helper.make_node("Slice", ["shp", "two", "three"], ["plen"]),
             helper.make_node("Squeeze", ["plen"], ["n"]),
             helper.make_node("Range", ["zero", "n", "one"], ["pos"]),
             helper.make_node("Cast", ["pos"], ["posf"], to=TensorProto.FLOAT),
             helper.make_node("Add", ["sd", "posf"], ["sa"]),
             helper.make_node("Softmax", ["sa"], ["p"], axis=-1),
             helper.make_node("Tanh", ["p"], ["pt"]),
             helper.make_node("Where", ["cond", "pt", "p"], ["pw"]),
             helper.make_node("Concat", ["past", "k"], ["vv"], axis=2),
             helper.make_node("MatMul", ["pw", "vv"], ["y"])]
    i64 = TensorProto.INT64
    inits = [helper.make_tensor("scale", TensorProto.FLOAT, [], [np.sqrt(d)]),
             helper.make_tensor("two", i64, [1], [2]), helper.make_tensor("three", i64, [1], [3]),
             helper.make_tensor("zero", i64, [], [0]), helper.make_tensor("one", i64, [], [1]),
             helper.make_tensor("cond", TensorProto.BOOL, [1], [True])]
    fl = TensorProto.FLOAT
    g = helper.make_graph(nodes, "attn", [helper.make_tensor_value_info("past", fl, [1, 2, "past", d]),
                                          helper.make_tensor_value_info("k", fl, [1, 2, 1, d]),
                                          helper.make_tensor_value_info("q", fl, [1, 2, 1, d])],
                          [helper.make_tensor_value_info("y", fl, None), helper.make_tensor_value_info("kk", fl, None)],
                          inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    ref = ReferenceEvaluator(m)
    rng = np.random.default_rng(5)
    with ctxrt.InferenceSession(m.SerializeToString(), backend, dim_ranges={"past": (0, 40)}) as sess:
        for p in (0, 1, 7, 40, 3, 7):
            feeds = {"past": rng.standard_normal((1, 2, p, d)).astype(np.float32),
                     "k": rng.standard_normal((1, 2, 1, d)).astype(np.float32),
                     "q": rng.standard_normal((1, 2, 1, d)).astype(np.float32)}
            for w, x in zip(ref.run(None, feeds), sess.run(None, feeds), strict=True):
                assert w.shape == x.shape
                np.testing.assert_allclose(x, w, rtol=1e-5, atol=1e-6)
        assert sess.stats["shape_variants_compiled"] == 1
        if backend == "cpu":  # every changed step takes its extents: no kernel made per past length
            assert sess.stats["range_kernels_built"] == 0


def test_batch_cycle_is_one_compile(backend) -> None:
    # OpenCL builds each new shape's device programs once (PoCL: a compiler run each): fewer sizes there
    name, sizes = ("mobilenet_v3", range(1, 13)) if backend == "cpu" else ("audio1d", range(1, 5))
    path = exported.exported_model(name, "dynamo")
    theirs = _ort(path)
    with ctxrt.InferenceSession(path, backend) as sess:
        for _ in range(3):
            for batch in sizes:
                feeds = exported.exported_feeds(name, batch)
                want = theirs.run(None, feeds)[0]
                got = sess.run(None, feeds)[0]
                np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
        s = sess.stats
        assert s["shape_variants_compiled"] == 1 and s["range_specializations"] >= len(sizes)
        # the tensor cache keeps the IO tensors (one input, one output) of the last MAX_CHILDREN shapes only
        assert s["tensors_created"] - s["tensors_destroyed"] <= 2 * Graph.MAX_CHILDREN
        if backend == "cpu" and _native_convs():
            # every step takes the batch (native convs, pools, the classifier's GEMV): no kernel made for a size, one
            # recording for them all, whose structs are predicted from the second size on, learnt at the first from
            # the launches at batch 2-5 (runtime/slots.py): launches made at batch 1-5 only
            steps, made = divmod(s["range_live_launches_made"], 5)  # each step's launch at 5 sizes
            assert s["range_kernels_built"] == 0 and s["recordings"] == 1 and not made
            assert s["range_structs_predicted"] == (len(sizes) - 1) * steps  # every step's, at every other size


def _native_convs() -> bool:
    from ctxrt.backends.cpu import native
    from ctxrt.backends.cpu.onednn import api

    return native.library() is not None and api.available()


def _pointwise_block(act: tuple[str, dict, dict] | None, residual: bool) -> onnx.ModelProto:
    """x[batch, 16, 9, 11] -> 1x1 Conv 16 -> 40 + bias -> `act` (op, attributes, constant inputs) -> depthwise 3x3
    -> 1x1 Conv 40 -> 16 (+ x): an inverted-residual block, its 1x1 convs' epilogues fused."""
    rng = np.random.default_rng(3)
    c, e = 16, 40
    inits = [numpy_helper.from_array((rng.standard_normal((e, c, 1, 1)) / 4).astype(np.float32), "w1"),
             numpy_helper.from_array(rng.standard_normal(e).astype(np.float32), "b1"),
             numpy_helper.from_array((rng.standard_normal((e, 1, 3, 3)) / 3).astype(np.float32), "wd"),
             numpy_helper.from_array((rng.standard_normal((c, e, 1, 1)) / 6).astype(np.float32), "w2")]
    nodes, last = [helper.make_node("Conv", ["x", "w1", "b1"], ["h"])], "h"
    if act is not None:
        op, attrs, consts = act
        inits += [numpy_helper.from_array(np.array(v, np.float32), k) for k, v in consts.items()]
        nodes.append(helper.make_node(op, ["h", *consts], ["ha"], **attrs))
        last = "ha"
    nodes += [helper.make_node("Conv", [last, "wd"], ["d"], group=e, pads=[1, 1, 1, 1]),
              helper.make_node("Conv", ["d", "w2"], ["p" if residual else "y"])]
    if residual:
        nodes.append(helper.make_node("Add", ["p", "x"], ["y"]))
    io = [helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", c, 9, 11]) for name in ("x", "y")]
    graph = helper.make_graph(nodes, "block", io[:1], io[1:], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


ACTS = [None, ("Relu", {}, {}), ("HardSwish", {}, {}), ("Clip", {}, {"lo": 0.0, "hi": 6.0}),
        ("LeakyRelu", {"alpha": 0.1}, {}), ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}, {}), ("Sigmoid", {}, {})]


@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
@pytest.mark.parametrize("act", ACTS, ids=[a[0] if a else "none" for a in ACTS])
def test_a_range_programs_pointwise_convs_run_one_kernel_for_every_batch(act, residual, tmp_path, monkeypatch
                                                                         ) -> None:
    """A 1x1 Conv over channels-last rows in a batch range runs csrc/gemv.c's many-rows GEMM with its bias,
    residual and activation fused (the same code at every batch: no oneDNN primitive per batch size), reading the
    weights stored [K, N], and a depthwise Conv csrc/dwconv.c (weights [kh, kw, C]); equal to onnxruntime at batch
    1, 3 and 8, compiled and loaded from its binary; where the extension is missing at run time, oneDNN's matmul
    and convolution on the same weights. An activation the GEMM's epilogue lacks (Sigmoid) keeps oneDNN's conv."""
    from ctxrt.backends.cpu import gemv, native
    from ctxrt.backends.cpu.onednn import api

    model = _pointwise_block(act, residual)
    theirs = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(5)
    feeds = {n: {"x": rng.standard_normal((n, 16, 9, 11)).astype(np.float32)} for n in (1, 3, 8)}
    from ctxrt.cli import main as cli

    onnx.save(model, tmp_path / "block.onnx")
    assert cli(["compile", str(tmp_path / "block.onnx"), "-o", str(tmp_path / "block.ctx"), "--dim", "batch=1:8"]) == 0
    algs = [s.algorithm for s in ctxrt.context_from_binary(tmp_path / "block.ctx").graph().compiled.steps
            if s.op == "Conv"]
    if native.library() is not None and api.available():
        native_act = not (act and act[0] == "Sigmoid")
        assert algs == ["native:gemm_rows" if native_act else algs[0], "native:dwconv", "native:gemm_rows"], algs
        assert native_act or algs[0].startswith("onednn:conv")
    for no_native in (False, True):
        if no_native:
            monkeypatch.setattr(gemv, "launch", lambda *args, **kwargs: None)
            monkeypatch.setattr(native, "dwconv", lambda *args, **kwargs: None)
        g = ctxrt.context_from_binary(tmp_path / "block.ctx").graph()
        for n in (8, 1, 3, 8):
            want = theirs.run(None, feeds[n])[0]
            np.testing.assert_allclose(g.run(feeds[n])["y"], want, rtol=1e-5, atol=1e-5)
        # a kernel that binds any shape is the step's one kernel, a live step (runtime/extents.py): no kernel is
        # made for it at a new batch size (only for oneDNN's conv of a Sigmoid, once per size)
        free = {k for k, step in enumerate(g.compiled.steps) if step.attrs.get("any_rows") or step.attrs.get("dw_rows")}
        assert free <= set(g._extent.live_raw)
        assert len(free) == algs.count("native:gemm_rows") + algs.count("native:dwconv")
        made_per_size = set(g.ranges._by_step) - set(g._extent.live_raw)  # the layout's reorders, a Sigmoid's conv
        assert not free & made_per_size and g.ctx.stats["range_kernels_built"] == 3 * len(made_per_size)  # 8, 1, 3


def _stem(act: str | None) -> onnx.ModelProto:
    """x[batch, 3, 13, 15] -> Conv 3 -> 16, 3x3, stride 2, pads 1, bias -> `act` -> 1x1 Conv 16 -> 8: a CNN's first
    conv on its NCHW input."""
    rng = np.random.default_rng(8)
    inits = [numpy_helper.from_array((rng.standard_normal((16, 3, 3, 3)) / 4).astype(np.float32), "w1"),
             numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), "b1"),
             numpy_helper.from_array((rng.standard_normal((8, 16, 1, 1)) / 4).astype(np.float32), "w2")]
    nodes, last = [helper.make_node("Conv", ["x", "w1", "b1"], ["h"], strides=[2, 2], pads=[1, 1, 1, 1])], "h"
    if act is not None:
        nodes.append(helper.make_node(act, ["h"], ["ha"]))
        last = "ha"
    nodes.append(helper.make_node("Conv", [last, "w2"], ["y"]))
    io = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 13, 15]),
          helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8, 7, 8])]
    graph = helper.make_graph(nodes, "stem", io[:1], io[1:], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("act", [None, "Relu", "HardSwish", "Sigmoid"])
def test_a_range_programs_first_conv_reads_the_planar_input(act, tmp_path, monkeypatch) -> None:
    """A range program's conv of few channels on the graph's NCHW input runs csrc/dwconv.c's planar conv (bias and
    activation fused), with no reorder of the input before it and no kernel made per batch size; equal to
    onnxruntime at batch 8, 1, 3, 8, compiled and loaded from its binary, and where the extension is missing at run
    time (the input reordered into a copy of its own, oneDNN's conv). An activation the kernel lacks (Sigmoid) is
    a step of its own after it. A static program keeps oneDNN's reorder and conv."""
    from ctxrt.backends.cpu import native
    from ctxrt.cli import main as cli

    if not _native_convs():
        pytest.skip("oneDNN or the native extension is missing here")
    model = _stem(act)
    theirs = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(6)
    feeds = {n: {"x": rng.standard_normal((n, 3, 13, 15)).astype(np.float32)} for n in (1, 3, 8)}
    onnx.save(model, tmp_path / "stem.onnx")
    assert cli(["compile", str(tmp_path / "stem.onnx"), "-o", str(tmp_path / "stem.ctx"), "--dim", "batch=1:8"]) == 0
    steps = ctxrt.context_from_binary(tmp_path / "stem.ctx").graph().compiled.steps
    assert (steps[0].op, steps[0].algorithm) == ("Conv", "native:planar_conv"), [(s.op, s.algorithm) for s in steps]
    assert steps[1].op == ("Sigmoid" if act == "Sigmoid" else "Conv")
    static = ctxrt.compile(model.SerializeToString(), {"x": (2, 3, 13, 15)}).graph().compiled.steps
    assert static[0].op == "Reorder" and static[1].algorithm.startswith("onednn:")
    for no_native in (False, True):
        if no_native:
            monkeypatch.setattr(native, "planar_conv", lambda *args, **kwargs: None)
        g = ctxrt.context_from_binary(tmp_path / "stem.ctx").graph()
        for n in (8, 1, 3, 8):
            want = theirs.run(None, feeds[n])[0]
            np.testing.assert_allclose(g.run(feeds[n])["y"], want, rtol=1e-5, atol=1e-5)
        assert 0 in g._extent.live_raw
        assert g.ctx.stats["range_kernels_built"] == 3 * (len(g.ranges._by_step) - len(g._extent.live_raw))


def _sliced_stem() -> onnx.ModelProto:
    """The stem after x[:, :, ::2, ::2] (a Slice of step 2): its height and width are ceil(H / 2) and ceil(W / 2)
    from a node that is no strided conv or pool, which no derived dim stands for (compiler/floors.py)."""
    model = _stem("HardSwish")
    model.graph.input[0].type.tensor_type.shape.dim[2].dim_param = "height"
    model.graph.input[0].type.tensor_type.shape.dim[3].dim_param = "width"
    model.graph.initializer.extend([numpy_helper.from_array(np.array(v, np.int64), n) for n, v in
                                    (("s0", [0, 0]), ("s1", [1 << 30, 1 << 30]), ("sa", [2, 3]), ("ss", [2, 2]))])
    model.graph.node.insert(0, helper.make_node("Slice", ["x", "s0", "s1", "sa", "ss"], ["xs"]))
    model.graph.node[1].input[0] = "xs"
    return model


def test_a_session_ranges_a_strided_image_size_with_derived_dims() -> None:
    """A model whose batch, height and width are dynamic, read by a strided conv (its output height floor((H + 1) /
    2), no affine function of H): the session compiles one program over all three, the conv's output size a derived
    dim (compiler/floors.py), every size of every dim equal to onnxruntime, no warning. Where the rounding comes
    from a node that is no strided conv or pool (a Slice of step 2), the session compiles one program for a range
    of the batch at the image size met, with one warning naming the dims (PP-OCR's classifier and recognizer
    compiled per batch size before); another image size compiles one such program for it."""
    model = _stem("HardSwish")
    model.graph.input[0].type.tensor_type.shape.dim[2].dim_param = "height"
    model.graph.input[0].type.tensor_type.shape.dim[3].dim_param = "width"
    for d in (2, 3):
        model.graph.output[0].type.tensor_type.shape.dim[d].dim_param = f"out{d}"
    rng = np.random.default_rng(7)
    sizes = ((1, 13, 15), (3, 13, 15), (8, 13, 15), (2, 13, 15), (2, 9, 21), (5, 9, 21), (4, 13, 15), (7, 9, 21),
             (1, 2, 64), (6, 33, 1), (2, 40, 41))
    with warnings.catch_warnings():
        warnings.simplefilter("error", CtxrtWarning)
        data = model.SerializeToString()
        theirs = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
        with ctxrt.InferenceSession(data) as sess:
            for n, h, w in sizes:
                feeds = {"x": rng.standard_normal((n, 3, h, w)).astype(np.float32)}
                np.testing.assert_allclose(sess.run(None, feeds)[0], theirs.run(None, feeds)[0], rtol=1e-5,
                                           atol=1e-5)
            # (the first range's bounds 32: widened twice, for a width of 64 and a height of 33)
            assert sess.stats["shape_variants_compiled"] == sess.stats["range_programs_compiled"] == 3
            ranges = sess._current.ranged.ranges
            assert ranges.floors == ((1, 1, 2), (2, 1, 2)) and {"height", "width"} <= sess.dim_ranges.keys()
    data = _sliced_stem().SerializeToString()
    theirs = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    with pytest.warns(CtxrtWarning, match="one program for a range of 'batch' only, for each size of "
                                                "\\['height', 'width'\\] met"):
        sess = ctxrt.InferenceSession(data)
        for k, (n, h, w) in enumerate(sizes[:8]):
            feeds = {"x": rng.standard_normal((n, 3, h, w)).astype(np.float32)}
            np.testing.assert_allclose(sess.run(None, feeds)[0], theirs.run(None, feeds)[0], rtol=1e-5, atol=1e-5)
            assert sess.stats["shape_variants_compiled"] == (1 if k < 4 else 2)
    # one program per image size, both kept (a loop alternating sizes compiles nothing more)
    assert sess.stats["range_programs_compiled"] == 2 and sess.stats["shape_variants_freed"] == 0
    assert sess.dim_ranges["batch"][0] == 1
    assert "height" not in sess.dim_ranges
    sess.close()


def test_a_strided_image_size_is_refuted_before_the_second_check_point_is_read(monkeypatch) -> None:
    """Batch, height and width ranged (k = 3: U, U - 1, U - e_0, U - e_1 fitted, two check points): the Slice's
    output height (step 2: no strided conv's, no derived dim) is refuted at the first check point, tested once the
    four fit points are read, before the second is: five frontend reads, none lowered (a read ~30-90 ms for
    PP-OCR's classifier and recognizer)."""
    from ctxrt import compiler

    model = _sliced_stem()
    reads = spy(monkeypatch, compiler, "read", lambda model, shapes, *a, **k: shapes["x"])
    lowered = spy(monkeypatch, compiler, "compile_ir")
    with pytest.raises(RangeError, match="does not follow the dims linearly"):
        ctxrt.compile(model, dims={"batch": (1, 8), "height": (1, 64), "width": (1, 64)})
    assert len(reads) == 5 and not lowered, reads


def test_a_sessions_compile_attempts_share_the_model_as_read(tmp_path, monkeypatch) -> None:
    """A session whose range over batch, height and width is refuted compiles one over the batch next: both attempts
    lower the model as read once (its file parsed once, its arrays and constant chains shared, ir/memo.py), not
    once an attempt (PP-OCR's recognizer and classifier opened ~10-30% sooner)."""
    from ctxrt.frontend import onnx as frontend

    model = _sliced_stem()
    path = tmp_path / "stem.onnx"
    onnx.save(model, path)
    x = np.random.default_rng(2).standard_normal((2, 3, 13, 15)).astype(np.float32)
    with pytest.warns(CtxrtWarning, match="range of 'batch' only"), ctxrt.InferenceSession(path) as sess:
        parsed = spy(monkeypatch, frontend, "load_in_place")
        got = sess.run(None, {"x": x})[0]
        assert sess.stats["range_programs_compiled"] == 1 and len(parsed) == 1
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


MODELS = [(name, exp) for name in exported.MODELS for exp in ("dynamo", "legacy")
          if (name, exp) not in exported.UNEXPORTABLE]


@pytest.mark.parametrize("name, exporter", MODELS, ids=[f"{n}-{e}" for n, e in MODELS])
def test_every_exported_model_is_one_program_for_a_batch_range(name, exporter) -> None:
    path = exported.exported_model(name, exporter)
    g = ctxrt.compile(path, dims={"batch": (1, 8)}).graph()  # (branchy: the If's bodies follow the batch too)
    theirs = _ort(path)
    for batch in (1, 3, 8):
        feeds = exported.exported_feeds(name, batch)
        want = theirs.run(None, feeds)
        got = g.run(feeds)
        for w, x in zip(want, got.values(), strict=True):
            np.testing.assert_allclose(x, w, rtol=1e-4, atol=1e-4 * max(np.abs(w).max(), 1e-6))
    with pytest.raises(ShapeError, match=r"dim 'batch'\) is 9, outside the range 1\.\.8"):
        g.run(exported.exported_feeds(name, 9))


def test_ranges_survive_the_context_binary_and_the_epcontext_node(tmp_path, capsys, gpt2) -> None:
    from cli_helpers import cli

    path, feeds, want = gpt2
    out = tmp_path / "gpt.ctx"
    code, _, err = cli(capsys, "compile", path, "-o", out, "--epcontext", "--dim", "batch=1:2",
                       "--dim", "sequence=1:8", "--dim", "past_sequence=0:80", "-q")
    assert code == 0, err
    meta = ctxrt.read_metadata(out)
    assert meta["graphs"][0]["ranges"]["dims"] == [["batch", 1, 2], ["sequence", 1, 8], ["past_sequence", 0, 80]]
    wrapper = onnx.load(str(tmp_path / "gpt_ctx.onnx"))
    (node,) = wrapper.graph.node
    assert [a.strings for a in node.attribute if a.name == "dim_ranges"] == [[b"batch=1:2", b"sequence=1:8",
                                                                            b"past_sequence=0:80"]]
    assert [d.dim_param for d in wrapper.graph.output[1].type.tensor_type.shape.dim][::2] == \
        ["batch", "sequence + past_sequence"]
    for source in (out, tmp_path / "gpt_ctx.onnx"):
        with ctxrt.InferenceSession(source) as sess:
            assert sess.get_inputs()[1].shape == ["batch", 4, "past_sequence", 16]
            assert decoders.generate(lambda f: sess.run(None, f), feeds, TOKENS) == want
            with pytest.raises(ShapeError, match=r"'past_sequence'\) is 81, outside the range 0\.\.80"):
                sess.run(None, {**feeds, **{k: np.zeros((1, 4, 81, 16), np.float32) for k in list(feeds)[1:]}})
    code, text, _ = cli(capsys, "inspect", out, "--memory", "--at", "past_sequence=10", "--at", "batch=1")
    assert code == 0 and "ranges: batch 1..2, sequence 1..8, past_sequence 0..80" in text
    assert "at batch=1, sequence=8, past_sequence=10:" in text


def test_zero_size_and_growing_dims_read_the_right_bytes(backend) -> None:
    """The arena is planned at the bound; smaller shapes use the leading bytes of each place: two sessions
    stepping through shapes in opposite orders agree with onnxruntime at every step."""
    path = decoders.gpt2_decoder("dynamo")
    theirs = _ort(path)
    rng = np.random.default_rng(3)
    shapes = [(1, 1, 0), (2, 3, 5), (1, 8, 0), (2, 1, 17), (1, 2, 1)]
    with ctxrt.InferenceSession(path, backend, dim_ranges={"past_sequence": (0, 32), "sequence": (1, 8),
                                                           "batch": (1, 2)}) as sess:
        for b, s, p in shapes + shapes[::-1]:
            feeds = {"input_ids": rng.integers(0, decoders.VOCAB, (b, s), dtype=np.int64)}
            for k in decoders.names()[0][1:]:
                feeds[k] = rng.standard_normal((b, decoders.HEADS, p, 16)).astype(np.float32)
            for w, x in zip(theirs.run(None, feeds), sess.run(None, feeds), strict=True):
                assert w.shape == x.shape
                np.testing.assert_allclose(x, w, rtol=1e-4, atol=1e-4)
        assert sess.stats["shape_variants_compiled"] == 1


@pytest.mark.parametrize("edit, needle", [
    (lambda r: r["entries"][0][1].__setitem__(0, 10 ** 6), "upper bound"),
    (lambda r: [e[1].__setitem__(4, 10 ** 6) for e in r["entries"] if e[0][0] == "in"], "upper bound|shrinks"),
    (lambda r: r["entries"].append([["attr", 9999, "k"], [0] * 8]), "no integer"),
    (lambda r: r["entries"].append([["in", 0, 0, 7], [1] * 8]), "no integer"),
    (lambda r: r["dims"].__setitem__(0, ["batch", 5, 1]), r"dims\[0\] max"),
    (lambda r: r["dims"][0].append(3), "not multiples of its step"),
    (lambda r: r["dims"][0].append(1), r"dims\[0\] step"),
    (lambda r: r["readers"].pop(), "readers"),
    (lambda r: r["entries"][0].__setitem__(1, [1, 2]), "coefficients"),
])
def test_hostile_range_metadata_is_a_format_error(edit, needle) -> None:
    """Coefficients that would size a tensor past its place at the upper bound, places that name nothing, bad
    dims: refused when the binary is read, before any view of the arena is made."""
    from types import SimpleNamespace

    from ctxrt.backends import get_backend
    from ctxrt.compiler import compile_graphs
    from ctxrt.format import context_bytes

    be = get_backend("cpu")
    graphs, weights = compile_graphs([(decoders.gpt2_decoder("dynamo"), None, "main")], be,
                                     dims={"batch": (1, 2), "sequence": (1, 4), "past_sequence": (0, 8)})
    meta = graphs[0].ranges.to_meta()
    edit(meta)
    graphs[0].ranges = SimpleNamespace(to_meta=lambda: meta)  # the writer stores what to_meta gives
    with pytest.raises(FormatError, match=needle):
        ctxrt.InferenceSession(context_bytes(graphs, weights, {"backend": "cpu", "hardware": "x86_64",
                                                               "producer": "test", "alignment": 64}))


def test_gemms_at_few_rows_and_the_heap_after_a_compile(monkeypatch) -> None:
    """A range program's oneDNN GEMMs (bias, residual, Relu fused) at fewer than 8 rows run NumPy's GEMV on the
    same stored weights, at 8 or more the primitive: every size matches onnxruntime. The compile hands its freed
    heap back (runtime/heap.py) once."""
    from onnx import TensorProto, helper, numpy_helper

    from ctxrt.runtime import heap

    rng = np.random.default_rng(9)
    w1, w2 = (rng.standard_normal(s).astype(np.float32) * 0.2 for s in ((64, 48), (48, 64)))
    b1, b2 = (rng.standard_normal(n).astype(np.float32) for n in (48, 64))
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Add", ["h", "b1"], ["hb"]),
             helper.make_node("Relu", ["hb"], ["r"]), helper.make_node("MatMul", ["r", "w2"], ["o"]),
             helper.make_node("Add", ["o", "b2"], ["ob"]), helper.make_node("Add", ["ob", "x"], ["y"])]
    g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 64])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(a, k) for k, a in (("w1", w1), ("w2", w2), ("b1", b1), ("b2", b2))])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    trims = []
    monkeypatch.setattr(heap, "trim", lambda: trims.append(1) or True)
    theirs = ort.InferenceSession(m, providers=["CPUExecutionProvider"])
    with ctxrt.InferenceSession(m, dim_ranges={"n": (1, 32)}) as sess:
        for n in (1, 5, 8, 32, 2, 1):
            x = rng.standard_normal((n, 64)).astype(np.float32)
            np.testing.assert_allclose(sess.run(None, {"x": x})[0], theirs.run(None, {"x": x})[0], rtol=1e-4,
                                       atol=1e-4)
        assert sess.stats["shape_variants_compiled"] == 1 and trims == [1]
        g = next(iter(sess._variants.values())).ranged
        from ctxrt.backends.cpu.onednn import api

        if api.available():  # rows 1, 2 and 5 on the GEMV; 8 on the native GEMM of a few rows where the weights
            # are [K, N] and the extension is built, else (and 32, the upper bound's) on oneDNN
            from ctxrt.backends.cpu import gemv, native

            made = [m for cache in g._extent.cache.values() for m in cache.values() if m.step is not None
                    and m.step.op == "MatMul"]
            few = {m.step.inputs[0].shape[0] for m in made if m.kernel is None}
            tag = {m.step.attrs.get("weights_tag") for m in made}.pop()
            trans = tag == "ba"
            if tag not in ("ab", "ba"):  # blocked as oneDNN prefers them (AVX-512): its primitives at every size
                assert not few
            else:
                wide = gemv.WIDE_BYTES >= 64 * 48 * 4  # [N, K] weights this small: up to 16 rows natively
                assert few == {1, 2, 5} | ({8} if native.library() is not None and gemv.takes(8, trans, wide)
                                           else set())
            assert all(m.kernel is not None for m in made if m.step.inputs[0].shape[0] not in few)


def test_probe_compiles_share_the_weights_work(monkeypatch) -> None:
    """A range compile's probes lower one loaded proto and share its arrays and the weights derived from them
    (ir/memo.py): each weight is transposed once, not once per probe; outside a range compile nothing is kept."""
    from ctxrt.ir.passes import transpose_weights

    made = []
    real = transpose_weights.memo
    monkeypatch.setattr(transpose_weights, "memo",
                        lambda kind, source, extra, make: real(kind, source, extra, lambda: made.append(1) or make()))
    ctx = ctxrt.compile(decoders.gpt2_decoder("dynamo"),
                        dims={"batch": (1, 1), "sequence": (1, 8), "past_sequence": (0, 32)})
    stored = [s for s in ctx.graph().compiled.steps if s.attrs.get("transB") and s.op in ("MatMul", "Gemm")
              and s.inputs[1].space == CONST]  # (attention's Q.K^T reads K as stored: transB, not a weight)
    assert stored and len(made) == len(stored)  # 9+ probes, one transposition per weight
    made.clear()
    ctxrt.compile(decoders.gpt2_decoder("dynamo"), shapes={"input_ids": [1, 8]} | {
        k: [1, decoders.HEADS, 3, 16] for k in decoders.names()[0][1:]})
    assert len(made) == len(stored)  # a static compile: its own, nothing kept from before


def test_values_that_follow_the_dims_are_found_by_the_frontend_before_any_probe_is_compiled(monkeypatch) -> None:
    """The decoder's mask, positions and causal triangle change with the dims: the frontend alone at the upper bound
    and below it finds them (kept, computed at run time), so no probe is compiled twice: the k + 1 points of an
    affine fit and one check point compiled (k = 2 dims), two more frontend reads, the model checked once; the
    program runs as onnxruntime."""
    from ctxrt import compiler
    from ctxrt.frontend import onnx as frontend

    counts = {"read": 0, "compiled": 0, "checked": 0}

    def counting(key, real):
        def call(*a, **k):
            counts[key] += 1
            return real(*a, **k)
        return call
    monkeypatch.setattr(compiler, "read", counting("read", compiler.read))
    monkeypatch.setattr(compiler, "compile_ir", counting("compiled", compiler.compile_ir))
    monkeypatch.setattr(frontend, "check_model", counting("checked", frontend.check_model))
    path = decoders.gpt2_decoder("dynamo")
    ctx = ctxrt.compile(path, dims={"batch": (1, 1), "sequence": (1, 8), "past_sequence": (0, 32)})
    assert counts == {"read": 6, "compiled": 4, "checked": 1}
    assert {"arange", "triu"} <= set(ctx.graph().compiled.ranges.keep)
    feeds = decoders.empty_past(batch=1, seq=3)
    want = _ort(path).run(None, feeds)
    for got, w in zip(ctx.graph().run(feeds).values(), want, strict=True):
        np.testing.assert_allclose(got, w, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("axes, keepdims, dtype", [([1], 1, np.int64), ([1], 0, np.float32), ([0, 1], 1, np.float32),
                                                   (None, 0, np.int64)])
def test_reduce_sum_takes_extents(axes, keepdims, dtype) -> None:
    """ReduceSum over a dim that varies (a mask's row sums), down to a zero-size axis: onnx's reference at every
    length, and no kernel made per length."""
    from onnx import helper, numpy_helper
    from onnx.reference import ReferenceEvaluator

    t = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    inits = [numpy_helper.from_array(np.array(axes, np.int64), "axes")] if axes is not None else []
    nodes = [helper.make_node("ReduceSum", ["x"] + (["axes"] if axes is not None else []), ["s"], keepdims=keepdims),
             helper.make_node("Add", ["s", "s"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", t, [2, "n"])],
                          [helper.make_tensor_value_info("y", t, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    ref = ReferenceEvaluator(m)
    with ctxrt.InferenceSession(m.SerializeToString(), dim_ranges={"n": (0, 9)}) as sess:
        for n in (0, 1, 5, 9, 3):
            x = (np.random.default_rng(n).standard_normal((2, n)) * 10).astype(dtype)
            got, want = sess.run(None, {"x": x})[0], ref.run(None, {"x": x})[0]
            assert got.shape == want.shape
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        assert sess.stats["shape_variants_compiled"] == 1 and sess.stats["range_kernels_built"] == 0


@pytest.mark.parametrize("kernels", ["native", "numpy"])
@pytest.mark.parametrize("bias, scale_shape", [(True, [6]), (False, [6]), (True, [1])])
def test_layer_norm_and_softmax_take_extents(monkeypatch, kernels, bias, scale_shape) -> None:
    """LayerNormalization and Softmax over rows whose count follows a dim (a decoder's token and prompt) run one
    native call a step (csrc/norms_kernel.h) where the extension is built, with no kernel made per length; a Scale
    broadcast from one value, and no extension (a kernel per shape), give the same values. Against onnxruntime,
    with masked (-inf) scores and a row of all -inf (NaN, as onnxruntime gives)."""
    from onnx import helper, numpy_helper

    from ctxrt.backends.cpu import native

    if kernels == "numpy":
        monkeypatch.setattr(native, "library", lambda: None)
    elif native.library() is None:
        pytest.skip("the native extension is not built")
    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array(rng.standard_normal(scale_shape).astype(np.float32), "g")]
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(6).astype(np.float32), "b"))
    nodes = [helper.make_node("LayerNormalization", ["x", "g"] + (["b"] if bias else []), ["n"], axis=-1,
                              epsilon=1e-3),
             helper.make_node("Add", ["n", "mask"], ["s"]),
             helper.make_node("Softmax", ["s"], ["y"], axis=-1)]
    fl = onnx.TensorProto.FLOAT
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", fl, [2, "rows", 6]),
                                       helper.make_tensor_value_info("mask", fl, [2, "rows", 6])],
                          [helper.make_tensor_value_info("y", fl, None), helper.make_tensor_value_info("n", fl, None)],
                          inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    ref = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    with ctxrt.InferenceSession(m.SerializeToString(), dim_ranges={"rows": (0, 9)}) as sess:
        for rows in (1, 4, 9, 0, 2):
            x = (rng.standard_normal((2, rows, 6)) * 5 + 3).astype(np.float32)
            mask = np.where(rng.random((2, rows, 6)) < 0.3, -np.inf, 0).astype(np.float32)
            if rows:
                mask[1, 0] = -np.inf  # a row masked whole: NaN
            feeds = {"x": x, "mask": mask}
            for got, want in zip(sess.run(None, feeds), ref.run(None, feeds), strict=True):
                assert got.shape == want.shape
                np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        assert sess.stats["shape_variants_compiled"] == 1
        if kernels == "native":
            assert sess.stats["range_kernels_built"] == 0


@pytest.mark.parametrize("shared", [True, False], ids=["shared", "own"])
def test_sets_of_dims_run_batched_lists(monkeypatch, shared) -> None:
    """On arrays, a range program's sets of dims run one list shared by their recording (runtime/slots.py): its
    native launches merged into batches (backends/cpu/strided.py) once, every set batched from its first run. A set
    that runs its own list (its launches do not fit the shared one's slots) is batched from its second run while
    the program holds at most FEW_STATES sets (a batch loop), from its third beyond that (a generation: each past
    length met once per generation), from its first where kernels were built for it (its first run costs
    milliseconds anyway); the outputs are the same either way."""
    from onnx import helper, numpy_helper

    from ctxrt.backends.cpu import native, strided
    from ctxrt.runtime import extents, slots

    if native.library() is None:
        pytest.skip("the native extension is not built here")
    if not shared:
        monkeypatch.setattr(slots, "share", lambda *a: None)
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), n)
             for n, s in (("w", (8, 16)), ("b", (16,)), ("v", (16, 4)))]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["a"]),
             helper.make_node("Relu", ["a"], ["r"]), helper.make_node("Neg", ["r"], ["n"]),
             helper.make_node("MatMul", ["n", "v"], ["y"])]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", 1, ["batch", 8])],
                              [helper.make_tensor_value_info("y", 1, ["batch", 4])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    sizes = range(1, extents.FEW_STATES + 24)
    ctx = ctxrt.compile(model, dims={"batch": (1, sizes[-1])}, backend="cpu")
    g = ctx.graph()
    feeds = {b: {"x": rng.standard_normal((b, 8)).astype(np.float32)} for b in sizes}

    def batched_after(b: int, runs: int) -> bool:  # after `runs` more runs at batch b
        for _ in range(runs):
            got = g.run(feeds[b])["y"]
        w = np.maximum(feeds[b]["x"] @ numpy_helper.to_array(inits[0]) + numpy_helper.to_array(inits[1]), 0)
        np.testing.assert_allclose(got, -w @ numpy_helper.to_array(inits[2]), rtol=1e-5, atol=1e-5)
        state = g._extent.last[1]  # the set of dims the last run bound
        assert bool(state.shared) == shared
        launches = state.shared[1].batched if state.shared else state.resolved[1]
        return any(isinstance(launch, strided.Batch) for launch in launches)

    def built() -> bool:  # kernels were built for the dims of the last run
        return g._extent.last[1].built

    if shared:
        assert batched_after(1, 1) and batched_after(2, 1) and batched_after(sizes[-1], 1)
        for b in sizes[2:9]:  # each batch size its own GEMMs: its own recording and list, batched at once
            assert batched_after(b, 1)
        assert ctx.stats["range_shared_lists"] == ctx.stats["range_shared_runs"] == 10
        return
    assert not batched_after(1, 1) and not built() and batched_after(2, 2)  # few sets: from the second run
    big = sizes[-1]  # many rows: a GEMM kernel built for them
    assert batched_after(big, 1) and built()
    for b in sizes[8:-1]:  # more than FEW_STATES sets
        g.run(feeds[b])
    assert len(g._extent.states) > extents.FEW_STATES
    b = 3  # three rows: too few for a GEMM kernel, none built (as a generation's token): from the third run
    assert not batched_after(b, 1) and not built() and not batched_after(b, 1) and batched_after(b, 1)


def test_a_range_program_reads_a_gemm_s_weights_as_stored_and_runs_a_token_on_the_native_gemv() -> None:
    """Weights under onednn/matmul.py's STORED_MIN_BYTES are prepacked for a static program; a range program keeps
    them as stored (no second copy), so that its steps at a few rows run csrc/gemv.c's GEMV on them (sharing them
    among the idle cores): outputs equal onnxruntime's at one row and at the range's bound."""
    from ctxrt.backends.cpu import native
    from ctxrt.backends.cpu.backend import CpuBackend
    from ctxrt.backends.cpu.onednn import api

    if not api.available() or native.library() is None:
        pytest.skip("oneDNN or the native extension is not there")
    rng = np.random.default_rng(7)
    w = (rng.standard_normal((256, 1024)) / 16).astype(np.float32)  # 1 MiB
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["seq", 256])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["seq", 1024])],
                          [numpy_helper.from_array(w, "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()
    theirs = ort.InferenceSession(m, providers=["CPUExecutionProvider"])
    with ctxrt.InferenceSession(m, CpuBackend(onednn=True), dim_ranges={"seq": (1, 16)}) as sess:
        for seq in (1, 16, 1):
            x = rng.standard_normal((seq, 256)).astype(np.float32)
            np.testing.assert_allclose(sess.run(None, {"x": x})[0], theirs.run(None, {"x": x})[0], rtol=1e-4, atol=1e-4)
        assert sess.stats["weights_prepacked_bytes"] == 0
        assert sess.stats["weights_bytes"] == w.nbytes
        runner = next(iter(sess._variants.values())).contexts[0].graph()._extent
        one = next(st for st in runner.states.values() if st.inputs[0].shape == (1, 256))
        (made,) = one.steps.values()  # the MatMul at one row: a launch maker on the stored weights, no kernel
        assert made.kernel is None and made.make is not None


@pytest.mark.parametrize(("coeffs", "extent", "match"), [
    ([0, 1, 1, 0], 12, None),  # a + b: fits everywhere
    ([0, 1, 1, 0], 13, "is 12 at the upper bound, not the program's 13"),
    ([-2, 1, 0, 0], 2, "negative somewhere in the ranges"),  # a - 2 < 0 at a = 0
    ([10, -1, 1, 0], 14, "shrinks as dim 'a' grows"),  # 10 - a + b
    ([0, 0, 0, 1], 32, None),  # a b: monotone along every edge
])
def test_a_loaded_programs_extents_are_checked_against_its_arena(coeffs: list[int], extent: int, match: str | None
                                                                 ) -> None:
    """check_fits, which a context binary's load runs on every stored extent (all at once, then the first failing
    one for its message): the value at the upper bound is the program's, never negative, never shrinking as a dim
    grows (the arena is planned at the upper bound); the first failing entry is the one reported."""
    from types import SimpleNamespace

    from ctxrt.compiler.ranges import RangeError, Ranges, check_fits

    g = SimpleNamespace(inputs=[SimpleNamespace(name="x", shape=(12,)), SimpleNamespace(name="y", shape=(extent,))],
                        outputs=[], steps=[])
    dims = [("a", 0, 4), ("b", 1, 8)]
    ranges = Ranges(dims, [(0, 0), (0, 0)], [(["I", 0, 0], [0, 1, 1, 0]), (["I", 1, 0], coeffs)])
    if match is None:
        check_fits(g, ranges, dims)
        return
    with pytest.raises(RangeError, match=f"input 'y' axis 0 {match}" if "upper" in match else match):
        check_fits(g, ranges, dims)
    bad_first = Ranges(dims, [(0, 0), (0, 0)], [(["I", 1, 0], coeffs), (["I", 0, 0], [0, 1, 1, 0])])
    g.inputs[0].shape = (99,)  # both fail: the first entry's message
    with pytest.raises(RangeError, match=match):
        check_fits(g, bad_first, dims)


def test_a_native_conv_flag_the_node_cannot_have_is_a_clear_error() -> None:
    """A binary whose Conv says `any_rows` (the many-rows GEMM), `dw_rows` (the native depthwise conv) or
    `planar_rows` (the native conv of a planar input) where its shapes or layouts do not fit that kernel (damaged
    or forged): one UnsupportedOpError naming the node, not a failed reshape when it is bound."""
    from ctxrt.backends.cpu import native
    from ctxrt.backends.cpu.onednn import api, kernels
    from ctxrt.backends.kernel import NodeSpec, TensorSpec
    from ctxrt.errors import UnsupportedOpError

    if not api.available():
        pytest.skip("oneDNN is not installed here")
    f32 = np.dtype(np.float32)
    nhwc = {"src_layout": "nhwc", "dst_layout": "nhwc", "kernel": "onednn", "strides": [1, 1], "dilations": [1, 1]}
    depthwise = NodeSpec("Conv", "dw", {**nhwc, "group": 8, "pads": [1, 1, 1, 1], "kernel_shape": [3, 3]},
                         [TensorSpec((2, 5, 5, 8), f32), TensorSpec((8, 1, 3, 3), f32)],
                         [TensorSpec((2, 5, 5, 8), f32)], [None, np.ones((8, 1, 3, 3), np.float32)])
    pointwise = NodeSpec("Conv", "pw", {**nhwc, "group": 1, "pads": [0, 0, 0, 0], "kernel_shape": [1, 1]},
                         [TensorSpec((2, 5, 5, 8), f32), TensorSpec((16, 8, 1, 1), f32)],
                         [TensorSpec((2, 5, 5, 16), f32)], [None, np.ones((16, 8, 1, 1), np.float32)])
    for spec, flag in ((depthwise, "any_rows"), (pointwise, "dw_rows"), (pointwise, "planar_rows")):
        spec.attrs[flag] = 1
        with pytest.raises(UnsupportedOpError, match=f"Conv '{spec.name}': compiled for a native kernel \\({flag}\\)"):
            kernels.conv(spec)
        del spec.attrs[flag]
    if native.library() is not None:  # and the right flag on each is taken
        assert isinstance(kernels.conv(NodeSpec(depthwise.op, "dw", {**depthwise.attrs, "dw_rows": 1},
                                                depthwise.inputs, depthwise.outputs, depthwise.consts)),
                          kernels.DepthwiseRows)


@pytest.mark.parametrize("dim", ["p2o.DynamicDimension.0", "?"])
def test_dim_names_exporters_write_are_ranged(dim) -> None:
    """paddle2onnx names a dynamic dim "p2o.DynamicDimension.0" (a dotted name, not an expression of other dims)
    and writes "?" for an unnamed one: a batch loop through InferenceSession is one range program over it, equal
    to onnxruntime (a dotted name was taken for an expression and the model compiled per shape, silently)."""
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["h"]), helper.make_node("Neg", ["h"], ["y"])], "t",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [dim, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [dim, 8])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    theirs = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(4)
    with ctxrt.InferenceSession(model) as sess:
        for n in (1, 3, 2, 5):
            x = rng.standard_normal((n, 8)).astype(np.float32)
            np.testing.assert_allclose(sess.run(None, {"x": x})[0], theirs.run(None, {"x": x})[0])
        assert sess.stats["shape_variants_compiled"] == 1 and sess.stats["range_programs_compiled"] == 1


def _counting_compiles(monkeypatch) -> list[int]:
    from ctxrt import compiler

    made: list[int] = []
    real = compiler.compile_ir

    def call(*a, **k):
        made.append(1)
        return real(*a, **k)
    monkeypatch.setattr(compiler, "compile_ir", call)
    return made


def _merged_rows(tmp_path) -> Path:
    """x (batch, seq, 8) -> Reshape (batch * seq, 8) -> MatMul -> Reshape (batch, seq, 4): an extent that is a
    product of two dims (no affine fit holds)."""
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32), "w")
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Constant", [], ["rows"], value=numpy_helper.from_array(np.array([-1, 8], np.int64))),
             helper.make_node("Reshape", ["x", "rows"], ["flat"]),
             helper.make_node("MatMul", ["flat", "w"], ["m"]),
             helper.make_node("Slice", ["s", "zero", "two"], ["bs"]),
             helper.make_node("Concat", ["bs", "four"], ["back"], axis=0),
             helper.make_node("Reshape", ["m", "back"], ["y"])]
    consts = [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in
              (("zero", [0]), ("two", [2]), ("four", [4]))]
    graph = helper.make_graph(nodes, "merged", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", "s", 4])],
                              initializer=[w, *consts])
    path = tmp_path / "merged.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_a_product_of_dims_is_fitted_over_every_corner(tmp_path, monkeypatch) -> None:
    """An extent batch * seq: the affine fit (3 points) misses it at the check point, so every corner of the box is
    compiled (5 probes in all, the first four reused); right at shapes inside the ranges."""
    made = _counting_compiles(monkeypatch)
    path = _merged_rows(tmp_path)
    ctx = ctxrt.compile(path, dims={"b": (1, 6), "s": (1, 9)})
    assert len(made) == 5
    g = ctx.graph()
    assert any(c[3] for _, c in g.compiled.ranges.entries)  # the product's coefficient
    sess = _ort(path)
    for b, sq in ((1, 1), (6, 9), (2, 7), (5, 3)):
        x = np.random.default_rng(b * 10 + sq).standard_normal((b, sq, 8)).astype(np.float32)
        np.testing.assert_allclose(g.run({"x": x})["y"], sess.run(None, {"x": x})[0], rtol=1e-5, atol=1e-5)


def test_three_dims_fitted_affine_from_six_probes(monkeypatch) -> None:
    """The decoder ranged over batch, sequence and past: its integers are affine in the three, found from U, U - 1,
    U - e_j for two dims and two check points (6 probes, not 2^3 + 1); the program runs as onnxruntime at shapes
    inside the ranges."""
    made = _counting_compiles(monkeypatch)
    path = decoders.gpt2_decoder("dynamo")
    ctx = ctxrt.compile(path, dims={"batch": (1, 4), "sequence": (1, 8), "past_sequence": (0, 32)})
    assert len(made) == 6
    g, sess = ctx.graph(), _ort(path)
    for batch, seq, past in ((1, 1, 0), (4, 8, 32), (3, 2, 17), (2, 5, 1)):
        feeds = decoders.empty_past(batch=batch, seq=seq)
        rng = np.random.default_rng(batch + seq + past)
        feeds = {k: v if k == "input_ids" else rng.standard_normal((*v.shape[:2], past, v.shape[3])).astype(np.float32)
                 for k, v in feeds.items()}
        for got, want in zip(g.run(feeds).values(), sess.run(None, feeds), strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("checks, shown", [
    ([(4, 4, 2)], False),  # (U - V) = (2, 2, 4) per dim is (-2, -2, -4): batch * seq alone is off by 0 there
    ([(3, 4, 2), (2, 3, 1)], True),
])
def test_a_check_point_where_a_product_would_fit_is_not_used(checks, shown) -> None:
    """The affine fit's check points must each show every product of dims left out: one that a product alone
    fits (its miss c (v0 v1 + v2) is 0 at v = (-2, -2, -4)) is not taken, and the fit then uses every corner."""
    from ctxrt.compiler.ranges import _shows_products

    hi, alt = (6, 6, 6), (5, 5, 5)
    points = [hi, alt, (5, 6, 6), (6, 5, 6)]
    assert _shows_products(points, [0, 1, 2, 4], checks, 3) is shown


def test_a_probe_read_again_reuses_its_first_inference(monkeypatch) -> None:
    """Within a range compile (ir/memo.py), the frontend read again at a probe point (the first read found values
    that follow the dims, now kept unfolded) reuses its inference before anything was folded: one onnx shape
    inference fewer, the same graph as a read without the memo."""
    import onnx

    from ctxrt.backends import get_backend
    from ctxrt.compiler import read
    from ctxrt.ir import memo

    calls = spy(monkeypatch, onnx.shape_inference, "infer_shapes")
    path = decoders.gpt2_decoder("dynamo")
    model = onnx.load(str(path))
    shapes = {"input_ids": [1, 8], **{k: [1, decoders.HEADS, 5, 16] for k in decoders.names()[0][1:]}}
    backend = get_backend("cpu")
    plain = read(model, shapes, backend, keep=frozenset({"arange"}))
    without = len(calls)  # the inferences of that read alone
    calls.clear()
    with memo.shared():
        read(model, shapes, backend)
        calls.clear()
        again = read(model, shapes, backend, keep=frozenset({"arange"}))
        assert len(calls) == without - 1
    assert [(n.op, n.inputs, n.outputs) for n in again.nodes] == [(n.op, n.inputs, n.outputs) for n in plain.nodes]


def test_constant_chains_are_folded_before_inference_once_for_every_probe(monkeypatch) -> None:
    """Nodes computing from constants alone (paddle2onnx's Constant nodes, a weight's Transpose) are folded before
    the first shape inference, which then never types them (PP-OCR's recognizer: 860 -> 425 nodes inferred); within
    a range compile each result is one array for every probe, so that a probe read again still reuses its first
    inference (its memo compares large constants by identity). Outputs match onnxruntime across the range."""
    from ctxrt.frontend.onnx import Folder

    w = np.random.default_rng(3).standard_normal((64, 64)).astype(np.float32)
    nodes = [helper.make_node("Constant", [], ["w"], value=numpy_helper.from_array(w)),
             helper.make_node("Transpose", ["w"], ["wt"]),
             helper.make_node("Constant", [], ["minus1"], value=numpy_helper.from_array(np.array([-1], np.int64))),
             helper.make_node("MatMul", ["x", "wt"], ["y0"]),
             helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
             helper.make_node("Concat", ["n", "minus1"], ["to"], axis=0),
             helper.make_node("Reshape", ["y0", "to"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4, 64])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", None])],
                          [numpy_helper.from_array(np.array([0], np.int64), "zero")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    inferred = spy(monkeypatch, Folder, "skeleton", lambda folder: (
        {n.op_type for n in folder.nodes}, id(folder.consts.get("wt"))))
    ctx = ctxrt.compile(m, dims={"n": (1, 9)})
    assert inferred and not any({"Constant", "Transpose"} & ops for ops, _ in inferred)
    assert len({wt for _, wt in inferred}) == 1  # the probes' transposed weight: one array
    for n in (1, 4, 9):
        x = np.random.default_rng(n).standard_normal((n, 4, 64)).astype(np.float32)
        want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
        np.testing.assert_allclose(ctx.graph().run({"x": x})["y"], want, rtol=1e-4, atol=1e-4)


def test_onednn_is_asked_once_per_node_in_a_range_compile(monkeypatch) -> None:
    """A range compile asks oneDNN whether it runs each node (layouts, fusions) at its first probe, the upper bound,
    and takes the answers as such at the other probes: as many questions as one static compile, not one set a
    probe; the program the same as when every probe asks."""
    from ctxrt.backends.cpu import backend as cpu_backend
    from ctxrt.backends.cpu import onednn
    from ctxrt.backends.cpu.onednn import api

    if not api.available():
        pytest.skip("oneDNN is not installed here")
    asked = spy(monkeypatch, onednn, "supports", lambda spec: spec.name)
    path = decoders.gpt2_decoder("dynamo")
    dims = {"batch": (1, 1), "sequence": (1, 8), "past_sequence": (0, 32)}
    ctxrt.compiler.compile_model(str(path), {"input_ids": [1, 8], **{k: [1, decoders.HEADS, 32, 16] for k in
                                                                     decoders.names()[0][1:]}})
    static = len(asked)
    asked.clear()
    ranged, _ = ctxrt.compiler.compile_model(str(path), dims=dims)
    assert 0 < len(asked) <= static
    monkeypatch.setattr(cpu_backend, "_decided", lambda g, node, how, ask: ask())
    asked.clear()
    again, _ = ctxrt.compiler.compile_model(str(path), dims=dims)
    assert len(asked) > static  # every probe asks
    assert [(s.op, s.algorithm, s.attrs.get("kernel")) for s in again.steps] == \
        [(s.op, s.algorithm, s.attrs.get("kernel")) for s in ranged.steps]


def _rounding_model(pool: bool = False) -> bytes:
    """y = Resize(x[:, :, ::2]) x 2 along H (`pool`: MaxPool(x, 2 x 1, stride 2, ceil_mode) for the Slice): y's
    height is 2 * ceil(H / 2), the same at H = 64 and 63 (the upper bound and the probe below it), not linear in
    H."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1, "H", 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    inits = [numpy_helper.from_array(np.array([1, 1, 2, 1], np.float32), "scales"),
             *(numpy_helper.from_array(np.array([v], np.int64), n) for n, v in
               (("s0", 0), ("s1", 1 << 30), ("sa", 2), ("ss", 2)))]
    first = helper.make_node("MaxPool", ["x"], ["p"], kernel_shape=[2, 1], strides=[2, 1], ceil_mode=1) if pool \
        else helper.make_node("Slice", ["x", "s0", "s1", "sa", "ss"], ["p"])
    nodes = [first, helper.make_node("Resize", ["p", "", "scales"], ["y"], mode="nearest")]
    graph = helper.make_graph(nodes, "g", [x], [y], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]).SerializeToString()


def test_a_dim_of_two_values_still_gets_a_check_point(monkeypatch) -> None:
    """With N in 1..2 (two values: no third to check at) and H in 1..64, every corner of {U, U - 1} gives the output
    height 64: a fit without a check point took it as constant, and the program returned 64 rows for 22 (the
    session's outputs of the wrong shape, PP-OCR's detector the same). The check point takes N at its bound and H
    at a third value; the output's height, refuted there by the frontend's shapes alone, fails the range compile
    before any probe is lowered; the session ranges N alone and matches onnxruntime at every height."""
    from ctxrt import compiler
    from ctxrt.compiler.ranges import _verify_points

    assert _verify_points([("N", 1, 2), ("H", 1, 64)], [2, 64], [1, 63]) == [(2, 22), (2, 32)]
    assert _verify_points([("N", 1, 2), ("M", 0, 1)], [2, 1], [1, 0]) == []  # the corners are every point
    lowered = spy(monkeypatch, compiler, "compile_ir")
    with pytest.raises(RangeError, match=r"output 'y' axis 2 does not follow the dims linearly"):
        ctxrt.compile(_rounding_model(), dims={"N": (1, 2), "H": (1, 64)})
    assert not lowered
    for pool in (False, True):  # (a MaxPool's: one program with a derived dim, compiler/floors.py)
        data = _rounding_model(pool)
        theirs = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", CtxrtWarning)
            sess = ctxrt.InferenceSession(data, dim_ranges={"N": (1, 2), "H": (1, 64)})
            for shape in [(1, 1, 64, 8), (2, 1, 22, 8), (1, 1, 63, 8), (2, 1, 7, 8), (1, 1, 1, 8)]:
                x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
                (got,), (want,) = sess.run(None, {"x": x}), theirs.run(None, {"x": x})
                assert got.shape == want.shape and np.array_equal(got, want)
        assert [str(w.message) for w in caught if "range of 'N' only" in str(w.message)] != [] or pool
        assert sess.stats["shape_variants_compiled"] == (1 if pool else 5)


def test_a_compile_failing_inside_the_ranges_leaves_no_cycle() -> None:
    """A model with no graph at odd heights (x + Resize(MaxPool(x)): 64 rows and 63 + 1): the range compile fails at
    the probe below the upper bound, marked as inside the ranges (a session then ranges fewer dims rather than
    narrower bounds), and leaves nothing for the collector: the error no longer sat in a local of the probe's
    frame, whose traceback held that frame (its probes' graphs stayed until a collection: 11 MB more at the peak
    of the decoder's default session)."""
    import gc

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1, "H", 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    scales = numpy_helper.from_array(np.array([1, 1, 2, 1], np.float32), "scales")
    nodes = [helper.make_node("MaxPool", ["x"], ["p"], kernel_shape=[2, 1], strides=[2, 1], ceil_mode=1),
             helper.make_node("Resize", ["p", "", "scales"], ["r"], mode="nearest"),
             helper.make_node("Add", ["x", "r"], ["y"])]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [y], [scales]),
                              opset_imports=[helper.make_opsetid("", 18)])
    with pytest.raises(ShapeError, match=r"at N=1, H=63 \(inside the ranges\)") as info:
        ctxrt.compile(model, dims={"N": (1, 2), "H": (2, 64)})
    assert info.value.inside
    del info
    gc.collect()
    gc.disable()
    try:
        with pytest.raises(ShapeError):
            ctxrt.compile(model, dims={"N": (1, 2), "H": (2, 64)})
        assert gc.collect() == 0
    finally:
        gc.enable()


def test_a_session_ranges_the_dims_a_refuted_extent_does_not_follow() -> None:
    """y = x[:, :, 1::2] halves H (rounded down: 32 rows at 64 and 31 at 63, 11 at 22, no affine fit), z + 1 follows N
    and S: the range over N, S and H is refuted by y's height, which follows H alone; the session ranges N and S
    together (not one of them), H fixed per size: a loop over N and S is one compile, as onnxruntime's outputs."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1, "H", 8])
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, ["N", "S"])
    ys = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y", "w")]
    inits = [numpy_helper.from_array(np.array(1, np.float32), "one"),
             *(numpy_helper.from_array(np.array([v], np.int64), n) for n, v in
               (("s0", 1), ("s1", 1 << 30), ("sa", 2), ("ss", 2)))]
    nodes = [helper.make_node("Slice", ["x", "s0", "s1", "sa", "ss"], ["y"]),
             helper.make_node("Add", ["z", "one"], ["w"])]
    data = helper.make_model(helper.make_graph(nodes, "g", [x, z], ys, inits),
                             opset_imports=[helper.make_opsetid("", 18)]).SerializeToString()
    theirs = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    with pytest.warns(CtxrtWarning, match="range of 'N' and 'S' only"), \
            ctxrt.InferenceSession(data, dim_ranges={"N": (1, 4), "S": (1, 16), "H": (1, 64)}) as sess:
        for n, s in [(1, 5), (3, 16), (2, 1), (4, 9)]:
            feeds = {"x": rng.standard_normal((n, 1, 22, 8)).astype(np.float32),
                     "z": rng.standard_normal((n, s)).astype(np.float32)}
            for got, want in zip(sess.run(None, feeds), theirs.run(None, feeds), strict=True):
                assert got.shape == want.shape and np.array_equal(got, want)
        assert sess.stats["shape_variants_compiled"] == 1


@pytest.mark.parametrize("op", ["LSTM", "GRU"])
def test_a_range_programs_recurrent_nodes_run_the_native_kernel_at_every_shape(op: str) -> None:
    """A range program's LSTM or GRU (torch's tagger: bidirectional, constant weights; a GRU with
    linear_before_reset) runs the native kernel at every length and batch of its ranges, batches past the 16 rows
    a fixed program gives it included: oneDNN's primitive there reads plain weights (its reference RNN, an exported
    tagger 1.25x onnxruntime against 0.95x). One compile; outputs match onnxruntime."""
    from ctxrt.backends.cpu import native

    if native.library() is None:
        pytest.skip("the native extension is not built here")
    rng = np.random.default_rng(5)
    i, h, g = 6, 8, 4 if op == "LSTM" else 3
    inits = {"W": (rng.standard_normal((2, g * h, i)) / 3).astype(np.float32),
             "R": (rng.standard_normal((2, g * h, h)) / 3).astype(np.float32),
             "B": (rng.standard_normal((2, 2 * g * h)) * 0.3).astype(np.float32)}
    outs = ["Y", "Y_h", "Y_c"] if op == "LSTM" else ["Y", "Y_h"]
    extra = {} if op == "LSTM" else {"linear_before_reset": 1}
    node = helper.make_node(op, ["X", "W", "R", "B"], outs, hidden_size=h, direction="bidirectional", **extra)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["T", "N", i])],
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outs],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    theirs = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    with ctxrt.InferenceSession(model, dim_ranges={"T": (1, 40), "N": (1, 24)}) as sess:
        for t, n in ((7, 1), (40, 24), (3, 2), (12, 17), (1, 5)):
            x = rng.standard_normal((t, n, i)).astype(np.float32)
            for o, got, want in zip(outs, sess.run(None, {"X": x}), theirs.run(None, {"X": x}), strict=True):
                np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=f"{o} at T={t}, N={n}")
        assert sess.stats["shape_variants_compiled"] == 1
        (variant,) = sess._variants.values()
        g_ = variant.stages[0].graph
        assert g_.ranges is not None and [s.algorithm for s in g_.compiled.steps if s.op == op] == \
            [f"native_{op.lower()}"]


def test_a_branch_on_a_dim_is_chosen_per_run_not_folded_at_the_probes() -> None:
    """If(shape(x)[0] > 2): true at every probe and check point of 1..32, false at 1 and 2. Folded there, the
    program ran the then branch at every size (wrong at 1 and 2); the comparison is computed at run time."""
    then = helper.make_graph([helper.make_node("Mul", ["x", "two"], ["t"])], "then", [],
                             [helper.make_tensor_value_info("t", TensorProto.FLOAT, ["N", 4])])
    other = helper.make_graph([helper.make_node("Mul", ["x", "three"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", TensorProto.FLOAT, ["N", 4])])
    nodes = [helper.make_node("Shape", ["x"], ["sh"]), helper.make_node("Gather", ["sh", "zero"], ["n"], axis=0),
             helper.make_node("Greater", ["n", "lim"], ["c"]),
             helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
                          [numpy_helper.from_array(np.int64(0), "zero"), numpy_helper.from_array(np.int64(2), "lim"),
                           numpy_helper.from_array(np.float32(2), "two"),
                           numpy_helper.from_array(np.float32(3), "three")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()
    theirs = ort.InferenceSession(m, providers=["CPUExecutionProvider"])
    program = ctxrt.compile(m, dims={"N": (1, 32)}).graph()
    with ctxrt.InferenceSession(m) as sess:
        for n in (32, 5, 3, 2, 1):
            feeds = {"x": np.ones((n, 4), np.float32)}
            want = theirs.run(None, feeds)[0]
            np.testing.assert_array_equal(program.run(feeds)["y"], want)
            np.testing.assert_array_equal(sess.run(None, feeds)[0], want)
        assert sess.stats["shape_variants_compiled"] == 1
    assert "If" in [s.op for s in program.compiled.steps]


def _clamped_slice(op: str, bound: int) -> bytes:
    """y = relu(x[:op(N, bound)]): the Slice's end a piecewise function of the dim N, folded into a shape."""
    nodes = [helper.make_node("Shape", ["x"], ["sh"]), helper.make_node("Gather", ["sh", "zero"], ["n"], axis=0),
             helper.make_node(op, ["n", "bound"], ["e"]), helper.make_node("Slice", ["x", "zero", "e", "zero"], ["s"]),
             helper.make_node("Relu", ["s"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(np.array([0], np.int64), "zero"),
                           numpy_helper.from_array(np.array([bound], np.int64), "bound")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()


@pytest.mark.parametrize("op, bound, one_piece", [("Min", 8, False), ("Min", 64, True), ("Max", 5, False),
                                                  ("Max", 0, True)])
def test_a_shape_that_follows_a_clamped_dim_is_one_program_only_where_it_keeps_one_piece(op, bound, one_piece
                                                                                         ) -> None:
    """x[:min(N, 8)] for N in 1..32 has 8 rows at every probe and check point, N below 8: its program had 8 rows
    everywhere (garbage at N = 1, a crash at 5). A piecewise op folded into a shape is checked over the whole
    box of ranges: refused where it changes piece (the session then compiles exact shapes), one program where
    it does not (min(N, 64))."""
    m = _clamped_slice(op, bound)
    theirs = ort.InferenceSession(m, providers=["CPUExecutionProvider"])
    feeds = [{"x": np.arange(n * 4, dtype=np.float32).reshape(n, 4) - 7} for n in (32, 9, 5, 1)]
    if one_piece:
        program = ctxrt.compile(m, dims={"N": (1, 32)}).graph()
        for f in feeds:
            np.testing.assert_array_equal(program.run(f)["y"], theirs.run(None, f)[0])
    else:
        with pytest.raises(RangeError, match=f"a shape follows {op} value 'e', which changes piece"):
            ctxrt.compile(m, dims={"N": (1, 32)})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CtxrtWarning)
        with ctxrt.InferenceSession(m) as sess:
            for f in feeds:
                got, want = sess.run(None, f)[0], theirs.run(None, f)[0]
                assert got.shape == want.shape
                np.testing.assert_array_equal(got, want)


def test_a_lookup_at_an_index_that_follows_a_dim_is_computed_per_run() -> None:
    """y = x * table[N] (an int64 table of any values): folded at the probes the lookup is fitted as if it were
    affine in N (refuted only where a check point happens to show it); it is computed at run time instead, right
    at every N of the range."""
    table = np.array([5, 1, 9, 2, 7, 3, 8, 4, 6, 0] * 4, np.int64)
    nodes = [helper.make_node("Shape", ["x"], ["sh"]), helper.make_node("Gather", ["sh", "zero"], ["n"], axis=0),
             helper.make_node("Gather", ["table", "n"], ["t"], axis=0),
             helper.make_node("Cast", ["t"], ["tf"], to=TensorProto.FLOAT), helper.make_node("Mul", ["x", "tf"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
                          [numpy_helper.from_array(np.int64(0), "zero"), numpy_helper.from_array(table, "table")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()
    theirs = ort.InferenceSession(m, providers=["CPUExecutionProvider"])
    program = ctxrt.compile(m, dims={"N": (1, 32)}).graph()
    for n in range(1, 33):
        feeds = {"x": np.ones((n, 4), np.float32)}
        np.testing.assert_array_equal(program.run(feeds)["y"], theirs.run(None, feeds)[0])


@pytest.mark.parametrize("ends, steps, one_program", [([8], [1], False), ([-3], [1], False), ([-100], [-1], True),
                                                      ([40], [1], True)])
def test_a_slice_that_clamps_differently_inside_the_ranges_is_refused(ends, steps, one_program) -> None:
    """x[:8] over N in 1..32: 8 rows at every probe (the end clamped to N below 8: its program had 8 rows at N = 1,
    garbage, and crashed at 2..7). A slice whose bounds fall past its axis at some sizes only is refused; x[:40]
    (always clamped) and a reversed x[::-1] are one program, right at every N."""
    starts = [0] if steps[0] > 0 else [-1]
    nodes = [helper.make_node("Slice", ["x", "st", "en", "ax", "sp"], ["s"]), helper.make_node("Relu", ["s"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(np.array(v, np.int64), k)
                           for k, v in (("st", starts), ("en", ends), ("ax", [0]), ("sp", steps))])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()
    theirs = ort.InferenceSession(m, providers=["CPUExecutionProvider"])
    if not one_program:
        with pytest.raises(RangeError, match="Slice node .* clamps its bounds differently"):
            ctxrt.compile(m, dims={"N": (1, 32)})
        return
    program = ctxrt.compile(m, dims={"N": (1, 32)}).graph()
    for n in range(1, 33):
        feeds = {"x": np.arange(n * 4, dtype=np.float32).reshape(n, 4) - 3}
        want = theirs.run(None, feeds)[0]
        got = program.run(feeds)["y"]
        assert got.shape == want.shape
        np.testing.assert_array_equal(got, want)


def test_a_narrower_program_survives_a_widening_that_is_refused() -> None:
    """y = x[-20:] over N: one program for 1..16 (the start always clamped to 0); widened to 1..32 the start
    clamps at some sizes only and the range is refused. The narrower program keeps running its sizes (it was
    freed before the wider one compiled: every later small size compiled again); larger sizes compile exact."""
    nodes = [helper.make_node("Slice", ["x", "st", "en", "ax"], ["s"]), helper.make_node("Relu", ["s"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(np.array(v, np.int64), k)
                           for k, v in (("st", [-20]), ("en", [2 ** 62]), ("ax", [0]))])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()
    theirs = ort.InferenceSession(m, providers=["CPUExecutionProvider"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CtxrtWarning)
        with ctxrt.InferenceSession(m) as sess:
            for n in (3, 16, 25, 4, 11, 6):
                feeds = {"x": np.arange(n * 4, dtype=np.float32).reshape(n, 4) - 5}
                got, want = sess.run(None, feeds)[0], theirs.run(None, feeds)[0]
                assert got.shape == want.shape
                np.testing.assert_array_equal(got, want)
            assert sess.stats["shape_variants_compiled"] == 2  # 1..16, then 25 exact; 4, 11, 6 on the first


def _branch_reading_a_dim(kind: str) -> bytes:
    """y = If(sum(x) > 0, then: x * f(N), else: -x), N = x's rows read inside the branch: f(N) = (N > 2) ("compare")
    or table[N] ("lookup"), each folded in the branch's own read."""
    first = [helper.make_node("Shape", ["x"], ["sh"]), helper.make_node("Gather", ["sh", "zero"], ["n"], axis=0)]
    f = helper.make_node("Greater", ["n", "lim"], ["v"]) if kind == "compare" else \
        helper.make_node("Gather", ["table", "n"], ["v"], axis=0)
    then = helper.make_graph([*first, f, helper.make_node("Cast", ["v"], ["vf"], to=TensorProto.FLOAT),
                              helper.make_node("Mul", ["x", "vf"], ["t"])], "then", [],
                             [helper.make_tensor_value_info("t", TensorProto.FLOAT, None)])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", TensorProto.FLOAT, None)])
    nodes = [helper.make_node("ReduceSum", ["x"], ["sm"], keepdims=0), helper.make_node("Greater", ["sm", "f0"], ["c"]),
             helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)]
    table = np.array([5, 1, 9, 2, 7, 3, 8, 4, 6, 0] * 4, np.int64)
    inits = [numpy_helper.from_array(np.int64(0), "zero"), numpy_helper.from_array(np.int64(2), "lim"),
             numpy_helper.from_array(np.float32(0), "f0"), numpy_helper.from_array(table, "table")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()


@pytest.mark.parametrize("kind", ["compare", "lookup"])
def test_a_branch_that_reads_a_dim_computes_it_per_run(kind) -> None:
    """A comparison or a lookup on N inside an If branch: folded by the branch's own read, outside what the
    probes compared, the program ran N > 2 (or table[32]'s neighbours' fit) at every N: wrong at N = 1, 2 (at
    1..7 for the lookup). The branches' folded values are compared with the rest: computed per run, right at
    every N of the range, through a compile and a session."""
    m = _branch_reading_a_dim(kind)
    theirs = ort.InferenceSession(m, providers=["CPUExecutionProvider"])
    program = ctxrt.compile(m, dims={"N": (1, 32)}).graph()
    with ctxrt.InferenceSession(m) as sess:
        for n in range(1, 33):
            feeds = {"x": np.arange(n * 4, dtype=np.float32).reshape(n, 4) + 1}
            want = theirs.run(None, feeds)[0]
            np.testing.assert_array_equal(program.run(feeds)["y"], want, err_msg=f"N={n}")
            np.testing.assert_array_equal(sess.run(None, feeds)[0], want, err_msg=f"N={n}")
        assert sess.stats["shape_variants_compiled"] <= 2


@pytest.mark.parametrize("model, cuts", [(lambda: _clamped_slice("Min", 8), [8, 9]),
                                         (lambda: _sliced([-20], [2 ** 62]), [20, 21])])
def test_a_session_splits_its_range_where_a_piece_starts(model, cuts) -> None:
    """x[:min(N, 8)] and x[-20:] are one program on each side of their clamp, not over it: the RangeError says
    where the pieces start (N = 8 | 9), and a session ranges each piece (1..7, 8, 9..) instead of compiling every
    size exactly (66 compiles for these 70 runs before; 4 now), right at every size."""
    m = model()
    with pytest.raises(RangeError) as e:
        ctxrt.compile(m, dims={"N": (1, 32)})
    assert e.value.splits == {"N": cuts}
    theirs = ort.InferenceSession(m, providers=["CPUExecutionProvider"])
    with warnings.catch_warnings():
        warnings.simplefilter("error", CtxrtWarning)  # (no "compiles exact shapes" warning)
        with ctxrt.InferenceSession(m) as sess:
            for n in [*range(1, 33), *range(32, 0, -1), 5, 40, 3, 100, 8, 9]:
                feeds = {"x": np.arange(n * 4, dtype=np.float32).reshape(n, 4) - 7}
                got, want = sess.run(None, feeds)[0], theirs.run(None, feeds)[0]
                assert got.shape == want.shape, n
                np.testing.assert_array_equal(got, want)
            assert sess.stats["shape_variants_compiled"] <= 7
            pieces = sorted(tuple(v.ranged.ranges.dims[0][1:]) for v in sess._variants.values() if v.ranged)
            assert all(hi < cuts[0] or lo >= cuts[-1] for lo, hi in pieces), pieces


def _sliced(starts: list[int], ends: list[int]) -> bytes:
    nodes = [helper.make_node("Slice", ["x", "st", "en", "ax"], ["s"]), helper.make_node("Relu", ["s"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(np.array(v, np.int64), k)
                           for k, v in (("st", starts), ("en", ends), ("ax", [0]))])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()


def test_a_range_whose_length_clamps_at_zero_is_split_there() -> None:
    """y = arange(N - 5) + 1: no elements for N <= 5 (Range's length clamps at 0), N - 5 above. One program over
    1..32 would have a negative extent below 6: refused, saying where the pieces start (5 | 6); a session ranges
    each piece (no elements at 1..4) instead of compiling every size (60 compiles for these 64 runs before)."""
    nodes = [helper.make_node("Shape", ["x"], ["sh"]), helper.make_node("Gather", ["sh", "zero"], ["n"], axis=0),
             helper.make_node("Sub", ["n", "five"], ["l"]), helper.make_node("Range", ["zero", "l", "one"], ["r"]),
             helper.make_node("Cast", ["r"], ["rf"], to=TensorProto.FLOAT),
             helper.make_node("Add", ["rf", "fone"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(np.int64(0), "zero"), numpy_helper.from_array(np.int64(1), "one"),
                           numpy_helper.from_array(np.int64(5), "five"),
                           numpy_helper.from_array(np.float32(1), "fone")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()
    with pytest.raises(RangeError, match="negative somewhere") as e:
        ctxrt.compile(m, dims={"N": (1, 32)})
    assert e.value.splits == {"N": [5, 6]}
    theirs = ort.InferenceSession(m, providers=["CPUExecutionProvider"])
    with warnings.catch_warnings():
        warnings.simplefilter("error", CtxrtWarning)
        with ctxrt.InferenceSession(m) as sess:
            for n in [*range(1, 33), *range(32, 0, -1)]:
                feeds = {"x": np.zeros((n, 4), np.float32)}
                got, want = sess.run(None, feeds)[0], theirs.run(None, feeds)[0]
                assert got.shape == want.shape, n
                np.testing.assert_array_equal(got, want)
            assert sess.stats["shape_variants_compiled"] <= 6


def test_a_resize_that_keeps_its_aspect_ratio_over_ranged_sizes_is_refused() -> None:
    """Resize(sizes=[4, s] on H, W, keep_aspect_ratio_policy=not_larger) takes min(4 / H, s / W): the first
    ratio at every probe of s in 1..8, the second below 4, which no fit of its extents sees (wrong shapes below
    4). Such a Resize over sizes that follow the dims is refused; a session compiles each value, right at each."""
    g = helper.make_graph([helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], mode="nearest", axes=[2, 3],
                                            keep_aspect_ratio_policy="not_larger")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 8, 8]),
                           helper.make_tensor_value_info("sizes", TensorProto.INT64, [2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 19)], ir_version=9).SerializeToString()
    with pytest.raises(RangeError, match="keeps its aspect ratio"):
        ctxrt.compile(m, dims={"sizes[1]": (1, 8)}, values={"sizes": [4, 0]})
    theirs = ort.InferenceSession(m, providers=["CPUExecutionProvider"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CtxrtWarning)
        with ctxrt.InferenceSession(m) as sess:
            for s in (8, 3, 5, 1, 2, 7):
                feeds = {"x": np.arange(64, dtype=np.float32).reshape(1, 1, 8, 8), "sizes": np.array([4, s])}
                got, want = sess.run(None, feeds)[0], theirs.run(None, feeds)[0]
                assert got.shape == want.shape, s
                np.testing.assert_array_equal(got, want)


def test_a_reshape_to_another_element_count_is_a_shape_error() -> None:
    """A Reshape target of another element count (onnx's inference lets it through) is a ShapeError naming the
    node when compiled, not a NumPy ValueError when its kernel is bound."""
    g = helper.make_graph([helper.make_node("Reshape", ["x", "shape"], ["y"], name="r")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4]),
                           helper.make_tensor_value_info("shape", TensorProto.INT64, [1])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()
    with pytest.raises(ShapeError, match=r"Reshape node 'r': cannot reshape \[2, 3, 4\] \(24 elements\) into \[50\]"):
        ctxrt.compile(m, values={"shape": [50]})
    with ctxrt.InferenceSession(m) as sess, pytest.raises(ShapeError, match="cannot reshape"):
        sess.run(None, {"x": np.zeros((2, 3, 4), np.float32), "shape": np.array([50])})


def test_an_einsum_label_of_two_sizes_is_a_shape_error() -> None:
    """'bij,bjk->bik' with b = 1 in one operand and 5 in the other: onnx types the output by the first (1, 2, 4)
    and the kernel crashed writing (5, 2, 4) into it; a range over x's batch compiled (its probes unchecked) and
    crashed at every size but 5. Now a ShapeError naming the label, and the session's range attempt fails over
    to exact shapes."""
    g = helper.make_graph([helper.make_node("Einsum", ["x", "y"], ["z"], equation="bij,bjk->bik", name="e")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2, 3]),
                           helper.make_tensor_value_info("y", TensorProto.FLOAT, [5, 3, 4])],
                          [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()
    y = np.ones((5, 3, 4), np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CtxrtWarning)
        with ctxrt.InferenceSession(m) as sess:
            want = ort.InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, {"x": np.ones((5, 2, 3),
                                                                                                   np.float32), "y": y})
            np.testing.assert_allclose(sess.run(None, {"x": np.ones((5, 2, 3), np.float32), "y": y})[0], want[0])
            with pytest.raises(ShapeError, match=r"Einsum node 'e': equation 'bij,bjk->bik' labels axes of sizes "
                                                 r"\[1, 5\] with 'b'"):
                sess.run(None, {"x": np.ones((1, 2, 3), np.float32), "y": y})


def test_a_compress_whose_bound_takes_the_smaller_size_is_split_where_it_changes() -> None:
    """Compress(x[N, 2], condition[3]) is bounded by min(3, N): 3 at every probe of N in 1..16, and the program's
    kernel crashed below 3. Refused there with where the pieces start (3 | 4); a session ranges each piece, right
    at every N."""
    g = helper.make_graph([helper.make_node("Compress", ["x", "c"], ["y"], axis=0)], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2]),
                           helper.make_tensor_value_info("c", TensorProto.BOOL, [3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()
    with pytest.raises(RangeError, match="upper bound takes the smaller") as e:
        ctxrt.compile(m, dims={"N": (1, 16)})
    assert e.value.splits == {"N": [3, 4]}
    theirs = ort.InferenceSession(m, providers=["CPUExecutionProvider"])
    c = np.array([True, False, True])
    with warnings.catch_warnings():
        warnings.simplefilter("error", CtxrtWarning)
        with ctxrt.InferenceSession(m) as sess:
            for n in [*range(1, 17), *range(16, 0, -1)]:
                feeds = {"x": np.arange(2 * n, dtype=np.float32).reshape(n, 2), "c": c}
                got, want = sess.run(None, feeds)[0], theirs.run(None, feeds)[0]
                assert got.shape == want.shape, n
                np.testing.assert_array_equal(got, want)
            assert sess.stats["shape_variants_compiled"] <= 5


def test_a_prelu_slope_that_does_not_broadcast_to_its_input_is_a_shape_error() -> None:
    """PRelu's slope broadcasts to X, not X to the slope: X [N, 4, 5] with a slope [3, 4, 5] is right at N = 3
    only. A range over N compiled (the probes unchecked) and crashed in NumPy at N = 1; now a ShapeError naming
    the node, and the session compiles exact shapes."""
    g = helper.make_graph([helper.make_node("PRelu", ["x", "slope"], ["y"], name="p")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4, 5]),
                           helper.make_tensor_value_info("slope", TensorProto.FLOAT, [3, 4, 5])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()
    slope = np.full((3, 4, 5), 0.5, np.float32)
    x = np.arange(60, dtype=np.float32).reshape(3, 4, 5) - 30
    want = ort.InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, {"x": x, "slope": slope})[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CtxrtWarning)
        with ctxrt.InferenceSession(m) as sess:
            np.testing.assert_array_equal(sess.run(None, {"x": x, "slope": slope})[0], want)
            with pytest.raises(ShapeError, match=r"PRelu node 'p': its slope \[3, 4, 5\] does not broadcast"):
                sess.run(None, {"x": x[:1], "slope": slope})


def test_an_expand_whose_input_does_not_broadcast_is_a_shape_error() -> None:
    """Expand(x[3, N], [3, 4]) is right at N = 1 and 4 only. A range over N compiled (onnx typed the probes' outputs
    [3, N]) and answered N = 1 with [3, 1] (onnxruntime: [3, 4]); now every other N is a ShapeError naming the
    node, the session compiles exact shapes, right at 1 and 4."""
    g = helper.make_graph([helper.make_node("Expand", ["x", "shape"], ["y"], name="e")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, "N"])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(np.array([3, 4], np.int64), "shape")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()
    theirs = ort.InferenceSession(m, providers=["CPUExecutionProvider"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CtxrtWarning)
        with ctxrt.InferenceSession(m) as sess:
            for n in (4, 1):
                feeds = {"x": np.arange(3 * n, dtype=np.float32).reshape(3, n)}
                got, want = sess.run(None, feeds)[0], theirs.run(None, feeds)[0]
                assert got.shape == want.shape
                np.testing.assert_array_equal(got, want)
            with pytest.raises(ShapeError, match=r"Expand node 'e': its input \[3, 6\] does not broadcast"):
                sess.run(None, {"x": np.zeros((3, 6), np.float32)})


def test_a_ceil_pool_window_larger_than_its_input_makes_no_output() -> None:
    """MaxPool 3x3 / 2 with ceil_mode over a width of 1 (opset 22): onnxruntime and the spec make no output
    column, onnx's inference (and ctxrt, which followed it) one."""
    g = helper.make_graph([helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2],
                                            ceil_mode=1)], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 4, 1])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 22)], ir_version=10).SerializeToString()
    x = np.arange(4, dtype=np.float32).reshape(1, 1, 4, 1)
    want = ort.InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert want.shape == (1, 1, 2, 0)
    with ctxrt.InferenceSession(m) as sess:
        assert sess.run(None, {"x": x})[0].shape == want.shape


def test_an_output_step_every_size_shares_is_written_at_every_size() -> None:
    """x[3, C] -> GatherElements (its kernel made per C) -> Neg -> Slice -> Squeeze into the output (one call every
    C shares). Run on arrays, the first C's run pointed that call at its caller's output array; the next C's list,
    planned while the call still pointed there, did not see it write the output: every other C returned an array
    nothing wrote (onnx's expanded NegativeLogLikelihoodLoss, ranged over its classes). Now the calls point back at
    the buffers before another list is planned or run."""
    nodes = [helper.make_node("Unsqueeze", ["t", "ax"], ["t1"]),
             helper.make_node("GatherElements", ["x", "t1"], ["g"], axis=1), helper.make_node("Neg", ["g"], ["n"]),
             helper.make_node("Slice", ["n", "z", "ax", "ax"], ["sl"]),
             helper.make_node("Squeeze", ["sl", "ax"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, "C"]),
                                       helper.make_tensor_value_info("t", TensorProto.INT64, [3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(np.array([1], np.int64), "ax"),
                           numpy_helper.from_array(np.array([0], np.int64), "z")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()
    theirs = ort.InferenceSession(m, providers=["CPUExecutionProvider"])
    program = ctxrt.compile(m, dims={"C": (5, 16)}).graph()
    t = np.array([1, 4, 3])
    rng = np.random.default_rng(0)
    with ctxrt.InferenceSession(m, dim_ranges={"C": (5, 16)}) as sess:
        for c in (6, 5, 6, 8, 5, 16):
            feeds = {"x": rng.standard_normal((3, c)).astype(np.float32), "t": t}
            want = theirs.run(None, feeds)[0]
            np.testing.assert_array_equal(program.run(feeds)["y"], want, err_msg=f"C={c}")
            np.testing.assert_array_equal(sess.run(None, feeds)[0], want, err_msg=f"C={c}")


def test_a_flat_compress_over_two_dims_is_right_on_both_sides_of_its_bound() -> None:
    """Compress(x[N, M], condition[5]) without an axis is bounded by min(5, N * M): a product of the dims, 5 at every
    probe of N, M in 1..16; its kernel crashed where N * M < 5. The bound's product is checked at the corners of
    the box (a multilinear sign is the corners'): refused, and the session right everywhere."""
    g = helper.make_graph([helper.make_node("Compress", ["x", "c"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "M"]),
                           helper.make_tensor_value_info("c", TensorProto.BOOL, [5])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()
    with pytest.raises(RangeError, match="upper bound takes the smaller"):
        ctxrt.compile(m, dims={"N": (1, 16), "M": (1, 16)})
    theirs = ort.InferenceSession(m, providers=["CPUExecutionProvider"])
    c = np.array([True, False, True, True, False])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CtxrtWarning)
        with ctxrt.InferenceSession(m) as sess:
            for n, k in ((3, 4), (1, 1), (2, 2), (1, 3), (5, 5), (1, 7), (2, 1)):
                feeds = {"x": np.arange(n * k, dtype=np.float32).reshape(n, k), "c": c}
                got, want = sess.run(None, feeds)[0], theirs.run(None, feeds)[0]
                assert got.shape == want.shape, (n, k)
                np.testing.assert_array_equal(got, want)


def _strided_net() -> bytes:
    """y = x + up4(relu(conv_s2(relu(conv_s2(x))))) over x[N, 3, H, W]: the sizes a feature pyramid takes (its
    Add needs H and W multiples of 4; a strided conv's output, ceil(H / 2), is linear in H only over multiples)."""
    rng = np.random.default_rng(0)
    w1, w2 = (rng.standard_normal((c, 3 if c == 4 else 4, 3, 3)).astype(np.float32) * 0.3 for c in (4, 3))
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], strides=[2, 2], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], strides=[2, 2], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c2"], ["r2"]),
             helper.make_node("Resize", ["r2", "", "scales"], ["up"], mode="nearest"),
             helper.make_node("Add", ["x", "up"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, "H", "W"])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2"),
                           numpy_helper.from_array(np.array([1, 1, 4, 4], np.float32), "scales")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()


def test_a_stepped_range_is_one_program_for_every_multiple(tmp_path, capsys) -> None:
    """An image size through strided convs is no affine function of the size (ceil(H / 2)), but it is over the
    multiples of the net's stride: `--dim H=8:128:8` (sizes in steps of 8) compiles one program for every
    multiple, stored as such (`inspect` says the step); a size off the step is a ShapeError naming it."""
    from ctxrt.cli import main as cli

    m = _strided_net()
    src, out = tmp_path / "net.onnx", tmp_path / "net.ctx"
    src.write_bytes(m)
    with pytest.raises(CtxrtError):  # (every size: no graph at 127, its Add)
        ctxrt.compile(m, dims={"N": (1, 1), "H": (8, 128), "W": (8, 128)})
    assert cli(["compile", str(src), "-o", str(out), "--dim", "N=1:1", "--dim", "H=8:128:8",
                "--dim", "W=8:64:8"]) == 0
    assert cli(["inspect", str(out)]) == 0
    assert "ranges: H 8..128 in steps of 8, W 8..64 in steps of 8" in capsys.readouterr().out
    theirs = ort.InferenceSession(m, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    with ctxrt.InferenceSession(out) as sess:
        assert sess.dim_ranges == {"H": (8, 128, 8), "W": (8, 64, 8)}
        for h, w in ((8, 8), (128, 64), (40, 24), (96, 56), (16, 64)):
            feeds = {"x": rng.standard_normal((1, 3, h, w)).astype(np.float32)}
            got, want = sess.run(None, feeds)[0], theirs.run(None, feeds)[0]
            assert got.shape == want.shape
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        with pytest.raises(ShapeError, match=r"dim 'H'\) is 44, outside the sizes 8\.\.128 in steps of 8"):
            sess.run(None, {"x": np.zeros((1, 3, 44, 8), np.float32)})


def test_a_session_ranges_image_sizes_over_the_step_they_share() -> None:
    """A session meets an image size whose range fails (strided convs): one program per size, the batch ranged.
    The second size met, both multiples of 8 and more: one program over the multiples of the largest power of
    two (up to 64) that divides them all, right at every multiple met later; a size off the step compiles its
    own (the sizes met then share a smaller step)."""
    m = _strided_net()
    theirs = ort.InferenceSession(m, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CtxrtWarning)
        with ctxrt.InferenceSession(m) as sess:
            sizes = [(32, 48), (16, 80), (48, 48), (64, 32), (16, 16), (32, 48), (8, 8), (20, 12)]
            counts = []
            for h, w in sizes:
                feeds = {"x": rng.standard_normal((2, 3, h, w)).astype(np.float32)}
                got, want = sess.run(None, feeds)[0], theirs.run(None, feeds)[0]
                assert got.shape == want.shape
                np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
                counts.append(sess.stats["shape_variants_compiled"])
            assert counts[:6] == [1, 2, 2, 2, 2, 2], counts  # then 8 x 8 and 20 x 12: off the step of 16
            assert sess.dim_ranges["H"][-1] == 4  # (the step 32 | 16, 16 | 16, then 8, then 4 that all share)
            assert counts[-1] <= 4


def test_a_stepped_range_runs_on_opencl(opencl) -> None:
    """The same program over multiples of 8 on the OpenCL backend, right at the ends and inside."""
    m = _strided_net()
    theirs = ort.InferenceSession(m, providers=["CPUExecutionProvider"])
    graph = ctxrt.compile(m, dims={"N": (1, 2), "H": (8, 64, 8), "W": (8, 64, 8)}, backend=opencl).graph()
    rng = np.random.default_rng(3)
    for n, h, w in ((1, 8, 8), (2, 64, 64), (2, 24, 40)):
        x = rng.standard_normal((n, 3, h, w)).astype(np.float32)
        np.testing.assert_allclose(graph.run({"x": x})["y"], theirs.run(None, {"x": x})[0], rtol=1e-4, atol=1e-4)


def test_a_conv_transpose_with_an_output_shape_is_typed_by_it() -> None:
    """onnx's inference drops an axis of ConvTranspose(output_shape=[10, 8], strides=[3, 2]) over an 8 x 9 input
    ([1, 2, 10]): the kernel failed with NumPy's zip() message. The frontend types it from output_shape."""
    rng = np.random.default_rng(4)
    g = helper.make_graph([helper.make_node("ConvTranspose", ["x", "w"], ["y"], output_shape=[10, 8], strides=[3, 2])],
                          "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, "H", "W"])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(rng.standard_normal((1, 2, 3, 3)).astype(np.float32), "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()
    theirs = ort.InferenceSession(m, providers=["CPUExecutionProvider"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CtxrtWarning)
        with ctxrt.InferenceSession(m) as sess:
            for h, w in ((3, 3), (8, 9)):
                feeds = {"x": rng.standard_normal((1, 1, h, w)).astype(np.float32)}
                got, want = sess.run(None, feeds)[0], theirs.run(None, feeds)[0]
                assert got.shape == want.shape == (1, 2, 10, 8)
                np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_a_dim_name_two_inputs_give_two_sizes_is_ranged_per_axis() -> None:
    """An exporter that names two lengths alike (torch's legacy exporter given one "seq" for a BART's encoder and
    decoder tokens): onnxruntime checks no dim name across inputs, and runs such feeds where its buffer plan allows
    (a decoder longer than the encoder). A session ranges each axis of that name as its own dim (INPUT:AXIS) once
    feeds give it two sizes: every run equals the model's results, one program for them all (it ran the first
    program for feeds it did not fit: a ShapeError from inside the run)."""
    nodes = [helper.make_node("ReduceSum", ["x", "ax"], ["sx"], keepdims=0),
             helper.make_node("ReduceSum", ["y", "ax"], ["sy"], keepdims=0),
             helper.make_node("Add", ["sx", "sy"], ["s"]), helper.make_node("Relu", ["y"], ["r"])]
    g = helper.make_graph(nodes, "tied", [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", "seq"])
                                          for n in ("x", "y")],
                          [helper.make_tensor_value_info("s", TensorProto.FLOAT, ["batch"]),
                           helper.make_tensor_value_info("r", TensorProto.FLOAT, ["batch", "seq"])],
                          [numpy_helper.from_array(np.array([1], np.int64), "ax")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()
    rng = np.random.default_rng(0)
    with ctxrt.InferenceSession(model) as sess:
        for b, n, m in ((2, 5, 3), (1, 4, 9), (3, 7, 7), (2, 1, 6), (4, 6, 2)):
            x, y = (rng.standard_normal(s).astype(np.float32) for s in ((b, n), (b, m)))
            s, r = sess.run(None, {"x": x, "y": y})
            np.testing.assert_allclose(s, x.sum(1) + y.sum(1), rtol=1e-5, atol=1e-5)
            np.testing.assert_array_equal(r, np.maximum(y, 0))
        assert sess.stats["shape_variants_compiled"] == 1
        assert {"x:1", "y:1", "batch"} <= set(sess.dim_ranges) and "seq" not in sess.dim_ranges
