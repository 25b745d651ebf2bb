#!/usr/bin/env bash
# One GPU call for the engine issue: thread proofs (8 threads x 100 000 ops, release every ms), the whole
# suite on the cuda backend, and bench_pool on this tree and on a baseline tree (BASE, default .base) in
# the same run, so the no-regression ratio is measured side by side. Logs under $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1 MRKIT_TEST_BACKEND=cuda MRKIT_REQUIRE_GPU=1 HYPOTHESIS_PROFILE=${HYPOTHESIS_PROFILE:-dev}
BASE=${BASE:-.base}
nvidia-smi -L > "$OUT/info.txt" 2>&1
PYTHONPATH=$PWD timeout ${THREAD_BUDGET:-240} python3 -X faulthandler -m pytest -q -p no:cacheprovider -rxs \
  tests/test_threads.py > "$OUT/threads.txt" 2>&1
tail -4 "$OUT/threads.txt"
PYTHONPATH=$PWD MRKIT_THREAD_OPS=2000 timeout ${TEST_BUDGET:-240} python3 -X faulthandler -m pytest -q -p no:cacheprovider \
  --timeout=90 -rxs tests/ > "$OUT/pytest.txt" 2>&1
tail -6 "$OUT/pytest.txt"
for round in 1 2; do
  PYTHONPATH=$PWD timeout ${BENCH_BUDGET:-100} python3 benchmarks/bench_pool.py --quick > "$OUT/bench_new_$round.txt" 2>&1
  PYTHONPATH=$PWD/$BASE timeout ${BENCH_BUDGET:-100} python3 benchmarks/bench_pool.py --quick > "$OUT/bench_base_$round.txt" 2>&1
done
grep -i -A12 "allocator" "$OUT/bench_new_2.txt" | head -14; grep -i -A12 "allocator" "$OUT/bench_base_2.txt" | head -14
