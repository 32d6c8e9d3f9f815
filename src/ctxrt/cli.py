"""The `ctxrt` command (docs/cli.md).

Every bad input is one line on stderr and exit status 2 (130 for Ctrl-C), never a traceback; arguments
are checked (cli_args.py) before any work starts; a command that fails or is interrupted leaves no output
file behind (format/atomic.py). Each subcommand is a `cmd_*` function; `build_parser` declares them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from ctxrt import progress
from ctxrt.cli_args import (
    UsageError,
    graph_shapes,
    graph_values,
    load_inputs,
    model_kind,
    naming,
    non_negative_int,
    not_an_input,
    output_dir,
    output_file,
    parse_dims,
    positive_int,
    random_feeds,
    read_inputs,
    shape_targets,
)
from ctxrt.cli_devices import cmd_devices
from ctxrt.cli_generate import add_generate
from ctxrt.cli_inspect import cmd_inspect
from ctxrt.cli_tuning import add_commands, compile_backend, load_config
from ctxrt.errors import CtxrtError, CtxrtWarning
from ctxrt.format.atomic import StagedFiles, atomic_write, pause_point


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse exits 2 with usage; keep it to one line
        raise UsageError(message)


def _progress(args: argparse.Namespace, label: str) -> contextlib.AbstractContextManager[None]:
    """A progress bar on stderr while the block runs: only on a terminal, and not with --quiet."""
    return progress.showing(label, not args.quiet and sys.stderr.isatty())


def _graph_names(models: list[str]) -> list[str]:
    stems = [Path(m).name.removesuffix(".onnx") for m in models]
    return [s if stems.count(s) == 1 else f"{s}_{i}" for i, s in enumerate(stems)]


# -- run -----------------------------------------------------------------------------------------------
def _run_kind(model: str) -> str:
    """'ctx', 'onnx' (compiled in memory) or 'epcontext'."""
    kind = model_kind("", model)
    if kind == "onnx":
        from ctxrt.frontend.epcontext import is_epcontext

        return "epcontext" if is_epcontext(model) else "onnx"
    return kind


def open_context(model: str, kind: str, shapes: dict[str, tuple[int, ...]], args: argparse.Namespace,
                 feeds: dict[str, np.ndarray] | None = None) -> Any:
    """A finalized context from a .onnx model (compiled in memory: with `feeds`, for their shapes and the
    values of its value inputs in them) or a .ctx binary."""
    import ctxrt
    from ctxrt.backends import get_backend
    from ctxrt.compiler import compile_graphs
    from ctxrt.runtime.loader import compile_to_context, context_from_binary

    with naming(model):
        if kind != "onnx":
            return context_from_binary(model, args.backend)
        with _progress(args, f"compile {Path(model).name}"):
            if feeds is None:
                return ctxrt.compile(model, shapes=shapes, backend=args.backend)
            backend = get_backend(args.backend)
            graphs, weights = compile_graphs([(model, {**{k: v.shape for k, v in feeds.items()}, **shapes}, "main")],
                                             backend, feeds=feeds)
            return compile_to_context(graphs, weights, backend)


def _context_source(model: str, kind: str, shapes: dict[str, tuple[int, ...]], args: argparse.Namespace,
                    backend: Any) -> str | bytes:
    """What a ContextGroup loads for `model`: a .ctx path, an EPContext model's one binary, or (for a .onnx
    model) a context binary compiled in memory."""
    if kind == "ctx":
        return model
    if kind == "epcontext":
        from ctxrt.frontend.epcontext import read_epcontext
        from ctxrt.runtime.group import epcontext_model

        with naming(model):
            nodes = epcontext_model(read_epcontext(model), None, model)
        if len(nodes) > 1:
            raise UsageError(f"{model} chains several context binaries: run it alone")
        return nodes[0].source if isinstance(nodes[0].source, bytes) else str(nodes[0].source)
    from ctxrt.compiler import compile_graphs, context_to_bytes

    with naming(model), _progress(args, f"compile {Path(model).name}"):
        graphs, weights = compile_graphs([(model, shapes, "main")], backend)
        return context_to_bytes(graphs, weights, backend, [model])


def _time(fn: Any, repeat: int) -> list[float]:
    """Milliseconds of `repeat` runs after one untimed warm-up run (recording, first-touch page faults and
    thread-pool start-up are not what a steady loop pays)."""
    fn()
    times = []
    for k in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
        if k == 0:
            pause_point("running")
    return times


def _save_outputs(path: str | None, outs: dict[str, np.ndarray]) -> None:
    if path:
        with atomic_write(path) as f:
            np.savez(f, **{k.replace(":", "/"): v for k, v in outs.items()})


def _print_report(report: dict[str, Any], outs: dict[str, np.ndarray], n: int) -> None:
    for name, v in outs.items():
        flat = v.reshape(-1)
        print(f"{name}: {v.dtype}{list(v.shape)}  first values {np.array2string(flat[:5], precision=5)}")
    m, mib = report["memory"], 2 ** 20
    print(f"latency: {report['latency_ms']:.2f} ms (median of {n})")
    line = (f"memory: weights {m['weights'] / mib:.2f} MiB, spill-fill {m['spillfill'] / mib:.2f} MiB "
            f"(lower bound {m['lower_bound'] / mib:.2f} MiB), IO {m['io'] / mib:.2f} MiB")
    if m.get("spillfill_saved"):
        line += f", {m['spillfill_saved'] / mib:.2f} MiB of spill-fill saved by sharing"
    if "kernel" in m:
        line += (f"; kernel constants {m['prepacked'] / mib:.2f} MiB in the weights (made at compile time), "
                 f"{m['kernel'] / mib:.2f} MiB made at load")
    print(line)


def _check_run_args(args: argparse.Namespace, kinds: list[str]) -> list[dict[str, tuple[int, ...]]]:
    """Per model, the --shape values for it. A --shape that only models of fixed shapes (.ctx, EPContext)
    would get is an error, not ignored."""
    n = len(args.model)
    for spec in args.shape:
        targets, _ = shape_targets(spec, n)
        if all(kinds[k] != "onnx" for k in targets):
            raise UsageError(f"--shape {spec}: {args.model[targets[0]]} has fixed shapes; --shape applies to "
                             ".onnx models compiled at run time (compile it again with --shape)")
    if args.graph and n > 1:
        raise UsageError("--graph applies to a single model, not to several models")
    if args.inputs and n > 1:
        raise UsageError("--inputs applies to a single model; several models run on random inputs")
    return graph_shapes(args.shape, n)


def _run_backend(model: str, kind: str) -> str:
    """The backend a model runs on without --backend: the one its context binary was compiled for, cpu for an
    ONNX model compiled in memory."""
    if kind == "onnx":
        return "cpu"
    from ctxrt.format import read_metadata

    with naming(model):
        if kind == "epcontext":
            from ctxrt.frontend.epcontext import read_epcontext

            model = read_epcontext(model)[0].source
        return str(read_metadata(model)["backend"])


def cmd_run(args: argparse.Namespace) -> int:
    if args.output:
        not_an_input(f"--output {args.output}", output_file("--output", args.output, ".npz"),
                     [*args.model, args.inputs])
    kinds = [_run_kind(m) for m in args.model]
    args.backend = args.backend or _run_backend(args.model[0], kinds[0])
    shapes = _check_run_args(args, kinds)
    if kinds[0] == "epcontext" and len(args.model) == 1:
        return _run_chain(args)
    if len(args.model) > 1 or args.share_spillfill:
        return _run_group(args, kinds, shapes)
    model = args.model[0]
    given = read_inputs(args.inputs) if args.inputs else None
    ctx = open_context(model, kinds[0], shapes[0], args, given if kinds[0] == "onnx" else None)
    try:
        ctx.num_threads = args.threads or None
        with naming(model):
            g = ctx.graph(args.graph)
        feeds = load_inputs(args.inputs, _fed(g), given, ranged=g.ranges is not None) if args.inputs else \
            random_feeds(g.inputs, values=g.value_inputs)
        outs = {o.name: np.empty(o.shape, np.dtype(o.dtype)) for o in g.outputs}
        real: dict[str, tuple[int, ...]] = {}  # outputs of data-dependent size: their real shape
        if g.ranges is not None or g.compiled.carriers:  # a range program: outputs of the shapes the feeds' dims give
            times = _time(lambda: outs.update(g.run(feeds)), args.repeat)
        else:
            times = _time(lambda: real.update(g.execute(feeds, outs)), args.repeat)
        outs.update({k: outs[k][tuple(slice(0, d) for d in shape)] for k, shape in real.items()})
        _save_outputs(args.output, outs)
        props = ctx.properties
        report = {
            "outputs": {k: list(v.shape) for k, v in outs.items()},
            "latency_ms": statistics.median(times),
            "stats": dict(ctx.stats),
            "memory": {"weights": props["weights_buffer_size"], "spillfill": g.spillfill_size,
                       "lower_bound": g.lower_bound, "io": ctx.stats["alloc_io_bytes"], "spillfill_saved": 0,
                       **{k: v for k, v in ctx.memory().items() if k in ("prepacked", "kernel", "padding")}},
        }
    finally:
        ctx.free()
    if args.json:
        print(json.dumps(report))
    else:
        _print_report(report, outs, len(times))
    return 0


def _fed(g: Any) -> list[Any]:
    """The inputs a graph is fed: its own, a value input it takes as lengths given as the value instead
    (`compile --dim limit=1:64`: the run converts it)."""
    from ctxrt.compiler.program import TensorInfo
    from ctxrt.frontend.carriers import carrier

    records = g.compiled.carriers
    made = {carrier(n, j, len(e)) for n, _, _, e in records for j in range(len(e))}
    return [t for t in g.inputs if t.name not in made] + [TensorInfo(n, tuple(shape), dt)
                                                          for n, dt, shape, _ in records]


def _run_chain(args: argparse.Namespace) -> int:
    """One model of an EPContext file (its nodes chained, or one node), the nodes run in order per repeat."""
    from ctxrt.runtime.group import ContextGroup

    model = args.model[0]
    with naming(model):
        group = ContextGroup.from_epcontext(model, args.backend, share_spillfill=args.share_spillfill,
                                            graph=args.graph)
    try:
        for ctx in group.contexts:
            ctx.num_threads = args.threads or None
        feeds = load_inputs(args.inputs, group.inputs) if args.inputs else random_feeds(group.inputs)
        outs: dict[str, np.ndarray] = {}
        times = _time(lambda: outs.update(group.run(feeds)), args.repeat)
        lower = max(s.context.graph(s.graph).lower_bound for s in group.steps)
        return _group_report(args, group, outs, times, lower)
    finally:
        group.free()


def _run_group(args: argparse.Namespace, kinds: list[str], shapes: list[dict[str, tuple[int, ...]]]) -> int:
    """Several models, each context's graph run once per repeat, in order (one spill-fill buffer with
    --share-spillfill)."""
    from ctxrt.backends import get_backend
    from ctxrt.runtime.group import ContextGroup

    backend = get_backend(args.backend)
    sources = [_context_source(m, k, s, args, backend) for m, k, s in zip(args.model, kinds, shapes, strict=True)]
    group = ContextGroup(sources, backend, share_spillfill=args.share_spillfill, num_threads=args.threads or None)
    try:
        runs = []
        labels = [Path(m).name for m in args.model]
        labels = [lb if labels.count(lb) == 1 else f"{lb}#{k}" for k, lb in enumerate(labels)]
        for model, label, ctx in zip(args.model, labels, group.contexts, strict=True):
            with naming(model):
                g = ctx.graph(args.graph)
            feeds = load_inputs(args.inputs, g.inputs) if args.inputs else random_feeds(g.inputs,
                                                                                         values=g.value_inputs)
            outs = {o.name: np.empty(o.shape, np.dtype(o.dtype)) for o in g.outputs}
            prefix = f"{label}:" if len(args.model) > 1 else ""
            runs.append((g, feeds, outs, prefix))

        def once() -> None:
            for g, feeds, outs, _ in runs:
                g.execute(feeds, outs)

        times = _time(once, args.repeat)
        outs = {prefix + k: v for _, _, o, prefix in runs for k, v in o.items()}
        return _group_report(args, group, outs, times, max(g.lower_bound for g, *_ in runs))
    finally:
        group.free()


def _group_report(args: argparse.Namespace, group: Any, outs: dict[str, np.ndarray], times: list[float],
                  lower_bound: int) -> int:
    _save_outputs(args.output, outs)
    memory = group.memory()
    report = {
        "outputs": {k: list(v.shape) for k, v in outs.items()},
        "latency_ms": statistics.median(times),
        "stats": dict(group.stats),
        "memory": {**memory, "lower_bound": lower_bound},
        "contexts": [{"source": f"<{len(s)} bytes>" if isinstance(s, bytes) else str(s),
                      "spillfill_size": n, "loaded": group.load_order.index(k)}
                     for k, (s, n) in enumerate(zip(group.sources, group.spillfill_sizes, strict=True))],
    }
    if args.json:
        print(json.dumps(report))
    else:
        _print_report(report, outs, len(times))
    return 0


# -- compile -------------------------------------------------------------------------------------------
def _check_compile_args(args: argparse.Namespace) -> None:
    if args.embed and not (args.epcontext or args.split):
        raise UsageError("--embed puts the binary inside the EPContext model: add --epcontext (or --split K)")
    for m in args.models:
        if model_kind("", m) == "ctx":
            raise UsageError(f"{m} is a context binary (already compiled); compile takes ONNX models")
    if args.split is not None and len(args.models) != 1:
        raise UsageError("--split takes one model")


def cmd_compile(args: argparse.Namespace) -> int:
    from ctxrt.compiler import compile_graphs, compile_options, save_context

    if args.generate:
        return _compile_generate(args, load_config(args.config))
    given = [f for f, v in (("--prompt-window", args.prompt_window), ("--context", args.context),
                            ("--batch", args.batch)) if v is not None]
    if given:
        raise UsageError(f"{', '.join(given)} go with --generate")
    _check_compile_args(args)
    tuning = load_config(args.config)
    if args.split is not None:
        return _compile_split(args, tuning)
    out = output_file("-o", args.output, ".ctx")
    not_an_input(f"-o {args.output}", out, args.models)
    if args.epcontext:
        wrapper = out.with_name(out.name.removesuffix(".ctx") + "_ctx.onnx")
        not_an_input(f"-o {args.output} --epcontext: {wrapper}", wrapper, args.models)
    backend = compile_backend(args.backend, args.config, tuning)
    shapes = graph_shapes(args.shape, len(args.models))
    values = graph_values(args.value, len(args.models))
    dims = parse_dims(args.dim)
    models = [(m, s, n, v) for m, s, n, v in zip(args.models, shapes, _graph_names(args.models), values,
                                                  strict=True)]
    label = args.models[0] if len(args.models) == 1 else f"{len(args.models)} models"
    with _progress(args, f"compile {Path(label).name}"):
        with naming(args.models[0]) if len(args.models) == 1 else contextlib.nullcontext():
            graphs, weights = compile_graphs(models, backend, args.io_mem_type,
                                             options=compile_options(args.prefer), dims=dims, **tuning)
        if args.epcontext:
            written = _write_with_epcontext(args, out, graphs, weights, backend)
        else:
            written = [save_context(out, graphs, weights, backend, args.models)]
    print(f"wrote {' and '.join(map(str, written))}")
    for g in graphs:  # a range's least size raised to where the model's strided outputs have a frame
        for name, lo, _, _ in (g.ranges.natural() if g.ranges is not None and g.ranges.floors else ()):
            given = dims.get(name) if isinstance(dims, dict) else None
            if isinstance(given, tuple | list) and len(given) >= 2 and int(given[0]) < lo:
                print(f"note: dim {name!r} starts at {lo}, not {given[0]}: the model's strided convs and pools "
                      f"leave no output below {lo}")
    return 0


def _compile_generate(args: argparse.Namespace, tuning: dict[str, Any]) -> int:
    """MODEL (a builder folder, a decoder export) --generate -o OUT.ctx: one range program for every prompt chunk
    and token of a generation (docs/generate.md), its KV cache a shared buffer where the model's config says so."""
    from ctxrt.compiler import compile_graphs, compile_options, compile_split, save_context
    from ctxrt.generation.generator import PROMPT_WINDOW, generation_ranges
    from ctxrt.generation.spec import describe, locate, mask_only_counts
    from ctxrt.runtime.session import InferenceSession

    if len(args.models) != 1 or args.dim or args.shape or args.value:
        raise UsageError("--generate takes one model and chooses its ranges itself (no --dim, --shape or --value)")
    files = locate(args.models[0])
    if model_kind("", os.fspath(files.model)) == "ctx":
        raise UsageError(f"{files.model} is a context binary (already compiled); compile takes ONNX models")
    if args.split is not None:
        out = output_dir("-o", args.output)
    else:
        out = output_file("-o", args.output, ".ctx")
        not_an_input(f"-o {args.output}", out, [os.fspath(files.model)])
    backend = compile_backend(args.backend, args.config, tuning)
    with naming(args.models[0]):
        session = InferenceSession(files.model, backend)  # reads the declared IO only: nothing compiles
        try:
            inputs = session.get_inputs()
            spec = describe(files, inputs, session.get_outputs(), args.context)
        finally:
            session.close()
        ranges, _ = generation_ranges(spec, {i.name: i.shape for i in inputs}, args.prompt_window or PROMPT_WINDOW,
                                      args.batch or 1)
        if not ranges:
            raise UsageError(f"{args.models[0]}: no past input whose sequence axis is a symbolic dim to range")
        shared = [s.past for s in spec.kv] if spec.share_buffer else []
        options = compile_options(args.prefer, shared)
        found = {"mask_only_counts": bool(spec.share_buffer and spec.attention_mask is not None and
                                          mask_only_counts(files, spec.attention_mask))}
        with _progress(args, f"compile {files.model.name} for generation"):
            if args.split is not None:
                parts, outputs = compile_split(files.model, None, backend, args.split, args.io_mem_type,
                                               options=options, dims=ranges, **tuning)
            else:
                graphs, weights = compile_graphs([(files.model, None, "main")], backend, args.io_mem_type,
                                                 options=options, dims=ranges, **tuning)
                written = save_context(out, graphs, weights, backend, [files.model], generation=found)
        if args.split is not None:
            return _write_split(args, out, files.model, parts, outputs, backend, found)
    print(f"wrote {written} (ranges: " + ", ".join(f"{k}={':'.join(map(str, v)) if isinstance(v, tuple) else v}"
                                                   for k, v in ranges.items()) + ")")
    return 0


