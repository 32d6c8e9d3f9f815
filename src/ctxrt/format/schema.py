"""What META and PROGRAMS hold once decoded: checked field by field, then turned into dataclasses.

The writer runs the same checks on what it is about to write, so it never produces a file that the
reader would refuse.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np

from ctxrt.compiler.program import ARENA, CONST, INPUT, OUTPUT, Body, CompiledGraph, Interval, Ref, Step, TensorInfo
from ctxrt.errors import FormatError
from ctxrt.format.codec import (
    EXT_BODY,
    as_dtype,
    as_int,
    as_list,
    as_map,
    as_pow2,
    as_shape,
    as_str,
    check_depth,
    decode,
    field,
    from_ext,
    nbytes,
    stored_nbytes,
)
from ctxrt.format.layout import EXTERNAL_VERSION, FORMAT_VERSION, WEIGHT_ALIGNMENT
from ctxrt.format.tuning import check_tuning, params

MEM_TYPES = ("raw", "memhandle")
SPACES = (ARENA, INPUT, OUTPUT, CONST)
MAX_BODY_DEPTH = 8  # control-flow bodies inside bodies
META_KEYS = ("format_version", "backend", "hardware", "producer", "source_models", "alignment", "tuning",
             "weights_size", "max_spillfill_size", "graphs", "weights")


# -- META ------------------------------------------------------------------------------------------

def check_meta(value: Any, weights_size: int, header_version: int = FORMAT_VERSION) -> dict[str, Any]:
    """Check decoded META against the schema, the actual WEIGHTS section length and the header's format version;
    return it."""
    m = as_map(value, "META")
    for key in META_KEYS:
        field(m, key, "META")
    version = as_int(m["format_version"], "META format_version")
    if version != header_version:
        raise FormatError(f"META format_version {version} does not match the header's {header_version}")
    for key in ("backend", "hardware", "producer"):
        as_str(m[key], f"META {key}")
    for i, s in enumerate(as_list(m["source_models"], "META source_models")):
        as_str(s, f"META source_models[{i}]")
    as_pow2(m["alignment"], "META alignment")
    check_depth(as_map(m["tuning"], "META tuning"), "META tuning")
    check_tuning(m["tuning"])
    if "device" in m:  # optional: files written before devices were recorded have none
        str_map(m["device"], "META device")
    if "generation" in m:  # optional: written by `compile --generate`
        for key, value in as_map(m["generation"], "META generation").items():
            if not isinstance(key, str) or not isinstance(value, bool):
                raise FormatError(f"META generation: {key!r} must name a bool, got {value!r}")
    if as_int(m["weights_size"], "META weights_size") != weights_size:
        raise FormatError(f"META weights_size {m['weights_size']} differs from the WEIGHTS section's "
                          f"length {weights_size}")
    for name, entry in as_map(m["weights"], "META weights").items():
        weight_entry(entry, f"META weights[{name!r}]", weights_size)
    if version >= EXTERNAL_VERSION:
        for name, entry in as_map(field(m, "external_weights", "META"), "META external_weights").items():
            external_entry(entry, f"META external_weights[{name!r}]")
            if name in m["weights"]:
                raise FormatError(f"META external_weights[{name!r}]: the name is also in META weights")
    elif "external_weights" in m:
        raise FormatError(f"META external_weights needs format version {EXTERNAL_VERSION}, the file is {version}")
    graphs = as_list(m["graphs"], "META graphs")
    if not graphs:
        raise FormatError("META graphs: a context needs at least one graph")
    names = [graph_meta(g, f"META graphs[{i}]")["name"] for i, g in enumerate(graphs)]
    if len(set(names)) != len(names):
        raise FormatError(f"META graphs: duplicate graph names in {names}")
    biggest = max(g["spillfill_size"] for g in graphs)
    if as_int(m["max_spillfill_size"], "META max_spillfill_size") != biggest:
        raise FormatError(f"META max_spillfill_size {m['max_spillfill_size']} is not the largest graph "
                          f"spill-fill size {biggest}")
    return m


def weight_entry(value: Any, where: str, weights_size: int) -> tuple[int, int, np.dtype, tuple[int, ...]]:
    """[offset_in_weights_section, nbytes, dtype, shape], checked to lie inside the section."""
    offset, size, dtype, shape = as_list(value, where, size=4)
    offset = as_int(offset, f"{where} offset")
    size = as_int(size, f"{where} nbytes")
    dt = as_dtype(dtype, f"{where} dtype")
    shape = as_shape(shape, f"{where} shape", dt)
    if size != stored_nbytes(shape, dt):
        raise FormatError(f"{where}: nbytes {size} is not that of {list(shape)} {dt} ({stored_nbytes(shape, dt)})")
    if offset % WEIGHT_ALIGNMENT:
        raise FormatError(f"{where}: offset {offset} is not aligned to {WEIGHT_ALIGNMENT}")
    if offset + size > weights_size:
        raise FormatError(f"{where}: offset {offset} + nbytes {size} > weights section length {weights_size}")
    return offset, size, dt, shape


def external_entry(value: Any, where: str) -> tuple[str, int, np.dtype, tuple[int, ...], int]:
    """[key, nbytes, dtype, shape, crc32] of a weight kept outside the file; key: the SHA-256 of its bytes, as
    64 lowercase hex digits."""
    key, size, dtype, shape, crc = as_list(value, where, size=5)
    key = as_str(key, f"{where} key")
    if len(key) != 64 or any(c not in "0123456789abcdef" for c in key):
        raise FormatError(f"{where} key: expected a SHA-256 as 64 lowercase hex digits, got {key[:80]!r}")
    size = as_int(size, f"{where} nbytes")
    dt = as_dtype(dtype, f"{where} dtype")
    shape = as_shape(shape, f"{where} shape", dt)
    if size != nbytes(shape, dt):
        raise FormatError(f"{where}: nbytes {size} is not that of {list(shape)} {dt} ({nbytes(shape, dt)})")
    return key, size, dt, shape, as_int(crc, f"{where} crc", 0, 2**32 - 1)


def weight_sizes(meta: dict[str, Any]) -> dict[str, int]:
    """name -> nbytes of every weight a (checked) META lists, in the file or outside it."""
    return {name: int(entry[1]) for table in (meta["weights"], meta.get("external_weights", {}))
            for name, entry in table.items()}


def graph_meta(value: Any, where: str) -> dict[str, Any]:
    g = as_map(value, where)
    as_str(field(g, "name", where), f"{where} name")
    as_int(field(g, "opset", where), f"{where} opset", 0, 1 << 31)
    as_str(field(g, "strategy", where), f"{where} strategy")
    as_int(field(g, "spillfill_size", where), f"{where} spillfill_size")
    as_int(field(g, "lower_bound", where), f"{where} lower_bound")
    io_bytes, io = 0, {}
    for key in ("inputs", "outputs"):
        infos = _infos(field(g, key, where), f"{where} {key}")
        io_bytes += sum(nbytes(t.shape, np.dtype(t.dtype)) for t in infos)
        io[key] = {t.name: t for t in infos}
    if as_int(field(g, "io_bytes", where), f"{where} io_bytes") != io_bytes:
        raise FormatError(f"{where}: io_bytes {g['io_bytes']} is not the sum of its IO tensors ({io_bytes})")
    value_inputs(g, io["inputs"], where)
    value_ranges(g, io["inputs"], where)
    for name, axis in as_map(g.get("bounded_outputs", {}), f"{where} bounded_outputs").items():
        info = io["outputs"].get(name)
        if info is None or not info.shape:
            raise FormatError(f"{where} bounded_outputs: {name!r} is not an output with at least one axis")
        as_int(axis, f"{where} bounded_outputs[{name!r}]", 0, len(info.shape) - 1)
    for i, part in enumerate(as_list(g.get("partitions", []), f"{where} partitions")):  # optional
        p = as_map(part, f"{where} partitions[{i}]")
        as_str(field(p, "backend", where), f"{where} partitions[{i}] backend")
        as_int(field(p, "steps", where), f"{where} partitions[{i}] steps")
        for op, n in as_map(field(p, "ops", where), f"{where} partitions[{i}] ops").items():
            as_int(n, f"{where} partitions[{i}] ops[{op!r}]")
    return g


def _infos(value: Any, where: str) -> list[TensorInfo]:
    infos = [tensor_info(t, f"{where}[{i}]") for i, t in enumerate(as_list(value, where))]
    if len({t.name for t in infos}) != len(infos):
        raise FormatError(f"{where}: duplicate tensor names")
    return infos


_KINDS = {"b": (bool,), "i": (int,), "u": (int,), "f": (int, float)}


def value_inputs(g: dict[str, Any], inputs: dict[str, TensorInfo], where: str) -> dict[str, np.ndarray]:
    """The optional `value_inputs` of a graph entry: input name -> its compiled value, as an array."""
    out = {}
    for name, flat in as_map(g.get("value_inputs", {}), f"{where} value_inputs").items():
        at = f"{where} value_inputs[{name!r}]"
        info = inputs.get(name)
        if info is None:
            raise FormatError(f"{at}: not an input of the graph")
        dt = np.dtype(info.dtype)
        items = as_list(flat, at)
        if len(items) != nbytes(info.shape, dt) // dt.itemsize or dt.kind not in _KINDS:
            raise FormatError(f"{at}: {len(items)} values for {dt}{list(info.shape)}")
        for i, v in enumerate(items):
            if not isinstance(v, _KINDS[dt.kind]) or (dt.kind != "b" and isinstance(v, bool)):
                raise FormatError(f"{at}[{i}]: {type(v).__name__} is not a value of {dt}")
        try:
            arr = np.array(items, dt).reshape(info.shape)
        except OverflowError:
            raise FormatError(f"{at}: a value does not fit {dt}") from None
        if dt.kind in "iu" and arr.tolist() != np.array(items, object).reshape(info.shape).tolist():
            raise FormatError(f"{at}: a value does not fit {dt}")
        out[name] = arr
    return out


def value_ranges(g: dict[str, Any], inputs: dict[str, TensorInfo], where: str) -> tuple[Any, ...]:
    """The optional `value_ranges` of a graph entry (value inputs taken as the lengths of inputs, ranged:
    docs/format.md), as frontend/carriers.py's Record."""
    from ctxrt.compiler.ranges import is_dim_name
    from ctxrt.frontend.carriers import MAX_ELEMENTS, carrier

    items = as_list(g.get("value_ranges", []), f"{where} value_ranges")
    ranged = {d[0] for d in g["ranges"]["dims"]} if isinstance(g.get("ranges"), dict) and isinstance(
        g["ranges"].get("dims"), list) and all(isinstance(d, list) and d for d in g["ranges"]["dims"]) else set()
    out, names = [], set()
    for i, item in enumerate(items):
        at = f"{where} value_ranges[{i}]"
        v = as_map(item, at)
        name = as_str(field(v, "name", at), f"{at} name")
        dt = as_dtype(field(v, "dtype", at), f"{at} dtype")
        shape = tuple(as_int(d, f"{at} shape", 1, MAX_ELEMENTS) for d in as_list(field(v, "shape", at), f"{at} shape"))
        size = int(np.prod(shape, dtype=np.int64))
        elements = as_list(field(v, "elements", at), f"{at} elements", size)
        if name in inputs or name in names or dt.kind not in "iu" or len(shape) > 1 or size > MAX_ELEMENTS:
            raise FormatError(f"{at}: {name!r} is not an integer value input of at most {MAX_ELEMENTS} elements "
                              "apart from the graph's inputs")
        names.add(name)
        info = np.iinfo(dt)
        for j, e in enumerate(elements):
            if isinstance(e, str):
                length = inputs.get(carrier(name, j, size))
                if not is_dim_name(e) or e not in ranged or length is None or np.dtype(length.dtype) != np.uint8 or \
                        len(length.shape) != 1:
                    raise FormatError(f"{at} elements[{j}]: {e!r} is no ranged dim of a uint8 input "
                                      f"{carrier(name, j, size)!r}")
            else:
                as_int(e, f"{at} elements[{j}]", int(info.min), int(info.max))
        out.append((name, dt.str, shape, tuple(elements)))
    return tuple(out)


