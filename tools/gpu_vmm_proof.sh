#!/usr/bin/env bash
# A short GPU proof of the VMM: build the compiled core in place, then the VMM's, the footprint bound's,
# the GPU's and the threads' tests on the cuda backend with the compiled core, and the VMM's and the
# GPU's on the Python build. Output on stdout (the pytest summary lines last).
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
timeout 60 env MRKIT_BUILD_INPLACE=1 python3 setup.py > /tmp/build.txt 2>&1; echo "build rc=$?"
python3 -m mrkit info 2>&1 | grep core
T="tests/test_vmm.py tests/test_footprint_bound.py tests/test_gpu.py tests/test_threads.py"
MRKIT_TEST_BACKEND=cuda MRKIT_REQUIRE_GPU=1 HYPOTHESIS_PROFILE=dev timeout ${T1:-120} python3 -m pytest -q -p no:cacheprovider \
  $T --deselect tests/test_threads.py::test_eight_threads_with_release_every_millisecond_on_the_gpu 2>&1 | tail -n 3
MRKIT_NO_EXTENSIONS=1 MRKIT_TEST_BACKEND=cuda MRKIT_REQUIRE_GPU=1 HYPOTHESIS_PROFILE=dev timeout ${T2:-60} python3 -m pytest -q \
  -p no:cacheprovider tests/test_vmm.py tests/test_footprint_bound.py tests/test_gpu.py 2>&1 | tail -n 1
# CALLS=1: then bench_vmm_calls.py on the GPU under RMM's rules (new sizes each pass), 1 GiB and 4 GiB,
# two passes each: µs per operation, the part in driver calls and every driver function's count and cost
if [ "${CALLS:-0}" = 1 ]; then
  nvidia-smi --query-gpu=name --format=csv,noheader
  for s in 1GiB 4GiB; do
    MRKIT_BENCH_RULES=rmm timeout ${CALLS_TIME:-60} python3 benchmarks/bench_vmm_calls.py --footprint-limit 1.1 \
      --passes 2 --fresh --max-size $s 2>&1
  done
fi
