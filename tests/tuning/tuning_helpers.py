"""Helpers of the tuning and server tests: tiny models (PoCL builds are slow: few kernels, small budgets) and a device
description for cache tests that need no device."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

# A made-up device tier: cache tests run without OpenCL.
DEVICE = {"backend": "opencl", "vendor": "Acme Corp.", "device": "Acme(R) GPU 9000", "driver": "1.2 (build 7)",
          "tier": "acme/acme-gpu-9000/1.2-build-7", "ctxrt": "0.1.0"}


def mlp_model(path: Path, k: int = 16, n: int = 32, seed: int = 0) -> Path:
    """x[8, k] -> MatMul W[k, n] -> Add b -> Relu -> y: three tunable OpenCL kernels (b is [1, n], not the [n]
    bias the OpenCL backend folds into the GEMM's epilogue)."""
    rng = np.random.default_rng(seed)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
             helper.make_node("Add", ["h", "b"], ["a"], name="add"),
             helper.make_node("Relu", ["a"], ["y"], name="relu")]
    g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, k])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, n])],
                          [numpy_helper.from_array(rng.standard_normal((k, n)).astype(np.float32), "w"),
                           numpy_helper.from_array(rng.standard_normal((1, n)).astype(np.float32), "b")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path


def entry(n: int) -> dict:
    """A performance-cache entry as the tuner writes one."""
    params = {"VW": 1 + n % 4, "WGS": 64}
    return {"signature": {"op": "Relu", "n": n}, "label": f"kernel {n}", "default": {"VW": 4, "WGS": 64},
            "default_time_s": 2e-6, "best": params, "best_time_s": 1e-6, "tried": [[params, 1e-6, None]],
            "complete": True, "note": ""}
