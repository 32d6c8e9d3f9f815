"""Helpers of the quantized-op tests: models with com.microsoft nodes, onnxruntime as the oracle (onnx's shape
inference cannot type those nodes, so output types are given), integer comparisons to within a step."""

from __future__ import annotations

from typing import Any

import harness
import ml_dtypes
import numpy as np
import onnx
from onnx import helper, numpy_helper

MS = "com.microsoft"
INT4, UINT4 = np.dtype(ml_dtypes.int4), np.dtype(ml_dtypes.uint4)
RANGES: dict[Any, tuple[int, int]] = {np.uint8: (0, 255), np.int8: (-128, 127), np.uint16: (0, 65535),
                                      np.int16: (-32768, 32767), np.int32: (-(2**31), 2**31 - 1), INT4: (-8, 7),
                                      UINT4: (0, 15)}


def ints(dtype: Any, *shape: int, lo: int | None = None, hi: int | None = None) -> np.ndarray:
    """Random integers of `dtype` over its range (or [lo, hi])."""
    a, b = RANGES[np.dtype(dtype) if np.dtype(dtype) in (INT4, UINT4) else dtype]
    lo = a if lo is None else lo
    hi = b if hi is None else hi
    return harness.RNG.integers(lo, hi + 1, size=shape).astype(dtype)


def qmodel(nodes: onnx.NodeProto | list[onnx.NodeProto], feeds: dict[str, np.ndarray],
           inits: dict[str, Any] | None = None, opset: int = 21, outputs: list[str] | None = None) -> onnx.ModelProto:
    """A model of these nodes; a com.microsoft opset is imported when a node is in that domain."""
    nodes = [nodes] if isinstance(nodes, onnx.NodeProto) else list(nodes)
    inputs = [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
              for k, v in feeds.items()]
    outs = outputs or [o for o in nodes[-1].output if o]
    graph = helper.make_graph(nodes, "quant_test", inputs,
                              [helper.make_tensor_value_info(o, onnx.TensorProto.UNDEFINED, None) for o in outs],
                              initializer=[numpy_helper.from_array(np.asarray(v), k) for k, v in (inits or {}).items()])
    opsets = [helper.make_opsetid("", opset)]
    if any(n.domain == MS for n in nodes):
        opsets.append(helper.make_opsetid(MS, 1))
    return helper.make_model(graph, opset_imports=opsets, ir_version=10)


def ort_outputs(model: onnx.ModelProto, feeds: dict[str, np.ndarray], dtypes: list[Any],
                optimize: bool = True) -> list[np.ndarray]:
    """onnxruntime's outputs, the model's outputs typed `dtypes` first."""
    import onnxruntime as ort

    model = onnx.ModelProto.FromString(model.SerializeToString())
    for out, dt in zip(model.graph.output, dtypes, strict=True):
        out.type.tensor_type.elem_type = helper.np_dtype_to_tensor_dtype(np.dtype(dt))
    so = ort.SessionOptions()
    if not optimize:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)


def assert_ints(got: np.ndarray, want: np.ndarray, within: int = 0, rare: float = 1.0, name: str = "") -> None:
    """Same shape and dtype; every value within `within` of want's, and at most a fraction `rare` of them off."""
    assert got.shape == want.shape, f"{name}: shape {got.shape} != {want.shape}"
    assert got.dtype == want.dtype, f"{name}: dtype {got.dtype} != {want.dtype}"
    diff = np.abs(got.astype(np.int64) - want.astype(np.int64))
    assert diff.max(initial=0) <= within, f"{name}: off by up to {diff.max()} (allowed {within})"
    assert (diff > 0).mean() <= rare if diff.size else True, f"{name}: {(diff > 0).mean():.1%} of values differ"


def run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return harness.run_ctxrt(model, feeds)
