#!/usr/bin/env bash
# One GPU call after an engine change: the pool's, the GPU's and the threads' tests on the cuda backend
# (compiled core, TEST_TIME seconds), then tools/gpu_ab.sh (bench_core for this tree and OLD in turn;
# ROUNDS, PY_ROUNDS, WORKLOAD as there). Summaries in $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1
timeout 60 env MRKIT_BUILD_INPLACE=1 python3 setup.py > "$OUT/build.txt" 2>&1; echo "build rc=$?" >> "$OUT/build.txt"
MRKIT_TEST_BACKEND=cuda MRKIT_REQUIRE_GPU=1 HYPOTHESIS_PROFILE=dev PYTHONPATH=$PWD timeout ${TEST_TIME:-100} python3 -m pytest -q \
  -p no:cacheprovider tests/test_pool.py tests/test_core.py tests/test_gpu.py tests/test_gpu_integrations.py tests/test_threads.py \
  --deselect tests/test_threads.py::test_eight_threads_with_release_every_millisecond_on_the_gpu > "$OUT/tests.txt" 2>&1
echo "pytest rc=$?" >> "$OUT/tests.txt"; tail -n 2 "$OUT/tests.txt"
bash tools/gpu_ab.sh
