#!/usr/bin/env bash
# Download RMM's wheels (for Python 3.12, CUDA 13) into .whl/ so that a GPU call can carry them
# (the GPU machine has no network). tools/gpu_final.sh installs them when .whl/ exists; name ".whl"
# in the device tool's `carry` list. About 6 MiB.
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .whl "rmm-cu13==26.10.*" "librmm-cu13==26.10.*" "rapids-logger==0.3.*"
ls -la .whl