def str_map(value: Any, where: str) -> dict[str, str]:
    m = as_map(value, where)
    for k, v in m.items():
        as_str(v, f"{where}[{k!r}]")
    return m


# -- KERNELS ---------------------------------------------------------------------------------------

PROGRAM_KEYS = ("name", "source_hash", "options", "source", "binary")


def check_kernels(value: Any) -> dict[str, Any]:
    """Decoded KERNELS: `{device: {str: str}, programs: [{name, source_hash, options, source, binary}]}`. Each
    source must hash to its source_hash (SHA-256, hex), so a binary is never paired with another source."""
    k = as_map(value, "KERNELS")
    str_map(field(k, "device", "KERNELS"), "KERNELS device")
    seen = set()
    for i, entry in enumerate(as_list(field(k, "programs", "KERNELS"), "KERNELS programs")):
        where = f"KERNELS programs[{i}]"
        p = as_map(entry, where)
        name, digest, options, source = (as_str(field(p, key, where), f"{where} {key}") for key in PROGRAM_KEYS[:4])
        if not isinstance(field(p, "binary", where), bytes):
            raise FormatError(f"{where} binary: expected bytes, got {type(p['binary']).__name__}")
        if hashlib.sha256(source.encode()).hexdigest() != digest:
            raise FormatError(f"{where} ({name}): its source does not match its source_hash")
        if (digest, options) in seen:
            raise FormatError(f"{where} ({name}): a second program for the same source and options")
        seen.add((digest, options))
    return k


