"""The `ctxrt` command. Errors are one line on stderr with exit status 2, never a traceback."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ctxrt.errors import CtxrtError


class UsageError(CtxrtError):
    """Bad command-line arguments."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse exits 2 with usage; keep it to one line
        raise UsageError(message)


def parse_shape(text: str) -> tuple[str, tuple[int, ...]]:
    name, sep, dims = text.rpartition("=")
    try:
        if not sep or not name:
            raise ValueError
        shape = tuple(int(d) for d in dims.lower().split("x"))
    except ValueError:
        raise UsageError(f"--shape expects NAME=DxDx...D (e.g. data=1x3x224x224), got {text!r}") from None
    return name, shape


def random_feeds(inputs: Sequence[Any], seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded inputs: normal floats; integers and booleans in {0, 1} (valid ids and masks)."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for info in inputs:
        dt = np.dtype(info.dtype)
        if dt.kind == "f":
            feeds[info.name] = rng.standard_normal(info.shape).astype(dt)
        else:
            feeds[info.name] = rng.integers(0, 2, size=info.shape).astype(dt)
    return feeds


def load_inputs(path: str, inputs: Sequence[Any]) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as data:
            feeds = {k: data[k] for k in data.files}
    except (OSError, ValueError) as e:
        raise UsageError(f"cannot read inputs {path}: {e}") from e
    names = [i.name for i in inputs]
    if set(feeds) != set(names):
        raise UsageError(f"{path} has arrays {sorted(feeds)}; the model's inputs are {names}")
    return feeds


def graph_shapes(specs: Sequence[str], n_models: int) -> list[dict[str, tuple[int, ...]]]:
    """--shape NAME=DIMS applies to every model; K:NAME=DIMS to the K-th (0-based) only."""
    per: list[dict[str, tuple[int, ...]]] = [{} for _ in range(n_models)]
    for spec in specs:
        head, colon, rest = spec.partition(":")
        if colon and head.isdigit() and "=" in rest:
            k = int(head)
            if k >= n_models:
                raise UsageError(f"--shape {spec}: there are only {n_models} models")
            name, shape = parse_shape(rest)
            per[k][name] = shape
        else:
            name, shape = parse_shape(spec)
            for d in per:
                d[name] = shape
    return per


def _graph_names(models: Sequence[str]) -> list[str]:
    stems = [Path(m).name.removesuffix(".onnx") for m in models]
    return [s if stems.count(s) == 1 else f"{s}_{i}" for i, s in enumerate(stems)]


def open_context(model: str, shapes: dict[str, tuple[int, ...]], backend: str) -> Any:
    """A finalized context from a .onnx model (compiled in memory), a .ctx binary or an EPContext model
    that points at one context binary."""
    import ctxrt
    from ctxrt.runtime.loader import context_from_binary

    if model.endswith(".onnx"):
        from ctxrt.frontend.epcontext import is_epcontext, read_epcontext

        if Path(model).is_file() and is_epcontext(model):
            nodes = read_epcontext(model)
            return context_from_binary(nodes[0].source, backend)
        return ctxrt.compile(model, shapes=shapes, backend=backend)
    return context_from_binary(model, backend)


def _is_chain(model: str) -> bool:
    """An EPContext model whose nodes point at more than one context binary (e.g. a split model)."""
    if not model.endswith(".onnx") or not Path(model).is_file():
        return False
    from ctxrt.frontend.epcontext import is_epcontext, read_epcontext

    if not is_epcontext(model):
        return False
    return len({n.source if isinstance(n.source, bytes) else str(n.source) for n in read_epcontext(model)}) > 1


def _context_source(model: str, shapes: dict[str, tuple[int, ...]], backend: Any) -> str | bytes:
    """What a ContextGroup loads for `model`: a .ctx path, an EPContext model's binary, or (for a .onnx
    model) a context binary compiled in memory."""
    if not model.endswith(".onnx"):
        return model
    from ctxrt.frontend.epcontext import is_epcontext, read_epcontext

    if Path(model).is_file() and is_epcontext(model):
        source = read_epcontext(model)[0].source
        return source if isinstance(source, bytes) else str(source)
    from ctxrt.format import context_bytes
    from ctxrt.runtime.loader import compile_graphs, context_info

    graphs, weights = compile_graphs([(model, shapes, "main")], backend)
    return context_bytes(graphs, weights, context_info(backend, [model]))


def _time(fn: Any, repeat: int) -> list[float]:
    """Milliseconds of `repeat` runs after one untimed warm-up run (recording, first-touch page faults and
    thread-pool start-up are not what a steady loop pays)."""
    fn()
    times = []
    for _ in range(max(1, repeat)):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return times


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


def cmd_run(args: argparse.Namespace) -> int:
    shapes = dict(parse_shape(s) for s in args.shape)
    if len(args.model) > 1 or args.share_spillfill or _is_chain(args.model[0]):
        return _run_group(args, shapes)
    ctx = open_context(args.model[0], shapes, args.backend)
    ctx.num_threads = _threads(args)
    g = ctx.graph(args.graph)
    feeds = load_inputs(args.inputs, g.inputs) if args.inputs else random_feeds(g.inputs)
    outs = {o.name: np.empty(o.shape, np.dtype(o.dtype)) for o in g.outputs}
    times = _time(lambda: g.execute(feeds, outs), args.repeat)
    if args.output:
        np.savez(args.output, **outs)
    props = ctx.properties
    report = {
        "outputs": {k: list(v.shape) for k, v in outs.items()},
        "latency_ms": statistics.median(times),
        "stats": dict(ctx.stats),
        "memory": {"weights": props["weights_buffer_size"], "spillfill": g.spillfill_size,
                   "lower_bound": g.lower_bound, "io": ctx.stats["alloc_io_bytes"], "spillfill_saved": 0,
                   **{k: v for k, v in ctx.memory().items() if k in ("prepacked", "kernel", "padding")}},
    }
    ctx.free()
    if args.json:
        print(json.dumps(report))
    else:
        _print_report(report, outs, len(times))
    return 0


def _threads(args: argparse.Namespace) -> int | None:
    if args.threads < 0:
        raise UsageError(f"--threads must be >= 0 (0: the cores other processes leave idle), got {args.threads}")
    return args.threads or None


def _run_group(args: argparse.Namespace, shapes: dict[str, tuple[int, ...]]) -> int:
    """Several models (or one chain of contexts), each context's graph run once per repeat, in order."""
    from ctxrt.runtime import get_backend
    from ctxrt.runtime.group import ContextGroup

    backend = get_backend(args.backend)
    chains = [m for m in args.model if _is_chain(m)]
    if chains and len(args.model) > 1:
        raise UsageError(f"{chains[0]} chains several context binaries: run it alone")
    if args.graph and (len(args.model) > 1 or chains):
        raise UsageError("--graph applies to a single model, not to several models or a chain")
    if chains:
        group = ContextGroup.from_epcontext(chains[0], backend, share_spillfill=args.share_spillfill)
        try:
            for ctx in group.contexts:
                ctx.num_threads = _threads(args)
            feeds = load_inputs(args.inputs, group.inputs) if args.inputs else random_feeds(group.inputs)
            outs: dict[str, np.ndarray] = {}
            times = _time(lambda: outs.update(group.run(feeds)), args.repeat)
            lower = max(s.context.graph(s.graph).lower_bound for s in group.steps)
            return _group_report(args, group, outs, times, lower)
        finally:
            group.free()
    if args.inputs and len(args.model) > 1:
        raise UsageError("--inputs applies to a single model; several models run on random inputs")
    sources = [_context_source(m, shapes, backend) for m in args.model]
    group = ContextGroup(sources, backend, share_spillfill=args.share_spillfill)
    try:
        for ctx in group.contexts:
            ctx.num_threads = _threads(args)
        runs = []
        labels = [Path(m).name for m in args.model]
        labels = [lb if labels.count(lb) == 1 else f"{lb}#{k}" for k, lb in enumerate(labels)]
        for label, ctx in zip(labels, group.contexts, strict=True):
            g = ctx.graph(args.graph)
            feeds = load_inputs(args.inputs, g.inputs) if args.inputs else random_feeds(g.inputs)
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
    if args.output:
        np.savez(args.output, **{k.replace(":", "/"): v for k, v in outs.items()})
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


def cmd_compile(args: argparse.Namespace) -> int:
    from ctxrt.compiler import compile_options
    from ctxrt.runtime import get_backend
    from ctxrt.runtime.loader import compile_graphs, context_info, save_context

    if args.config:
        raise UsageError("--config (tuning) is not implemented yet")
    if args.split:
        return _compile_split(args)
    backend = get_backend(args.backend)
    shapes = graph_shapes(args.shape, len(args.models))
    models = [(m, s, n) for m, s, n in zip(args.models, shapes, _graph_names(args.models), strict=True)]
    graphs, weights = compile_graphs(models, backend, args.io_mem_type, compile_options(args.prefer))
    out = save_context(args.output, graphs, weights, context_info(backend, args.models))
    if args.epcontext:
        from ctxrt.format import read_metadata
        from ctxrt.frontend.epcontext import write_epcontext

        wrapper = out.with_name(out.name.removesuffix(".ctx") + "_ctx.onnx")
        write_epcontext(wrapper, [(out, read_metadata(out))], embed=args.embed,
                        source_model=Path(args.models[0]).name)
        print(f"wrote {out} and {wrapper}")
    else:
        print(f"wrote {out}")
    return 0


def _compile_split(args: argparse.Namespace) -> int:
    """MODEL.onnx --split K -o DIR/: DIR/MODEL_part{i}.ctx for each part and DIR/MODEL_ctx.onnx chaining them."""
    from ctxrt.compiler import compile_options
    from ctxrt.format import read_metadata
    from ctxrt.frontend.epcontext import write_epcontext
    from ctxrt.runtime import get_backend
    from ctxrt.runtime.loader import compile_split, context_info, save_context

    if len(args.models) != 1:
        raise UsageError("--split takes one model")
    if args.split < 1:
        raise UsageError(f"--split needs K >= 1, got {args.split}")
    out_dir = Path(args.output)
    if out_dir.exists() and not out_dir.is_dir():
        raise UsageError(f"--split writes several files: -o must be a directory, {out_dir} is a file")
    backend = get_backend(args.backend)
    model = args.models[0]
    stem = Path(model).name.removesuffix(".onnx")
    parts, outputs = compile_split(model, graph_shapes(args.shape, 1)[0], backend, args.split, args.io_mem_type,
                                   compile_options(args.prefer))
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for i, (graph, weights) in enumerate(parts):
        path = save_context(out_dir / f"{stem}_part{i}.ctx", [graph], weights, context_info(backend, [model]))
        written.append((path, read_metadata(path)))
    wrapper = out_dir / f"{stem}_ctx.onnx"
    write_epcontext(wrapper, written, embed=args.embed, source_model=Path(model).name, outputs=outputs)
    for path, meta in written:
        g = meta["graphs"][0]
        print(f"wrote {path}: {len(g['inputs'])} inputs, {len(g['outputs'])} outputs, weights "
              f"{meta['weights_size'] / 2**20:.2f} MiB, spill-fill {meta['max_spillfill_size'] / 2**20:.2f} MiB")
    print(f"wrote {wrapper}")
    return 0


def _binaries(path: str) -> list[tuple[str, str | bytes]]:
    """(label, source) of every context binary `path` names: itself, or each one its EPContext nodes use."""
    if not path.endswith(".onnx"):
        return [(path, path)]
    from ctxrt.frontend.epcontext import read_epcontext

    out: list[tuple[str, str | bytes]] = []
    for node in read_epcontext(path):
        source = node.source if isinstance(node.source, bytes) else str(node.source)
        if all(source != s for _, s in out):
            out.append((node.name if isinstance(source, bytes) else Path(source).name, source))
    return out


def inspect_report(meta: dict[str, Any]) -> dict[str, Any]:
    return {
        "format_version": meta["format_version"], "backend": meta["backend"], "hardware": meta["hardware"],
        "producer": meta["producer"], "source_models": meta["source_models"],
        "weights_size": meta["weights_size"], "spillfill_size": meta["max_spillfill_size"],
        "alignment": meta["alignment"], "tuning": meta["tuning"],
        "graphs": [{"name": g["name"], "spillfill_size": g["spillfill_size"], "lower_bound": g["lower_bound"],
                    "io_bytes": g["io_bytes"], "inputs": g["inputs"], "outputs": g["outputs"]}
                   for g in meta["graphs"]],
    }


def cmd_inspect(args: argparse.Namespace) -> int:
    from ctxrt.format import read_metadata

    binaries = _binaries(args.file)
    reports = [inspect_report(read_metadata(source)) for _, source in binaries]
    if args.memory or args.plot:
        from ctxrt.runtime.report import graph_memory, plot_arena

        for r, (_, source) in zip(reports, binaries, strict=True):
            r["memory"] = graph_memory(source)
        if args.plot:
            plot_arena([(f"{label}:{g['name']}" if len(binaries) > 1 else g["name"], g)
                        for r, (label, _) in zip(reports, binaries, strict=True) for g in r["memory"]], args.plot)
    if args.kernels:
        from ctxrt.runtime.report import graph_kernels

        for r, (_, source) in zip(reports, binaries, strict=True):
            r["kernels"] = graph_kernels(source)
    if args.json:
        for r in reports:
            for g in r.get("memory", []):
                del g["intervals"]
        report = dict(reports[0])
        if len(reports) > 1:
            report["contexts"] = reports
        print(json.dumps(report))
        return 0
    mib = 2 ** 20
    for (label, _), report in zip(binaries, reports, strict=True):
        name = args.file if len(binaries) == 1 else f"{args.file} [{label}]"
        print(f"{name}: ctxrt context binary v{report['format_version']}, backend {report['backend']} "
              f"({report['hardware']}), made by {report['producer']} from {', '.join(report['source_models'])}")
        print(f"weights {report['weights_size'] / mib:.2f} MiB, max spill-fill {report['spillfill_size'] / mib:.2f} "
              f"MiB, buffer start alignment {report['alignment']}")
        for g in report["graphs"]:
            print(f"graph {g['name']}: spill-fill {g['spillfill_size'] / mib:.2f} MiB "
                  f"(lower bound {g['lower_bound'] / mib:.2f} MiB), IO {g['io_bytes'] / mib:.2f} MiB")
            for kind in ("inputs", "outputs"):
                for t in g[kind]:
                    print(f"  {kind[:-1]:6} {t['name']}: {t['dtype']}{list(t['shape'])} ({t['mem_type']})")
        if "memory" in report:
            print(f"  {'memory':<24}{'weights':>12}{'spill-fill':>12}{'lower bound':>12}{'arena/bound':>12}"
                  f"{'IO':>12}")
            for g in report["memory"]:
                ratio = g["spillfill"] / g["lower_bound"] if g["lower_bound"] else 1.0
                print(f"  {g['name']:<24}{_mib(g['weights'])}{_mib(g['spillfill'])}{_mib(g['lower_bound'])}"
                      f"{ratio:>12.3f}{_mib(g['io'])}")
        for g in report.get("kernels", []):
            _print_kernels(g)
    if args.plot:
        print(f"wrote {args.plot}")
    return 0


def _print_kernels(g: dict[str, Any]) -> None:
    print(f"  kernels of {g['name']} ({_mib(g['prepacked_bytes']).strip()} of weights prepacked at compile time):")
    for k in g["kernels"]:
        print(f"    {k['op']:<20} {k['algorithm']:<48} x{k['count']}")
    for r in g["reorders"]:
        print(f"    reorder at step {r['step']}: {r['tensor']} {r['from']} -> {r['to']} ({r['bytes']} bytes)")


def _mib(n: int) -> str:
    return f"{n / 2 ** 20:>8.2f} MiB"


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="ctxrt", description="Compile and run ONNX models with planned memory.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    c = sub.add_parser("compile", help="offline prepare: write a context binary")
    c.add_argument("models", nargs="+", metavar="MODEL.onnx")
    c.add_argument("-o", "--output", required=True, metavar="OUT.ctx")
    c.add_argument("--backend", default="cpu")
    c.add_argument("--io-mem-type", default="raw", choices=["raw", "memhandle"])
    c.add_argument("--shape", action="append", default=[], help="[K:]NAME=1x3x224x224 (K: model index)")
    c.add_argument("--split", type=int, default=0, metavar="K",
                   help="cut the model into K context binaries in the directory -o, chained by an EPContext model")
    c.add_argument("--config", help="tuning configuration (JSON)")
    c.add_argument("--prefer", default="speed", choices=["speed", "memory"],
                   help="memory: no kernel whose own constants (Winograd, prepacked weights) outgrow the weights")
    c.add_argument("--epcontext", action="store_true", help="also write OUT_ctx.onnx (EPContext model)")
    c.add_argument("--embed", action="store_true", help="embed the binary in the EPContext model")
    c.set_defaults(func=cmd_compile)
    i = sub.add_parser("inspect", help="print a context binary's metadata (reads only its header)")
    i.add_argument("file", metavar="FILE.ctx|FILE_ctx.onnx")
    i.add_argument("--memory", action="store_true", help="per graph: weights, spill-fill, lower bound, IO bytes")
    i.add_argument("--plot", metavar="FILE.png", help="draw each arena: one rectangle per tensor over (step, offset)")
    i.add_argument("--kernels", action="store_true",
                   help="per graph: the kernel each op runs, where reorders between layouts sit, prepacked bytes")
    i.add_argument("--json", action="store_true")
    i.set_defaults(func=cmd_inspect)
    r = sub.add_parser("run", help="run a model (.onnx compiled in memory), a .ctx or an EPContext model")
    r.add_argument("model", nargs="+", metavar="MODEL")
    r.add_argument("--inputs", help=".npz keyed by input name (default: seeded random inputs)")
    r.add_argument("--output", help="write outputs to this .npz")
    r.add_argument("--repeat", type=int, default=1, help="timed runs after one warm-up run (median reported)")
    r.add_argument("--threads", type=int, default=0,
                   help="threads of every pool (BLAS, OpenMP); 0: the cores other processes leave idle")
    r.add_argument("--shape", action="append", default=[], help="NAME=1x3x224x224 for dynamic inputs")
    r.add_argument("--backend", default="cpu")
    r.add_argument("--graph", help="graph to run in a multi-graph context (default: the first)")
    r.add_argument("--share-spillfill", action="store_true",
                   help="one spill-fill buffer of the largest size for every context (loaded largest first)")
    r.add_argument("--json", action="store_true", help="print one JSON object")
    r.set_defaults(func=cmd_run)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        return args.func(args)
    except CtxrtError as e:
        print(f"ctxrt: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # unreadable / unwritable files named on the command line
        print(f"ctxrt: error: {e.strerror or e}: {e.filename or ''}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("ctxrt: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
