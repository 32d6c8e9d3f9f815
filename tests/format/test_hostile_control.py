"""Hostile context binaries, new fields: control-flow bodies (nested programs in step attributes), value inputs
and bounded outputs. Every malformed file raises FormatError; none crashes, recurses without bound or runs."""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable
from typing import Any

import msgpack
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from ctxrt.backends import get_backend
from ctxrt.compiler import compile_graphs, context_info
from ctxrt.errors import FormatError
from ctxrt.format import ContextFile, context_bytes
from ctxrt.runtime.loader import context_from_binary

META, PROGRAMS, WEIGHTS = 1, 2, 3
BODY = 3  # the extension code of a compiled body


def _model():
    """A run-time Loop (trip count from data) whose body holds an If, a value input and a NonZero output."""
    vi = helper.make_tensor_value_info
    add = helper.make_graph([helper.make_node("Add", ["acc", "x"], ["a"])], "add", [], [vi("a", T.FLOAT, [3])])
    sub = helper.make_graph([helper.make_node("Sub", ["acc", "w"], ["b"])], "sub", [], [vi("b", T.FLOAT, [3])])
    body = helper.make_graph(
        [helper.make_node("Mod", ["i", "two"], ["r"]), helper.make_node("Equal", ["r", "zero"], ["even"]),
         helper.make_node("If", ["even"], ["acc2"], then_branch=add, else_branch=sub),
         helper.make_node("Identity", ["cond"], ["c2"])],
        "body", [vi("i", T.INT64, []), vi("cond", T.BOOL, []), vi("acc", T.FLOAT, [3])],
        [vi("c2", T.BOOL, []), vi("acc2", T.FLOAT, [3])])
    nodes = [helper.make_node("ReduceMax", ["x"], ["mx"], keepdims=0), helper.make_node("Cast", ["mx"], ["M"], to=7),
             helper.make_node("Loop", ["M", "", "z"], ["y"], body=body, name="loop"),
             helper.make_node("Reshape", ["y", "shape"], ["ys"]), helper.make_node("NonZero", ["x"], ["nz"])]
    inits = {"z": np.zeros(3, np.float32), "two": np.int64(2), "zero": np.int64(0), "w": np.ones(3, np.float32)}
    g = helper.make_graph(nodes, "g", [vi("x", T.FLOAT, [3]), vi("shape", T.INT64, [2])],
                          [vi("ys", T.FLOAT, None), vi("nz", T.INT64, None)],
                          [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


BE = get_backend("cpu")
GRAPHS, WEIGHT_ARRAYS = compile_graphs([(_model(), None, "main", {"shape": [1, 3]})], BE)
VALID = context_bytes(GRAPHS, WEIGHT_ARRAYS, context_info(BE, ["m.onnx"]))


def _sections(data: bytes) -> dict[int, tuple[int, bytes]]:
    out = {}
    for i in range(3):
        kind, align, offset, length, _, _ = struct.unpack_from("<IIQQII", data, 64 + 32 * i)
        out[kind] = (align, data[offset:offset + length])
    return out


SECTIONS = _sections(VALID)


def assemble(meta: bytes | None = None, programs: bytes | None = None) -> bytes:
    """The file rebuilt as the writer lays it out, with some sections replaced (checksums recomputed)."""
    bodies = {META: meta, PROGRAMS: programs, WEIGHTS: None}
    pos, entries, chunks = 160, [], []
    for kind in (META, PROGRAMS, WEIGHTS):
        align, body = SECTIONS[kind]
        body = body if bodies[kind] is None else bodies[kind]
        offset = -(-pos // align) * align
        chunks.append(bytes(offset - pos) + body)
        entries.append(struct.pack("<IIQQII", kind, align, offset, len(body), zlib.crc32(body), 0))
        pos = offset + len(body)
    head = struct.pack("<8sIIIIQQI16s", b"CTXRTBIN", 1, 64, 3, 32, 64, pos, 0, bytes(16))
    table = b"".join(entries)
    return head + struct.pack("<I", zlib.crc32(head + table)) + table + b"".join(chunks)


def _loop_step(programs: list[Any]) -> dict[str, Any]:
    return next(s for s in programs[0]["steps"] if s["op"] == "Loop")


def _edit_body(edit: Callable[[dict[str, Any]], None], inner: bool = False) -> bytes:
    """Decode the Loop's body (or the else branch of the If inside it), edit it, encode it back."""
    programs = msgpack.unpackb(SECTIONS[PROGRAMS][1], ext_hook=msgpack.ExtType)
    step = _loop_step(programs)
    body = msgpack.unpackb(step["attrs"]["body"].data, ext_hook=msgpack.ExtType)
    if inner:
        if_step = next(s for s in body["steps"] if s["op"] == "If")
        branch = msgpack.unpackb(if_step["attrs"]["else_branch"].data, ext_hook=msgpack.ExtType)
        edit(branch)
        if_step["attrs"]["else_branch"] = msgpack.ExtType(BODY, msgpack.packb(branch))
    else:
        edit(body)
    step["attrs"]["body"] = msgpack.ExtType(BODY, msgpack.packb(body))
    return assemble(programs=msgpack.packb(programs))


def _first_ref(body: dict[str, Any], space: str) -> list[Any]:
    return next(r for s in body["steps"] for r in s["inputs"] + s["outputs"] if r and r[0] == space)


def _nest(depth: int) -> msgpack.ExtType:
    """A body holding a step whose attribute is a body holding a step ... `depth` levels deep."""
    body = {"inputs": [], "outputs": [], "steps": [], "arena_size": 0, "alignment": 64}
    for _ in range(depth):
        step = {"op": "If", "name": "n", "attrs": {"then_branch": msgpack.ExtType(BODY, msgpack.packb(body))},
                "inputs": [], "outputs": [], "scratch": [], "algorithm": "default"}
        body = {**body, "steps": [step]}
    return msgpack.ExtType(BODY, msgpack.packb(body))


BAD_BODIES = {
    "payload not msgpack": lambda: _programs(lambda s: s["attrs"].__setitem__("body", msgpack.ExtType(BODY, b"\xc1"))),
    "payload a list": lambda: _programs(lambda s: s["attrs"].__setitem__("body", msgpack.ExtType(BODY, b"\x90"))),
    "arena over the scratch": lambda: _edit_body(lambda b: b.__setitem__("arena_size", 1 << 40)),
    "arena ref past the arena": lambda: _edit_body(lambda b: _first_ref(b, "arena").__setitem__(2, 1 << 20)),
    "input ref unknown": lambda: _edit_body(lambda b: _first_ref(b, "input").__setitem__(1, "nope")),
    "const not captured": lambda: _edit_body(lambda b: _first_ref(b, "const").__setitem__(1, "nope"), inner=True),
    "const bigger than captured": lambda: _edit_body(
        lambda b: _first_ref(b, "const").__setitem__(3, [1 << 20]), inner=True),
    "steps not a list": lambda: _edit_body(lambda b: b.__setitem__("steps", {})),
    "alignment": lambda: _edit_body(lambda b: b.__setitem__("alignment", 3)),
    "inputs duplicate": lambda: _edit_body(lambda b: b["inputs"].append(b["inputs"][0])),
    "nested too deep": lambda: _programs(lambda s: s["attrs"].__setitem__("body", _nest(40))),
    "captures longer than inputs": lambda: _programs(lambda s: s["attrs"].__setitem__("captures", ["a"] * 99)),
    "body in a list attribute": lambda: _programs(lambda s: s["attrs"].__setitem__("bounded", [_nest(1)])),
}


def _programs(edit_step: Callable[[dict[str, Any]], None]) -> bytes:
    programs = msgpack.unpackb(SECTIONS[PROGRAMS][1], ext_hook=msgpack.ExtType)
    edit_step(_loop_step(programs))
    return assemble(programs=msgpack.packb(programs))


def test_the_rebuilt_valid_file_runs() -> None:
    ctx = context_from_binary(assemble())
    feeds = {"x": np.array([0.0, 3.0, 1.5], np.float32), "shape": np.array([1, 3], np.int64)}
    out = ctx.graph().run(feeds)
    want = ort.InferenceSession(_model().SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    np.testing.assert_allclose(out["ys"], want[0])
    np.testing.assert_array_equal(out["nz"], want[1])
    ctx.free()


@pytest.mark.parametrize("case", sorted(BAD_BODIES))
def test_malformed_bodies_are_refused(case: str) -> None:
    with ContextFile.open(BAD_BODIES[case]()) as cf, pytest.raises(FormatError, match="PROGRAMS"):
        cf.graphs()


def test_a_body_that_does_not_fit_its_node_is_refused_at_load() -> None:
    """Schema-valid but inconsistent with the step: the Loop kernel refuses it (FormatError, not a crash)."""
    def retype(b: dict[str, Any]) -> None:
        b["outputs"][1]["shape"] = [4]

    with pytest.raises(FormatError, match="Loop node 'loop' body"):
        context_from_binary(_edit_body(retype))


def _meta(edit: Callable[[dict[str, Any]], None]) -> bytes:
    meta = msgpack.unpackb(SECTIONS[META][1])
    edit(meta["graphs"][0])
    return assemble(meta=msgpack.packb(meta))


BAD_META = {
    "value of an unknown input": lambda g: g["value_inputs"].__setitem__("nope", [1]),
    "value count": lambda g: g["value_inputs"].__setitem__("shape", [1, 2, 3]),
    "value type": lambda g: g["value_inputs"].__setitem__("shape", ["1", "3"]),
    "value bool for int": lambda g: g["value_inputs"].__setitem__("shape", [True, 3]),
    "value too big": lambda g: g["value_inputs"].__setitem__("shape", [1 << 63, 3]),
    "value_inputs a list": lambda g: g.__setitem__("value_inputs", [1]),
    "bounded unknown output": lambda g: g["bounded_outputs"].__setitem__("nope", 0),
    "bounded axis": lambda g: g["bounded_outputs"].__setitem__("nz", 2),
}


@pytest.mark.parametrize("case", sorted(BAD_META))
def test_malformed_value_inputs_and_bounds_are_refused(case: str) -> None:
    with pytest.raises(FormatError, match="META"):
        ContextFile.open(_meta(BAD_META[case]))


@pytest.mark.parametrize("case", ["missing", "not int64", "not scalar", "extra"])
def test_extents_must_match_the_bounded_outputs(case: str) -> None:
    programs = msgpack.unpackb(SECTIONS[PROGRAMS][1], ext_hook=msgpack.ExtType)
    extents = programs[0]["extents"]
    if case == "missing":
        extents.clear()
    elif case == "not int64":
        extents["nz"][4] = "<f8"
    elif case == "not scalar":
        extents["nz"][3] = [1]
    else:
        extents["ys"] = extents["nz"]
    with ContextFile.open(assemble(programs=msgpack.packb(programs))) as cf, pytest.raises(FormatError,
                                                                                          match="extents"):
        cf.graphs()
