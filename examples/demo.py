"""What ctxrt is for, in one run: compile real models ahead of time, plan all their intermediate
memory into one arena, run them on NumPy and on an OpenCL device, tune the device kernels with a persistent
performance cache, and compare outputs, speed and memory with onnxruntime.

    bash scripts/demo.sh            # ResNet-50 (random weights), a 2-layer BERT encoder, SqueezeNet on OpenCL,
                                    # text generation from a model builder folder beside onnxruntime-genai
    bash scripts/demo.sh --quick    # ResNet-50 only
"""

from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

import ctxrt

ort.set_default_logger_severity(3)  # no warnings about the unused initializer of the light models

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "models"))
import zoo  # noqa: E402  (test fixtures: the onnx package's light models with random weights, BERT export)


def _median_ms(fn, repeat: int) -> float:
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def show(title: str, path: Path, feeds: dict[str, np.ndarray], shapes: dict | None, repeat: int) -> None:
    print(f"\n=== {title}  ({path.name})")
    t0 = time.perf_counter()
    ctx = ctxrt.compile(path, shapes=shapes)
    compile_s = time.perf_counter() - t0
    g = ctx.graph()
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    ours = g.run(feeds)
    theirs = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds), strict=True))
    for name, want in theirs.items():
        got = ours[name]
        err = float(np.max(np.abs(got - want)))
        print(f"  output {name} {list(got.shape)}: max |ctxrt - onnxruntime| = {err:.2e} "
              f"(max |ort| = {float(np.max(np.abs(want))):.3g})")
        if got.ndim == 2 and got.shape[1] == 1000:
            print(f"    top-5 classes  ctxrt {np.argsort(-got[0])[:5].tolist()}  "
                  f"onnxruntime {np.argsort(-want[0])[:5].tolist()}")
    props = ctx.properties
    naive = sum(s.outputs[0].nbytes for s in g.compiled.steps)
    mib = 2 ** 20
    print(f"  compiled in {compile_s:.2f} s: {len(g.compiled.steps)} kernel launches, "
          f"planner strategy {g.compiled.strategy}")
    print(f"  memory: weights {props['weights_buffer_size'] / mib:.1f} MiB | spill-fill arena "
          f"{g.spillfill_size / mib:.2f} MiB (lower bound {g.lower_bound / mib:.2f} MiB, "
          f"ratio {g.spillfill_size / max(g.lower_bound, 1):.3f}) | one buffer per tensor would be "
          f"{naive / mib:.1f} MiB")
    outs = {o.name: np.empty(o.shape, np.dtype(o.dtype)) for o in g.outputs}
    ours_ms = _median_ms(lambda: g.execute(feeds, outs), repeat)
    ort_ms = _median_ms(lambda: sess.run(None, feeds), repeat)
    print(f"  latency (median of {repeat}): ctxrt {ours_ms:.1f} ms, onnxruntime {ort_ms:.1f} ms, "
          f"ratio {ours_ms / ort_ms:.2f}")
    ctx.free()


