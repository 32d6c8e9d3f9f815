"""Shared test helpers: tests/ops (harness) and tests/models (zoo) are importable from every test folder."""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
for folder in ("ops", "models"):
    if str(HERE / folder) not in sys.path:
        sys.path.insert(0, str(HERE / folder))


import pytest  # noqa: E402


@pytest.fixture(scope="session")
def squeezenet():
    """SqueezeNet (light, random weights): its path, seeded feeds and onnxruntime's outputs."""
    import zoo
    from test_models import ort_outputs

    path = zoo.light_model("squeezenet")
    feeds = zoo.light_feeds("squeezenet")
    return path, feeds, ort_outputs(path, feeds)
