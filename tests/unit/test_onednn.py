"""oneDNN through its C API (backends/cpu/onednn/api.py): how a weights format is named, when a primitive is made."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import ctxrt
from ctxrt.backends.cpu.onednn import api

pytestmark = pytest.mark.skipif(not api.available(), reason="oneDNN is not installed")


def test_a_weights_format_is_named_by_its_blocking_and_the_name_gives_the_same_descriptor() -> None:
    """oneDNN's chosen weights format is stored by its tag name (api.Desc.tag_name): spelled from the descriptor's
    strides and inner blocks, one descriptor made to confirm it, instead of one per tag of the ~760 (60% of
    MobileNetV3's compile). Every tag of the library, at dims with and without ones (stride ties), gets a name
    whose descriptor equals it; the spelled name is found for most, the rest by the scan of the tags of its rank."""
    spelled = checked = 0
    for dims_of in (lambda n: [48] * n, lambda n: [16 * k + 24 for k in range(n)], lambda n: [1] + [32] * (n - 1),
                    lambda n: ([64, 1, 1] + [3] * n)[:n]):
        for name, value in api.tags().items():
            n = len({c.lower() for c in name if c.isalpha()})
            dims = dims_of(n)
            try:
                desc = api.Desc.make(dims, value)
            except api.CtxrtError:
                continue
            got = desc.tag_name(dims)
            assert got is not None and api.Desc.make(dims, got) == desc, (name, dims, got)
            checked += 1
            spelled += got in desc._spelled(n)
    assert checked > 2000 and spelled > 0.8 * checked
    plain = api.Desc.strided([2, 3], [1, 4])  # a layout no tag of rank 2 has: None
    assert plain.tag_name([2, 3]) is None or api.Desc.make([2, 3], plain.tag_name([2, 3])) == plain


def test_a_primitive_is_made_on_its_first_launch_only(monkeypatch) -> None:
    """oneDNN's primitive (its JIT code) is made when a kernel's launch is, not with its descriptor: the layout
    pass's questions and a range compile's probe programs (compared, then dropped) make none; the program that
    runs makes one per oneDNN step, and runs as onnx.reference does."""
    made = []
    real = api.Primitive.made

    def counting(self):
        if not self.handle:
            made.append(self.what)
        return real(self)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 8, 12, 12)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], "c1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["a"], ["b"]),
             helper.make_node("Conv", ["b", "w2"], ["y"], "c2", kernel_shape=[3, 3], strides=[2, 2])]
    w1, w2 = (rng.standard_normal(s).astype(np.float32) for s in ((16, 8, 3, 3), (16, 16, 3, 3)))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8, 12, 12])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    monkeypatch.setattr(api.Primitive, "made", counting)
    ctxrt.compile(model.SerializeToString(), {"x": x.shape})  # a static program: its two convs
    assert sorted(w for w in made if w.startswith("Conv")) == ["Conv 'c1'", "Conv 'c2'"]
    made.clear()
    ctx = ctxrt.compile(model.SerializeToString(), dims={"batch": (1, 4)})  # probes compiled, one program made
    assert len([w for w in made if w.startswith("Conv")]) <= 2  # (a range program's convs may be native: none)
    got = ctx.graph().run({"x": x})  # (at batch 2: its convs' primitives for that size, made now)
    want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    np.testing.assert_allclose(got["y"], want, rtol=1e-4, atol=1e-4)
