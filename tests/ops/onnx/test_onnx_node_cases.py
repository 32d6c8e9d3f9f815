"""onnx's own backend node cases (tests/ops/onnx/onnx_nodes.py) for what ctxrt must run at any input value: tensors
with a 0 dim, inputs read at run time (Clip's bounds, Pad's constant value, NonMaxSuppression's thresholds) and inputs
that decide a shape, baked in from the feeds as value inputs (OneHot's depth, Range's limits, Resize/Upsample
scales and sizes, the Reduce* axes). Each case runs through an InferenceSession on each backend and is compared
with the outputs onnx stores with it."""

from __future__ import annotations

import harness
import pytest
from onnx_nodes import cases, run_case, zero_size

# Generator modules of onnx.backend.test.case.node: every case of these ...
INPUT_MODULES = ("clip", "onehot", "rangeop", "resize", "upsample", "reducemean", "reducesum", "reducemax",
                 "reducemin", "reduceprod", "reducel1", "reducel2", "reduce_log_sum", "reduce_log_sum_exp",
                 "reducesumsquare", "nonmaxsuppression", "pad", "where", "trilu", "topk")
# ... and the cases of these with a 0 dim in an input or output.
ZERO_SIZE_MODULES = ("constantofshape", "reshape", "shape", "size", "slice", "split", "concat", "gather", "nonzero")

_BFLOAT16 = "bfloat16 Range: NumPy has no such dtype (ml_dtypes gives one) and ctxrt no Range kernel for it"
_ALIGN_CORNERS = ("onnx's expected output scales the coordinates by 1/scale; onnxruntime (and ctxrt) map the corners "
                  "of input and output onto each other ((in - 1) / (out - 1)), as align_corners says")
KNOWN: dict[str, str] = {
    "test_range_bfloat16_type_positive_delta": _BFLOAT16,
    "test_range_bfloat16_type_positive_delta_expanded": _BFLOAT16,
    "test_resize_downsample_scales_cubic_align_corners": _ALIGN_CORNERS,
    "test_resize_downsample_scales_linear_align_corners": _ALIGN_CORNERS,
}

_ALL = cases(*INPUT_MODULES, *ZERO_SIZE_MODULES)
_CHOSEN = sorted(n for n in cases(*INPUT_MODULES)) + sorted(n for n, c in cases(*ZERO_SIZE_MODULES).items()
                                                             if zero_size(c))
ZERO_SIZE = sorted(n for n in _CHOSEN if zero_size(_ALL[n]))


def test_the_zero_size_cases_are_there() -> None:
    """The selection is not empty by accident (e.g. a renamed generator module)."""
    assert len(ZERO_SIZE) >= 30 and "test_split_zero_size_splits_opset18" in ZERO_SIZE
    assert {"test_clip", "test_onehot_with_axis", "test_range_float_type_positive_delta",
            "test_resize_upsample_scales_linear", "test_upsample_nearest",
            "test_reduce_mean_default_axes_keepdims_example"} <= set(_CHOSEN)


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.xfail(reason=KNOWN[n], strict=True))
                                  if n in KNOWN else n for n in _CHOSEN])
def test_onnx_node_case(name: str) -> None:
    run_case(_ALL[name], harness.BACKEND)
