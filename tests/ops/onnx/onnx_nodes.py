"""onnx's own backend node cases, run through `InferenceSession` against the outputs onnx stores with them.

The onnx wheel ships the generators of those cases (`onnx.backend.test.case.node.<op>`), not the `data/node`
folders, so the cases are made in memory: importing a generator module runs its `export*` functions, each adding
a `TestCase` (model + inputs + expected outputs). One module takes well under a second; all of them ~11 s.

The session compiles each model for its feeds' shapes, baking in value inputs (Range's limits, OneHot's depth, ...)
from the feeds, as `ctxrt run --inputs` does. `python tests/ops/onnx/onnx_nodes.py [SUBSTRING ...]` runs every case (or
those whose name contains one of the substrings) on the CPU and prints the counts and each failure's first line.
"""

from __future__ import annotations

import importlib
import pickle
import pkgutil
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "models"))  # zoo's cache (also run as a script)
import zoo  # noqa: E402

_PACKAGE = "onnx.backend.test.case.node"


_MADE: dict[str, dict[str, Any]] = {}  # generator module -> its cases, made once per process


def module_cases(module: str) -> dict[str, Any]:
    """name -> TestCase of the node cases one generator module makes ("clip", "ai_onnx_ml.label_encoder").

    Kept in the model cache (tests/models/zoo.py's: $CTXRT_MODEL_CACHE, else .cache/models), one pickle per module,
    onnx and NumPy version: made anew, the pool modules take onnx's reference 10-25 s (3-D pools in Python loops)
    of every test process's collection, each pytest-xdist worker's included."""
    if module not in _MADE:
        import onnx

        path = zoo.cache_dir() / "onnx_nodes" / f"{module}_onnx{onnx.__version__}_np{np.__version__}.pkl"
        try:
            _MADE[module] = pickle.loads(path.read_bytes())
        except Exception:  # none yet (or unreadable): made and kept
            _MADE[module] = _make(module)
            zoo._write_atomic(path, pickle.dumps(_MADE[module]))
    return _MADE[module]


def _make(module: str) -> dict[str, Any]:
    node = importlib.import_module(_PACKAGE)
    node._NodeTestCases.clear()
    importlib.import_module(f"{_PACKAGE}.{module}")  # its export functions add the cases
    made = {c.name: c for c in node._NodeTestCases}
    node._NodeTestCases.clear()
    return made


def cases(*modules: str) -> dict[str, Any]:
    """name -> TestCase of the cases these generator modules make (all of them when none is named)."""
    if not modules:
        package = importlib.import_module(_PACKAGE)
        modules = tuple(m.name.removeprefix(f"{_PACKAGE}.") for m in pkgutil.walk_packages(package.__path__,
                                                                                         f"{_PACKAGE}.")
                        if not m.ispkg)
    return {name: case for m in modules for name, case in module_cases(m).items()}


def zero_size(case: Any) -> bool:
    """Whether an input or an expected output of the case has a 0 dim."""
    return any(isinstance(x, np.ndarray) and 0 in x.shape for data in case.data_sets for xs in data for x in xs)


def run_case(case: Any, backend: str = "cpu") -> None:
    """Run one case's every data set through an InferenceSession; assert outputs as onnx's runner does (dtype,
    shape, values within the case's tolerances)."""
    import ctxrt

    model = case.model
    names = [i.name for i in model.graph.input if i.name not in {t.name for t in model.graph.initializer}]
    with ctxrt.InferenceSession(model.SerializeToString(), backend) as sess:
        for inputs, outputs in case.data_sets:
            feeds = dict(zip(names, (np.asarray(x) for x in inputs), strict=True))
            got = sess.run(None, feeds)
            assert len(got) == len(outputs), f"{len(got)} outputs, {len(outputs)} expected"
            for out, g, w in zip(model.graph.output, got, outputs, strict=True):
                w = np.asarray(w)
                assert g.dtype == w.dtype, f"{out.name}: dtype {g.dtype} != {w.dtype}"
                assert g.shape == w.shape, f"{out.name}: shape {g.shape} != {w.shape}"
                if w.dtype.kind in "biuO":
                    np.testing.assert_array_equal(g, w, err_msg=out.name)
                else:
                    np.testing.assert_allclose(g, w, rtol=case.rtol, atol=case.atol, err_msg=out.name)


def main(patterns: list[str]) -> int:
    import warnings

    warnings.simplefilter("ignore")
    chosen = {n: c for n, c in cases().items() if not patterns or any(p in n for p in patterns)}
    failed: dict[str, str] = {}
    for name, case in sorted(chosen.items()):
        try:
            run_case(case)
        except Exception as e:  # noqa: BLE001 - a report, one line per failure
            first = (str(e).strip().splitlines() or [""])[0]
            failed[name] = f"{type(e).__name__}: {first[:300]}"
    for name, why in failed.items():
        print(f"FAIL {name}: {why}")
    print(f"{len(chosen) - len(failed)} passed, {len(failed)} failed of {len(chosen)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
