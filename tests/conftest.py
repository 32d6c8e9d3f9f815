"""Shared test helpers: tests/ops (harness) and tests/models (zoo) are importable from every test folder."""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
for folder in ("ops", "models"):
    if str(HERE / folder) not in sys.path:
        sys.path.insert(0, str(HERE / folder))
