#!/usr/bin/env bash
# One batched GPU call: the whole suite on the cuda backend (GPU tests required, not skipped; the
# simulator-only mutation suite left to CI), the kit under its `gpu` profile, the thread proof at full
# size (8 threads x 100 000 operations, release every millisecond), and bench_pool alternating this
# tree and a baseline tree (BASE, default .base) ROUNDS times. Everything lands under $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1 MRKIT_TEST_BACKEND=cuda MRKIT_REQUIRE_GPU=1
BASE=${BASE:-.base}
nvidia-smi -L > "$OUT/info.txt" 2>&1
PYTHONPATH=$PWD HYPOTHESIS_PROFILE=dev timeout ${THREAD_BUDGET:-150} python3 -X faulthandler -m pytest -q -p no:cacheprovider -rxs \
  tests/test_threads.py -k gpu > "$OUT/threads.txt" 2>&1
tail -1 "$OUT/threads.txt"
PYTHONPATH=$PWD HYPOTHESIS_PROFILE=dev MRKIT_THREAD_OPS=2000 timeout ${TEST_BUDGET:-240} python3 -X faulthandler -m pytest -q \
  -p no:cacheprovider --timeout=120 -rxs --ignore=tests/test_mutations.py --deselect tests/test_threads.py::test_eight_threads_with_release_every_millisecond_on_the_gpu \
  ${TESTS:-tests/} > "$OUT/pytest.txt" 2>&1
grep -E "^(FAILED|ERROR)" "$OUT/pytest.txt" | head -20; tail -1 "$OUT/pytest.txt"
# The kit under `gpu`, its state machines split over KIT_SHARDS processes (the machine has 16 cores).
PYTHONPATH=$PWD python3 -m pytest -q -p no:cacheprovider --collect-only -k "state_machine and not rejects" tests/test_kit.py \
  | grep '::' > "$OUT/kit_ids.txt"
SHARDS=${KIT_SHARDS:-8}
for i in $(seq 0 $((SHARDS - 1))); do
  awk -v n="$SHARDS" -v i="$i" 'NR % n == i' "$OUT/kit_ids.txt" > "$OUT/kit_shard_$i.txt"
  [ -s "$OUT/kit_shard_$i.txt" ] || continue
  (PYTHONPATH=$PWD HYPOTHESIS_PROFILE=gpu timeout ${KIT_BUDGET:-200} xargs -d '\n' -a "$OUT/kit_shard_$i.txt" \
    python3 -X faulthandler -m pytest -q -p no:cacheprovider > "$OUT/kit_gpu_$i.txt" 2>&1) &
done
wait
cat "$OUT"/kit_gpu_*.txt > "$OUT/kit_gpu.txt"; rm -f "$OUT"/kit_gpu_*.txt "$OUT"/kit_shard_*.txt "$OUT/kit_ids.txt"
grep -E "^(FAILED|ERROR)" "$OUT/kit_gpu.txt" | head; grep -E "passed|failed|error" "$OUT/kit_gpu.txt" | grep " in " 
if [ "${ROUNDS:-0}" -gt 0 ] && [ -d "$BASE" ]; then
  for round in $(seq 1 "$ROUNDS"); do
    PYTHONPATH=$PWD timeout ${BENCH_BUDGET:-60} python3 benchmarks/bench_pool.py --quick --rounds 2 --json "$OUT/bench_new_$round.json" > "$OUT/bench_new_$round.txt" 2>&1
    PYTHONPATH=$PWD/$BASE timeout ${BENCH_BUDGET:-60} python3 benchmarks/bench_pool.py --quick --rounds 2 --json "$OUT/bench_base_$round.json" > "$OUT/bench_base_$round.txt" 2>&1
  done
  grep -h "mrkit pool / cupy MemoryPool" "$OUT"/bench_*.txt
fi
