#!/usr/bin/env bash
# One GPU call for a session's proof and figures: the whole suite on the cuda backend (compiled core,
# tools/gpu_third.sh with BENCH=1: bench_cupy_route, bench_core on both builds), then the engine's and
# the GPU's tests on the Python build, then bench_core twice more per build with RMM installed from the
# carried wheels (.whl). Results under $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1 OPENBLAS_NUM_THREADS=1
python3 -m pip install -q --no-deps --no-index --target /tmp/rmmlib .whl/*.whl > "$OUT/rmm_install.txt" 2>&1
BENCH=${BENCH:-1} bash tools/gpu_third.sh > "$OUT/third.txt" 2>&1
MRKIT_NO_EXTENSIONS=1 MRKIT_TEST_BACKEND=cuda MRKIT_REQUIRE_GPU=1 HYPOTHESIS_PROFILE=dev PYTHONPATH=$PWD timeout ${PY_TIME:-90} \
  python3 -m pytest -q -p no:cacheprovider tests/test_engine_parts.py tests/test_finalizers.py tests/test_core.py \
  tests/test_pool.py tests/test_vmm.py tests/test_gpu.py tests/test_threads.py tests/test_gpu_integrations.py \
  tests/test_footprint_bound.py --deselect tests/test_threads.py::test_eight_threads_with_release_every_millisecond_on_the_gpu \
  > "$OUT/python_suite.txt" 2>&1
for k in $(seq ${CORE_ROUNDS:-1}); do
  for core in 0 1; do
    MRKIT_NO_EXTENSIONS=$core PYTHONPATH=$PWD:/tmp/rmmlib timeout 60 python3 benchmarks/bench_core.py --quick --rounds 3 \
      --json "$OUT/core_${core}_$k.json" > "$OUT/core_${core}_$k.txt" 2>&1
  done
done
tail -n 3 "$OUT/pytest.txt"; tail -n 1 "$OUT/python_suite.txt"; grep -h -E "x$" "$OUT"/core_*.txt "$OUT"/bench_*.txt
