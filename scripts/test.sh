#!/usr/bin/env bash
# Set up (if needed), lint, and run the whole test suite: in parallel, one pytest-xdist worker per core
# (CTXRT_TEST_WORKERS overrides the count; 0 runs in this process). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check src tests bench examples
# loadfile: a file's tests run on one worker (its module-scoped fixtures made once), but tests/ops's tests go out
# one at a time, last, to keep every worker busy to the end (tests/conftest.py)
exec .venv/bin/python -m pytest -n "${CTXRT_TEST_WORKERS:-auto}" --dist loadfile "$@"
