#!/usr/bin/env bash
# One GPU call of at most ~560 s for a session with little device time: the compiled core built in
# place; the whole GPU suite on it in two pytest processes at once, beside the Python build's engine
# and GPU tests (SUITE_TIME each); then bench_core.py for an earlier tree (OLD, a git archive carried
# under .scratch, built there) and this one in turn, AB_ROUNDS turns (CORE_ARGS, default --quick
# --rounds 3; AB_TIME each), and this tree's Python build once. Summaries on stdout, details in $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1 OPENBLAS_NUM_THREADS=1
timeout 60 env MRKIT_BUILD_INPLACE=1 python3 setup.py > "$OUT/build.txt" 2>&1; echo "build rc=$?" >> "$OUT/build.txt"
if [ -n "${OLD:-}" ]; then
  (cd "$OLD" && timeout 90 env MRKIT_BUILD_INPLACE=1 python3 setup.py > "$OUT/old_build.txt" 2>&1); echo "old build rc=$?" >> "$OUT/build.txt"
fi
tail -n 2 "$OUT/build.txt"
if [ "${NO_SUITE:-0}" != 1 ]; then
  g0=$(bash tools/suite_group.sh 0); g1=$(bash tools/suite_group.sh 1)
  desel=(--deselect tests/test_threads.py::test_eight_threads_with_release_every_millisecond_on_the_gpu)
  export MRKIT_TEST_BACKEND=cuda MRKIT_REQUIRE_GPU=1 HYPOTHESIS_PROFILE=dev
  ( PYTHONPATH=$PWD timeout ${SUITE_TIME:-270} python3 -X faulthandler -m pytest -q -p no:cacheprovider -rfE "${desel[@]}" $g1 \
      > "$OUT/g1.txt" 2>&1; echo "rc=$?" >> "$OUT/g1.txt" ) &
  ( PYTHONPATH=$PWD timeout ${SUITE_TIME:-270} python3 -X faulthandler -m pytest -q -p no:cacheprovider -rfE "${desel[@]}" $g0 \
      "tests/test_examples.py::test_example_runs[18_torch_under_a_limit.py]" > "$OUT/g0.txt" 2>&1; echo "rc=$?" >> "$OUT/g0.txt" ) &
  ( PY_TIME=${SUITE_TIME:-270} bash tools/gpu_python_suite.sh > "$OUT/py.txt" 2>&1; echo "rc=$?" >> "$OUT/py.txt" ) &
  wait
  for f in "$OUT/g0.txt" "$OUT/g1.txt" "$OUT/py.txt"; do echo "$(basename $f): $(grep -E 'passed|failed' $f | tail -n 1) $(tail -n 1 $f)"; done
  grep -l "Fatal Python error" "$OUT"/*.txt
  unset MRKIT_TEST_BACKEND MRKIT_REQUIRE_GPU
fi
bench() {  # label, tree, extra env
  echo "== $1" >> "$OUT/ab.txt"
  env PYTHONPATH=$2 ${3:-} timeout ${AB_TIME:-45} python3 $PWD/benchmarks/bench_core.py ${CORE_ARGS:---quick --rounds 3} \
    --json "$OUT/core_${1// /_}.json" 2>&1 | grep -E "^core:|x$" >> "$OUT/ab.txt"
}
for k in $(seq ${AB_ROUNDS:-2}); do
  [ -n "${OLD:-}" ] && bench "old $k" $PWD/$OLD
  bench "new $k" $PWD
done
bench "new python" $PWD MRKIT_NO_EXTENSIONS=1
cat "$OUT/ab.txt"
