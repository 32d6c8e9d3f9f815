"""Fixtures of the tuning tests."""

from __future__ import annotations

from pathlib import Path

import pytest
from tuning_helpers import mlp_model


@pytest.fixture(scope="module")
def mlp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return mlp_model(tmp_path_factory.mktemp("models") / "mlp.onnx")