def tensor_info(value: Any, where: str) -> TensorInfo:
    t = as_map(value, where)
    dt = as_dtype(field(t, "dtype", where), f"{where} dtype")
    shape = as_shape(field(t, "shape", where), f"{where} shape", dt)
    mem_type = as_str(field(t, "mem_type", where), f"{where} mem_type")
    if mem_type not in MEM_TYPES:
        raise FormatError(f"{where} mem_type: {mem_type!r} is not one of {MEM_TYPES}")
    return TensorInfo(as_str(field(t, "name", where), f"{where} name"), shape, t["dtype"], mem_type)


# -- PROGRAMS --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Places:
    """How many bytes each place a Ref can point into has, for one graph."""

    arena: int
    alignment: int
    inputs: dict[str, int]
    outputs: dict[str, int]
    weights: dict[str, int]


def graphs_from(value: Any, meta: dict[str, Any]) -> list[CompiledGraph]:
    """Decoded PROGRAMS + checked META -> CompiledGraphs, every Ref checked to lie inside its place."""
    programs = as_list(value, "PROGRAMS")
    metas = meta["graphs"]
    if len(programs) != len(metas):
        raise FormatError(f"PROGRAMS has {len(programs)} graphs but META lists {len(metas)}")
    weights = weight_sizes(meta)
    return [_graph(p, g, weights, meta["backend"], f"PROGRAMS[{i}]")
            for i, (p, g) in enumerate(zip(programs, metas, strict=True))]


