#!/usr/bin/env bash
# One GPU call: the whole suite on the cuda backend, compiled (tools/gpu_split_suite.sh), the Python
# build's engine and GPU tests (tools/gpu_python_suite.sh), then an A/B of this tree against an earlier
# one (OLD, a git archive carried under .scratch), in turn, this tree's scripts for both:
#   AB_BENCH=route (default): `cupy.empty` through mrkit, bench_cupy_route.py --rounds 2, AB_ROUNDS times;
#   AB_BENCH=core: bench_core.py --quick --rounds 3 (compiled, AB_ROUNDS times), then this tree's
#     Python build once (this tree alone when OLD is unset).
# PROBE=1 ends with tools/probe_py_batch.py (the Python build's cupy.empty batch round by round, misses
# and collections counted). Summaries in $OUT/*.txt; SUITE_TIME, PY_TIME, AB_TIME, PROBE_TIME (seconds).
set -uo pipefail
export PYTHONUNBUFFERED=1 OPENBLAS_NUM_THREADS=1
SUITE_TIME=${SUITE_TIME:-250} bash tools/gpu_split_suite.sh
PYTHONPATH=$PWD PY_TIME=${PY_TIME:-80} bash tools/gpu_python_suite.sh > "$OUT/py.txt" 2>&1
tail -n 1 "$OUT/py.txt"
bench() {  # label, tree, extra env
  echo "== $1" >> "$OUT/ab.txt"
  if [ "${AB_BENCH:-route}" = core ]; then
    env PYTHONPATH=$2 ${3:-} timeout ${AB_TIME:-45} python3 $PWD/benchmarks/bench_core.py --quick --rounds 3 2>&1 \
      | grep -E "^core:|x$" >> "$OUT/ab.txt"
  else
    PYTHONPATH=$2 timeout ${AB_TIME:-60} python3 $PWD/benchmarks/bench_cupy_route.py --rounds 2 >> "$OUT/ab.txt" 2>&1
  fi
}
if [ -n "${OLD:-}" ]; then
  (cd "$OLD" && timeout 90 python3 setup.py build_ext --inplace > /tmp/old_build.txt 2>&1); echo "old build rc=$?" >> "$OUT/build.txt"
  for k in $(seq ${AB_ROUNDS:-2}); do bench "old $k" $PWD/$OLD; bench "new $k" $PWD; done
elif [ "${AB_BENCH:-route}" = core ]; then
  bench "new" $PWD
fi
[ "${AB_BENCH:-route}" = core ] && bench "new python" $PWD MRKIT_NO_EXTENSIONS=1
grep -E "^==|^core:|x$|mrkit|cupy pool|floor \(C hook\)" "$OUT/ab.txt"
if [ "${PROBE:-0}" = 1 ]; then
  MRKIT_NO_EXTENSIONS=1 PYTHONPATH=$PWD timeout ${PROBE_TIME:-40} python3 tools/probe_py_batch.py > "$OUT/pybatch.txt" 2>&1
  head -n 30 "$OUT/pybatch.txt"
fi