def _write_with_epcontext(args: argparse.Namespace, out: Path, graphs: list[Any], weights: dict[str, Any],
                          backend: Any) -> list[Path]:
    """OUT.ctx and OUT_ctx.onnx, both or neither."""
    from ctxrt.compiler import save_context
    from ctxrt.format import read_metadata
    from ctxrt.frontend.epcontext import write_epcontext

    with StagedFiles(out.parent, out.name) as stage:
        binary = save_context(stage.path(out.name), graphs, weights, backend, args.models)
        pause_point("staged")
        write_epcontext(stage.path(out.name.removesuffix(".ctx") + "_ctx.onnx"), [(binary, read_metadata(binary))],
                        embed=args.embed, source_model=Path(args.models[0]).name)
        return stage.commit()


def _compile_split(args: argparse.Namespace, tuning: dict[str, Any]) -> int:
    """MODEL.onnx --split K -o DIR: DIR/MODEL_part{i}.ctx for each part and DIR/MODEL_ctx.onnx chaining them,
    all written or none."""
    from ctxrt.compiler import compile_options, compile_split

    out_dir = output_dir("-o", args.output)
    backend = compile_backend(args.backend, args.config, tuning)
    model = args.models[0]
    with _progress(args, f"split {Path(model).name}"), naming(model):
        parts, outputs = compile_split(model, graph_shapes(args.shape, 1)[0], backend, args.split,
                                       args.io_mem_type, graph_values(args.value, 1)[0],
                                       compile_options(args.prefer), **tuning)
    return _write_split(args, out_dir, model, parts, outputs, backend)