def _graph(value: Any, g: dict[str, Any], weights: dict[str, int], backend: str, where: str) -> CompiledGraph:
    p = as_map(value, where)
    if field(p, "name", where) != g["name"]:
        raise FormatError(f"{where} name {p['name']!r} does not match META's {g['name']!r}")
    inputs = [tensor_info(t, "META inputs") for t in g["inputs"]]
    outputs = [tensor_info(t, "META outputs") for t in g["outputs"]]
    alignment = as_pow2(field(p, "alignment", where), f"{where} alignment")
    const_names = [as_str(n, f"{where} const_names[{i}]")
                   for i, n in enumerate(as_list(field(p, "const_names", where), f"{where} const_names"))]
    for n in const_names:
        if n not in weights:
            raise FormatError(f"{where} const_names: {n!r} is not in the weights table")
    places = _Places(g["spillfill_size"], alignment, {t.name: _size(t) for t in inputs},
                     {t.name: _size(t) for t in outputs}, weights)
    steps = [_step(s, places, f"{where} steps[{i}]", backend=backend)
             for i, s in enumerate(as_list(field(p, "steps", where), f"{where} steps"))]
    intervals = [_interval(v, places.arena, f"{where} intervals[{i}]")
                 for i, v in enumerate(as_list(field(p, "intervals", where), f"{where} intervals"))]
    bounded = g.get("bounded_outputs", {})
    extents = {}
    for name, r in as_map(p.get("extents", {}), f"{where} extents").items():
        ref = _ref(r, places, f"{where} extents[{name!r}]")
        if name not in bounded or ref.space != ARENA or ref.shape != () or np.dtype(ref.dtype) != np.int64:
            raise FormatError(f"{where} extents[{name!r}]: not an int64 scalar in the arena for a bounded output")
        extents[name] = (bounded[name], ref)
    if extents.keys() != bounded.keys():
        raise FormatError(f"{where} extents: {sorted(extents)} do not match META's bounded outputs {sorted(bounded)}")
    graph = CompiledGraph(g["name"], g["opset"], inputs, outputs, steps, g["spillfill_size"], g["lower_bound"],
                          alignment, g["strategy"], intervals, const_names,
                          value_inputs(g, {t.name: t for t in inputs}, where), extents)
    if "ranges" in g:
        graph.ranges = _ranges(g["ranges"], graph, f"{where} ranges")
    graph.carriers = value_ranges(g, {t.name: t for t in inputs}, where)
    return graph


