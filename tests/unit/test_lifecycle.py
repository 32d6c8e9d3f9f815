"""Context lifecycle rules (DESIGN.md §5): deferred init, registered buffers, finalize, free; on every backend."""

import numpy as np
import pytest
from harness import read, write
from onnx import TensorProto, helper, numpy_helper

import ctxrt
from ctxrt.backends import get_backend
from ctxrt.errors import LifecycleError, RegistrationError


def _model():
    w = numpy_helper.from_array(np.arange(1, 65, dtype=np.float32).reshape(8, 8), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "w"], ["y"])]
    g = helper.make_graph(nodes, "t", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


X = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
W = np.arange(1, 65, dtype=np.float32).reshape(8, 8)
WANT = np.maximum(X @ W, 0) @ W


@pytest.fixture
def deferred(backend):
    ctx = ctxrt.compile(_model(), defer_graph_init=True, backend=backend)
    yield ctx
    ctx.free()


def test_properties_before_finalize(deferred) -> None:
    p = deferred.properties
    assert p["weights_buffer_size"] == 8 * 8 * 4
    assert p["max_spillfill_buffer_size"] == deferred.graph().spillfill_size > 0
    assert p["buffer_start_alignment"] == deferred.backend.alignment >= 64


def test_execute_before_finalize_is_refused(deferred) -> None:
    with pytest.raises(LifecycleError, match="not finalized"):
        deferred.graph().run({"x": X})


def test_registered_buffers_are_used_and_weights_copied(deferred) -> None:
    be = deferred.backend
    align = be.alignment
    wbuf = be.alloc_shared(4096, 64)
    sbuf = be.alloc_shared(deferred.properties["max_spillfill_buffer_size"] + 2 * align, 64)
    deferred.register_weights_buffer(wbuf, offset=align)
    deferred.register_spillfill_buffer(sbuf, offset=2 * align)
    deferred.finalize()
    np.testing.assert_allclose(deferred.graph().run({"x": X})["y"], WANT, rtol=1e-5)
    assert deferred.stats["weights_copied_bytes"] == 256
    assert "alloc_spillfill_bytes" not in deferred.stats and "alloc_weights_bytes" not in deferred.stats
    stored = be.view(wbuf, align, (8, 8), np.float32)
    np.testing.assert_array_equal(read(be, stored), W.T)  # stored [N, K]
    write(be, stored, np.zeros((8, 8), np.float32))  # the graph reads its weights from the registered buffer
    np.testing.assert_array_equal(deferred.graph().run({"x": X})["y"], np.zeros((4, 8), np.float32))


def test_without_defer_weights_are_used_in_place_or_uploaded_once(backend) -> None:
    ctx = ctxrt.compile(_model(), backend=backend)
    assert ctx.stats["weights_copied_bytes"] == 0
    if ctx.stats["alloc_weights_bytes"] == 0:  # cpu: the mapped weights section itself, read-only
        assert not next(iter(ctx.weights.values())).flags.writeable
    else:  # a device: one buffer of its own, uploaded once at finalize
        assert ctx.stats["alloc_weights_bytes"] == ctx.stats["weights_uploaded_bytes"] == 256
    for _ in range(3):
        np.testing.assert_allclose(ctx.graph().run({"x": X})["y"], WANT, rtol=1e-5)
    assert ctx.stats["weights_uploaded_bytes"] in (0, 256)
    ctx.free()


@pytest.mark.parametrize("role", ["weights", "spillfill"])
def test_small_or_misaligned_buffers_are_refused(deferred, role) -> None:
    be = deferred.backend
    register = getattr(deferred, f"register_{role}_buffer")
    need = deferred.properties["weights_buffer_size" if role == "weights" else "max_spillfill_buffer_size"]
    with pytest.raises(RegistrationError, match="too small"):
        register(be.alloc_shared(need - 1, 64))
    with pytest.raises(RegistrationError, match="too small"):
        register(be.alloc_shared(need, 64), offset=be.alignment)
    with pytest.raises(RegistrationError, match="not aligned"):
        register(be.alloc_shared(need + 64, 64), offset=4)


def test_one_weights_buffer_for_two_contexts_is_refused(deferred, backend) -> None:
    other = ctxrt.compile(_model(), defer_graph_init=True, backend=backend)
    buf = get_backend(backend).alloc_shared(4096, 64)
    deferred.register_weights_buffer(buf)
    with pytest.raises(RegistrationError, match="another context"):
        other.register_weights_buffer(buf)
    other.free()


def test_registration_after_finalize_and_deregistration_rules(deferred) -> None:
    be = deferred.backend
    buf = be.alloc_shared(4096, 64)
    deferred.register_spillfill_buffer(buf)
    deferred.deregister_buffer("spillfill")  # fine before finalize
    deferred.register_spillfill_buffer(buf)
    deferred.finalize()
    with pytest.raises(LifecycleError, match="after finalize"):
        deferred.deregister_buffer("spillfill")
    with pytest.raises(LifecycleError, match="before finalize"):
        deferred.register_weights_buffer(be.alloc_shared(4096, 64))
    with pytest.raises(LifecycleError, match="already finalized"):
        deferred.finalize()


def test_free_deregisters_and_graphs_refuse_to_run(deferred, backend) -> None:
    buf = deferred.backend.alloc_shared(4096, 64)
    deferred.register_weights_buffer(buf)
    deferred.finalize()
    g = deferred.graph()
    deferred.free()
    with pytest.raises(LifecycleError, match="freed"):
        g.run({"x": X})
    with pytest.raises(LifecycleError, match="freed"):
        deferred.graph()
    other = ctxrt.compile(_model(), defer_graph_init=True, backend=backend)
    other.register_weights_buffer(buf)  # free() released the registration
    other.free()


def test_kernel_byte_count_reads_no_attribute_of_what_it_skips() -> None:
    """`alloc_kernel_bytes` walks what kernels and launches hold (backends/kernel.py, held_constants_bytes): arrays
    they made are counted once, weights (read-only) never, and modules are not walked: their globals are no
    kernel's, and one may hold an object whose every attribute lookup warns (torch.distributed's deprecated
    `reduce_op`, reached through modules once torch was imported: a count at a context's load put two
    FutureWarnings into an OpenCL test's one expected warning)."""
    import functools
    import types
    import warnings

    from ctxrt.backends.kernel import held_constants_bytes

    class Loud:
        def __getattribute__(self, key):
            warnings.warn("an attribute was looked up", FutureWarning, stacklevel=2)
            return object.__getattribute__(self, key)

    mod = types.ModuleType("holder")
    mod.loud, mod.array = Loud(), np.ones(1000, np.float32)  # reachable through the module only
    own, weight = np.zeros(256, np.float32), np.ones(64, np.float32)
    weight.flags.writeable = False
    run = functools.partial(lambda *a: None, own, own[:10], weight, mod)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert held_constants_bytes([run]) == own.nbytes


@pytest.mark.parametrize("dims", [[4, 8], ["n", 8]], ids=["fixed", "range-program"])
def test_a_session_its_user_drops_frees_its_contexts_without_a_garbage_collection(dims) -> None:
    """As onnxruntime's: `del sess` (no close) frees the session and its contexts' arenas at once; its cached
    tensors, variants and tensor cache refer to it weakly (no reference cycle waits for the collector)."""
    import gc
    import weakref

    model = _model()
    if dims[0] == "n":  # a symbolic batch: InferenceSession compiles a range program
        model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "n"
    gc.disable()
    try:
        sess = ctxrt.InferenceSession(model.SerializeToString())
        (y,) = sess.run(None, {"x": X})
        b = sess.io_binding()
        b.bind_input("x", X)
        b.bind_output("y")
        sess.run_with_iobinding(b)  # (session tensors from its cache)
        np.testing.assert_allclose(b.copy_outputs_to_cpu()[0], WANT, rtol=1e-6)
        del b
        np.testing.assert_allclose(y, WANT, rtol=1e-6)
        ctxs = [c for v in sess._variants.values() for c in v.contexts]
        assert ctxs and all(c.arena is not None for c in ctxs)
        alive = weakref.ref(sess)
        del sess
        assert alive() is None
        assert all(c.arena is None for c in ctxs)  # freed by the session's close, not left to the collector
    finally:
        gc.enable()
