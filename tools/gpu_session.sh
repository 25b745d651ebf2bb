#!/usr/bin/env bash
# A session's closing GPU call: the whole suite on the cuda backend (compiled core; tools/gpu_split_suite.sh,
# two pytest processes at once, TEST_BUDGET seconds each),
# the engine's and the GPU's tests on the Python build, bench_core (CORE_ROUNDS per build in CORES, RMM beside
# it from the carried wheels in .whl), bench_cupy_route, then tools/gpu_ab.sh against OLD (AB=0 skips
# it). Everything lands in $OUT/results.tgz; the summary is printed.
set -uo pipefail
export PYTHONUNBUFFERED=1 OPENBLAS_NUM_THREADS=1
R=$(mktemp -d)
pack() {  # after each stage: the summary so far and every result, in one archive (a run cut short keeps them)
  { for f in "$R"/suite_*.txt; do grep -E "passed|failed|rc=" "$f" | tail -n 2; done; tail -n 1 "$R/python_suite.txt"; grep -H -E "x$" "$R"/core_*.txt; cat "$R/ab.txt"; } \
    > "$R/summary.txt" 2>/dev/null
  tar czf "$OUT/results.tgz" -C "$R" .
}
python3 -m pip install -q --no-deps --no-index --target /tmp/rmmlib .whl/*.whl > "$R/rmm_install.txt" 2>&1
nvidia-smi -L > "$R/info.txt" 2>&1
OUT=$R SUITE_TIME=${TEST_BUDGET:-300} bash tools/gpu_split_suite.sh > "$R/split.txt" 2>&1; pack
bash tools/gpu_python_suite.sh > "$R/python_suite.txt" 2>&1; pack
for k in $(seq ${CORE_ROUNDS:-1}); do
  for core in ${CORES:-0 1}; do
    MRKIT_NO_EXTENSIONS=$core PYTHONPATH=$PWD:/tmp/rmmlib timeout 60 python3 benchmarks/bench_core.py --quick --rounds 3 \
      --json "$R/core_${core}_$k.json" > "$R/core_${core}_$k.txt" 2>&1; pack
  done
done
PYTHONPATH=$PWD timeout 90 python3 benchmarks/bench_cupy_route.py --rounds ${ROUTE_ROUNDS:-5} --json "$R/route.json" \
  > "$R/route.txt" 2>&1; pack
[ "${AB:-1}" = 1 ] && OUT=$R bash tools/gpu_ab.sh > /dev/null 2>&1; pack
cat "$R/summary.txt"
