"""Model split (DESIGN.md §7): `ctxrt compile --split K` makes K context binaries chained by an EPContext
model; run with one shared spill-fill buffer, the chain gives the unsplit model's outputs."""

from __future__ import annotations

import json

import numpy as np
import pytest
import zoo
from test_models import Run, assert_close, ort_outputs

import ctxrt
from ctxrt.cli import main as cli
from ctxrt.compiler.split import choose_cuts
from ctxrt.errors import PlanError
from ctxrt.runtime.group import ContextGroup

SEQ = 16


def _model(name: str):
    if name == "bert":
        path = zoo.bert_model(layers=2, hidden=64, heads=4, seq=SEQ)
        feeds = zoo.bert_feeds(SEQ)
        return path, feeds, {k: v.shape for k, v in feeds.items()}
    return zoo.light_model(name), zoo.light_feeds(name), {}


def _shape_args(shapes):
    return [a for k, v in shapes.items() for a in ("--shape", f"{k}={'x'.join(map(str, v))}")]


@pytest.fixture(scope="module", params=["squeezenet", "bert"])
def model(request):
    path, feeds, shapes = _model(request.param)
    return path, feeds, shapes, ort_outputs(path, feeds)


@pytest.mark.parametrize("k", [2, 3])
def test_split_chain_matches_the_whole_model(model, k, tmp_path, capsys, backend) -> None:
    path, feeds, shapes, want = model
    out = tmp_path / "split"
    assert cli(["compile", str(path), "--split", str(k), "-o", str(out), *_shape_args(shapes),
                "--backend", backend]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    stem = path.name.removesuffix(".onnx")
    wrapper = out / f"{stem}_ctx.onnx"
    parts = sorted(out.glob("*.ctx"))
    assert len(parts) == k and wrapper.is_file()
    sizes = [ctxrt.read_metadata(p)["max_spillfill_size"] for p in parts]
    for p in parts:  # tensors between parts are prepared as memhandles, the model's own IO as raw
        g = ctxrt.read_metadata(p)["graphs"][0]
        for t in g["inputs"]:
            assert t["mem_type"] == ("raw" if t["name"] in feeds else "memhandle")
        for t in g["outputs"]:
            assert t["mem_type"] == ("raw" if t["name"] in want else "memhandle")

    whole = ctxrt.compile(path, shapes=shapes, backend=backend)
    try:
        expected = {n: a.copy() for n, a in whole.graph().run(feeds).items()}
    finally:
        whole.free()
    with ContextGroup.from_epcontext(wrapper, backend) as chain:
        assert chain.buffer.nbytes == max(sizes)
        got = chain.run(feeds)
        got = chain.run(feeds)  # twice: the recordings of the first run are replayed
        stats = chain.stats
        assert stats["copies_in"] == 2 * len(feeds)  # only the model's inputs are copied; parts pass handles
        assert stats["recordings"] == k
        assert chain.memory()["spillfill_saved"] == sum(sizes) - max(sizes)
    assert_close(Run(want, got, 0, 0))
    for name, arr in expected.items():
        np.testing.assert_allclose(got[name], arr, rtol=1e-5, atol=1e-6)

    # The command line (on the backend the parts were compiled for): same outputs, with the memory report.
    np.savez(tmp_path / "in.npz", **feeds)
    assert cli(["run", str(wrapper), "--share-spillfill", "--inputs", str(tmp_path / "in.npz"),
                "--output", str(tmp_path / "out.npz"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["memory"]["spillfill"] == max(sizes)
    assert report["memory"]["spillfill_saved"] == sum(sizes) - max(sizes)
    assert [c["loaded"] for c in report["contexts"]] == list(np.argsort(np.argsort([-s for s in sizes],
                                                                                     kind="stable")))
    with np.load(tmp_path / "out.npz") as data:
        for name, arr in expected.items():
            np.testing.assert_allclose(data[name], arr, rtol=1e-5, atol=1e-6)


def test_split_embedded_epcontext(tmp_path) -> None:
    path, feeds, _ = _model("squeezenet")
    out = tmp_path / "s"
    assert cli(["compile", str(path), "--split", "2", "--embed", "-o", str(out)]) == 0
    with ContextGroup.from_epcontext(out / f"{path.name.removesuffix('.onnx')}_ctx.onnx") as chain:
        assert isinstance(chain.sources[0], bytes)
        got = chain.run(feeds)
    assert_close(Run(ort_outputs(path, feeds), got, 0, 0))


def test_unshared_chain_costs_the_sum(tmp_path, capsys) -> None:
    path, _, _ = _model("squeezenet")
    out = tmp_path / "s"
    assert cli(["compile", str(path), "--split", "3", "-o", str(out)]) == 0
    capsys.readouterr()
    wrapper = out / f"{path.name.removesuffix('.onnx')}_ctx.onnx"
    sizes = [ctxrt.read_metadata(p)["max_spillfill_size"] for p in sorted(out.glob("*.ctx"))]
    assert cli(["run", str(wrapper), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["memory"]["spillfill"] == sum(sizes) and report["memory"]["spillfill_saved"] == 0


def test_cuts_follow_the_fewest_live_bytes_and_balance_weights() -> None:
    #          p: 0   1   2   3   4   5   6   7   8
    carried = [0, 50, 10, 60, 60, 5, 70, 80, 0]
    weights = [0, 10, 20, 30, 40, 50, 60, 70, 80]
    assert choose_cuts(carried, weights, 1) == []
    assert choose_cuts(carried, weights, 2) == [5]  # 5 bytes carried, weights 50 / 30
    assert choose_cuts(carried, weights, 3) == [2, 5]
    # most weights early: balance moves the cut to 2, though 5 carries fewer bytes
    assert choose_cuts(carried, [0, 40, 45, 50, 55, 75, 78, 79, 80], 2) == [2]
    with pytest.raises(PlanError, match="into 9 parts"):
        choose_cuts(carried, weights, 9)


def test_split_errors(tmp_path, capsys) -> None:
    path, _, _ = _model("squeezenet")
    f = tmp_path / "file"
    f.write_text("")
    assert cli(["compile", str(path), "--split", "2", "-o", str(f)]) == 2
    assert "must be a directory" in capsys.readouterr().err
    assert cli(["compile", str(path), str(path), "--split", "2", "-o", str(tmp_path / "d")]) == 2
    assert "one model" in capsys.readouterr().err
    assert cli(["compile", str(path), "--split", "100000", "-o", str(tmp_path / "d")]) == 2
    assert "parts" in capsys.readouterr().err
