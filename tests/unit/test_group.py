"""Contexts sharing one spill-fill buffer (DESIGN.md §7): sizes from metadata without loading, one buffer of
the maximum size, the largest context loaded first, the group lock serializing execution; on every backend."""

import threading
import time

import numpy as np
import pytest
from harness import run_in_threads
from onnx import TensorProto, helper, numpy_helper

import ctxrt
import ctxrt.format
import ctxrt.runtime.loader as loader
from ctxrt.backends import get_backend
from ctxrt.compiler import compile_graphs, save_context
from ctxrt.errors import FormatError, LifecycleError
from ctxrt.runtime.group import ContextGroup


def _mlp(width: int, seed: int):
    """x[4, 16] -> MatMul(16 x width) -> Relu -> MatMul(width x 16): the arena grows with `width`."""
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array((rng.standard_normal((16, width)) / 4).astype(np.float32), "w1"),
             numpy_helper.from_array((rng.standard_normal((width, 16)) / 4).astype(np.float32), "w2")]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["y"])]
    g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    w1, w2 = (numpy_helper.to_array(t) for t in inits)
    return model, lambda x: np.maximum(x @ w1, 0) @ w2


@pytest.fixture
def three(tmp_path, backend):
    """Three context binaries, small / LARGE / medium: the largest is neither first nor last given."""
    be = get_backend(backend)
    out = []
    for name, width in [("small", 32), ("large", 1024), ("medium", 256)]:
        model, fn = _mlp(width, width)
        graphs, weights = compile_graphs([(model, None, "main")], be)
        path = save_context(tmp_path / f"{name}.ctx", graphs, weights, be, [name])
        out.append((path, fn))
    return out


def _sizes(paths):
    return [ctxrt.read_metadata(p)["max_spillfill_size"] for p in paths]


def test_one_buffer_of_the_maximum_not_the_sum(three, backend) -> None:
    paths = [p for p, _ in three]
    sizes = _sizes(paths)
    assert sizes[1] > sizes[2] > sizes[0]
    with ContextGroup(paths, backend) as group:
        assert group.buffer.nbytes == max(sizes)  # the maximum over all, though the first is the smallest
        assert all(c.stats["alloc_spillfill_bytes"] == 0 for c in group.contexts)
        assert all(c.arena[0] is group.buffer for c in group.contexts)
        mem = group.memory()
        assert mem["spillfill"] == max(sizes)
        assert mem["spillfill_saved"] == sum(sizes) - max(sizes)
        x = np.random.default_rng(1).standard_normal((4, 16)).astype(np.float32)
        for ctx, (_, fn) in zip(group.contexts, three, strict=True):
            np.testing.assert_allclose(ctx.graph().run({"x": x})["y"], fn(x), rtol=1e-4, atol=1e-5)


def test_unshared_group_allocates_one_buffer_per_context(three, backend) -> None:
    paths = [p for p, _ in three]
    with ContextGroup(paths, backend, share_spillfill=False) as group:
        assert group.buffer is None
        assert group.memory()["spillfill"] == sum(_sizes(paths))
        assert group.memory()["spillfill_saved"] == 0


@pytest.mark.parametrize("order", [[0, 1, 2], [0, 2, 1], [1, 0, 2], [2, 0, 1]])
def test_sizes_read_first_then_largest_loaded_first(three, backend, order, monkeypatch) -> None:
    paths = [three[k][0] for k in order]
    events = []
    read_metadata, load = ctxrt.format.read_metadata, loader.context_from_binary
    monkeypatch.setattr(ctxrt.format, "read_metadata", lambda s: events.append(("meta", s)) or read_metadata(s))
    monkeypatch.setattr(loader, "context_from_binary",
                        lambda s, *a, **k: events.append(("load", s)) or load(s, *a, **k))
    with ContextGroup(paths, backend) as group:
        # every size is read from metadata before any binary is loaded
        assert [e[0] for e in events] == ["meta"] * 3 + ["load"] * 3
        loaded = [s for kind, s in events if kind == "load"]
        assert loaded[0] == three[1][0]  # the large one leads, wherever it was given
        assert loaded == sorted(paths, key=lambda p: -ctxrt.read_metadata(p)["max_spillfill_size"])
        assert group.leader is group.contexts[paths.index(three[1][0])]


