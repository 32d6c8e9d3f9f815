"""Shared test helpers: tests/ops (harness), tests/models (zoo), tests/tuning and tests/server (*_helpers) are
importable from every test folder, and the `backend` fixture runs a test once per backend ("cpu", "opencl")."""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
for folder in ("ops", "models", "tuning", "server", "cli"):
    if str(HERE / folder) not in sys.path:
        sys.path.insert(0, str(HERE / folder))


import pytest  # noqa: E402
from harness import BACKENDS, skip_unless_available  # noqa: E402


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
