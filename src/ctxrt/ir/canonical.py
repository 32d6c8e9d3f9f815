"""Canonical node forms: constant "parameter" inputs that the frontend moves into attributes.

ONNX moved many attributes to inputs across opsets (Slice in 10, Squeeze/Unsqueeze/Split in 13,
ReduceX in 13/18, ...). Kernels see one form: the attribute. Keys are input positions.
"""

PARAM_INPUTS: dict[str, dict[int, str]] = {
    "Slice": {1: "starts", 2: "ends", 3: "axes", 4: "steps"},
    "Squeeze": {1: "axes"},
    "Unsqueeze": {1: "axes"},
    "Split": {1: "split"},
    "ReduceMean": {1: "axes"},
    "ReduceSum": {1: "axes"},
    "ReduceMax": {1: "axes"},
    "ReduceMin": {1: "axes"},
    "Reshape": {1: "shape"},
    "Expand": {1: "shape"},
    "Pad": {1: "pads", 2: "constant_value", 3: "axes"},
    "Clip": {1: "min", 2: "max"},
    "Tile": {1: "repeats"},
}

# Inputs that decide an output's shape but stay inputs (their kernels read them as constants): like the
# parameter inputs above, they must be known at compile time, so a graph input reaching one is a value input.
SHAPE_INPUTS: dict[str, set[int]] = {
    "Range": {0, 1, 2},
    "ConstantOfShape": {0},
    "TopK": {1},
    "OneHot": {1},
    "Resize": {2, 3},
    "Upsample": {1},
    "NonMaxSuppression": {2},
}

# Inputs that choose a branch or a trip count. Control flow can decide them at run time, so only small
# integer or boolean graph inputs reaching them are treated as value inputs (as TensorRT's shape tensors).
BRANCH_INPUTS: dict[str, set[int]] = {"If": {0}, "Loop": {0, 1}}
