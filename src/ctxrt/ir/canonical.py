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
    # Resize-10's input 1 is its scales: its kernel reads them under "roi" (the key is per position, not opset).
    "Resize": {1: "roi", 2: "scales", 3: "sizes"},
    "Upsample": {1: "scales"},
}
