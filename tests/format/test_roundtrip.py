"""Context binaries of real models: the binary runs bit for bit like the in-memory compile; multi-graph
contexts store shared weights once; EPContext models pass onnx.checker and run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import zoo  # tests/models is on sys.path (tests/conftest.py)

import ctxrt
from ctxrt.backends import get_backend
from ctxrt.cli import main
from ctxrt.compiler import compile_graphs, save_context
from ctxrt.format import read_metadata
from ctxrt.runtime.loader import context_from_binary

# VGG-19 and ZFNet-512 are left out: every (op, kernel) pair of theirs is one of AlexNet's (oneDNN's convs, LRN,
# MaxPool; Gemm), at 20 and 8 s a round trip; tests/models runs both against onnxruntime
CASES = [(name, None) for name in zoo.LIGHT if name not in ("vgg19", "zfnet512")] + [("bert", 16)]


def _model(name: str) -> tuple[Path, dict[str, np.ndarray], dict]:
    if name == "bert":
        path = zoo.bert_model(layers=2, hidden=64, heads=4, seq=16)
        feeds = zoo.bert_feeds(16)
        return path, feeds, {k: v.shape for k, v in feeds.items()}
    path = zoo.light_model(name)
    return path, zoo.light_feeds(path), {}


@pytest.mark.parametrize("name", [c[0] for c in CASES])
def test_binary_runs_bit_for_bit_like_the_in_memory_compile(name, tmp_path) -> None:
    path, feeds, shapes = _model(name)
    # one thread each (a busy machine would leave the two runs different idle cores: oneDNN's kernels for other
    # thread counts may sum in another order)
    with ctxrt.compile(path, shapes=shapes, num_threads=1) as ctx:
        want = {k: v.copy() for k, v in ctx.graph().run(feeds).items()}
    backend = get_backend("cpu")
    graphs, weights = compile_graphs([(path, shapes, "main")], backend)
    out = save_context(tmp_path / "m.ctx", graphs, weights, backend, [str(path)])
    del graphs, weights
    assert ctxrt.read_metadata(out)["graphs"][0]["name"] == "main"
    with ctxrt.context_from_binary(out, num_threads=1) as ctx:
        assert ctx.stats["weights_copied_bytes"] == 0  # weights used in place from the mapped file
        assert not next(iter(ctx.weights.values())).flags.writeable
        got = ctx.graph().run(feeds)
        for k in want:
            np.testing.assert_array_equal(got[k], want[k], err_msg=k)


def test_multi_graph_context_stores_shared_weights_once(tmp_path) -> None:
    path = zoo.bert_model(layers=2, hidden=64, heads=4, seq=16)
    one, two = tmp_path / "one.ctx", tmp_path / "two.ctx"
    small = ["--shape", "input_ids=1x16", "--shape", "attention_mask=1x16"]
    big = ["--shape", "1:input_ids=4x32", "--shape", "1:attention_mask=4x32"]
    assert main(["compile", str(path), "-o", str(one), *small]) == 0
    assert main(["compile", str(path), str(path), "-o", str(two), *small[:1], "0:input_ids=1x16",
                 *small[2:3], "0:attention_mask=1x16", *big]) == 0
    m1, m2 = read_metadata(one), read_metadata(two)
    # The second graph adds only its shape-dependent folded constants (position embeddings for 32
    # tokens, ...), not a second copy of the matrices.
    assert m2["weights_size"] - m1["weights_size"] < 0.1 * m1["weights_size"]
    assert m2["max_spillfill_size"] == max(g["spillfill_size"] for g in m2["graphs"])
    assert m2["graphs"][1]["spillfill_size"] > m2["graphs"][0]["spillfill_size"]
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    with context_from_binary(two) as ctx:
        assert ctx.properties["max_spillfill_buffer_size"] == m2["max_spillfill_size"]
        for graph, (batch, seq) in ((ctx.graph(ctx.graph_names[0]), (1, 16)), (ctx.graph(ctx.graph_names[1]), (4, 32))):
            feeds = zoo.bert_feeds(seq, batch=batch)
            got = graph.run(feeds)
            want = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds), strict=True))
            for k, w in want.items():
                assert np.max(np.abs(got[k] - w)) <= 1e-4 * np.max(np.abs(w)) + 1e-5


@pytest.mark.parametrize("embed", [False, True])
def test_epcontext_model_passes_checker_and_runs(tmp_path, embed, capsys) -> None:
    path, feeds, shapes = _model("bert")
    out = tmp_path / "bert.ctx"
    argv = ["compile", str(path), "-o", str(out), "--epcontext",
            *[f"--shape={k}={'x'.join(map(str, v))}" for k, v in shapes.items()]]
    assert main(argv + (["--embed"] if embed else [])) == 0
    wrapper = tmp_path / "bert_ctx.onnx"
    model = onnx.load(str(wrapper))
    onnx.checker.check_model(model)
    (node,) = model.graph.node
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    assert node.domain == "com.microsoft" and node.op_type == "EPContext"
    assert attrs["main_context"] == 1 and attrs["embed_mode"] == int(embed) and attrs["source"] == b"ctxrt"
    assert attrs["max_size"] == read_metadata(out)["max_spillfill_size"]
    if embed:
        assert attrs["ep_cache_context"] == out.read_bytes()
    else:
        assert attrs["ep_cache_context"] == b"bert.ctx"
    assert [i.name for i in model.graph.input] == list(feeds)
    np.savez(tmp_path / "in.npz", **feeds)
    capsys.readouterr()
    assert main(["run", str(wrapper), "--inputs", str(tmp_path / "in.npz"), "--output", str(tmp_path / "o.npz")]) == 0
    with ctxrt.compile(path, shapes=shapes) as ctx:
        want = ctx.graph().run(feeds)
    got = np.load(tmp_path / "o.npz")
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])
    assert main(["inspect", str(wrapper), "--json"]) == 0
