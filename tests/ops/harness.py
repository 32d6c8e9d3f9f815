"""Op tests: one ONNX node (or a tiny graph) run by ctxrt vs onnx.reference.ReferenceEvaluator."""

from __future__ import annotations

import contextlib
import functools
import os
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

RNG = np.random.default_rng(0)
BACKENDS = ["cpu", "opencl"]
BACKEND = "cpu"  # what `check` runs on: tests/ops/conftest.py sets it per test, once per backend


@functools.cache
def opencl_missing() -> str | None:
    """Why OpenCL tests cannot run here, or None. CI must have a device (scripts/setup.sh installs PoCL)."""
    from ctxrt.backends.opencl.device import opencl_devices

    if opencl_devices():
        return None
    return ("no OpenCL device on this machine: install one (scripts/setup.sh does: apt-get install "
            "pocl-opencl-icd, or pip install pocl-binary-distribution)")


def skip_unless_available(name: str) -> None:
    """Skip an OpenCL test on a machine without an OpenCL device, with the reason; in CI (CI set) fail
    instead: CI must run every OpenCL test (scripts/setup.sh installs PoCL)."""
    if name.startswith("opencl") and opencl_missing():
        import pytest

        if os.environ.get("CI"):
            pytest.fail(f"CI has no OpenCL device: {opencl_missing()}", pytrace=False)
        pytest.skip(opencl_missing())


def rand(*shape: int, dtype: Any = np.float32, low: float = -1.0, high: float = 1.0) -> np.ndarray:
    return RNG.uniform(low, high, size=shape).astype(dtype)


