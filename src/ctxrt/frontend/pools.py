"""Pool (and ConvTranspose) output shapes onnx shape inference gets wrong: with ceil_mode=1, a last window that starts
in the end padding is counted before opset 22 (the spec and onnxruntime drop it at every opset), and a window larger
than the padded input makes one output (none in the spec and onnxruntime). The frontend types such a pool's outputs
itself (`Folder.annotate`) and its readers from them (`Folder.skeleton`)."""

from __future__ import annotations

import onnx
from onnx import helper

POOLS = {"MaxPool", "AveragePool", "LpPool"}
DECIDED = POOLS | {"ConvTranspose"}  # ops whose output shape the frontend may decide itself (typed by it)


def conv_transpose_shape(node: onnx.NodeProto, x: tuple[int, ...] | None, w: tuple[int, ...] | None
                         ) -> tuple[int, ...] | None:
    """A ConvTranspose's output shape when it names one (`output_shape`: its spatial sizes), which onnx's shape
    inference gets wrong at some input sizes (an axis dropped: [1, 2, 10] for an 8 x 9 input and output_shape
    [10, 8]); None otherwise (inference is right)."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    out = attrs.get("output_shape")
    if not out or x is None or w is None or len(x) < 3 or len(w) != len(x):
        return None
    nd = len(x) - 2
    if len(out) < nd:
        return None
    return (x[0], w[1] * int(attrs.get("group", 1)), *(int(d) for d in list(out)[-nd:]))


def ceil_pool_shape(node: onnx.NodeProto, shape: tuple[int, ...]) -> tuple[int, ...] | None:
    """The output shape of a pool with ceil_mode=1 whose last window along some axis would start in the end
    padding: the ONNX spec and onnxruntime drop that window, onnx shape inference counts it before opset 22; or
    whose window is larger than the padded input along some axis: no output there (inference says 1). None for any
    other pool (inference is right)."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    nd = len(shape) - 2
    if not attrs.get("ceil_mode") or attrs.get("auto_pad", b"NOTSET") != b"NOTSET" or nd < 1:
        return None
    k, st = list(attrs.get("kernel_shape", [])), list(attrs.get("strides", [1] * nd))
    dil, pads = list(attrs.get("dilations", [1] * nd)), list(attrs.get("pads", [0] * 2 * nd))
    if not len(k) == len(st) == len(dil) == nd or len(pads) != 2 * nd or min(st) < 1:
        return None  # the kernel names what is wrong
    out, dropped = [], False
    for a, i in enumerate(shape[2:]):
        o = -(-(i + pads[a] + pads[a + nd] - (k[a] - 1) * dil[a] - 1) // st[a]) + 1
        if o > 1 and (o - 1) * st[a] >= i + pads[a]:
            o, dropped = o - 1, True
        elif o < 1:  # a window larger than the padded input: no output (onnx's inference says 1)
            o, dropped = 0, True
        out.append(o)
    return (*shape[:2], *out) if dropped else None
