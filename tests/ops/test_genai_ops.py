"""The operators of onnxruntime-genai's decoder models vs onnxruntime (which defines them): com.microsoft
GroupQueryAttention, RotaryEmbedding, SkipSimplifiedLayerNormalization, SkipLayerNormalization;
SimplifiedLayerNormalization (default domain, as the model builder writes it); RMSNormalization-23 and
RotaryEmbedding-23; and a decoder layer through InferenceSession, a prompt then token steps."""

from __future__ import annotations

import harness
import numpy as np
import onnx
import pytest
from harness import ITERATOR_BUFFER, allocated, bind, make_model, rand
from onnx import helper

import ctxrt
from ctxrt.errors import ShapeError, UnsupportedOpError

MS = "com.microsoft"
F32, I32 = np.float32, np.int32


def ms_model(nodes, feeds: dict, inits: dict | None = None, opset: int = 17, types: list | None = None
             ) -> onnx.ModelProto:
    model = make_model(nodes, feeds, inits, opset)
    model.opset_import.append(helper.make_opsetid(MS, 1))
    for out, t in zip(model.graph.output, types or [F32] * len(model.graph.output), strict=True):
        out.type.tensor_type.elem_type = helper.np_dtype_to_tensor_dtype(np.dtype(t))
    return model


