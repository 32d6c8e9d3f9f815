#!/usr/bin/env bash
# Set up (if needed), lint, and run the whole test suite: in parallel, one pytest-xdist worker per core
# (CTXRT_TEST_WORKERS overrides the count; 0 runs in this process). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check src tests bench examples
# loadgroup: tests go to the workers one at a time, but a module's tests that share a module-scoped fixture stay
# on one worker (tests/conftest.py marks them)
exec .venv/bin/python -m pytest -n "${CTXRT_TEST_WORKERS:-auto}" --dist loadgroup "$@"
