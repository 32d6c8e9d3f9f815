"""onnx's own backend node cases (tests/ops/onnx/onnx_nodes.py makes them from onnx's generators) of the ops issue 22
fixed: TopK (ties to the lower index, 1-D inputs), SpaceToDepth/DepthToSpace (CRD mode), AveragePool (a last
ceil_mode window starting in the end padding, also at opset 19, where onnx shape inference counts it; MaxPool's
and LpPool's ceil_mode cases with it), If returning constants, Scan (opset 8's batch form too) and Reshape
(allowzero, 0 dims). Each case runs through an InferenceSession on each backend against onnx's expected outputs
(rtol 1e-3, atol 1e-7, as onnx's backend runner)."""

from __future__ import annotations

import dataclasses

import harness
import onnx
import pytest
from onnx_nodes import cases, run_case

MODULES = ("topk", "spacetodepth", "depthtospace", "averagepool", "if_", "scan", "reshape")
# Sequence and Optional values (SequenceConstruct, Optional) are not ctxrt types (docs/operators-sequence.md).
NOT_TENSORS = {"test_if_seq", "test_if_opt"}
# The cases that failed before issue 22 (a regression here is a regression of that issue).
FIXED = {"test_top_k_same_values", "test_top_k_same_values_largest", "test_spacetodepth_crd_mode_example",
         "test_if", "test_scan_sum", "test_reshape_allowzero_reordered"}
# Pools with ceil_mode=1, also run with their model's opset set to 19 (the attributes are the same there).
POOL_MODULES = ("averagepool", "maxpool", "lppool")
OPSET19 = "@opset19"

_ALL = cases(*MODULES, *POOL_MODULES)
_NAMES = sorted(n for n in cases(*MODULES) if n not in NOT_TENSORS)


def _ceil_mode(case) -> bool:
    has = {a.name: onnx.helper.get_attribute_value(a) for a in case.model.graph.node[0].attribute}
    return bool(has.get("ceil_mode"))


_POOLS19 = sorted(n + OPSET19 for n, c in cases(*POOL_MODULES).items() if _ceil_mode(c))


def _at_opset19(case):
    model = onnx.ModelProto()
    model.CopyFrom(case.model)
    model.opset_import[0].version = 19
    return dataclasses.replace(case, model=model, name=case.name + OPSET19)


def test_the_cases_are_there() -> None:
    """The selection is not empty by accident (e.g. a renamed generator module or case)."""
    assert set(_NAMES) >= FIXED
    assert {"test_averagepool_2d_ceil_last_window_starts_on_pad" + OPSET19,
            "test_maxpool_2d_ceil_output_size_reduce_by_one" + OPSET19} <= set(_POOLS19)


@pytest.mark.parametrize("name", _NAMES + _POOLS19)
def test_onnx_node_case(name: str) -> None:
    if name.endswith(OPSET19):
        run_case(_at_opset19(_ALL[name.removesuffix(OPSET19)]), harness.BACKEND)
    else:
        run_case(_ALL[name], harness.BACKEND)
