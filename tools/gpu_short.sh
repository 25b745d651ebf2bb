#!/usr/bin/env bash
# A short GPU call when device time is scarce: build the compiled core in place; the GPU integration
# tests (CuPy, PyTorch); bench_core on both builds; RMM's workload for the pool beside CuPy's pool.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
timeout 40 env MRKIT_BUILD_INPLACE=1 python3 setup.py > "$OUT/build.txt" 2>&1; echo "build rc=$?" >> "$OUT/build.txt"
MRKIT_TEST_BACKEND=cuda MRKIT_REQUIRE_GPU=1 HYPOTHESIS_PROFILE=dev timeout ${INTEG_TIME:-120} python3 -X faulthandler -m pytest -q \
  -p no:cacheprovider -rxs ${INTEG:-tests/test_gpu_integrations.py tests/test_gpu_torch.py} > "$OUT/integ.txt" 2>&1
timeout ${BENCH_TIME:-90} python3 benchmarks/bench_core.py --quick --rounds 3 --json "$OUT/bench_compiled.json" > "$OUT/bench_compiled.txt" 2>&1
MRKIT_NO_EXTENSIONS=1 timeout ${BENCH_TIME:-90} python3 benchmarks/bench_core.py --quick --rounds 3 --json "$OUT/bench_python.json" > "$OUT/bench_python.txt" 2>&1
timeout ${WORKLOAD_TIME:-90} python3 benchmarks/bench_workload.py --ops 1000 --timeout 25 --no-fragmentation \
  --only "${WORKLOAD:-mrkit pool,cupy MemoryPool}" --json "$OUT/workload.json" > "$OUT/workload.txt" 2>&1
tail -n 3 "$OUT/integ.txt"; tail -n 12 "$OUT"/bench_*.txt; grep "^|" "$OUT/workload.txt"; tail -n 1 "$OUT/build.txt"
