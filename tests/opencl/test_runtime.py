"""The OpenCL backend around its kernels: CPU partitions (host mappings where memory is shared, counted copies
through planned staging where not), program binaries in context binaries, device selection and errors."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
from harness import make_model, rand, read, reference, steady_state_allocation, write
from onnx import helper

import ctxrt
from ctxrt.backends import get_backend, list_devices
from ctxrt.backends.opencl import device as cl_device
from ctxrt.backends.opencl.backend import OpenCLBackend
from ctxrt.cli import main as cli
from ctxrt.compiler import compile_graphs
from ctxrt.errors import CtxrtError, CtxrtWarning, FormatError, RegistrationError
from ctxrt.format import ContextFile, write_context

pytestmark = pytest.mark.usefixtures("opencl")


def _mixed():
    """x -> MatMul (opencl) -> Einsum (cpu) -> Add (opencl) -> Einsum transpose (cpu) -> Mul (opencl) -> y, plus
    Einsum reading the graph input directly: CPU partitions in the middle, at the start and at the end (Einsum
    has no OpenCL kernel)."""
    nodes = [helper.make_node("Einsum", ["x"], ["s0"], equation="ij->ij"),
             helper.make_node("MatMul", ["s0", "w"], ["h"]),
             helper.make_node("Einsum", ["h"], ["s"], equation="ij->ij"),
             helper.make_node("Add", ["s", "h"], ["a"]),
             helper.make_node("Einsum", ["a"], ["t"], equation="ij->ji"),
             helper.make_node("Mul", ["t", "k"], ["m"]),
             helper.make_node("Einsum", ["m"], ["y"], equation="ij->ji")]
    feeds = {"x": rand(5, 12)}
    return make_model(nodes, feeds, {"w": rand(12, 7), "k": rand(7, 1)}), feeds


PARTITIONS = ["cpu", "opencl", "cpu", "opencl", "cpu", "opencl", "cpu"]


def _backend(zero_copy: bool) -> OpenCLBackend:
    """Device 0 in that mode; zero copy where the device has its own memory (a discrete GPU) is refused, once."""
    if zero_copy and not get_backend("opencl").info.unified_memory:
        with pytest.raises(CtxrtError, match="zero_copy=True needs a device whose memory is shared"):
            OpenCLBackend(0, zero_copy=True)
        pytest.skip("zero copy is refused on a device with its own memory (checked above)")
    return OpenCLBackend(0, zero_copy=zero_copy)


@pytest.mark.parametrize("zero_copy", [True, False], ids=["mapped", "copies"])
def test_cpu_partitions_over_mappings_or_counted_copies(zero_copy) -> None:
    model, feeds = _mixed()
    (want,) = reference(model, feeds)
    be = _backend(zero_copy)
    with ctxrt.compile(model, backend=be) as ctx:
        g = ctx.graph()
        assert [p["backend"] for p in g.partitions] == PARTITIONS
        runs = 3
        for _ in range(runs):
            np.testing.assert_allclose(g.run(feeds)["y"], want, rtol=1e-5, atol=1e-6)
        s = ctx.stats
        assert s["partition_syncs"] == 3 * runs  # before each CPU partition that follows device launches
        if zero_copy:
            assert s["staging_copies_to_host"] == s["staging_copies_to_device"] == s["alloc_staging_bytes"] == 0
        else:
            # in: x (first Einsum), h (second Einsum), a (third), m (fourth): 4 per run, their bytes;
            # out: s0, s, t, y
            assert s["staging_copies_to_host"] == 4 * runs and s["staging_copies_to_device"] == 4 * runs
            f4 = 4
            assert s["staging_bytes_to_host"] == runs * f4 * (5 * 12 + 5 * 7 + 5 * 7 + 7 * 5)
            assert s["staging_bytes_to_device"] == runs * f4 * (5 * 12 + 5 * 7 + 7 * 5 + 5 * 7)
            assert 0 < s["alloc_staging_bytes"] <= 2 * 64 * 4 + 2 * 5 * 12 * 4  # planned: no more than two tensors live


@pytest.mark.parametrize("zero_copy", [True, False], ids=["mapped", "copies"])
def test_steady_loop_with_fallback_creates_and_records_nothing(zero_copy) -> None:
    """reference/003: per-run tensor creation at fallback boundaries is the cost to avoid."""
    model, feeds = _mixed()
    be = _backend(zero_copy)
    with ctxrt.compile(model, backend=be, io_mem_type="memhandle") as ctx:
        g = ctx.graph()
        buf = be.alloc_shared(4096, 64)
        x, y = ctx.mem_register(buf, 0, (5, 12), np.float32), ctx.mem_register(buf, 1024, (5, 7), np.float32)
        write(be, x.view, feeds["x"])
        g.execute({"x": x}, {"y": y})
        made, recorded, staged = be.stats["buffers_created"], ctx.stats["recordings"], ctx.stats["alloc_staging_bytes"]
        peak, growth = steady_state_allocation(lambda: g.execute({"x": x}, {"y": y}))
        assert (be.stats["buffers_created"], ctx.stats["recordings"], ctx.stats["alloc_staging_bytes"]) == \
               (made, recorded, staged)
        assert peak < 16384 and growth < 2048
        np.testing.assert_allclose(read(be, y.view), reference(model, feeds)[0], rtol=1e-5, atol=1e-6)
        ctx.mem_deregister(x)
        ctx.mem_deregister(y)


@pytest.mark.parametrize("zero_copy", [True, False], ids=["mapped", "copies"])
def test_only_weights_device_kernels_read_are_uploaded(zero_copy) -> None:
    """Einsum (a CPU partition) reads its table from the host weights; only Add's bias goes to the device."""
    table, bias = rand(1000, 16), rand(16)
    nodes = [helper.make_node("Einsum", ["x", "table"], ["g"], equation="ij,jk->ik"),
             helper.make_node("Add", ["g", "bias"], ["y"])]
    feeds = {"x": rand(2, 1000)}
    model = make_model(nodes, feeds, {"table": table, "bias": bias})
    with ctxrt.compile(model, backend=_backend(zero_copy)) as ctx:
        assert [p["backend"] for p in ctx.graph().partitions] == ["cpu", "opencl"]
        assert ctx.stats["alloc_weights_bytes"] == ctx.stats["weights_uploaded_bytes"] == bias.nbytes
        np.testing.assert_allclose(ctx.graph().run(feeds)["y"], feeds["x"] @ table + bias, rtol=1e-5, atol=1e-5)