def _ranges(value: Any, g: CompiledGraph, where: str) -> Any:
    """A range program's dims and entries, each place they name checked to exist, and every tensor they shape
    checked to stay within its upper-bound size anywhere in the ranges (so no view leaves the arena)."""
    from ctxrt.compiler.ranges import MAX_DIMS, MAX_FLOORS, RangeError, Ranges, check_fits, entry_target

    r = as_map(value, where)

    def rows(key: str, width: int, what: str, wider: int = 0) -> list[tuple[str, list[Any]]]:
        out = []
        for i, row in enumerate(as_list(field(r, key, where), f"{where} {key}")):
            row = as_list(row, f"{where} {key}[{i}]")
            if len(row) not in (width, wider or width):
                raise FormatError(f"{where} {key}[{i}]: expected [{what}]")
            out.append((f"{where} {key}[{i}]", row))
        return out

    dims, steps = [], []
    for at, (name, lo, hi, *step) in rows("dims", 3, "name, min, max[, step]", 4):
        lo = as_int(lo, f"{at} min")
        hi = as_int(hi, f"{at} max", lo)
        s = as_int(step[0], f"{at} step", 2) if step else 1
        if lo % s or hi % s:
            raise FormatError(f"{at}: min {lo} and max {hi} are not multiples of its step {s}")
        dims.append((as_str(name, f"{at} name"), lo // s, hi // s))  # (the program takes a stepped dim's size / step)
        steps.append(s)
    if not 0 < len(dims) <= MAX_DIMS:
        raise FormatError(f"{where} dims: 1 to {MAX_DIMS} dims, got {len(dims)}")
    readers = []
    for at, (inp, axis) in rows("readers", 2, "input, axis"):
        inp = as_int(inp, f"{at} input", 0, len(g.inputs) - 1)
        readers.append((inp, as_int(axis, f"{at} axis", 0, max(len(g.inputs[inp].shape) - 1, 0))))
    if len(readers) != len(dims):
        raise FormatError(f"{where} readers: {len(readers)} for {len(dims)} dims")
    floors = []
    for i, f in enumerate(as_list(r.get("floors", []), f"{where} floors")):
        at = f"{where} floors[{i}]"
        f = as_list(f, at)
        if len(f) != 3:
            raise FormatError(f"{at}: expected [dim, a, s]")
        j = as_int(f[0], f"{at} dim", 0, len(dims) - 1)
        if steps[j] != 1:
            raise FormatError(f"{at}: dim {dims[j][0]!r} is stepped")
        floors.append((j, as_int(f[1], f"{at} a", -(1 << 40), 1 << 40), as_int(f[2], f"{at} s", 2, 1 << 40)))
    if len(floors) > MAX_FLOORS:
        raise FormatError(f"{where} floors: at most {MAX_FLOORS}, got {len(floors)}")
    width = 1 << (len(dims) + len(floors))
    basis = [as_int(m, f"{where} basis[{i}]", 0, width - 1) for i, m in enumerate(as_list(r.get("basis", []),
                                                                                             f"{where} basis"))]
    if floors and not basis or len(set(basis)) != len(basis):
        raise FormatError(f"{where} basis: a program with derived dims lists its monomials, each once")
    entries = []
    for at, (place, coeffs) in rows("entries", 2, "where, coefficients"):
        place = as_list(place, f"{at} where")
        coeffs = [as_int(c, f"{at} coefficients", -(1 << 40), 1 << 40) for c in as_list(coeffs, f"{at} coefficients")]
        if len(coeffs) != (len(basis) or width) or not entry_target(g, place):
            raise FormatError(f"{at}: {place!r} is no integer of this program, or the coefficients do not match "
                              "the dims")
        entries.append((place, coeffs))
    ranges = Ranges(dims, readers, entries, steps=tuple(steps) if any(x > 1 for x in steps) else (),
                    floors=tuple(floors), basis=tuple(basis))
    try:
        check_fits(g, ranges, dims)
    except RangeError as e:
        raise FormatError(f"{where}: {e}") from None
    return ranges


def _size(t: TensorInfo) -> int:
    return nbytes(t.shape, np.dtype(t.dtype))


def _step(value: Any, places: _Places, where: str, depth: int = 0, backend: str = "") -> Step:
    """A step; `backend` runs it unless it names another (older files name none: they ran on one)."""
    s = as_map(value, where)
    backend = as_str(s.get("backend", backend), f"{where} backend")
    refs = {}
    for key in ("inputs", "outputs", "scratch"):
        items = as_list(field(s, key, where), f"{where} {key}")
        refs[key] = [None if r is None and key == "inputs" else _ref(r, places, f"{where} {key}[{i}]")
                     for i, r in enumerate(items)]
    attrs = as_map(field(s, "attrs", where), f"{where} attrs")
    check_depth(attrs, f"{where} attrs")
    attrs = {k: _body(v, refs, attrs, f"{where} attrs[{k!r}]", depth + 1, backend)
             if isinstance(v, msgpack.ExtType) and v.code == EXT_BODY else _attr(v, f"{where} attrs[{k!r}]")
             for k, v in attrs.items()}
    return Step(as_str(field(s, "op", where), f"{where} op"), as_str(field(s, "name", where), f"{where} name"),
                attrs, refs["inputs"], refs["outputs"], refs["scratch"],
                as_str(field(s, "algorithm", where), f"{where} algorithm"), backend,
                params(s.get("params", {}), f"{where} params"))  # optional: tuned steps only


def _body(ext: msgpack.ExtType, refs: dict[str, list[Any]], attrs: dict[str, Any], where: str, depth: int,
          backend: str) -> Body:
    """A control-flow body: its refs must lie inside its own arena (at most the step's scratch), its inputs and
    outputs, or the step's captured inputs (the last len(captures) inputs of the step, named by `captures`)."""
    if depth > MAX_BODY_DEPTH:
        raise FormatError(f"{where}: control-flow bodies nested deeper than {MAX_BODY_DEPTH} levels")
    b = as_map(decode(ext.data, f"{where} payload", keep_ext=True), where)
    inputs, outputs = _infos(field(b, "inputs", where), f"{where} inputs"), _infos(field(b, "outputs", where),
                                                                                f"{where} outputs")
    arena = as_int(field(b, "arena_size", where), f"{where} arena_size")
    alignment = as_pow2(field(b, "alignment", where), f"{where} alignment")
    scratch = sum(r.nbytes for r in refs["scratch"])
    if arena > scratch:
        raise FormatError(f"{where}: its arena of {arena} bytes exceeds the step's scratch ({scratch} bytes)")
    captures = [as_str(n, f"{where} captures[{i}]")
                for i, n in enumerate(as_list(attrs.get("captures", []), f"{where} captures"))]
    if len(captures) > len(refs["inputs"]):
        raise FormatError(f"{where}: {len(captures)} captures for {len(refs['inputs'])} step inputs")
    captured = refs["inputs"][len(refs["inputs"]) - len(captures):]
    places = _Places(arena, alignment, {t.name: _size(t) for t in inputs}, {t.name: _size(t) for t in outputs},
                     {n: r.nbytes for n, r in zip(captures, captured, strict=True) if r is not None})
    steps = [_step(s, places, f"{where} steps[{i}]", depth, backend)
             for i, s in enumerate(as_list(field(b, "steps", where), f"{where} steps"))]
    return Body(inputs, outputs, steps, arena, alignment)


def _attr(v: Any, where: str) -> Any:
    """Plain msgpack values pass; numpy extensions are decoded (nesting was bounded by check_depth)."""
    if isinstance(v, msgpack.ExtType):
        return from_ext(v, where)
    if isinstance(v, list):
        return [_attr(x, f"{where}[{i}]") for i, x in enumerate(v)]
    if isinstance(v, dict):
        return {k: _attr(x, f"{where}[{k!r}]") for k, x in v.items()}
    return v


def _ref(value: Any, places: _Places, where: str) -> Ref:
    space, key, offset, shape, dtype = as_list(value, where, size=5)
    key = as_str(key, f"{where} key")
    offset = as_int(offset, f"{where} offset")
    dt = as_dtype(dtype, f"{where} dtype")
    shape = as_shape(shape, f"{where} shape", dt)
    if space == ARENA:
        limit, place = places.arena, "the arena"
        if offset % places.alignment:
            raise FormatError(f"{where}: arena offset {offset} is not aligned to {places.alignment}")
    else:
        table = {INPUT: places.inputs, OUTPUT: places.outputs, CONST: places.weights}.get(space)
        if table is None:
            raise FormatError(f"{where}: space {space!r} is not one of {SPACES}")
        if key not in table:
            raise FormatError(f"{where}: {space} {key!r} does not exist")
        limit, place = table[key], f"{space} {key!r}"
    need = stored_nbytes(shape, dt) if space == CONST else nbytes(shape, dt)  # weights: 4-bit ones packed
    if offset + need > limit:
        raise FormatError(f"{where}: offset {offset} + {need} bytes exceeds {place} ({limit} bytes)")
    return Ref(space, key, offset, shape, dtype)


def _interval(value: Any, arena: int, where: str) -> Interval:
    key, offset, size, first, last = as_list(value, where, size=5)
    iv = Interval(as_str(key, f"{where} key"), as_int(offset, f"{where} offset"), as_int(size, f"{where} size"),
                  as_int(first, f"{where} first"), as_int(last, f"{where} last"))
    if iv.offset + iv.size > arena:
        raise FormatError(f"{where}: offset {iv.offset} + size {iv.size} exceeds the arena ({arena} bytes)")
    if iv.last < iv.first:
        raise FormatError(f"{where}: last step {iv.last} comes before first step {iv.first}")
    return iv
