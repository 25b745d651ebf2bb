#!/usr/bin/env bash
# Final GPU call of a session: build the compiled core in place; CuPy's own tests with mrkit as the
# allocator (both cores); bench_core (both cores); the suite on the cuda backend (SUITE=1).
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
MRKIT_BUILD_INPLACE=1 python3 setup.py > "$OUT/build.txt" 2>&1; echo "build rc=$?" >> "$OUT/build.txt"
python3 -m mrkit info > "$OUT/info.txt" 2>&1
CT=.scratch/cupy_tests/tests/cupy_tests
printf '[pytest]\naddopts = -p no:randomly\n' > .scratch/cupy_tests/tests/pytest.ini
for build in compiled python; do
  [ $build = python ] && export MRKIT_NO_EXTENSIONS=1
  if [ -n "${CUPY_TESTS:-}" ]; then
    timeout ${CUPY_TIME:-120} python3 -m pytest -q -p no:cacheprovider -p tools.mrkit_cupy_plugin -c .scratch/cupy_tests/tests/pytest.ini --rootdir=.scratch/cupy_tests/tests \
      $(for t in $CUPY_TESTS; do echo $CT/$t; done) > "$OUT/cupy_$build.txt" 2>&1
    echo "rc=$?" >> "$OUT/cupy_$build.txt"
  fi
  [ "${BENCH:-0}" = 1 ] && timeout 240 python3 benchmarks/bench_core.py ${BENCH_ARGS:-} --json "$OUT/bench_$build.json" > "$OUT/bench_$build.txt" 2>&1
done
unset MRKIT_NO_EXTENSIONS
# RMM's random workload on the 64 MiB / 1 GiB / 4 GiB ranges (compiled build), e.g.
# WORKLOAD="mrkit pool,cupy MemoryPool,mrkit vmm,torch expandable segments"
[ -n "${WORKLOAD:-}" ] && timeout ${WORKLOAD_TIME:-300} python3 benchmarks/bench_workload.py --ops ${OPS:-1000} --timeout 40 \
  --no-fragmentation --only "$WORKLOAD" --json "$OUT/workload.json" > "$OUT/workload.txt" 2>&1
if [ "${SUITE:-0}" = 1 ]; then
  MRKIT_TEST_BACKEND=cuda MRKIT_REQUIRE_GPU=1 HYPOTHESIS_PROFILE=dev timeout ${TEST_BUDGET:-300} python3 -X faulthandler -m pytest -q -p no:cacheprovider -rxs \
    --ignore=tests/test_mutations.py --ignore=tests/test_gpu_dask.py --ignore=tests/test_examples.py \
    --deselect tests/test_threads.py::test_eight_threads_with_release_every_millisecond_on_the_gpu tests/ > "$OUT/pytest.txt" 2>&1
  tail -n 3 "$OUT/pytest.txt"
fi
for f in "$OUT"/cupy_*.txt; do [ -f $f ] && { echo "== $f"; grep -E "passed|failed|mrkit-cupy|^rc=" $f | tail -n 4; grep -A3 "mrkit-cupy" $f | tail -n 3; }; done
tail -n 12 "$OUT"/bench_*.txt 2>/dev/null; grep "^|" "$OUT/workload.txt" 2>/dev/null; grep core "$OUT/info.txt"; tail -n 1 "$OUT/build.txt"
