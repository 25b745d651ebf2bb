#!/usr/bin/env bash
# Diagnose the GPU suite's groups (as tools/gpu_split_suite.sh deals them): group 0 with each test's
# name and a traceback of every thread when one test runs past FH_TIMEOUT seconds; group 1 under gdb
# (where installed) for a C backtrace if the process crashes, at exit included. $OUT/diag_{0,1}.txt.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
timeout 60 env MRKIT_BUILD_INPLACE=1 python3 setup.py > "$OUT/build.txt" 2>&1; echo "build rc=$?" >> "$OUT/build.txt"
files=$(ls tests/test_*.py | grep -v -e test_mutations.py -e test_gpu_dask.py -e test_examples.py)
g0=${G0:-$(echo "$files" | awk 'NR % 2 == 1')}; g1=${G1:-$(echo "$files" | awk 'NR % 2 == 0')}
args=(-p no:cacheprovider -rfEs --durations=15 -o faulthandler_timeout=${FH_TIMEOUT:-60}
      --deselect tests/test_threads.py::test_eight_threads_with_release_every_millisecond_on_the_gpu)
export MRKIT_TEST_BACKEND=cuda MRKIT_REQUIRE_GPU=1 HYPOTHESIS_PROFILE=dev
( timeout ${T0:-300} python3 -X faulthandler -m pytest -v "${args[@]}" $g0 > "$OUT/diag_0.txt" 2>&1
  echo "pytest rc=$?" >> "$OUT/diag_0.txt" ) &
if command -v gdb > /dev/null; then
  timeout ${T1:-300} gdb -q -batch -ex "set pagination off" -ex run -ex "thread apply all bt 25" \
    --args python3 -X faulthandler -m pytest -q "${args[@]}" $g1 > "$OUT/diag_1.txt" 2>&1
else
  echo "no gdb" > "$OUT/diag_1.txt"
  timeout ${T1:-300} python3 -X faulthandler -m pytest -q "${args[@]}" $g1 >> "$OUT/diag_1.txt" 2>&1
fi
echo "rc=$?" >> "$OUT/diag_1.txt"
wait
grep -E "passed|failed|rc=|Timeout|SIGSEGV" "$OUT/diag_0.txt" | tail -n 5
grep -E "passed|failed|rc=|SIGSEGV|no gdb" "$OUT/diag_1.txt" | tail -n 5
