#!/usr/bin/env bash
# Create .venv and install ctxrt with everything its demo, tests and benchmarks use. Idempotent:
# re-installs only when pyproject.toml or this script changed.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  "${PYTHON:-python3}" -m venv .venv
fi
# A C compiler for the native kernels (setup.py builds them into ctxrt._native; without one ctxrt installs all
# the same and runs NumPy's kernels in their place)
if ! command -v cc >/dev/null && command -v apt-get >/dev/null; then
  sudo=$([ "$(id -u)" = 0 ] || echo sudo)
  { $sudo apt-get update -q && $sudo apt-get install -y -q gcc; } || true
fi
stamp=.venv/.ctxrt-setup
# setup.py and csrc/ too: the native kernels (ctxrt._native) are built by the install
want=$(cat pyproject.toml setup.py scripts/setup.sh csrc/* | sha256sum | cut -c1-16)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "setting up .venv (first run takes a few minutes)..." >&2
  .venv/bin/python -m pip install -q --upgrade pip
  # torch only exports the BERT test models; 2.13.0 is a CPU build on the project's machines.
  .venv/bin/python -m pip install -q torch==2.13.0
  .venv/bin/python -m pip install -q -e '.[test]'
  echo "$want" > "$stamp"
fi
# The OpenCL tests need an OpenCL device: where there is none, install PoCL (a CPU device) -- Debian's
# pocl-opencl-icd when apt is there, else the PoCL wheel PyOpenCL can load.
has_opencl() {
  .venv/bin/python -c 'import pyopencl as cl, sys; sys.exit(not any(p.get_devices() for p in cl.get_platforms()))' \
    2>/dev/null
}
if ! has_opencl; then
  echo "no OpenCL device: installing PoCL..." >&2
  if command -v apt-get >/dev/null; then
    sudo=$([ "$(id -u)" = 0 ] || echo sudo)
    { $sudo apt-get update -q && $sudo apt-get install -y -q pocl-opencl-icd; } || true
  fi
  has_opencl || .venv/bin/python -m pip install -q pocl-binary-distribution
  has_opencl || echo "warning: still no OpenCL device; the OpenCL tests will skip" >&2
fi