def test_declared_size_too_small_is_a_format_error(three, backend) -> None:
    paths = [p for p, _ in three]
    sizes = _sizes(paths)
    sizes[1] //= 2  # an EPContext node's max_size that lies
    with pytest.raises(FormatError, match="declared max spill-fill size"):
        ContextGroup(paths, backend, spillfill_sizes=sizes)


def test_group_lock_serializes_threads(three, backend, monkeypatch) -> None:
    """Graphs of different contexts in one group, run from 6 threads: never two at once, all correct."""
    active, overlap = [0], [0]
    guard = threading.Lock()
    be = get_backend(backend)
    run = be.run

    def probe(launches):
        with guard:
            active[0] += 1
            overlap[0] = max(overlap[0], active[0])
        time.sleep(0.001)  # widen the window a concurrent run would fall into
        run(launches)
        with guard:
            active[0] -= 1

    monkeypatch.setattr(be, "run", probe)
    with ContextGroup([p for p, _ in three], be) as group:
        def work(k: int) -> None:
            ctx, fn = group.contexts[k % 3], three[k % 3][1]
            rng = np.random.default_rng(k)
            for _ in range(15):
                x = rng.standard_normal((4, 16)).astype(np.float32)
                np.testing.assert_allclose(ctx.graph().run({"x": x})["y"], fn(x), rtol=1e-4, atol=1e-5)

        run_in_threads(work, 6)
    assert overlap[0] == 1


def test_free_releases_the_shared_buffer(three, backend) -> None:
    group = ContextGroup([p for p, _ in three], backend)
    buf = group.buffer
    group.free()
    assert buf.released and all(c.freed for c in group.contexts)
    with pytest.raises(LifecycleError):
        group.contexts[0].graph()
    group.free()  # twice is harmless


def test_group_from_bytes(three, backend) -> None:
    sources = [p.read_bytes() for p, _ in three]
    with ContextGroup(sources, backend) as group:
        assert group.buffer.nbytes == max(_sizes([p for p, _ in three]))


def test_a_bad_binary_in_a_group_is_one_error_and_frees_the_rest(three, backend, tmp_path, monkeypatch) -> None:
    bad = tmp_path / "bad.ctx"
    data = bytearray(three[1][0].read_bytes())
    data[-100:] = b"\xff" * 100  # the last section's checksum (weights, or OpenCL programs) no longer matches
    bad.write_bytes(bytes(data))
    made = []
    be = get_backend(backend)
    shared, device = be.alloc_shared, be.alloc_device
    monkeypatch.setattr(be, "alloc_shared", lambda n, a=64: made.append(shared(n, a)) or made[-1])
    monkeypatch.setattr(be, "alloc_device", lambda n: made.append(device(n)) or made[-1])
    with pytest.raises(FormatError):
        ContextGroup([three[0][0], bad, three[2][0]], backend)
    assert made and all(b.released for b in made)  # the shared buffer and every context's buffers


def _chain(tmp_path, three, edit):
    """An EPContext model with a second node reading the first's output "y", that node edited by `edit`."""
    import onnx
    from onnx import helper

    from ctxrt.frontend.epcontext import write_epcontext

    wrapper = tmp_path / "chain_ctx.onnx"
    write_epcontext(wrapper, [(three[0][0], ctxrt.read_metadata(three[0][0]))])
    model = onnx.load(str(wrapper))
    second = helper.make_node("EPContext", ["y"], ["z"], name="second", domain="com.microsoft",
                              ep_cache_context=str(three[2][0].name), embed_mode=0, partition_name="main",
                              max_size=0)
    model.graph.node.append(second)
    model.graph.output[0].name = "z"
    edit(model.graph.node[1])
    onnx.save(model, str(wrapper))
    return wrapper


def _set(attr: str, value: bytes):
    def edit(node) -> None:
        next(a for a in node.attribute if a.name == attr).s = value
    return edit


@pytest.mark.parametrize("edit, message", [
    (lambda node: None, "do not match"),  # the second binary's graph reads "x" and writes "y", not "y" -> "z"
    (_set("partition_name", b"nope"), "names graph 'nope'"),
    (_set("ep_cache_context", b"gone.ctx"), "missing file"),
], ids=["wiring", "graph", "file"])
def test_epcontext_chain_rejects_bad_models(three, backend, tmp_path, edit, message) -> None:
    with pytest.raises(FormatError, match=message):
        ContextGroup.from_epcontext(_chain(tmp_path, three, edit), backend)
