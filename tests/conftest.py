"""Shared test helpers: tests/ops (harness), tests/models (zoo), tests/tuning and tests/server (*_helpers) are
importable from every test folder, and the `backend` fixture runs a test once per backend ("cpu", "opencl").

scripts/test.sh runs the suite in parallel (pytest-xdist `-n auto --dist loadfile`; the scheduler is below)."""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
for folder in ("ops", "models", "tuning", "server", "cli"):
    if str(HERE / folder) not in sys.path:
        sys.path.insert(0, str(HERE / folder))


import pytest  # noqa: E402
from harness import BACKENDS, skip_unless_available  # noqa: E402


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist's: a run without it never calls this
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """`--dist loadfile`, except that tests/ops goes out one test at a time.

    A file's tests stay on one worker, so its module-scoped fixtures (a server, a model run once, a workspace) are
    made once. xdist hands out the files with the most tests first and the single tests last: tests/ops's ~6,000
    short tests (no fixture above function scope there) fill both workers to the end, instead of a worker idling
    while the other finishes a long file."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class Scheduler(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return nodeid if path.startswith("tests/ops/") else path

    return Scheduler(config, log)


@pytest.fixture(scope="session", params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """The name of a backend to run on; OpenCL tests skip (with the reason) where there is no device."""
    skip_unless_available(request.param)
    return request.param


@pytest.fixture(scope="session")
def opencl() -> str:
    skip_unless_available("opencl")
    return "opencl"


@pytest.fixture(scope="session")
def squeezenet():
    """SqueezeNet (light, random weights): its path, seeded feeds and onnxruntime's outputs."""
    import zoo
    from test_models import ort_outputs

    path = zoo.light_model("squeezenet")
    feeds = zoo.light_feeds("squeezenet")
    return path, feeds, ort_outputs(path, feeds)