def _write_split(args: argparse.Namespace, out_dir: Path, model: str | os.PathLike, parts: list[Any],
                 outputs: list[str], backend: Any, generation: dict[str, Any] | None = None) -> int:
    """DIR/MODEL_part{i}.ctx and DIR/MODEL_ctx.onnx chaining them, all written or none (`generation`: as
    save_context's)."""
    from ctxrt.compiler import save_context
    from ctxrt.format import read_metadata
    from ctxrt.frontend.epcontext import write_epcontext

    stem = Path(model).name.removesuffix(".onnx")
    with _progress(args, f"write {len(parts)} parts"), StagedFiles(out_dir) as stage:
        written = []
        for i, (graph, weights) in enumerate(parts):
            with progress.part(f"part {i + 1}/{len(parts)}"):
                path = save_context(stage.path(f"{stem}_part{i}.ctx"), [graph], weights, backend, [model],
                                    generation=generation)
            written.append((path, read_metadata(path)))
            pause_point("staged")
        write_epcontext(stage.path(f"{stem}_ctx.onnx"), written, embed=args.embed,
                        source_model=Path(model).name, outputs=outputs)
        final = stage.commit()
    for path, (_, meta) in zip(final, written, strict=False):
        g = meta["graphs"][0]
        print(f"wrote {path}: {len(g['inputs'])} inputs, {len(g['outputs'])} outputs, weights "
              f"{meta['weights_size'] / 2**20:.2f} MiB, spill-fill {meta['max_spillfill_size'] / 2**20:.2f} MiB")
    print(f"wrote {final[-1]}")
    return 0