def sharing(resnet: Path, bert: Path, bert_shapes: dict, bert_feeds: dict) -> None:
    """Two context binaries on one spill-fill buffer; a model split in two and run as a chain; IO by handles."""
    import tempfile

    from ctxrt.cli import main as cli

    mib = 2 ** 20
    shape_args = [a for k, v in bert_shapes.items() for a in ("--shape", f"{k}={'x'.join(map(str, v))}")]
    with tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stdout(io.StringIO()):
        t = Path(tmp)
        cli(["compile", str(resnet), "-o", str(t / "resnet50.ctx"), "--io-mem-type", "memhandle"])
        cli(["compile", str(bert), "-o", str(t / "bert.ctx"), *shape_args])
        cli(["compile", str(bert), "--split", "2", "-o", str(t / "split"), *shape_args])
        group = ctxrt.ContextGroup([t / "bert.ctx", t / "resnet50.ctx"])
        chain = ctxrt.ContextGroup.from_epcontext(t / "split" / f"{bert.stem}_ctx.onnx")
    print("\n=== Sharing memory")
    m = group.memory()
    leader = group.sources[group.load_order[0]].name
    print(f"  two context binaries, one spill-fill buffer: {m['spillfill'] / mib:.2f} MiB instead of "
          f"{m['spillfill_unshared'] / mib:.2f} MiB ({m['spillfill_saved'] / mib:.2f} MiB saved); "
          f"{leader} loaded first (largest)")
    ctx = group.contexts[1]  # ResNet-50, prepared with memhandle IO: no internal IO buffers
    g = ctx.graph()
    buf = ctx.backend.alloc_shared(sum(-(-t.nbytes // 64) * 64 for t in g.inputs + g.outputs), 64)
    off, handles = 0, {}
    for t in g.inputs + g.outputs:
        handles[t.name] = ctx.mem_register(buf, off, t.shape, t.dtype)
        off += -(-t.nbytes // 64) * 64
    for name, x in zoo.light_feeds(resnet).items():
        handles[name].view[...] = x
    for _ in range(3):
        g.execute({t.name: handles[t.name] for t in g.inputs}, {t.name: handles[t.name] for t in g.outputs})
    s = ctx.stats
    print(f"  ResNet-50 run 3 times from memory handles in one shared buffer: {s['copies_in']} copies in, "
          f"{s['copies_out']} out, {s['alloc_io_bytes']} bytes of internal IO buffers, "
          f"{s['recordings']} recording")
    whole = group.contexts[0].graph().run(bert_feeds)
    parts = chain.run(bert_feeds)
    err = max(float(np.max(np.abs(parts[k] - whole[k]))) for k in whole)
    cm = chain.memory()
    print(f"  BERT split in 2 context binaries, run as a chain: max |chain - whole| = {err:.1e}; spill-fill "
          f"{cm['spillfill'] / mib:.2f} MiB shared instead of {cm['spillfill_unshared'] / mib:.2f} MiB, "
          f"{chain.stats['copies_in']} copies in (the tensors between parts pass as handles)")
    with ctxrt.InferenceSession(bert) as sess:  # onnxruntime's API; dynamic dims compiled at the first run
        for _ in range(5):
            sess.run(None, bert_feeds)
        st = sess.stats
        print(f"  InferenceSession, 5 runs: {st['tensors_created']} device tensors created (first run only), "
              f"{st['tensor_cache_hits']} cache hits, {st['recordings']} recording (pinned), "
              f"{st['tensor_cache_bytes_held']} bytes held until close()")
    for h in handles.values():
        ctx.mem_deregister(h)
    buf.release()
    group.free()
    chain.free()


def opencl(path: Path, feeds: dict[str, np.ndarray]) -> None:
    """Compile for the OpenCL device with tuning mode (cold, then warm from the performance cache), store the
    tuned kernels and program binaries in a .ctx, load it (nothing built from source) and check it."""
    import json
    import subprocess
    import tempfile

    from ctxrt.backends import list_devices
    from ctxrt.cli import main as cli

    devices = [d for d in list_devices() if str(d.get("backend")).startswith("opencl")]
    print("\n=== OpenCL device, tuning mode and the performance cache")
    if not devices:
        print("  no OpenCL device on this machine (install pocl-opencl-icd): skipped")
        return
    d = devices[0]
    print(f"  device opencl:0: {d.get('name')} ({d.get('vendor', '')}, driver {d.get('driver')}, "
          f"{d.get('compute_units')} compute units)")
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    want = sess.run(None, feeds)[0]
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        config = t / "tuning.json"
        config.write_text(json.dumps({"tuning_mode": True, "performance_cache_dir": str(t / "perf"),
                                      "tuning_budget_candidates": 6}))
        times = []
        for _ in range(2):  # cold: every kernel profiled; warm: every kernel from the performance cache
            t0 = time.perf_counter()
            with contextlib.redirect_stdout(io.StringIO()):
                cli(["compile", str(path), "-o", str(t / "model.ctx"), "--backend", "opencl", "--config",
                     str(config), "-q"])
            times.append(time.perf_counter() - t0)
        rec = ctxrt.read_metadata(t / "model.ctx").get("tuning") or {}
        kernels = rec.get("kernels", [])
        gains = [k["default_time_us"] / k["best_time_us"] for k in kernels if k.get("best_time_us")]
        print(f"  compile with tuning_mode: cold {times[0]:.1f} s, warm {times[1]:.2f} s "
              f"({rec.get('kernels_from_cache', 0)} of {len(kernels)} kernels from the performance cache, "
              f"{rec.get('kernels_profiled', 0)} profiled); best kernel speed-up over its default "
              f"{max(gains, default=1.0):.2f}x")
        # a fresh process loads the stored .ctx: programs come from the binaries inside, none built from source
        probe = ("import json, sys, time; t0 = time.perf_counter(); import ctxrt; "
                 "ctx = ctxrt.context_from_binary(sys.argv[1]); "
                 "print(json.dumps({'ms': (time.perf_counter() - t0) * 1e3, **ctx.stats}))")
        child = subprocess.run([sys.executable, "-c", probe, str(t / "model.ctx")], capture_output=True, text=True,
                               check=True)
        s = json.loads(child.stdout.strip().splitlines()[-1])
        print(f"  stored .ctx loaded in a fresh process in {s['ms']:.0f} ms (imports included): "
              f"{s.get('programs_built_from_source', 0)} programs built from source, "
              f"{s.get('programs_loaded_from_binary', 0)} loaded from their device binaries")
        ctx = ctxrt.context_from_binary(t / "model.ctx")  # no backend given: the one it was compiled for
        g = ctx.graph()
        got = next(iter(g.run(feeds).values())).reshape(1, -1)
        want = want.reshape(1, -1)
        err = float(np.max(np.abs(got - want)))
        steps = g.compiled.steps
        on_device = sum(1 for st in steps if st.backend.startswith("opencl"))
        print(f"  {on_device} of {len(steps)} steps on the device; max |ctxrt opencl - onnxruntime| = {err:.2e} "
              f"(max |ort| = {float(np.max(np.abs(want))):.3g}); top-5 {np.argsort(-got[0])[:5].tolist()} vs "
              f"{np.argsort(-want[0])[:5].tolist()}")
        outs = {o.name: np.empty(o.shape, np.dtype(o.dtype)) for o in g.outputs}
        cl_ms = _median_ms(lambda: g.execute(feeds, outs), 5)
        ort_ms = _median_ms(lambda: sess.run(None, feeds), 5)
        print(f"  latency (median of 5): ctxrt on {d.get('name')} {cl_ms:.1f} ms, onnxruntime CPU {ort_ms:.1f} ms")
        ctx.free()


def generation() -> None:
    """A decoder written by onnxruntime-genai's model builder (a small random Llama), compiled ahead for a whole
    generation, generating beside onnxruntime-genai."""
    print("\n=== Text generation (onnxruntime-genai's model builder: a random Llama, 2 layers, hidden 64)")
    try:
        import onnxruntime_genai  # noqa: F401
        from gen_models import builder_llama, genai_greedy
    except ImportError as e:
        print(f"  skipped: {e}")
        return
    import shutil
    import tempfile

    from ctxrt.cli import main as cli

    folder = builder_llama("fp32")
    prompts, n = [[5, 9, 17, 33], [7, 8, 40]], 24
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copy(folder / "genai_config.json", tmp)
        with contextlib.redirect_stdout(io.StringIO()) as said:
            cli(["compile", str(folder), "--generate", "--batch", "2", "-o", f"{tmp}/model.ctx", "-q"])
        print(f"  ctxrt compile {folder.name} --generate: {said.getvalue().strip().split(' (', 1)[1][:-1]}")
        with ctxrt.Generator(Path(tmp) / "model.ctx") as gen:
            got = gen.generate(prompts, n, use_eos=False)
            compiles = gen.session.stats["shape_variants_compiled"]
    want = [genai_greedy(folder, p, n) for p in prompts]
    print(f"  {n} tokens for {len(prompts)} prompts in one batch ({got.batching}), {compiles} compiles: tokens equal "
          f"onnxruntime-genai's: {got.tokens == want}")
    print(f"  KV cache: one buffer per layer of the context's length, written in place: "
          f"{got.memory['kv_cache'] / 1024:.0f} KiB; time to first token {got.time_to_first_token_ms:.1f} ms")
    print(f"  {got.tokens_per_s:.0f} tokens/s (a model this small measures per-step overhead, where ctxrt's Python "
          "launches lose; on a 420 MB model a .ctx generates 1.39-1.46x as fast as onnxruntime-genai in fp32 and "
          "1.06-1.27x in int4 at 0.6-0.8x its peak memory, with native GEMVs on ctxrt's own threads: "
          "bench/bench_generate.py, README)")

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="ResNet-50 only")
    ap.add_argument("--repeat", type=int, default=10)
    args = ap.parse_args()
    resnet = zoo.light_model("resnet50")
    show("ResNet-50 (onnx light model, random weights)", resnet, zoo.light_feeds(resnet), None, args.repeat)
    if not args.quick:
        seq = 64
        bert = zoo.bert_model(layers=2, hidden=128, heads=4, seq=seq)
        shapes = {"input_ids": (1, seq), "attention_mask": (1, seq)}
        show("BERT encoder (2 layers, hidden 128, torch.onnx.export, padded mask)", bert,
             zoo.bert_feeds(seq), shapes, args.repeat)
        sharing(resnet, bert, shapes, zoo.bert_feeds(seq))
        squeezenet = zoo.light_model("squeezenet")
        opencl(squeezenet, zoo.light_feeds(squeezenet))
        generation()
    print("\nThe same from the command line:  .venv/bin/ctxrt run MODEL.onnx --repeat 10 [--json]")
    print("                                 .venv/bin/ctxrt run a.ctx b.ctx --share-spillfill")
    print("                                 .venv/bin/ctxrt compile MODEL.onnx -o m.ctx --backend opencl "
          "--config tuning.json")
    print("                                 .venv/bin/ctxrt compile FOLDER --generate -o FOLDER/model.ctx; "
          ".venv/bin/ctxrt generate FOLDER/model.ctx --prompt-ids 5,9,17")
    print("                                 .venv/bin/ctxrt compile FOLDER --generate --split 4 -o PARTS/  "
          "(4 binaries, one spill-fill buffer)")


if __name__ == "__main__":
    main()
