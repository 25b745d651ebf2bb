#!/usr/bin/env bash
# No-regression A/B on one machine: bench_core (both builds) and the pool's RMM workload for this tree
# and for an earlier one (OLD, a git archive carried under .scratch), old and new interleaved; both trees
# run this tree's benchmark scripts (the same measurement), each importing its own mrkit.
set -uo pipefail
export PYTHONUNBUFFERED=1 OPENBLAS_NUM_THREADS=1
OLD=${OLD:-.scratch/oldf2}
nvidia-smi -L > "$OUT/ab.txt" 2>&1; which g++ >> "$OUT/ab.txt" 2>&1
timeout 90 env MRKIT_BUILD_INPLACE=1 python3 setup.py > "$OUT/build.txt" 2>&1; echo "build rc=$?" >> "$OUT/build.txt"
(cd $OLD && timeout 90 python3 setup.py build_ext --inplace > /tmp/old_build.txt 2>&1); echo "old build rc=$?" >> "$OUT/build.txt"
bench() {  # label, PYTHONPATH, extra env
  echo "== $1" >> "$OUT/ab.txt"
  env PYTHONPATH=$2 ${3:-} timeout 45 python3 $PWD/benchmarks/bench_core.py --quick --rounds 3 2>&1 | grep -E "^core:|x$" >> "$OUT/ab.txt"
}
for k in $(seq ${ROUNDS:-2}); do bench "old compiled $k" $OLD; bench "new compiled $k" $PWD; done
for k in $(seq ${PY_ROUNDS:-1}); do bench "old python $k" $OLD MRKIT_NO_EXTENSIONS=1; bench "new python $k" $PWD MRKIT_NO_EXTENSIONS=1; done
[ "${WORKLOAD:-1}" = 0 ] && { cat "$OUT/ab.txt"; exit 0; }
for who in new old; do
  P=$PWD; [ $who = old ] && P=$OLD
  ONLY="mrkit pool,cupy MemoryPool"; [ $who = old ] && ONLY="mrkit pool"
  echo "== workload $who" >> "$OUT/ab.txt"
  PYTHONPATH=$P timeout ${WORKLOAD_TIME:-70} python3 $P/benchmarks/bench_workload.py --ops 1000 --timeout 20 \
    --no-fragmentation --only "$ONLY" > /tmp/w.txt 2>&1; grep "^|" /tmp/w.txt >> "$OUT/ab.txt"
done
cat "$OUT/ab.txt"; cat "$OUT/build.txt"
