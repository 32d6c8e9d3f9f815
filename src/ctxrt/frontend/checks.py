"""Checks before any work: onnx.checker's verdict, and every operator the backend lacks, listed at once."""

from __future__ import annotations

from collections.abc import Iterable

import onnx

from ctxrt.errors import ModelError, UnsupportedOpError
from ctxrt.frontend import contrib
from ctxrt.frontend.control import all_nodes


def check_model(proto: onnx.ModelProto, unchecked: Iterable[str] = ()) -> None:
    """onnx.checker's verdict (e.g. an attribute the model's opset does not have) as a ModelError.

    The checker runs on a copy whose initializers are empty stubs (it serializes what it checks: a 500 MB
    model took 6 s). Like onnxruntime, graph inputs and outputs declared without an element type or a shape
    are accepted (the checker wants both on the main graph), and an IR-3 model's initializers need not be graph
    inputs. `unchecked`: default-domain ops onnx does not define but onnxruntime does (SimplifiedLayerNormalization),
    which the checker would refuse."""
    g = proto.graph
    light = onnx.GraphProto(name=g.name, node=g.node, input=g.input, output=g.output, value_info=g.value_info,
                            sparse_initializer=g.sparse_initializer)
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 0)
    unchecked = set(unchecked)
    for node in all_nodes(light):  # deprecated ops (GroupNormalization-18, ...) still run, as in onnxruntime
        if node.domain in ("", "ai.onnx") and (node.op_type in unchecked or _deprecated(node.op_type, opset)):
            node.domain = _UNCHECKED
    light.initializer.extend(onnx.TensorProto(name=t.name, data_type=t.data_type, dims=[0]) for t in g.initializer)
    for vi in list(light.input) + list(light.output):
        tt = vi.type.tensor_type
        if vi.type.WhichOneof("value") in (None, "tensor_type"):
            tt.elem_type = tt.elem_type
            tt.shape.SetInParent()
    # IR 3 wants every initializer listed as a graph input; onnxruntime runs IR-3 models whose added initializers
    # are not (onnxruntime.quantization's zero points and scales in an old model), so they are checked as IR 4
    model = onnx.ModelProto(ir_version=max(proto.ir_version, 4), opset_import=proto.opset_import, graph=light,
                            functions=proto.functions)
    model.opset_import.add(domain=_UNCHECKED, version=1)
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as e:
        detail = " ".join(line.strip() for line in str(e).splitlines() if line.strip())
        raise ModelError(f"onnx.checker rejects the model: {detail}") from e


_UNCHECKED = "ctxrt.unchecked"  # a domain the checker does not know: it skips nodes in it


def _deprecated(op: str, opset: int) -> bool:
    try:
        return bool(onnx.defs.get_schema(op, opset, "").deprecated)
    except onnx.defs.SchemaError:  # unknown ops are reported by check_supported
        return False


def op_key(node: onnx.NodeProto) -> str:
    """The op's name in kernel tables and the IR: its type in the default domain (and for the com.microsoft
    quantized ops of contrib.py, which quantize a default-domain op), else "domain.type"
    ("com.microsoft.GroupQueryAttention"): an op of another domain runs only where a kernel table admits it."""
    if node.domain in ("", "ai.onnx") or contrib.accepted(node):
        return node.op_type
    return f"{node.domain}.{node.op_type}"


def check_supported(nodes: Iterable[onnx.NodeProto], supported: set[str], extra: set[str]) -> None:
    """Every op the backend lacks, listed at once. Ops of the default domain, and the com.microsoft ops ctxrt
    implements (frontend/contrib.py); every other domain is unsupported."""
    bad: dict[str, list[str]] = {}
    for node in nodes:
        key = op_key(node)
        if key not in supported | extra:
            bad.setdefault(key, []).append(node.name or "<unnamed>")
    if bad:
        listing = "; ".join(f"{op} ({', '.join(names[:5])}{', ...' if len(names) > 5 else ''})"
                            for op, names in sorted(bad.items()))
        raise UnsupportedOpError(f"unsupported operators: {listing}")