# -- parser and entry point ----------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    import ctxrt

    p = _Parser(prog="ctxrt", description="Compile and run ONNX models with planned memory.")
    p.add_argument("--version", action="version", version=f"ctxrt {ctxrt.__version__}")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    c = sub.add_parser("compile", help="offline prepare: write a context binary")
    c.add_argument("models", nargs="+", metavar="MODEL.onnx")
    c.add_argument("-o", "--output", required=True, metavar="OUT.ctx",
                   help="the context binary to write (a directory with --split)")
    c.add_argument("--backend", default="cpu", help="cpu, opencl (device $CTXRT_OPENCL_DEVICE or 0) or opencl:N")
    c.add_argument("--io-mem-type", default="raw", choices=["raw", "memhandle"])
    c.add_argument("--shape", action="append", default=[], help="[K:]NAME=1x3x224x224 (K: model index)")
    c.add_argument("--value", action="append", default=[],
                   help="[K:]NAME=1,2,3: compile for this value of an input that decides a shape or a branch")
    c.add_argument("--dim", action="append", default=[],
                   help="NAME=MIN:MAX: one program for every size of dim NAME (a symbolic dim of the model, or "
                   "INPUT:AXIS) in this range; or for every value of a value input NAME (NAME[J]: its element J) "
                   "(docs/shapes-and-control-flow.md)")
    c.add_argument("--split", type=positive_int, metavar="K",
                   help="cut the model into K context binaries in the directory -o, chained by an EPContext model")
    c.add_argument("--config", metavar="TUNING.json",
                   help='compile config (JSON), e.g. {"tuning_mode": true, "performance_cache_dir": "perf"} to tune '
                        "the OpenCL kernels on the device (docs/tuning.md); TARGET_SERVER_SOCKET=host:port compiles "
                        "and tunes on a `ctxrt serve` machine")
    c.add_argument("--prefer", default="speed", choices=["speed", "memory"],
                   help="memory: no kernel whose own constants (Winograd, prepacked weights) outgrow the weights")
    c.add_argument("--generate", action="store_true",
                   help="MODEL is a decoder (an onnxruntime-genai builder folder or a torch export): one program for "
                   "every prompt chunk and token of a generation, for `ctxrt generate` (docs/generate.md); with "
                   "--split K, K binaries of such programs")
    c.add_argument("--prompt-window", type=positive_int, metavar="N",
                   help="with --generate: the most prompt tokens one run takes (default 128)")
    c.add_argument("--context", type=positive_int, metavar="N",
                   help="with --generate: the context length (default: the model's config)")
    c.add_argument("--batch", type=positive_int, metavar="N",
                   help="with --generate: the most prompts one run takes (default 1)")
    c.add_argument("--epcontext", action="store_true", help="also write OUT_ctx.onnx (EPContext model)")
    c.add_argument("--embed", action="store_true", help="embed the binary in the EPContext model")
    c.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    c.set_defaults(func=cmd_compile)
    i = sub.add_parser("inspect", help="print a context binary's metadata (reads only its header)")
    i.add_argument("file", metavar="FILE.ctx|FILE_ctx.onnx")
    i.add_argument("--memory", action="store_true", help="per graph: weights, spill-fill, lower bound, IO bytes")
    i.add_argument("--at", action="append", default=[], metavar="NAME=N",
                   help="with --memory, a range program's arena bytes live at this size of dim NAME (others at "
                   "their upper bound)")
    i.add_argument("--plot", metavar="FILE.png", help="draw each arena: one rectangle per tensor over (step, offset)")
    i.add_argument("--kernels", action="store_true",
                   help="per graph: the kernel each op runs, where reorders between layouts sit, prepacked bytes")
    i.add_argument("--tuning", action="store_true",
                   help="per tuned kernel: default and tuned time, speed-up, parameters (as tune-report)")
    i.add_argument("--json", action="store_true")
    i.set_defaults(func=cmd_inspect)
    r = sub.add_parser("run", help="run a model (.onnx compiled in memory), a .ctx or an EPContext model")
    r.add_argument("model", nargs="+", metavar="MODEL")
    r.add_argument("--inputs", help=".npz keyed by input name (default: seeded random inputs)")
    r.add_argument("--output", metavar="OUT.npz", help="write outputs to this .npz")
    r.add_argument("--repeat", type=positive_int, default=1, metavar="N",
                   help="run N times (N >= 1) after one warm-up run; the latency reported is the median")
    r.add_argument("--threads", type=non_negative_int, default=0, metavar="N",
                   help="threads of every pool (BLAS, OpenMP); 0: the cores other processes leave idle")
    r.add_argument("--shape", action="append", default=[],
                   help="[K:]NAME=1x3x224x224 for dynamic inputs of .onnx models (K: model index)")
    r.add_argument("--backend", help="cpu, opencl or opencl:N (default: the backend a .ctx was compiled for; cpu "
                   "for an ONNX model)")
    r.add_argument("--graph", help="graph to run in a multi-graph context or EPContext file (default: the first)")
    r.add_argument("--share-spillfill", action="store_true",
                   help="one spill-fill buffer of the largest size for every context (loaded largest first)")
    r.add_argument("--json", action="store_true", help="print one JSON object")
    r.add_argument("-q", "--quiet", action="store_true", help="no progress bar while compiling .onnx models")
    r.set_defaults(func=cmd_run)
    add_generate(sub)
    d = sub.add_parser("devices", help="list the backends and OpenCL devices (name, driver, compute units, memory)")
    d.add_argument("--json", action="store_true")
    d.set_defaults(func=cmd_devices)
    add_commands(sub)
    return p


