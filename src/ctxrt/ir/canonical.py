"""Canonical node forms: constant "parameter" inputs that the frontend moves into attributes, and the record of
which optional outputs a node has.

ONNX moved many attributes to inputs across opsets (Slice in 10, Squeeze/Unsqueeze/Split in 13,
ReduceX in 13/18, ...). Kernels see one form: the attribute. Keys are input positions.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

PARAM_INPUTS: dict[str, dict[int, str]] = {
    "Slice": {1: "starts", 2: "ends", 3: "axes", 4: "steps"},
    "Squeeze": {1: "axes"},
    "Unsqueeze": {1: "axes"},
    "Split": {1: "split"},
    **{f"Reduce{r}": {1: "axes"} for r in ("Mean", "Sum", "Max", "Min", "Prod", "L1", "L2", "LogSum", "LogSumExp",
                                            "SumSquare")},
    "Reshape": {1: "shape"},
    "Expand": {1: "shape"},
    "Pad": {1: "pads", 2: "constant_value", 3: "axes"},
    "Clip": {1: "min", 2: "max"},
    "Tile": {1: "repeats"},
    "TopK": {1: "k"},  # decides the output shape
    "CumSum": {1: "axis"},
    "CumProd": {1: "axis"},
    "OneHot": {1: "depth"},  # decides the output shape
    # Resize-10's input 1 is its scales: its kernel reads them under "roi" (the key is per position, not opset).
    "Resize": {1: "roi", 2: "scales", 3: "sizes"},
    "Upsample": {1: "scales"},
    "MaxUnpool": {2: "output_shape"},  # decides the output shape
    "Col2Im": {1: "image_shape", 2: "block_shape"},  # decide the output shape
    "CenterCropPad": {1: "shape"},  # decides the output shape
    "DFT": {1: "dft_length", 2: "axis"},  # decide the output shape (axis an input from opset 20)
    "STFT": {1: "frame_step", 3: "frame_length"},  # decide the output shape; the window (2) is data
}

# Parameter inputs that decide no shape (data, not structure): moved into attributes when they are constants,
# otherwise left as inputs that the kernel reads at run time. Never value inputs: a Clip(x, max(x) - 80) compiles
# once, whatever its bounds.
RUNTIME_PARAMS: dict[str, set[int]] = {"Clip": {1, 2}, "Pad": {2}}

# Ops whose outputs onnx's shape inference leaves untyped (GroupNormalization and MeanVarianceNormalization are
# functions without an inference function; BatchNormalization-9 types Y only): shape inference sees them as Identity
# nodes, output k <- input j.
INFER_AS_IDENTITY: dict[str, dict[int, int]] = {
    "GroupNormalization": {0: 0},
    "MeanVarianceNormalization": {0: 0},
    "BatchNormalization": {0: 0, 1: 3, 2: 4, 3: 3, 4: 4},
}

# Ops with optional outputs that may be missing before a present one (LSTM's Y_c without Y_h, LayerNormalization's
# InvStdDev without Mean). A kernel is given only the outputs that exist, so the canonical form records the slots:
# attribute OUTPUTS_PRESENT, one 0/1 per output position of the ONNX node.
OUTPUTS_PRESENT = "outputs_present"
SLOTTED_OUTPUTS = {"LSTM", "GRU", "RNN", "DynamicQuantizeLSTM", "LayerNormalization", "BatchNormalization",
                   "SimplifiedLayerNormalization", "com.microsoft.SkipLayerNormalization",
                   "com.microsoft.SkipSimplifiedLayerNormalization"}


def output_slots(attrs: Mapping[str, Any], count: int, slots: int) -> list[int | None]:
    """For each of `slots` output positions, the index of that output among the `count` present ones, or None.

    Without the attribute (a node built by hand), the present outputs are the first `count` slots."""
    present = list(attrs.get(OUTPUTS_PRESENT) or [1] * count)
    present = (present + [0] * slots)[:slots]
    index, k = [], 0
    for p in present:
        index.append(k if p else None)
        k += bool(p)
    return index


# Inputs that decide an output's shape but stay inputs (their kernels read them as constants): like the
# parameter inputs above, they must be known at compile time, so a graph input reaching one is a value input.
SHAPE_INPUTS: dict[str, set[int]] = {"Range": {0, 1, 2}, "ConstantOfShape": {0}, "NonMaxSuppression": {2}}

# Inputs that choose a branch or a trip count: a value input reaching one is baked in when a value is given (the
# If inlined, the Loop unrolled); otherwise control flow decides at run time.
BRANCH_INPUTS: dict[str, set[int]] = {"If": {0}, "Loop": {0, 1}}
