"""The `ctxrt` command. Errors are one line on stderr with exit status 2, never a traceback."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Sequence
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


def cmd_run(args: argparse.Namespace) -> int:
    import ctxrt

    shapes = dict(parse_shape(s) for s in args.shape)
    ctx = ctxrt.compile(args.model, shapes=shapes, backend=args.backend)
    g = ctx.graph()
    feeds = load_inputs(args.inputs, g.inputs) if args.inputs else random_feeds(g.inputs)
    outs = {o.name: np.empty(o.shape, np.dtype(o.dtype)) for o in g.outputs}
    times = []
    for _ in range(max(1, args.repeat)):
        t0 = time.perf_counter()
        g.execute(feeds, outs)
        times.append((time.perf_counter() - t0) * 1e3)
    if args.output:
        np.savez(args.output, **outs)
    props = ctx.properties
    report = {
        "outputs": {k: list(v.shape) for k, v in outs.items()},
        "latency_ms": statistics.median(times),
        "stats": dict(ctx.stats),
        "memory": {"weights": props["weights_buffer_size"], "spillfill": g.spillfill_size,
                   "lower_bound": g.lower_bound, "io": g.compiled.io_bytes, "spillfill_saved": 0},
    }
    ctx.free()
    if args.json:
        print(json.dumps(report))
        return 0
    for name, v in outs.items():
        flat = v.reshape(-1)
        print(f"{name}: {v.dtype}{list(v.shape)}  first values {np.array2string(flat[:5], precision=5)}")
    m = report["memory"]
    print(f"latency: {report['latency_ms']:.2f} ms (median of {len(times)})")
    print(f"memory: weights {m['weights'] / 2**20:.2f} MiB, spill-fill {m['spillfill'] / 2**20:.2f} MiB "
          f"(lower bound {m['lower_bound'] / 2**20:.2f} MiB), IO {m['io'] / 2**20:.2f} MiB")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="ctxrt", description="Compile and run ONNX models with planned memory.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    r = sub.add_parser("run", help="compile a model in memory and run it")
    r.add_argument("model")
    r.add_argument("--inputs", help=".npz keyed by input name (default: seeded random inputs)")
    r.add_argument("--output", help="write outputs to this .npz")
    r.add_argument("--repeat", type=int, default=1)
    r.add_argument("--shape", action="append", default=[], help="NAME=1x3x224x224 for dynamic inputs")
    r.add_argument("--backend", default="cpu")
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