def _tell(notes: list[warnings.WarningMessage]) -> None:
    """After a command succeeded: ctxrt's notes one line each on stderr, other warnings as Python shows them."""
    for w in notes:
        if issubclass(w.category, CtxrtWarning):
            print(f"ctxrt: {_one_line(w.message)}", file=sys.stderr)
        else:
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)


def _one_line(e: BaseException) -> str:
    if isinstance(e, OSError) and e.filename:
        return f"{e.strerror or e}: {e.filename}"
    return " ".join(str(e).split()) or type(e).__name__


def _notes_line(notes: list[warnings.WarningMessage]) -> str:
    """ctxrt's notes as a suffix of the error line: they may explain it (e.g. dynamic dims bound to 1)."""
    said = [_one_line(w.message) for w in notes if issubclass(w.category, CtxrtWarning)]
    return f" (note: {'; '.join(said)})" if said else ""


def main(argv: list[str] | None = None) -> int:
    notes: list[warnings.WarningMessage] = []
    try:
        args = build_parser().parse_args(argv)
        with warnings.catch_warnings(record=True) as caught:
            notes = caught
            warnings.simplefilter("always", CtxrtWarning)
            code = args.func(args)
        _tell(notes)
        sys.stdout.flush()  # a closed stdout fails here, not at exit
        return code
    except SystemExit as e:  # --help, --version
        return e.code if isinstance(e.code, int) else 0
    except KeyboardInterrupt:
        print("ctxrt: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # stdout's reader left (`ctxrt inspect ... | head -1`): not an error to report
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except (CtxrtError, OSError) as e:  # OSError: files named on the command line (their names, never temporaries)
        print(f"ctxrt: error: {_one_line(e)}{_notes_line(notes)}", file=sys.stderr)
        return 2
    except MemoryError as e:
        print(f"ctxrt: error: not enough memory: {_one_line(e)}", file=sys.stderr)
        return 2
    except Exception as e:
        if os.environ.get("CTXRT_TRACEBACK"):
            raise
        print(f"ctxrt: internal error (a bug in ctxrt; CTXRT_TRACEBACK=1 shows where): {type(e).__name__}: "
              f"{_one_line(e)}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
