"""Every op test runs once per backend: `check` compiles its model for the backend the fixture sets (on OpenCL
a node without an OpenCL kernel runs in a CPU partition, so every op is checked on both). Each test draws its
random inputs from a generator seeded by its name, so both backends see the same data, whatever ran before."""

import zlib

import harness
import numpy as np
import pytest
from harness import BACKENDS, skip_unless_available


@pytest.fixture(autouse=True, params=BACKENDS)
def op_backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    skip_unless_available(request.param)
    monkeypatch.setattr(harness, "BACKEND", request.param)
    name = request.node.nodeid.replace(f"[{request.param}-", "[").replace(f"[{request.param}]", "")
    monkeypatch.setattr(harness, "RNG", np.random.default_rng(zlib.crc32(name.encode())))
    return request.param
