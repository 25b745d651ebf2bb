#!/usr/bin/env bash
# First GPU call of a session: build the compiled core in place; the whole suite on the cuda backend
# (compiled core); bench_core --quick on both builds; the pool's random workload beside CuPy's pool.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi -L > "$OUT/info.txt" 2>&1
timeout 60 python3 setup.py build_ext --inplace > "$OUT/build.txt" 2>&1; echo "build rc=$?" >> "$OUT/build.txt"
python3 -m mrkit info >> "$OUT/info.txt" 2>&1
MRKIT_TEST_BACKEND=cuda MRKIT_REQUIRE_GPU=1 HYPOTHESIS_PROFILE=dev timeout ${TEST_BUDGET:-250} python3 -X faulthandler -m pytest -q -p no:cacheprovider -rfExs \
  --ignore=tests/test_mutations.py --ignore=tests/test_gpu_dask.py --ignore=tests/test_examples.py \
  --deselect tests/test_threads.py::test_eight_threads_with_release_every_millisecond_on_the_gpu ${SUITE_ARGS:-tests/} > "$OUT/pytest.txt" 2>&1
echo "pytest rc=$?" >> "$OUT/pytest.txt"
timeout ${BENCH_TIME:-80} python3 benchmarks/bench_core.py --quick --rounds 3 --json "$OUT/bench_compiled.json" > "$OUT/bench_compiled.txt" 2>&1
MRKIT_NO_EXTENSIONS=1 timeout ${BENCH_TIME:-80} python3 benchmarks/bench_core.py --quick --rounds 3 --json "$OUT/bench_python.json" > "$OUT/bench_python.txt" 2>&1
timeout ${WORKLOAD_TIME:-80} python3 benchmarks/bench_workload.py --ops 1000 --timeout 20 --no-fragmentation \
  --only "${WORKLOAD:-mrkit pool,cupy MemoryPool}" --json "$OUT/workload.json" > "$OUT/workload.txt" 2>&1
tail -n 25 "$OUT/pytest.txt"; tail -n 14 "$OUT"/bench_*.txt; grep "^|" "$OUT/workload.txt"; tail -n 1 "$OUT/build.txt"; cat "$OUT/info.txt" | head -5
