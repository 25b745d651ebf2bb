#!/usr/bin/env bash
# Issue 33's figures on the GPU: RMM's random workload on the VMM (default and footprint_limit=1.1)
# beside PyTorch's expandable segments, under bench_workload's rules and RMM's (new sizes every timed
# pass), with the driver-call breakdown of the limited VMM at 1 and 4 GiB. Results in $OUT/vmm.tgz.
set -uo pipefail
export PYTHONUNBUFFERED=1 OPENBLAS_NUM_THREADS=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
R=$(mktemp -d)
pack() { tar czf "$OUT/vmm.tgz" -C "$R" .; }
ONLY="mrkit vmm,mrkit vmm footprint_limit=1.1,torch expandable segments"
for rules in bench rmm; do
  timeout ${WL_TIME:-200} python3 benchmarks/bench_workload.py --rules $rules --ops 1000 --timeout 40 --repeat ${REPEAT:-1} \
    --no-fragmentation --only "$ONLY" --json "$R/workload_$rules.json" > "$R/workload_$rules.txt" 2>&1; pack
done
for rules in bench rmm; do
  for m in 1GiB 4GiB; do
    MRKIT_BENCH_RULES=$rules timeout 60 python3 benchmarks/bench_vmm_calls.py --max-size $m --footprint-limit 1.1 \
      --passes 3 --fresh > "$R/calls_${rules}_$m.txt" 2>&1; pack
  done
done
grep "^|" "$R"/workload_*.txt; grep -H "^pass" "$R"/calls_*.txt