def make_model(nodes: onnx.NodeProto | list[onnx.NodeProto], feeds: dict[str, np.ndarray],
               inits: dict[str, np.ndarray] | None = None, opset: int = 17,
               outputs: list[str] | None = None) -> onnx.ModelProto:
    nodes = [nodes] if isinstance(nodes, onnx.NodeProto) else list(nodes)
    inits = inits or {}
    inputs = [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
              for k, v in feeds.items()]
    outs = outputs or [o for o in nodes[-1].output if o]
    graph = helper.make_graph(
        nodes, "op_test", inputs,
        [helper.make_tensor_value_info(o, onnx.TensorProto.UNDEFINED, None) for o in outs],
        initializer=[numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def reference(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return [np.asarray(o) for o in ReferenceEvaluator(model).run(None, feeds)]


def run_ctxrt(model: onnx.ModelProto, feeds: dict[str, np.ndarray], backend: str | None = None) -> list[np.ndarray]:
    import ctxrt

    ctx = ctxrt.compile(model, backend=backend or BACKEND)
    try:
        result = ctx.graph().run(feeds)
    finally:
        ctx.free()
    return [result[o.name] for o in model.graph.output]


def onnxruntime_outputs(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    import onnxruntime as ort

    model = onnx.ModelProto.FromString(model.SerializeToString())
    # Output dtypes from shape inference (the reference may fail where onnxruntime is the oracle); ops it
    # leaves untyped (GroupNormalization) take the reference's.
    inferred = onnx.shape_inference.infer_shapes(model).graph.output
    for k, (out, typed) in enumerate(zip(model.graph.output, inferred, strict=True)):
        elem = typed.type.tensor_type.elem_type
        if not elem:
            elem = helper.np_dtype_to_tensor_dtype(reference(model, feeds)[k].dtype)
        out.type.tensor_type.elem_type = elem
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def check(nodes: onnx.NodeProto | list[onnx.NodeProto], feeds: dict[str, np.ndarray],
          inits: dict[str, np.ndarray] | None = None, opset: int = 17,
          rtol: float = 1e-5, atol: float = 1e-6, oracle: str = "reference") -> list[np.ndarray]:
    """Run the node(s) in ctxrt and in the oracle (onnx.reference, or "onnxruntime" where the reference
    disagrees with onnxruntime), compare every output (shape, dtype, values); return ctxrt's."""
    model = make_model(nodes, feeds, inits, opset)
    want = reference(model, feeds) if oracle == "reference" else onnxruntime_outputs(model, feeds)
    # CTXRT_TEST_DIRECT=1 calls the kernel alone (single-node models): for kernel development only.
    runner = run_direct if os.environ.get("CTXRT_TEST_DIRECT") == "1" else run_ctxrt
    got = runner(model, feeds)
    for name, w, g in zip([o.name for o in model.graph.output], want, got, strict=True):
        assert g.shape == w.shape, f"{name}: shape {g.shape} != {w.shape}"
        assert g.dtype == w.dtype, f"{name}: dtype {g.dtype} != {w.dtype}"
        if w.dtype == np.bool_ or np.issubdtype(w.dtype, np.integer):
            np.testing.assert_array_equal(g, w, err_msg=name)
        else:
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, err_msg=name)
    return got


def run_direct(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Call the CPU kernel of a single-node model directly (no frontend, planner or runtime).

    For developing kernels before the pipeline runs them; `check` itself goes through ctxrt.compile.
    """
    from ctxrt.backends.cpu.registry import KERNELS
    from ctxrt.backends.kernel import NodeSpec, TensorSpec
    from ctxrt.ir.canonical import PARAM_INPUTS

    (node,) = model.graph.node
    consts = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    want = reference(model, feeds)
    attrs = {}
    for a in node.attribute:
        v = helper.get_attribute_value(a)
        if isinstance(v, bytes):
            v = v.decode()
        elif isinstance(v, onnx.TensorProto):
            v = numpy_helper.to_array(v)
        elif isinstance(v, list):
            v = [x.decode() if isinstance(x, bytes) else x for x in v]
        attrs[a.name] = v
    names = list(node.input)
    for pos, key in PARAM_INPUTS.get(node.op_type, {}).items():
        if pos < len(names) and names[pos]:
            assert names[pos] in consts, f"parameter input {key} must be an initializer"
            attrs[key] = consts[names[pos]].tolist()
            names[pos] = ""
    while names and not names[-1]:
        names.pop()
    values = {**feeds, **consts}
    ins = [values[n] if n else None for n in names]
    spec = NodeSpec(node.op_type, node.name or node.op_type, attrs,
                    [TensorSpec(tuple(x.shape), x.dtype) if x is not None else None for x in ins],
                    [TensorSpec(tuple(w.shape), w.dtype) for w in want],
                    [consts.get(n) if n else None for n in names],
                    model.opset_import[0].version)
    kernel = KERNELS[node.op_type](spec)
    outs = [np.empty(w.shape, w.dtype) for w in want]
    scratch = [np.empty(n, np.uint8) for n in kernel.scratch]
    kernel.bind(ins, outs, scratch)()
    return outs


def bind(op: str, ins: list[np.ndarray], outs: list[np.ndarray], attrs: dict[str, Any] | None = None,
         consts: list[Any] | None = None, opset: int = 17):
    """The registered kernel's launch, bound to these arrays (outs may be inputs: in-place runs)."""
    from ctxrt.backends.cpu.registry import KERNELS
    from ctxrt.backends.kernel import NodeSpec, TensorSpec

    spec = NodeSpec(op, op, attrs or {}, [TensorSpec(x.shape, x.dtype) if x is not None else None for x in ins],
                    [TensorSpec(y.shape, y.dtype) for y in outs], consts or [None] * len(ins), opset)
    kernel = KERNELS[op](spec)
    return kernel.bind(ins, outs, [np.empty(n, np.uint8) for n in kernel.scratch])


def write(be: Any, tensor: Any, array: np.ndarray) -> None:
    """Host array -> a backend's tensor (a memory handle's view, a view of a shared buffer)."""
    be.copy_in(tensor, np.asarray(array))


def read(be: Any, tensor: Any) -> np.ndarray:
    """A backend's tensor -> a new host array."""
    out = np.empty(tensor.shape, tensor.dtype)
    be.copy_out(out, tensor)
    return out


def allocated(launch) -> int:
    """Peak bytes NumPy and Python allocate over 3 launches, with the CPU backend's ufunc buffer size."""
    import tracemalloc

    from ctxrt.backends.cpu.backend import _UFUNC_BUFSIZE

    old = np.setbufsize(_UFUNC_BUFSIZE)
    try:
        launch()
        tracemalloc.start()
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(3):
            launch()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        np.setbufsize(old)
    return peak - before


# NumPy's ufunc iterator takes small fixed-size buffers for strided or broadcast operands (the CPU backend
# sets them to 1024 elements); nothing that scales with a tensor may be allocated during a run.
ITERATOR_BUFFER = 16384


def _fill_free_lists() -> None:
    """Fill CPython's free lists of lists, dicts, small dicts' string-keyed key tables (a call's keyword arguments:
    NumPy's `take` leaves one of 120 bytes) and small tuples (80 to 2,000 each in 3.11), made before tracing
    starts. A list freed while its free list has room stays there, still traced as allocated, and the next list
    comes from there untraced: how full the lists were when tracing started (which depends on what the process
    did before, e.g. how many objects its kernels keep, or how many of a run's launches are Python calls) moved a
    run's traced peak by ~2 KB and its growth by ~4 KB."""
    held = [([None], {None: None}, {"": None}, *((None,) * k for k in range(1, 20))) for _ in range(2000)]
    del held


def steady_state_allocation(run, settle: int = 10, measure: int = 50, tries: int = 1) -> tuple[int, int]:
    """(peak bytes allocated above the start, bytes retained growth) over repeated calls of `run`.

    With `tries` > 1 the least of each over that many measurements: an allocation every run makes shows in
    each of them, a one-time one (a registry's dict growing once in a worker that ran other tests first, as
    seen once in CI: +1.1 KB peak) in one only.

    Growth compares `settle` runs with `settle + measure`, so allocator free-list noise is not counted; and
    CPython's object free lists are filled first (`_fill_free_lists`), so what they hold is not counted either.
    The cycle collector is off meanwhile: its full collections empty those free lists, which then refill with
    traced blocks (NumPy's `take` leaves a 120-byte object in one per call), so growth read 0-6 KB
    depending on when it last ran.

    The default thread count (measured from the cores other processes leave idle) is held at every usable core
    meanwhile, what it is on an idle machine: beside a busy core (another test process, pytest-xdist) it would
    change from run to run, and the first run at a new count makes oneDNN primitive variants for it (by design),
    inside the measured runs; and two measurements a test compares would be made at different counts."""
    from ctxrt.backends.cpu import threads

    monitor = threads.monitor()
    cores = monitor.cores
    monitor.available = lambda: cores  # type: ignore[method-assign]  # the instance's, over the class's method
    try:
        found = [_measure(run, settle, measure) for _ in range(tries)]
        return min(p for p, _ in found), min(g for _, g in found)
    finally:
        del monitor.available


def _measure(run, settle: int, measure: int) -> tuple[int, int]:
    import gc
    import tracemalloc

    run()
    enabled = gc.isenabled()
    gc.disable()
    _fill_free_lists()
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        for _ in range(settle):
            run()
        middle, _ = tracemalloc.get_traced_memory()
        for _ in range(measure):
            run()
        after, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        if enabled:
            gc.enable()
    return peak - before, after - middle


def run_in_threads(work, n: int) -> None:
    """Call work(k) for k in range(n), each in its own thread; re-raise the first failure in the caller."""
    import threading

    errors: list[BaseException] = []

    def guarded(k: int) -> None:
        try:
            work(k)
        except BaseException as e:  # noqa: BLE001 - re-raised below, in the test's thread
            errors.append(e)

    threads = [threading.Thread(target=guarded, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


@contextlib.contextmanager
def native_avx512(allowed: bool):
    """Inside the block csrc/gemv.c's many-rows GEMM and csrc/dwconv.c run their AVX-512 kernels (allowed) or their
    AVX2 / portable ones (as on a CPU without AVX-512)."""
    from ctxrt.backends.cpu import native

    native.library().ctxrt_gemm_avx512(int(allowed))
    try:
        yield
    finally:
        native.library().ctxrt_gemm_avx512(1)


def spy(monkeypatch: Any, owner: Any, name: str, record: Any = None) -> list[Any]:
    """Replace `owner.name` (a module's function) by one that calls it and appends `record(*args)` (default: the
    first argument) to the returned list, for the test's counters."""
    real = getattr(owner, name)
    seen: list[Any] = []

    def call(*args: Any, **kwargs: Any) -> Any:
        seen.append(record(*args) if record is not None else args[0] if args else None)
        return real(*args, **kwargs)
    monkeypatch.setattr(owner, name, call)
    return seen


def count_sgemm(monkeypatch: Any) -> list[int]:
    """From now on, every call of a oneDNN GEMM made by `api.sgemm` (a NumPy kernel's large GEMM on OpenMP's
    threads) appends to the returned list."""
    from ctxrt.backends.cpu.onednn import api

    ran: list[int] = []
    real = api.sgemm

    def counting(a: Any, b: Any, out: Any) -> Any:
        call = real(a, b, out)
        if call is None:
            return None

        def counted() -> None:
            ran.append(1)
            call()
        return counted
    monkeypatch.setattr(api, "sgemm", counting)
    return ran
