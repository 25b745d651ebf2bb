#!/usr/bin/env bash
# A session's closing proof in one call: the engine's and the GPU's tests on the cuda backend for
# both builds (SUITE, default below), then the A/B against an earlier tree (tools/gpu_ab.sh).
set -uo pipefail
export PYTHONUNBUFFERED=1 OPENBLAS_NUM_THREADS=1 PYTHONPATH=$PWD
timeout 90 env MRKIT_BUILD_INPLACE=1 python3 setup.py > /tmp/build.txt 2>&1 || echo "build failed" >> "$OUT/proof.txt"
SUITE=${SUITE:-"tests/test_freelist.py tests/test_core.py tests/test_pool.py tests/test_vmm.py tests/test_gpu.py
  tests/test_threads.py tests/test_footprint_bound.py tests/test_snapshot.py tests/test_gpu_integrations.py"}
for core in 0 1; do
  echo "== MRKIT_NO_EXTENSIONS=$core" >> "$OUT/proof.txt"
  MRKIT_NO_EXTENSIONS=$core MRKIT_TEST_BACKEND=cuda MRKIT_REQUIRE_GPU=1 HYPOTHESIS_PROFILE=dev timeout ${TEST_TIME:-120} \
    python3 -m pytest -q -p no:cacheprovider -rfE $SUITE \
    --deselect tests/test_threads.py::test_eight_threads_with_release_every_millisecond_on_the_gpu 2>&1 | tail -n 3 >> "$OUT/proof.txt"
done
[ "${AB:-1}" = 1 ] && bash tools/gpu_ab.sh > /dev/null 2>&1
cat "$OUT/proof.txt"; grep -E "==|x$|^\|" "$OUT/ab.txt" 2>/dev/null
