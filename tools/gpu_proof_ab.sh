#!/usr/bin/env bash
# One GPU call: the whole suite on the cuda backend, compiled (tools/gpu_split_suite.sh), the Python
# build's engine and GPU tests (tools/gpu_python_suite.sh), then `cupy.empty` through mrkit for this tree
# and an earlier one (OLD, a git archive carried under .scratch), in turn (bench_cupy_route.py, this
# tree's script for both). Summaries in $OUT/*.txt; SUITE_TIME, PY_TIME, AB_TIME (seconds), AB_ROUNDS.
set -uo pipefail
export PYTHONUNBUFFERED=1 OPENBLAS_NUM_THREADS=1
SUITE_TIME=${SUITE_TIME:-250} bash tools/gpu_split_suite.sh
PYTHONPATH=$PWD PY_TIME=${PY_TIME:-80} bash tools/gpu_python_suite.sh > "$OUT/py.txt" 2>&1
tail -n 1 "$OUT/py.txt"
[ -n "${OLD:-}" ] || exit 0
(cd "$OLD" && timeout 90 python3 setup.py build_ext --inplace > /tmp/old_build.txt 2>&1); echo "old build rc=$?" >> "$OUT/build.txt"
for k in $(seq ${AB_ROUNDS:-2}); do
  for who in old new; do
    P=$PWD; [ $who = old ] && P=$PWD/$OLD
    echo "== $who $k" >> "$OUT/ab.txt"
    PYTHONPATH=$P timeout ${AB_TIME:-60} python3 benchmarks/bench_cupy_route.py --rounds 2 >> "$OUT/ab.txt" 2>&1
  done
done
grep -E "^==|mrkit|cupy pool|floor \(C hook\)" "$OUT/ab.txt"
