#!/usr/bin/env bash
# Runs the whole suite on a GPU machine with the cuda backend, then mrkit info; logs under $OUT.
# Usage: OUT=/tmp/out bash tools/gpu_check.sh [pytest args]
set -uo pipefail
OUT=${OUT:-/tmp/mrkit-gpu}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MRKIT_TEST_BACKEND=cuda MRKIT_REQUIRE_GPU=1 HYPOTHESIS_PROFILE=${HYPOTHESIS_PROFILE:-gpu}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 | tee "$OUT/nvidia-smi.txt"
python3 -m mrkit info 2>&1 | tee "$OUT/info.txt"
python3 -m pytest -q -p no:cacheprovider "$@" 2>&1 | tee "$OUT/pytest.txt"
