#!/usr/bin/env bash
# A mid-session GPU call: build in place; PyTorch's GPU cases; CuPy's own tests with mrkit as the
# allocator on both builds (unraisable count); where cupy.empty's time goes (bench_cupy_route);
# the VMM rows of RMM's workload (bench_workload) and its driver calls (bench_vmm_calls --fresh).
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
timeout 60 env MRKIT_BUILD_INPLACE=1 python3 setup.py > "$OUT/build.txt" 2>&1; echo "build rc=$?" >> "$OUT/build.txt"
MRKIT_TEST_BACKEND=cuda MRKIT_REQUIRE_GPU=1 timeout ${TORCH_TIME:-150} python3 -X faulthandler -m pytest -q -p no:cacheprovider -rfExs \
  ${TORCH_TESTS:-tests/test_gpu_torch.py tests/test_torch_hooks.py} > "$OUT/torch.txt" 2>&1; echo "rc=$?" >> "$OUT/torch.txt"
timeout 60 python3 benchmarks/bench_cupy_route.py > "$OUT/route.txt" 2>&1
MRKIT_NO_EXTENSIONS=1 timeout 60 python3 benchmarks/bench_cupy_route.py >> "$OUT/route.txt" 2>&1
timeout 30 python3 tools/probe_random.py pool > "$OUT/probe.txt" 2>&1
CUPY_DIRS="${CUPY_TESTS:-cuda_tests/test_memory.py}" CUPY_TIME=${CUPY_TIME:-100} bash tools/gpu_cupy_broad.sh > /dev/null
timeout 40 python3 benchmarks/bench_core.py --quick --rounds 3 > "$OUT/bench_compiled.txt" 2>&1
MRKIT_NO_EXTENSIONS=1 timeout 40 python3 benchmarks/bench_core.py --quick --rounds 3 > "$OUT/bench_python.txt" 2>&1
[ -n "${WORKLOAD:-}" ] && timeout ${WORKLOAD_TIME:-150} python3 benchmarks/bench_workload.py --ops 1000 --timeout 40 \
  --no-fragmentation --only "$WORKLOAD" --json /tmp/workload.json > /tmp/workload.txt 2>&1
[ -n "${RMM_WORKLOAD:-}" ] && MRKIT_BENCH_RULES=rmm timeout ${RMM_WORKLOAD_TIME:-80} python3 benchmarks/bench_workload.py --ops 1000 --timeout 40 \
  --no-fragmentation --only "$RMM_WORKLOAD" > /tmp/workload_rmm.txt 2>&1
head -n 30 "$OUT/probe.txt"; tail -n 4 "$OUT/torch.txt"; grep -E "us\"|ratio|: [0-9]" "$OUT/route.txt" | head -40
for f in "$OUT"/cupy_*.txt; do echo "== $f"; grep -E "passed|failed|mrkit-cupy|^rc=" $f | tail -n 3; done
tail -n 10 "$OUT"/bench_*.txt; grep "^|" /tmp/workload.txt 2>/dev/null; echo "RMM rules:"; grep "^|" /tmp/workload_rmm.txt 2>/dev/null; tail -n 1 "$OUT/build.txt"
