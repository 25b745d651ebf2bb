#!/usr/bin/env bash
# One GPU call: the whole suite on the cuda backend, compiled (tools/gpu_split_suite.sh), the Python
# build's engine and GPU tests (tools/gpu_python_suite.sh), then an A/B of this tree against an earlier
# one (OLD, a git archive carried under .scratch), in turn, this tree's scripts for both:
#   AB_BENCH=route (default): `cupy.empty` through mrkit, bench_cupy_route.py --rounds 2, AB_ROUNDS times;
#   AB_BENCH=core: bench_core.py --quick --rounds 3 (compiled, AB_ROUNDS times), then this tree's
#     Python build once (this tree alone when OLD is unset).
# PROBE=1 ends with tools/probe_py_batch.py (the Python build's cupy.empty batch round by round, misses
# and collections counted). NO_SUITE=1 skips both suites; OLD_SCRIPTS=1 runs OLD's own benchmark
# scripts for OLD (an A/B of the benchmarks themselves, the engine alike). WORKLOAD=1 adds
# bench_workload.py's pool and CuPy rows (three ranges, fresh processes; OLD's too, with OLD's script). Summaries in $OUT/*.txt;
# SUITE_TIME, PY_TIME, AB_TIME, PROBE_TIME (seconds); CORE_ARGS (bench_core.py's, default --quick --rounds 3),
# WORKLOAD_ARGS (bench_workload.py's, default --ops 1000 --timeout 20).
set -uo pipefail
export PYTHONUNBUFFERED=1 OPENBLAS_NUM_THREADS=1
if [ "${NO_SUITE:-0}" != 1 ]; then
  SUITE_TIME=${SUITE_TIME:-250} bash tools/gpu_split_suite.sh
  PYTHONPATH=$PWD PY_TIME=${PY_TIME:-80} bash tools/gpu_python_suite.sh > "$OUT/py.txt" 2>&1
  tail -n 1 "$OUT/py.txt"
else
  timeout 60 env MRKIT_BUILD_INPLACE=1 python3 setup.py > "$OUT/build.txt" 2>&1; echo "build rc=$?" >> "$OUT/build.txt"
fi
bench() {  # label, tree, extra env, scripts' tree (default: this one)
  echo "== $1" >> "$OUT/ab.txt"
  if [ "${AB_BENCH:-route}" = core ]; then
    env PYTHONPATH=$2 ${3:-} timeout ${AB_TIME:-45} python3 ${4:-$PWD}/benchmarks/bench_core.py ${CORE_ARGS:---quick --rounds 3} 2>&1 \
      | grep -E "^core:|x$" >> "$OUT/ab.txt"
  else
    PYTHONPATH=$2 timeout ${AB_TIME:-60} python3 ${4:-$PWD}/benchmarks/bench_cupy_route.py --rounds 2 >> "$OUT/ab.txt" 2>&1
  fi
}
if [ -n "${OLD:-}" ]; then
  (cd "$OLD" && timeout 90 python3 setup.py build_ext --inplace > /tmp/old_build.txt 2>&1); echo "old build rc=$?" >> "$OUT/build.txt"
  olds=$PWD; [ "${OLD_SCRIPTS:-0}" = 1 ] && olds=$PWD/$OLD
  for k in $(seq ${AB_ROUNDS:-2}); do bench "old $k" $PWD/$OLD "" $olds; bench "new $k" $PWD; done
elif [ "${AB_BENCH:-route}" = core ]; then
  bench "new" $PWD
fi
[ "${AB_BENCH:-route}" = core ] && bench "new python" $PWD MRKIT_NO_EXTENSIONS=1
grep -E "^==|^core:|x$|mrkit|cupy pool|floor \(C hook\)" "$OUT/ab.txt"
if [ "${PROBE:-0}" = 1 ]; then
  MRKIT_NO_EXTENSIONS=1 PYTHONPATH=$PWD timeout ${PROBE_TIME:-40} python3 tools/probe_py_batch.py > "$OUT/pybatch.txt" 2>&1
  head -n 30 "$OUT/pybatch.txt"
fi
if [ "${WORKLOAD:-0}" = 1 ]; then
  PYTHONPATH=$PWD timeout ${WORKLOAD_TIME:-150} python3 benchmarks/bench_workload.py ${WORKLOAD_ARGS:---ops 1000 --timeout 20} \
    --no-fragmentation --only "mrkit pool,cupy MemoryPool" --json "$OUT/workload.json" > "$OUT/workload.txt" 2>&1
  tail -n 12 "$OUT/workload.txt"
  if [ -n "${OLD:-}" ]; then  # the earlier tree's pool beside CuPy, its own script
    PYTHONPATH=$PWD/$OLD timeout ${WORKLOAD_TIME:-150} python3 $OLD/benchmarks/bench_workload.py ${WORKLOAD_ARGS:---ops 1000 --timeout 20} \
      --no-fragmentation --only "mrkit pool,cupy MemoryPool" --json "$OUT/workload_old.json" > "$OUT/workload_old.txt" 2>&1
    tail -n 12 "$OUT/workload_old.txt"
  fi
fi