def ort_run(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    import onnxruntime as ort

    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def ctxrt_run(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    """Compiled for the feeds' shapes (a declared dim 0 reads as dynamic: an empty past is bound explicitly)."""
    ctx = ctxrt.compile(model, shapes={k: v.shape for k, v in feeds.items()}, backend=harness.BACKEND)
    try:
        result = ctx.graph().run(feeds)
    finally:
        ctx.free()
    return [result[o.name] for o in model.graph.output]


def compare(nodes, feeds: dict, inits: dict | None = None, opset: int = 17, types: list | None = None,
            rtol: float = 1e-5, atol: float = 1e-5, padding: bool = False) -> list[np.ndarray]:
    """ctxrt vs onnxruntime. `padding`: a GroupQueryAttention's first prompt whose sequences are shorter than its
    rows; the rows past a sequence's end are not compared (unspecified: onnxruntime applies local_window_size
    to them only without softcap)."""
    model = ms_model(nodes, feeds, inits, opset, types)
    want = ort_run(model, feeds)
    got = ctxrt_run(model, feeds)
    if padding:
        for b, last in enumerate(feeds["seqlens"]):
            got[0][b, last + 1:] = want[0][b, last + 1:] = 0
    for o, g, w in zip(model.graph.output, got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype, f"{o.name}: {g.dtype}{g.shape} != {w.dtype}{w.shape}"
        np.testing.assert_allclose(g.astype(np.float64), w, rtol=rtol, atol=atol, err_msg=o.name)
    return got


# --- GroupQueryAttention --------------------------------------------------------------------------------

# batch, new tokens, past length (None: no past inputs), seqlens_k, total_sequence_length
STEPS = {
    "prompt": (1, 5, None, [4], 5),
    "prompt-empty-past": (2, 5, 0, [4, 4], 5),
    "prompt-padded-batch": (2, 5, None, [4, 2], 5),
    "prompt-into-shared-buffer": (1, 4, 12, [3], 4),
    "token": (2, 1, 6, [6, 6], 7),
    "token-shared-buffer": (2, 1, 12, [6, 3], 7),
    "subsequent-prompt": (1, 3, 12, [7], 8),
}


def gqa(step: str, packed: bool = True, n: int = 4, kv: int = 2, h: int = 16, rotary_dim: int | None = None,
        sink: bool = False, **attrs) -> tuple[onnx.NodeProto, dict]:
    batch, s, past, seqlens, total = STEPS[step]
    feeds = {"q": rand(batch, s, (n + 2 * kv) * h if packed else n * h, low=-2, high=2)}
    if not packed:
        feeds.update(k=rand(batch, s, kv * h, low=-2, high=2), v=rand(batch, s, kv * h))
    if past is not None:
        feeds.update(pk=rand(batch, kv, past, h, low=-2, high=2), pv=rand(batch, kv, past, h))
    feeds.update(seqlens=np.array(seqlens, I32), total=np.array(total, I32))
    if attrs.get("do_rotary"):
        angles = rand(32, (rotary_dim or h) // 2, low=0, high=6)
        feeds.update(cos=np.cos(angles), sin=np.sin(angles))
    if sink:
        feeds["sink"] = rand(n)
    names = ["q", "k", "v", "pk", "pv", "seqlens", "total", "cos", "sin", "", "", "sink"]
    ins = [x if x in feeds else "" for x in names]
    while not ins[-1]:
        ins.pop()
    return helper.make_node("GroupQueryAttention", ins, ["out", "present_k", "present_v"], domain=MS,
                            num_heads=n, kv_num_heads=kv, **attrs), feeds


@pytest.mark.parametrize("packed", [True, False], ids=["packed-qkv", "separate-qkv"])
@pytest.mark.parametrize("step", list(STEPS))
def test_gqa_steps(step: str, packed: bool) -> None:
    compare(*gqa(step, packed))


ATTRS = {
    "rotary": dict(do_rotary=1),
    "rotary-interleaved": dict(do_rotary=1, rotary_interleaved=1),
    "rotary-partial": dict(do_rotary=1, rotary_dim=16, h=32),
    "window-softcap-scale": dict(local_window_size=3, softcap=1.5, scale=0.2),
    "smooth-softmax": dict(smooth_softmax=1),
    "head-sink": dict(sink=True),
    "one-kv-head": dict(n=4, kv=1, do_rotary=1),
    "no-grouping": dict(n=2, kv=2, local_window_size=2),
}


@pytest.mark.parametrize("step", ["prompt-padded-batch", "token-shared-buffer", "subsequent-prompt"])
@pytest.mark.parametrize("variant", list(ATTRS))
def test_gqa_attributes(variant: str, step: str) -> None:
    compare(*gqa(step, packed=variant != "rotary-interleaved", **ATTRS[variant]), padding="padded" in step)


@pytest.mark.parametrize("step", ["token", "token-shared-buffer", "subsequent-prompt", "prompt-padded-batch"])
@pytest.mark.parametrize("h", [64, 128, 48])
def test_gqa_head_sizes_of_the_vector_paths(step: str, h: int) -> None:
    """Heads of 64 and 128 (the native kernel's register-held weighted sum, its four-key scores and vector exp) and
    48 (scores by eight, the sum in plain loops), with rotary embedding, against onnxruntime."""
    compare(*gqa(step, h=h, do_rotary=1), padding="padded" in step)
    compare(*gqa(step, h=h, local_window_size=3, scale=0.05), padding="padded" in step)


def test_gqa_present_is_past_length_in_a_shared_buffer_and_past_plus_new_otherwise() -> None:
    out = compare(*gqa("token-shared-buffer"))
    assert out[1].shape == (2, 2, 12, 16)
    out = compare(*gqa("token"))
    assert out[1].shape == (2, 2, 7, 16)


def test_gqa_unsupported_inputs_attributes_and_bad_lengths() -> None:
    node, feeds = gqa("token")
    node.input.extend(["", "", "pos"])
    feeds["pos"] = np.zeros((2, 1), np.int64)
    with pytest.raises(UnsupportedOpError, match="GroupQueryAttention node .*input position_ids"):
        ctxrt_run(ms_model(node, feeds), feeds)
    node, feeds = gqa("token", qk_output=1)
    with pytest.raises(UnsupportedOpError, match="attribute qk_output=1"):
        ctxrt_run(ms_model(node, feeds), feeds)
    node, feeds = gqa("token")
    feeds["total"] = np.array(9, I32)  # past 6 + 1 new token cannot hold 9
    with pytest.raises(ShapeError, match="total_sequence_length 9"):
        ctxrt_run(ms_model(node, feeds), feeds)


def test_gqa_launch_allocates_nothing() -> None:
    node, feeds = gqa("token-shared-buffer", do_rotary=1, local_window_size=4, smooth_softmax=1)
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    ins = [feeds.get(x) for x in ["q", "k", "v", "pk", "pv", "seqlens", "total", "cos", "sin"]]
    outs = [np.empty((2, 1, 64), F32), np.empty((2, 2, 13, 16), F32), np.empty((2, 2, 13, 16), F32),
            np.zeros((), np.int64)]
    launch = bind("com.microsoft.GroupQueryAttention", ins, outs, attrs)
    assert allocated(launch) < ITERATOR_BUFFER
    assert int(outs[3]) == 12


# --- normalizations -----------------------------------------------------------------------------------

@pytest.mark.parametrize("skip_shape", [(2, 3, 16), (1, 3, 16), (3, 16)])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("outputs", [["y", "mean", "inv", "sum"], ["y", "", "", "sum"], ["y"], ["y", "", "inv"]])
@pytest.mark.parametrize("op", ["SkipSimplifiedLayerNormalization", "SkipLayerNormalization"])
def test_skip_norms(op: str, outputs: list[str], bias: bool, skip_shape) -> None:
    simplified = op.startswith("SkipSimplified")
    feeds = {"x": rand(2, 3, 16), "skip": rand(*skip_shape)}
    inits = {"gamma": rand(16), "beta": rand(16), "bias": rand(16)}
    ins = ["x", "skip", "gamma"] + ([] if simplified else ["beta"]) + (["bias"] if bias else [])
    node = helper.make_node(op, ins, outputs, domain=MS, epsilon=1e-5)
    out = compare(node, feeds, inits, rtol=1e-4)
    if simplified and "mean" in outputs:
        assert not out[1].any()  # onnxruntime leaves it zero


def test_skip_norms_2d_and_float16() -> None:
    node = helper.make_node("SkipSimplifiedLayerNormalization", ["x", "skip", "g"], ["y", "", "", "sum"], domain=MS)
    compare(node, {"x": rand(5, 32), "skip": rand(5, 32), "g": rand(32)}, rtol=1e-4)
    node = helper.make_node("SkipLayerNormalization", ["x", "skip", "g", "b"], ["y", "m", "i", "sum"], domain=MS)
    feeds = {k: rand(*s).astype(np.float16) for k, s in (("x", (2, 3, 64)), ("skip", (2, 3, 64)), ("g", (64,)),
                                                         ("b", (64,)))}
    compare(node, feeds, types=[np.float16, F32, F32, np.float16], rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("axis", [-1, -2, 1, 2])
@pytest.mark.parametrize("outputs", [["y"], ["y", "inv"]])
def test_simplified_layer_norm(axis: int, outputs: list[str]) -> None:
    node = helper.make_node("SimplifiedLayerNormalization", ["x", "s"], outputs, axis=axis, epsilon=1e-4)
    scale = rand(*(2, 3, 8)[axis:])
    compare(node, {"x": rand(2, 3, 8)}, {"s": scale}, rtol=1e-4)


def test_simplified_layer_norm_float16_and_run_time_scale() -> None:
    node = helper.make_node("SimplifiedLayerNormalization", ["x", "s"], ["y", "inv"])
    feeds = {"x": rand(2, 3, 64, high=4).astype(np.float16), "s": rand(64).astype(np.float16)}
    compare(node, feeds, types=[np.float16, F32], rtol=2e-3, atol=2e-3)
    compare(node, {"x": rand(4, 16), "s": rand(16)}, rtol=1e-4)


@pytest.mark.parametrize("axis", [-1, 1])
def test_rms_normalization_23(axis: int) -> None:
    node = helper.make_node("RMSNormalization", ["x", "s"], ["y"], axis=axis, epsilon=1e-3)
    compare(node, {"x": rand(2, 3, 8)}, {"s": rand(*(2, 3, 8)[axis:])}, opset=23, rtol=1e-4)


def test_norm_launches_allocate_nothing() -> None:
    x, skip, g = rand(4, 32), rand(4, 32), rand(32)
    outs = [np.empty((4, 32), F32), np.empty((4, 1), F32), np.empty((4, 1), F32), np.empty((4, 32), F32)]
    assert allocated(bind("com.microsoft.SkipSimplifiedLayerNormalization", [x, skip, g], outs)) < ITERATOR_BUFFER
    assert allocated(bind("com.microsoft.SkipLayerNormalization", [x, skip, g, g], outs)) < ITERATOR_BUFFER
    half = [x.astype(np.float16), g.astype(np.float16)]
    assert allocated(bind("SimplifiedLayerNormalization", half, [np.empty((4, 32), np.float16)])) < ITERATOR_BUFFER


# --- RotaryEmbedding ----------------------------------------------------------------------------------

def rotary_feeds(layout: str, positions: str, dim: int, h: int = 16, heads: int = 4) -> dict:
    batch, s = 2, 3
    x = rand(batch, s, heads * h) if layout == "3d" else rand(batch, heads, s, h)
    angles = rand(20, dim // 2, low=0, high=6)
    pos = RNG_POS[positions](batch, s)
    return {"x": x, "pos": pos, "cos": np.cos(angles), "sin": np.sin(angles)}


RNG_POS = {"tensor": lambda b, s: harness.RNG.integers(0, 20 - s, (b, s)).astype(np.int64),
           "offset": lambda b, s: np.array([7], np.int64)}


@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("positions", ["tensor", "offset"])
@pytest.mark.parametrize("layout,attrs", [("3d", dict(num_heads=4)), ("3d", {}), ("4d", {}),
                                          ("3d", dict(num_heads=4, rotary_embedding_dim=8)),
                                          ("4d", dict(num_heads=4, rotary_embedding_dim=8))])
def test_rotary_embedding_ms(layout: str, attrs: dict, positions: str, interleaved: int) -> None:
    feeds = rotary_feeds(layout, positions, attrs.get("rotary_embedding_dim", 16))
    node = helper.make_node("RotaryEmbedding", ["x", "pos", "cos", "sin"], ["y"], domain=MS, interleaved=interleaved,
                            **attrs)
    compare(node, feeds, rtol=1e-5)


@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("with_positions", [True, False])
@pytest.mark.parametrize("layout,attrs", [("3d", dict(num_heads=4)), ("4d", {}),
                                          ("3d", dict(num_heads=4, rotary_embedding_dim=8))])
def test_rotary_embedding_23(layout: str, attrs: dict, with_positions: bool, interleaved: int) -> None:
    feeds = rotary_feeds(layout, "tensor", attrs.get("rotary_embedding_dim", 16))
    pos = feeds.pop("pos")
    if not with_positions:  # caches given per (batch, position)
        feeds["cos"], feeds["sin"] = feeds["cos"][pos], feeds["sin"][pos]
    ins = ["x", "cos", "sin"] + (["pos"] if with_positions else [])
    feeds = {k: feeds[k] for k in ("x", "cos", "sin")} | ({"pos": pos} if with_positions else {})
    node = helper.make_node("RotaryEmbedding", ins, ["y"], interleaved=interleaved, **attrs)
    compare(node, feeds, opset=23, rtol=1e-5)


def test_rotary_launch_allocates_nothing() -> None:
    feeds = rotary_feeds("3d", "tensor", 16)
    ins = [feeds[k] for k in ("x", "pos", "cos", "sin")]
    launch = bind("com.microsoft.RotaryEmbedding", ins, [np.empty_like(feeds["x"])], {"num_heads": 4})
    assert allocated(launch) < ITERATOR_BUFFER


# --- admission -----------------------------------------------------------------------------------------

def test_other_ops_and_domains_are_still_refused_by_name() -> None:
    nodes = [helper.make_node("FusedMatMul", ["x", "x"], ["a"], domain=MS, name="fmm"),
             helper.make_node("Relu", ["a"], ["b"], domain="org.example", name="relu_elsewhere")]
    model = make_model(nodes, {"x": rand(4, 4)})
    model.opset_import.extend([helper.make_opsetid(MS, 1), helper.make_opsetid("org.example", 1)])
    with pytest.raises(UnsupportedOpError, match=r"unsupported operators: com\.microsoft\.FusedMatMul \(fmm\); "
                                                 r"org\.example\.Relu \(relu_elsewhere\)"):
        ctxrt.compile(model, backend=harness.BACKEND)


# --- a decoder layer through InferenceSession -------------------------------------------------------------

HIDDEN, HEADS, KV_HEADS, HEAD = 32, 4, 2, 16


def decoder_layer() -> onnx.ModelProto:
    """SimplifiedLayerNorm -> MatMul QKV -> GroupQueryAttention (rotary; seqlens_k and total_sequence_length from
    the attention mask, as the model builder writes them) -> MatMul -> SkipSimplifiedLayerNorm (and its residual)."""
    angles = rand(32, HEAD // 2, low=0, high=6)
    inits = {"ln1": rand(HIDDEN, low=0.5, high=1.5), "ln2": rand(HIDDEN, low=0.5, high=1.5),
             "wqkv": rand(HIDDEN, (HEADS + 2 * KV_HEADS) * HEAD, low=-0.3, high=0.3),
             "wo": rand(HEADS * HEAD, HIDDEN, low=-0.3, high=0.3), "cos": np.cos(angles), "sin": np.sin(angles),
             "axis1": np.array([1], np.int64), "one": np.array(1, np.int64)}
    n = helper.make_node
    nodes = [n("SimplifiedLayerNormalization", ["x", "ln1"], ["h"], epsilon=1e-5),
             n("MatMul", ["h", "wqkv"], ["qkv"]),
             n("ReduceSum", ["mask", "axis1"], ["count"], keepdims=0), n("Sub", ["count", "one"], ["last"]),
             n("Cast", ["last"], ["seqlens_k"], to=onnx.TensorProto.INT32), n("Shape", ["mask"], ["mask_shape"]),
             n("Gather", ["mask_shape", "one"], ["total64"]),
             n("Cast", ["total64"], ["total"], to=onnx.TensorProto.INT32),
             n("GroupQueryAttention", ["qkv", "", "", "past_k", "past_v", "seqlens_k", "total", "cos", "sin"],
               ["attn", "present_k", "present_v"], domain=MS, num_heads=HEADS, kv_num_heads=KV_HEADS, do_rotary=1),
             n("MatMul", ["attn", "wo"], ["o"]),
             n("SkipSimplifiedLayerNormalization", ["o", "x", "ln2"], ["y", "", "", "residual"], domain=MS,
               epsilon=1e-5)]
    f, i64 = onnx.TensorProto.FLOAT, onnx.TensorProto.INT64
    cache = ["batch", KV_HEADS, "past", HEAD]
    inputs = [helper.make_tensor_value_info("x", f, ["batch", "seq", HIDDEN]),
              helper.make_tensor_value_info("mask", i64, ["batch", "total"]),
              helper.make_tensor_value_info("past_k", f, cache), helper.make_tensor_value_info("past_v", f, cache)]
    outputs = [helper.make_tensor_value_info(o, f, None) for o in ("y", "residual", "present_k", "present_v")]
    graph = helper.make_graph(nodes, "decoder_layer", inputs, outputs,
                              [onnx.numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)],
                             ir_version=8)


@pytest.mark.parametrize("shared_buffer", [False, True], ids=["growing-past", "shared-buffer"])
def test_decoder_layer_prompt_then_tokens(shared_buffer: bool) -> None:
    """A prompt (batch 2, sequences of 5 and 3 tokens: the second padded) then 4 token steps, each feeding
    present back as past: from an empty past, or onnxruntime-genai's shared buffer (16 rows, seqlens_k says
    how many are filled). Every output equals onnxruntime's within 1e-4 relative."""
    import onnxruntime as ort

    model = decoder_layer().SerializeToString()
    ours = ctxrt.InferenceSession(model, backend=harness.BACKEND)
    theirs = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    rows = 16 if shared_buffer else 0
    past = {"past_k": np.zeros((2, KV_HEADS, rows, HEAD), F32), "past_v": np.zeros((2, KV_HEADS, rows, HEAD), F32)}
    state = {"ours": dict(past), "theirs": dict(past)}
    mask = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], np.int64)
    x = rand(2, 5, HIDDEN)
    for step in range(5):
        feeds = {"x": x, "mask": mask}
        got = ours.run(None, {**feeds, **state["ours"]})
        want = theirs.run(None, {**feeds, **state["theirs"]})
        for name, g, w in zip(("y", "residual", "present_k", "present_v"), got, want, strict=True):
            assert g.shape == w.shape, f"step {step} {name}: {g.shape} != {w.shape}"
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5, err_msg=f"step {step} {name}")
        assert got[2].shape[2] == (16 if shared_buffer else 5 + step)
        state = {"ours": {"past_k": got[2], "past_v": got[3]}, "theirs": {"past_k": want[2], "past_v": want[3]}}
        x, mask = rand(2, 1, HIDDEN), np.concatenate([mask, np.ones((2, 1), np.int64)], axis=1)
