#!/usr/bin/env bash
# One batched GPU call for everything: the thread proof, the whole suite on the cuda backend (PyTorch,
# Dask/dask-cuda and CuPy tests included; wheels for dask/distributed/dask-cuda carried in .wheels),
# the kit under its `gpu` profile in parallel shards meanwhile, then the benchmarks. At most 8 files
# land in $OUT: threads.txt pytest.txt kit.txt workload.json workload.png torch.json bench.txt.
set -uo pipefail
export PYTHONUNBUFFERED=1 MRKIT_TEST_BACKEND=cuda MRKIT_REQUIRE_GPU=1
T0=$SECONDS
{ nvidia-smi -L; python3 --version; } > "$OUT/bench.txt" 2>&1
if [ -d .wheels ]; then
  python3 -m pip install -q --no-deps --no-index --target /tmp/dk .wheels/*.whl >> "$OUT/bench.txt" 2>&1
fi
export PYTHONPATH=$PWD:/tmp/dk
# the kit under `gpu`, in the background
python3 -m pytest -q -p no:cacheprovider --collect-only -k "state_machine and not rejects" tests/test_kit.py | grep '::' > /tmp/kit_ids.txt
SHARDS=${KIT_SHARDS:-8}
[ "$SHARDS" -gt 0 ] && for i in $(seq 0 $((SHARDS - 1))); do
  awk -v n="$SHARDS" -v i="$i" 'NR % n == i' /tmp/kit_ids.txt > /tmp/kit_shard_$i.txt
  (HYPOTHESIS_PROFILE=gpu timeout ${KIT_BUDGET:-240} xargs -d '\n' -a /tmp/kit_shard_$i.txt \
    python3 -X faulthandler -m pytest -q -p no:cacheprovider > /tmp/kit_$i.txt 2>&1) &
done
[ "${THREADS:-1}" = 1 ] && HYPOTHESIS_PROFILE=dev timeout ${THREAD_BUDGET:-100} python3 -X faulthandler -m pytest -q -p no:cacheprovider -rxs \
  tests/test_threads.py -k gpu > "$OUT/threads.txt" 2>&1
[ -f "$OUT/threads.txt" ] && tail -1 "$OUT/threads.txt"
# the suite: the GPU-integration files each in a process of its own (-v: a crash names its test)
INTEG=${INTEG:-"tests/test_gpu_integrations.py tests/test_gpu_torch.py tests/test_gpu_dask.py tests/test_examples.py"}
IGN=""; for f in $INTEG; do IGN="$IGN --ignore=$f"; done
[ "${SUITE:-1}" = 1 ] && HYPOTHESIS_PROFILE=dev MRKIT_THREAD_OPS=2000 timeout ${TEST_BUDGET:-280} python3 -X faulthandler -m pytest -q \
  -p no:cacheprovider --timeout=150 -rxs --ignore=tests/test_mutations.py $IGN \
  --deselect tests/test_threads.py::test_eight_threads_with_release_every_millisecond_on_the_gpu \
  tests/ > "$OUT/pytest.txt" 2>&1 &
for f in $INTEG; do
  echo "=== $f" >> /tmp/integ.txt
  HYPOTHESIS_PROFILE=dev timeout ${INTEG_BUDGET:-200} python3 -X faulthandler -m pytest -v -p no:cacheprovider \
    --timeout=170 -rxs --tb=short $f 2>&1 | grep -v "^Extension modules" >> /tmp/integ.txt
done
wait
[ "$SHARDS" -gt 0 ] && for i in $(seq 0 $((SHARDS - 1))); do cat /tmp/kit_$i.txt; done > "$OUT/kit.txt"
touch "$OUT/pytest.txt"; cat /tmp/integ.txt >> "$OUT/pytest.txt"
grep -E "^(FAILED|ERROR)|PASSED|FAILED|SKIPPED| passed| failed|Fatal" "$OUT/pytest.txt" | grep -v "^tests/.*PASSED" | tail -30
grep -E "^(FAILED|ERROR)" "$OUT/kit.txt" | head; grep -E " in [0-9.]+s" "$OUT/kit.txt"
echo "tests done at $((SECONDS - T0)) s"
# benchmarks, each with its own time limit
if [ "${TORCH_BENCH:-1}" = 1 ]; then
  echo "== bench_torch_training" >> "$OUT/bench.txt"
  timeout ${TORCH_BUDGET:-150} python3 benchmarks/bench_torch_training.py --steps ${TORCH_STEPS:-10} \
    --json "$OUT/torch.json" >> "$OUT/bench.txt" 2>&1
  echo "torch bench done at $((SECONDS - T0)) s"
fi
LEFT=$(( ${TOTAL_BUDGET:-570} - (SECONDS - T0) ))
[ "${WORKLOAD:-1}" = 1 ] && timeout $(( LEFT > 100 ? LEFT - ${BENCH_SLACK:-40} : LEFT / 2 )) python3 benchmarks/bench_workload.py --ops ${OPS:-2000} --timeout ${CASE_TIMEOUT:-60} --repeat ${REPEAT:-1} ${WORKLOAD_ONLY:+--only "$WORKLOAD_ONLY"} \
  --json "$OUT/workload.json" --plot "$OUT/workload.png" >> "$OUT/bench.txt" 2>/tmp/workload.err
cat /tmp/workload.err >> "$OUT/bench.txt"  # one JSON line per case, even if the run was cut short
[ "${SMALL_BENCH:-1}" = 1 ] || { echo "all done at $((SECONDS - T0)) s" | tee -a "$OUT/bench.txt"; exit 0; }
echo "== mrkit bench" >> "$OUT/bench.txt"
timeout 60 python3 -m mrkit bench --quiet --rounds 3 --ops 20000 >> "$OUT/bench.txt" 2>&1
timeout 30 python3 -m mrkit bench --quiet --rounds 3 --ops 20000 --resource vmm --workload pairs --workload batch --workload random >> "$OUT/bench.txt" 2>&1
echo "== bench_python_floor" >> "$OUT/bench.txt"
timeout 40 python3 benchmarks/bench_python_floor.py --rounds 5 >> "$OUT/bench.txt" 2>&1
timeout 40 python3 benchmarks/bench_python_floor.py --rounds 5 --max-size 64MiB >> "$OUT/bench.txt" 2>&1
echo "== bench_statistics" >> "$OUT/bench.txt"
timeout 25 python3 benchmarks/bench_statistics.py --pairs 50000 --rounds 3 >> "$OUT/bench.txt" 2>&1
echo "all done at $((SECONDS - T0)) s" | tee -a "$OUT/bench.txt"
