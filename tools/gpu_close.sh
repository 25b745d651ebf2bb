#!/usr/bin/env bash
# A session's closing GPU call within a short budget: the whole suite on the cuda backend (compiled core,
# tools/gpu_third.sh), the engine's and the GPU's tests on the Python build, then issue 33's figures:
# bench_workload's VMM rows (default, footprint_limit=1.1, PyTorch's expandable segments) under both rules,
# and with OLD=<tree> the limited VMM of that tree under RMM's rules beside it. Everything in $OUT/results.tgz.
set -uo pipefail
export PYTHONUNBUFFERED=1 OPENBLAS_NUM_THREADS=1
R=$(mktemp -d)
pack() { tar czf "$OUT/results.tgz" -C "$R" .; }
OUT=$R BENCH=0 bash tools/gpu_third.sh > "$R/third.txt" 2>&1; pack
bash tools/gpu_python_suite.sh > "$R/python_suite.txt" 2>&1; pack
ONLY="${ONLY:-mrkit vmm footprint_limit=1.1,mrkit vmm,torch expandable segments}"
for rules in ${RULES:-rmm bench}; do
  PYTHONPATH=$PWD timeout ${WL_TIME:-100} python3 benchmarks/bench_workload.py --rules $rules --ops 1000 --timeout 30 \
    --no-fragmentation --only "$ONLY" --json "$R/workload_$rules.json" > "$R/workload_$rules.txt" 2>&1; pack
done
if [ -n "${OLD:-}" ]; then
  cp mrkit/_engine/_hotc*.so "$OLD/mrkit/_engine/" 2>/dev/null  # the compiled core is the same source in both trees
  (cd "$OLD" && PYTHONPATH=$PWD timeout ${OLD_TIME:-60} python3 benchmarks/bench_workload.py --rules rmm --ops 1000 --timeout 30 \
    --no-fragmentation --only "mrkit vmm footprint_limit=1.1" --json "$R/workload_rmm_old.json") > "$R/workload_rmm_old.txt" 2>&1; pack
fi
{ tail -n 3 "$R/pytest.txt"; tail -n 1 "$R/python_suite.txt"; grep -h "^|" "$R"/workload_*.txt; } | tee "$R/summary.txt"; pack
