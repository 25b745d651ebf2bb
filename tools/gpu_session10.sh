#!/usr/bin/env bash
# Tenth session's closing GPU call (a budget of about 7 minutes): the foreign-stream weak-reference probe;
# the GPU suite's second group (as tools/gpu_split_suite.sh deals it, the group that crashed at exit one
# run in two) COPIES times, the first group once and the Python build's GPU tests, all at once; then
# bench_core.py (compiled, this tree's scripts; with OLD, that tree's own scripts first, for an A/B of
# the benchmarks themselves) and the Python build (BENCH=0: the suites alone). Summaries on stdout, details in $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1 OPENBLAS_NUM_THREADS=1 PYTHONPATH=$PWD
timeout 60 env MRKIT_BUILD_INPLACE=1 python3 setup.py > "$OUT/build.txt" 2>&1; echo "build rc=$?" >> "$OUT/build.txt"
gcc -shared -fPIC -O1 -o "$OUT/libsegv.so" tools/diag/segv_backtrace.c
timeout 60 python3 tools/diag/probe_weakrefs.py > "$OUT/weakrefs.txt" 2>&1; cat "$OUT/weakrefs.txt"
g0=$(bash tools/suite_group.sh 0); g1=$(bash tools/suite_group.sh 1)
desel=(--deselect tests/test_threads.py::test_eight_threads_with_release_every_millisecond_on_the_gpu)
export MRKIT_TEST_BACKEND=cuda MRKIT_REQUIRE_GPU=1 HYPOTHESIS_PROFILE=dev
for k in $(seq ${COPIES:-4}); do
  ( LD_PRELOAD=$OUT/libsegv.so timeout ${SUITE_TIME:-240} python3 -X faulthandler -m pytest -q -p no:cacheprovider "${desel[@]}" $g1 \
      > "$OUT/g1_$k.txt" 2>&1; echo "rc=$?" >> "$OUT/g1_$k.txt" ) &
done
( timeout ${SUITE_TIME:-240} python3 -X faulthandler -m pytest -q -p no:cacheprovider -rfEs "${desel[@]}" $g0 \
    "tests/test_examples.py::test_example_runs[18_torch_under_a_limit.py]" > "$OUT/g0.txt" 2>&1; echo "rc=$?" >> "$OUT/g0.txt" ) &
( PY_TIME=${SUITE_TIME:-240} bash tools/gpu_python_suite.sh > "$OUT/py.txt" 2>&1; echo "rc=$?" >> "$OUT/py.txt" ) &
wait
for f in "$OUT"/g1_*.txt "$OUT/g0.txt" "$OUT/py.txt"; do echo "$(basename $f): $(grep -E 'passed|failed' $f | tail -n 1) $(tail -n 1 $f)"; done
grep -l "Fatal Python error" "$OUT"/*.txt
unset MRKIT_TEST_BACKEND MRKIT_REQUIRE_GPU
[ "${BENCH:-1}" = 0 ] && exit 0
bench() {  # label, scripts' tree, extra env
  echo "== $1" >> "$OUT/bench.txt"
  env ${3:-} timeout ${AB_TIME:-45} python3 $2/benchmarks/bench_core.py --quick --rounds ${ROUNDS:-3} --json "$OUT/core_$1.json" 2>&1 \
    | grep -E "^core:|x$" >> "$OUT/bench.txt"
}
[ -n "${OLD:-}" ] && bench old_scripts "$PWD/$OLD"
bench compiled "$PWD"
bench python "$PWD" MRKIT_NO_EXTENSIONS=1
cat "$OUT/bench.txt"