def test_inspect_shows_device_driver_and_partitions(tmp_path, capsys) -> None:
    model, _ = _mixed()
    src, out = tmp_path / "m.onnx", tmp_path / "m.ctx"
    src.write_bytes(model.SerializeToString())
    assert cli(["compile", str(src), "-o", str(out), "--backend", "opencl"]) == 0
    capsys.readouterr()
    assert cli(["inspect", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    info = get_backend("opencl").info
    assert (report["backend"], report["device"], report["driver"]) == ("opencl", info.name, info.driver)
    assert [p["backend"] for p in report["graphs"][0]["partitions"]] == PARTITIONS
    assert cli(["inspect", str(out)]) == 0
    text = capsys.readouterr().out
    assert f"backend opencl ({info.name}, driver {info.driver})" in text
    assert "partitions: cpu 1 steps (Einsum 1) | opencl 1 steps (MatMul 1) | cpu 1 steps (Einsum 1)" in text


# ---- program binaries -------------------------------------------------------------------------------------

@pytest.fixture
def stored(tmp_path, capsys):
    """BERT (2 layers) compiled for OpenCL into a .ctx, with its feeds and onnxruntime's outputs."""
    import zoo
    from test_models import ort_outputs

    path, feeds = zoo.bert_model(layers=2, hidden=64, heads=4, seq=16), zoo.bert_feeds(16, pad=4)
    out = tmp_path / "bert.ctx"
    shapes = [a for k, v in feeds.items() for a in ("--shape", f"{k}={'x'.join(map(str, v.shape))}")]
    assert cli(["compile", str(path), "-o", str(out), "--backend", "opencl", *shapes]) == 0
    capsys.readouterr()
    return out, feeds, ort_outputs(path, feeds)


def _run(ctx, feeds, want) -> None:
    got = ctx.graph().run(feeds)
    for name, w in want.items():
        assert np.max(np.abs(got[name] - w)) <= 1e-4 * np.max(np.abs(w)) + 1e-5


def test_stored_context_loads_without_building(stored) -> None:
    out, feeds, want = stored
    with ContextFile.open(out) as f:
        programs = f.programs()["programs"]
    assert programs and all(p["binary"] and p["source"] for p in programs)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CtxrtWarning)  # no warning of ctxrt's on the device it was made for
        ctx = ctxrt.context_from_binary(out, OpenCLBackend(0))  # a new context: nothing built in it yet
    with ctx:
        assert ctx.stats["programs_built_from_source"] == 0
        assert ctx.stats["programs_loaded_from_binary"] == len(programs)
        _run(ctx, feeds, want)


def test_stored_context_runs_on_its_own_backend_by_default(stored) -> None:
    """context_from_binary without a backend: the one the binary was compiled for (as `ctxrt run` does)."""
    out, feeds, want = stored
    with ctxrt.context_from_binary(out) as ctx:
        assert ctx.backend.name == "opencl"
        _run(ctx, feeds, want)
    with pytest.raises(FormatError, match="compiled for backend 'opencl', not 'cpu'"):
        ctxrt.context_from_binary(out, "cpu")


def _retarget(path, tier: str = "acme/gpu-9000/driver-1.0", binary: bytes | None = None) -> None:
    """Rewrite a .ctx as if its programs had been built for another device (or with other binaries)."""
    with ContextFile.open(path) as f:
        graphs, weights, meta, programs = f.graphs(), f.weights(), f.metadata, f.programs()
    programs["device"] = {"tier": tier, "vendor": "Acme", "device": "GPU 9000", "driver": "1.0"} if tier else \
        programs["device"]
    for p in programs["programs"]:
        p["binary"] = binary if binary is not None else p["binary"]
    info = {k: meta[k] for k in ("backend", "hardware", "producer", "alignment", "source_models", "tuning", "device")}
    write_context(path, graphs, weights, info, programs)


def test_binaries_for_another_device_are_rebuilt_with_one_warning(stored) -> None:
    out, feeds, want = stored
    _retarget(out)
    be = OpenCLBackend(0)
    with pytest.warns(CtxrtWarning) as caught:
        ctx = ctxrt.context_from_binary(out, be)
    assert len(caught) == 1
    message = str(caught[0].message)
    assert "GPU 9000 (Acme, driver 1.0)" in message and be.info.name in message and "stored sources" in message
    with ctx:
        assert ctx.stats["programs_loaded_from_binary"] == 0 and ctx.stats["programs_built_from_source"] > 0
        _run(ctx, feeds, want)


def test_a_binary_the_driver_refuses_is_rebuilt_not_a_crash(stored) -> None:
    out, feeds, want = stored
    _retarget(out, tier="", binary=b"not a program binary")
    with pytest.warns(CtxrtWarning, match="refused"):
        ctx = ctxrt.context_from_binary(out, OpenCLBackend(0))
    with ctx:
        assert ctx.stats["programs_built_from_source"] > 0
        _run(ctx, feeds, want)


def test_run_json_reports_program_counters(stored, capsys) -> None:
    out, _, _ = stored
    assert cli(["run", str(out), "--json"]) == 0  # the backend the .ctx names
    stats = json.loads(capsys.readouterr().out)["stats"]
    assert stats.get("programs_built_from_source", 0) == 0  # loaded, or already built in this process
    assert stats.get("programs_loaded_from_binary", 0) + stats.get("programs_reused", 0) > 0


def test_cpu_contexts_store_no_programs(tmp_path) -> None:
    model, _ = _mixed()
    be = get_backend("cpu")
    graphs, weights = compile_graphs([(model, None, "main")], be)
    assert all(g.programs == [] for g in graphs)
    out = ctxrt.compiler.save_context(tmp_path / "c.ctx", graphs, weights, be, ["m"])
    with ContextFile.open(out) as f:
        assert f.programs() is None


# ---- devices and errors -------------------------------------------------------------------------------------

def test_buffers_of_another_backend_are_refused() -> None:
    model, _ = _mixed()
    for mine, theirs, name in (("opencl", "cpu", "opencl"), ("cpu", "opencl", "cpu")):
        with ctxrt.compile(model, backend=mine, defer_graph_init=True) as ctx:
            foreign = get_backend(theirs).alloc_shared(1 << 16, 64)
            with pytest.raises(RegistrationError, match=f"the {name} backend needs its own buffers"):
                ctx.register_spillfill_buffer(foreign)
            with pytest.raises(RegistrationError, match=f"the {name} backend needs its own buffers"):
                ctx.mem_register(foreign, 0, (5, 12), np.float32)


def test_device_selection(monkeypatch) -> None:
    assert get_backend("opencl") is get_backend("opencl:0")
    assert get_backend("opencl:0").info.index == 0
    monkeypatch.setenv("CTXRT_OPENCL_DEVICE", "0")
    assert get_backend("opencl") is get_backend("opencl:0")
    monkeypatch.setenv("CTXRT_OPENCL_DEVICE", "99")
    with pytest.raises(CtxrtError, match="no OpenCL device 99"):
        get_backend("opencl")
    monkeypatch.setenv("CTXRT_OPENCL_DEVICE", "gpu")
    with pytest.raises(CtxrtError, match="CTXRT_OPENCL_DEVICE"):
        get_backend("opencl")
    with pytest.raises(CtxrtError, match="unknown backend 'cuda'"):
        get_backend("cuda")
    with pytest.raises(CtxrtError, match="takes no device"):
        get_backend("cpu:1")


def test_devices_listing(capsys) -> None:
    devices = list_devices()
    assert devices[0]["backend"] == "cpu"
    cl = [d for d in devices if d["backend"].startswith("opencl:")]
    assert cl and {"name", "driver", "compute_units", "global_memory", "unified_memory"} <= set(cl[0])
    assert cli(["devices", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["devices"] == devices
    assert cli(["devices"]) == 0
    assert cl[0]["name"] in capsys.readouterr().out


def test_no_platform_is_one_clear_error(monkeypatch, tmp_path, capsys) -> None:
    monkeypatch.setattr(cl_device, "_all_devices", lambda cl: [])
    with pytest.raises(CtxrtError, match="no OpenCL platform or device found: install"):
        OpenCLBackend(0)
    model, _ = _mixed()
    src = tmp_path / "m.onnx"
    src.write_bytes(model.SerializeToString())
    assert cli(["run", str(src), "--backend", "opencl:7"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ctxrt: error: ") and "no OpenCL platform or device found" in err and err.count("\n") == 1
    assert cli(["devices"]) == 0
    assert "no OpenCL device" in capsys.readouterr().out


def test_zero_copy_is_refused_where_the_device_has_its_own_memory(monkeypatch) -> None:
    """On a discrete GPU a mapping is the host's copy: zero copy would hand CPU partitions stale bytes (an H100
    gave zeros), so it is refused there with one clear error; the default there is copies."""
    import dataclasses

    from ctxrt.backends.opencl import backend as cl_backend

    real = cl_backend.open_device

    def discrete(index: int):
        dev, info = real(index)
        return dev, dataclasses.replace(info, unified_memory=False)
    monkeypatch.setattr(cl_backend, "open_device", discrete)
    with pytest.raises(CtxrtError, match="has its own memory: use zero_copy=False"):
        OpenCLBackend(0, zero_copy=True)
    assert not OpenCLBackend(0).zero_copy  # copies by default there


@pytest.mark.parametrize("op", ["Gather", "GatherElements", "GatherND", "ScatterND", "ScatterElements"])
def test_an_index_fed_outside_its_axis_is_refused_before_the_device_runs(op: str) -> None:
    """A gather's or scatter's indices fed from the host (a token id past the vocabulary): on OpenCL the kernel
    would wrap it (memory-safe, a wrong row); the session and the graph read the feed first and raise the CPU's
    InvalidInputError naming the node and the index, nothing run; in-range and negative indices run as on the CPU."""
    from onnx import TensorProto, helper, numpy_helper

    data = numpy_helper.from_array(np.arange(40, dtype=np.float32).reshape(10, 4), "data")
    nd = op in ("GatherND", "ScatterND")
    idx_shape = [2, 1] if nd else [2, 4] if op in ("GatherElements", "ScatterElements") else [2]
    ins = [helper.make_tensor_value_info("idx", TensorProto.INT64, idx_shape)]
    inits = [data]
    if op.startswith("Scatter"):
        upd = [2, 4] if nd or op == "ScatterElements" else [2]
        inits.append(numpy_helper.from_array(np.ones(upd, np.float32), "upd"))
        node = helper.make_node(op, ["data", "idx", "upd"], ["y"], **({} if nd else {"axis": 0}))
    else:
        node = helper.make_node(op, ["data", "idx"], ["y"], **({} if nd else {"axis": 0}))
    graph = helper.make_graph([node], "g", ins, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    good = np.array([[3], [-1]]) if nd else np.array([[3] * 4, [9] * 4]) if len(idx_shape) == 2 else np.array([3, -1])
    bad = good.copy()
    bad.flat[-1] = 10
    want = ctxrt.InferenceSession(model).run(None, {"idx": good})[0]
    for sess in (ctxrt.InferenceSession(model, "opencl"),):
        np.testing.assert_allclose(sess.run(None, {"idx": good})[0], want)
        with pytest.raises(ctxrt.InvalidInputError, match=rf"{op} node .*index 10 is outside"):
            sess.run(None, {"idx": bad})
        np.testing.assert_allclose(sess.run(None, {"idx": good})[0], want)
    g = ctxrt.compile(model, {"idx": tuple(idx_shape)}, backend="opencl").graph()
    with pytest.raises(ctxrt.InvalidInputError, match="index 10 is outside"):
        g.run({"idx": bad})
