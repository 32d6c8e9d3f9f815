#!/usr/bin/env bash
# Set up (if needed) and run the demo: compile real models, run them beside onnxruntime, show memory.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python examples/demo.py "$@"
