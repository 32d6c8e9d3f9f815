"""Every op test runs once per backend: `check` compiles its model for the backend the fixture sets (on OpenCL
a node without an OpenCL kernel runs in a CPU partition, so every op is checked on both)."""

import harness
import pytest
from harness import BACKENDS, skip_unless_available


@pytest.fixture(autouse=True, params=BACKENDS)
def op_backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    skip_unless_available(request.param)
    monkeypatch.setattr(harness, "BACKEND", request.param)
    return request.param
