"""Shared test helpers: tests/ops (harness), tests/models (zoo), tests/tuning and tests/server (*_helpers) are
importable from every test folder, and the `backend` fixture runs a test once per backend ("cpu", "opencl").

scripts/test.sh runs the suite in parallel (pytest-xdist, `--dist loadgroup`): tests go to the workers one by one,
except that every test of a module with a module- or class-scoped fixture (a server, a model run, a workspace)
goes to one worker, so that fixture is made once (`pytest_collection_modifyitems` below)."""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
for folder in ("ops", "models", "tuning", "server", "cli"):
    if str(HERE / folder) not in sys.path:
        sys.path.insert(0, str(HERE / folder))


import pytest  # noqa: E402
from harness import BACKENDS, skip_unless_available  # noqa: E402


def pytest_configure(config: pytest.Config) -> None:
    # pytest-xdist registers this mark too; a run without it (plain `pytest`) must not warn about it
    config.addinivalue_line("markers", "xdist_group(name): run these tests on one pytest-xdist worker")


_SHARED_SCOPES = {"module", "class", "package"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep a module's tests on one xdist worker where they share a module/class/package-scoped fixture (made once
    per worker otherwise). Session-scoped fixtures (cheap: the backend, SqueezeNet's outputs) are made per worker."""
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        if info is None or item.get_closest_marker("xdist_group"):
            continue
        if any(defs[-1].scope in _SHARED_SCOPES for defs in info.name2fixturedefs.values() if defs):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))


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
