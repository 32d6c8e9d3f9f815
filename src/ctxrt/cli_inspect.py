"""`ctxrt inspect`: a context binary's (or an EPContext model's binaries') metadata, with --memory or --plot its
arenas, with --kernels the kernel of each op and where reorders sit."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from ctxrt.cli_args import UsageError, model_kind, naming, not_an_input, output_file
from ctxrt.format.weights import bytes_by_type


def _binaries(path: str) -> list[tuple[str, str | bytes]]:
    """(label, source) of every context binary `path` names: itself, or each one its EPContext nodes use."""
    if model_kind("", path) == "ctx":
        return [(path, path)]
    from ctxrt.frontend.epcontext import is_epcontext, read_epcontext, read_epcontext_io

    if not is_epcontext(path):
        read_epcontext_io(path)  # an unreadable file is reported as such
        raise UsageError(f"inspect takes a .ctx or an EPContext model; {path} is an ONNX model: compile it "
                         f"first (ctxrt compile {path} -o OUT.ctx)")
    out: list[tuple[str, str | bytes]] = []
    for node in read_epcontext(path):
        source = node.source if isinstance(node.source, bytes) else str(node.source)
        if all(source != s for _, s in out):
            out.append((node.name if isinstance(source, bytes) else Path(source).name, source))
    return out


def inspect_report(meta: dict[str, Any]) -> dict[str, Any]:
    device = meta.get("device", {})  # files written before devices were recorded have none
    return {
        "format_version": meta["format_version"], "backend": meta["backend"], "hardware": meta["hardware"],
        "device": device.get("device", meta["hardware"]), "driver": device.get("driver", ""),
        "producer": meta["producer"], "source_models": meta["source_models"],
        "weights_size": meta["weights_size"], "spillfill_size": meta["max_spillfill_size"],
        "weights_by_type": bytes_by_type((e[0], e[1], e[2]) for e in meta.get("weights", {}).values()),
        "alignment": meta["alignment"], "tuning": meta["tuning"],
        "graphs": [{"name": g["name"], "spillfill_size": g["spillfill_size"], "lower_bound": g["lower_bound"],
                    "io_bytes": g["io_bytes"], "inputs": g["inputs"], "outputs": g["outputs"],
                    "value_inputs": g.get("value_inputs", {}), "bounded_outputs": g.get("bounded_outputs", {}),
                    "partitions": g.get("partitions", []), "value_ranges": g.get("value_ranges", []),
                    **({"ranges": g["ranges"]["dims"], "io_dims": _io_dims(g)} if "ranges" in g else {})}
                   for g in meta["graphs"]],
    }


def _io_dims(g: dict[str, Any]) -> dict[str, list[int | str]]:
    from ctxrt.compiler.ranges import io_dims

    ins, outs = io_dims(g["ranges"], g["inputs"], g["outputs"])
    return {t["name"]: d for t, d in zip(g["inputs"] + g["outputs"], ins + outs, strict=True)}


def _at(specs: list[str]) -> dict[str, int]:
    out = {}
    for spec in specs:
        name, sep, value = spec.partition("=")
        try:
            out[name] = int(value)
        except ValueError:
            raise UsageError(f"--at expects NAME=N (a dim of a range program and a size), got {spec!r}") from None
        if not sep or not name or out[name] < 0:
            raise UsageError(f"--at expects NAME=N (a dim of a range program and a size), got {spec!r}")
    return out


def _partitions_line(parts: list[dict[str, Any]]) -> str:
    """`opencl 12 steps (Gemm 3, Add 4) | cpu 3 steps (Conv 3)`: which nodes run where, in order."""
    def ops(p: dict[str, Any]) -> str:
        return ", ".join(f"{op} {n}" for op, n in sorted(p["ops"].items(), key=lambda kv: -kv[1]))
    return " | ".join(f"{p['backend']} {p['steps']} steps ({ops(p)})" for p in parts)


def cmd_inspect(args: argparse.Namespace) -> int:
    from ctxrt.format import read_metadata

    if args.plot:
        not_an_input(f"--plot {args.plot}", output_file("--plot", args.plot, ".png"), [args.file])
    with naming(args.file):
        binaries = _binaries(args.file)
        reports = [inspect_report(read_metadata(source)) for _, source in binaries]
        if args.memory or args.plot:
            from ctxrt.runtime.report import graph_memory

            at = _at(args.at)
            for r, (_, source) in zip(reports, binaries, strict=True):
                r["memory"] = graph_memory(source, at)
        if args.kernels:
            from ctxrt.runtime.report import graph_kernels

            for r, (_, source) in zip(reports, binaries, strict=True):
                r["kernels"] = graph_kernels(source)
    if args.plot:
        from ctxrt.runtime.report import plot_arena

        plot_arena([(f"{label}:{g['name']}" if len(binaries) > 1 else g["name"], g)
                    for r, (label, _) in zip(reports, binaries, strict=True) for g in r["memory"]], args.plot)
    if args.tuning:
        from ctxrt.tuning.record import report

        for r, (_, source) in zip(reports, binaries, strict=True):
            r["tuning_report"] = report(read_metadata(source))
    if args.json:
        for r in reports:
            for g in r.get("memory", []):
                del g["intervals"]
        report = dict(reports[0])
        if len(reports) > 1:
            report["contexts"] = reports
        print(json.dumps(report))
        return 0
    for (label, _), report in zip(binaries, reports, strict=True):
        _print_inspect(args.file if len(binaries) == 1 else f"{args.file} [{label}]", report)
    if args.plot:
        print(f"wrote {args.plot}")
    return 0


def _print_inspect(name: str, report: dict[str, Any]) -> None:
    mib = 2 ** 20
    driver = f", driver {report['driver']}" if report["driver"] else ""
    print(f"{name}: ctxrt context binary v{report['format_version']}, backend {report['backend']} "
          f"({report['device']}{driver}), made by {report['producer']} from {', '.join(report['source_models'])}")
    print(f"weights {report['weights_size'] / mib:.2f} MiB, max spill-fill {report['spillfill_size'] / mib:.2f} "
          f"MiB, buffer start alignment {report['alignment']}")
    if report["weights_by_type"]:
        print("weights by storage type: " + ", ".join(f"{t} {n / mib:.2f} MiB"
                                                      for t, n in report["weights_by_type"].items()))
    tuning = report["tuning"]
    if tuning.get("kernels") and "tuning_report" not in report:  # --tuning prints the whole table instead
        print(f"tuned: {len(tuning['kernels'])} kernels for {tuning['device'].get('device', '?')} "
              f"({tuning['kernels_profiled']} profiled, {tuning['kernels_from_cache']} from the performance cache; "
              "--tuning shows them)")
    for g in report["graphs"]:
        print(f"graph {g['name']}: spill-fill {g['spillfill_size'] / mib:.2f} MiB "
              f"(lower bound {g['lower_bound'] / mib:.2f} MiB), IO {g['io_bytes'] / mib:.2f} MiB")
        if "ranges" in g:
            print("  ranges: " + ", ".join(f"{d[0]} {d[1]}..{d[2]}" + (f" in steps of {d[3]}" if len(d) > 3 else "")
                                           for d in g["ranges"])
                  + " (one program for every shape inside; arena planned at the upper bound)")
        for kind in ("inputs", "outputs"):
            for t in g[kind]:
                print(f"  {kind[:-1]:6} {t['name']}: {t['dtype']}[{', '.join(_dims(t, g))}] ({t['mem_type']}"
                      + (f", value input compiled for {g['value_inputs'][t['name']]})" if t["name"] in
                         g["value_inputs"] else ")"))
        for v in g["value_ranges"]:  # value inputs taken as the lengths of the inputs above (docs/format.md)
            elements = ", ".join(str(e) for e in v["elements"])
            print(f"  value  {v['name']}: {v['dtype']}{v['shape']} = [{elements}] (fed as values; each ranged element "
                  "the length of an input above)")
        if len(g["partitions"]) > 1 or any(p["backend"] != report["backend"] for p in g["partitions"]):
            print(f"  partitions: {_partitions_line(g['partitions'])}")
    if "memory" in report:
        print(f"  {'memory':<24}{'weights':>12}{'spill-fill':>12}{'lower bound':>12}{'arena/bound':>12}{'IO':>12}")
        for g in report["memory"]:
            ratio = g["spillfill"] / g["lower_bound"] if g["lower_bound"] else 1.0
            print(f"  {g['name']:<24}{_mib(g['weights'])}{_mib(g['spillfill'])}{_mib(g['lower_bound'])}"
                  f"{ratio:>12.3f}{_mib(g['io'])}")
            if "live_at" in g:
                dims = ", ".join(f"{k}={v}" for k, v in g["live_at"]["dims"].items())
                print(f"  at {dims}: {g['live_at']['peak'] / 2 ** 20:.2f} MiB of the arena live at most, IO "
                      f"{g['live_at']['io'] / 2 ** 20:.2f} MiB")
    for g in report.get("kernels", []):
        _print_kernels(g)
    if "tuning_report" in report:
        from ctxrt.tuning.record import report_lines

        print("\n".join(report_lines(report["tuning_report"])))


def _print_kernels(g: dict[str, Any]) -> None:
    print(f"  kernels of {g['name']} ({_mib(g['prepacked_bytes']).strip()} of weights prepacked at compile time):")
    for k in g["kernels"]:
        print(f"    {k['op']:<20} {k['algorithm']:<48} x{k['count']}")
    for r in g["reorders"]:
        print(f"    reorder at step {r['step']}: {r['tensor']} {r['from']} -> {r['to']} ({r['bytes']} bytes)")


def _dims(t: dict[str, Any], g: dict[str, Any]) -> list[str]:
    """The tensor's dims; an upper bound (the real size known at run time) as <=N."""
    dims = [str(d) for d in g.get("io_dims", {}).get(t["name"], t["shape"])]
    axis = g["bounded_outputs"].get(t["name"])
    if axis is not None:
        dims[axis] = f"<={dims[axis]}"
    return dims


def _mib(n: int) -> str:
    return f"{n / 2 ** 20:>8.2f} MiB"
