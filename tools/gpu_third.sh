#!/usr/bin/env bash
# The session's proof call: build in place; the whole suite on the cuda backend (compiled core) with
# example 18; the CuPy tests that failed under mrkit, run with CuPy's own allocator (a baseline);
# BENCH=1: bench_cupy_route and bench_core on both builds; WORKLOAD="a,b": those rows of RMM's workload
# (it replaces tools/gpu_first.sh, run 22's call: the suite, bench_core on both builds, the pool's workload).
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi -L > "$OUT/info.txt" 2>&1
timeout 60 env MRKIT_BUILD_INPLACE=1 python3 setup.py > "$OUT/build.txt" 2>&1; echo "build rc=$?" >> "$OUT/build.txt"
python3 -m mrkit info >> "$OUT/info.txt" 2>&1
MRKIT_TEST_BACKEND=cuda MRKIT_REQUIRE_GPU=1 HYPOTHESIS_PROFILE=dev timeout ${TEST_BUDGET:-280} python3 -X faulthandler -m pytest -q -p no:cacheprovider -rfExs \
  --ignore=tests/test_mutations.py --ignore=tests/test_gpu_dask.py --ignore=tests/test_examples.py \
  --deselect tests/test_threads.py::test_eight_threads_with_release_every_millisecond_on_the_gpu ${SUITE:-tests/} \
  "tests/test_examples.py::test_example_runs[18_torch_under_a_limit.py]" > "$OUT/pytest.txt" 2>&1
echo "pytest rc=$?" >> "$OUT/pytest.txt"
CT=.scratch/cupy_tests/tests/cupy_tests
[ -d "$CT" ] || CUPY_TIME=0  # no carried CuPy tests: no baseline
[ -d "$CT" ] && printf '[pytest]\naddopts = -p no:randomly\n' > .scratch/cupy_tests/tests/pytest.ini
[ "${CUPY_TIME:-60}" != 0 ] && timeout -s INT ${CUPY_TIME:-60} python3 -m pytest -q -p no:cacheprovider -c .scratch/cupy_tests/tests/pytest.ini --rootdir=.scratch/cupy_tests/tests \
  $CT/cuda_tests/test_memory.py $CT/core_tests/test_ndarray.py $CT/creation_tests/test_from_data.py \
  -k "test_device1 or multi_device or multigpu or test_output_type_mismatch" > "$OUT/cupy_baseline.txt" 2>&1
echo "rc=$?" >> "$OUT/cupy_baseline.txt"
if [ "${BENCH:-0}" = 1 ]; then  # where cupy.empty's time goes, and the core benchmark, both builds
  timeout 60 python3 benchmarks/bench_cupy_route.py > "$OUT/route.txt" 2>&1
  timeout 40 python3 benchmarks/bench_core.py --quick --rounds 3 > "$OUT/bench_compiled.txt" 2>&1
  MRKIT_NO_EXTENSIONS=1 timeout 40 python3 benchmarks/bench_core.py --quick --rounds 3 > "$OUT/bench_python.txt" 2>&1
fi
[ -n "${WORKLOAD:-}" ] && timeout ${WORKLOAD_TIME:-80} python3 benchmarks/bench_workload.py --ops 1000 --timeout 20 \
  --no-fragmentation --only "$WORKLOAD" --json /tmp/workload.json > /tmp/workload.txt 2>&1
tail -n 30 "$OUT/pytest.txt"; tail -n 10 "$OUT"/bench_*.txt 2>/dev/null; grep -E "passed|failed|^rc=" "$OUT/cupy_baseline.txt" | tail -n 2; tail -n 1 "$OUT/build.txt"; head -3 "$OUT/info.txt"; grep "^|" /tmp/workload.txt 2>/dev/null
