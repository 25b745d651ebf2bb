#!/usr/bin/env bash
# One GPU call: build the compiled core in place, probe PyTorch, run GPU tests on both builds, bench.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
{ nvidia-smi -L; python3 --version; python3 -c "import cupy, torch; print('cupy', cupy.__version__, 'torch', torch.__version__)"; } > "$OUT/env.txt" 2>&1
MRKIT_BUILD_INPLACE=1 python3 setup.py > "$OUT/build.txt" 2>&1; echo "build rc=$?" >> "$OUT/build.txt"
python3 -m mrkit info > "$OUT/info.txt" 2>&1
MRKIT_NO_EXTENSIONS=1 python3 -m mrkit info >> "$OUT/info.txt" 2>&1
for c in ${PROBES:-}; do
  echo "== $c" >> "$OUT/probe.txt"; timeout 60 python3 tools/probe_torch.py $c >> "$OUT/probe.txt" 2>&1; echo "rc=$?" >> "$OUT/probe.txt"
done
export MRKIT_TEST_BACKEND=cuda MRKIT_REQUIRE_GPU=1
for build in compiled python; do
  [ $build = python ] && export MRKIT_NO_EXTENSIONS=1
  for f in ${INTEG:-}; do
    echo "=== $build $f" >> "$OUT/integ.txt"
    HYPOTHESIS_PROFILE=dev timeout ${TEST_TIMEOUT:-200} python3 -X faulthandler -m pytest -q -p no:cacheprovider -rxs --tb=short $f >> "$OUT/integ.txt" 2>&1
  done
  [ "${BENCH:-0}" = 1 ] && timeout 240 python3 benchmarks/bench_core.py ${BENCH_ARGS:-} --json "$OUT/bench_$build.json" > "$OUT/bench_$build.txt" 2>&1
done
unset MRKIT_NO_EXTENSIONS
grep -E "passed|failed|^=== " "$OUT/integ.txt" 2>/dev/null; tail -n 12 "$OUT"/bench_*.txt 2>/dev/null; cat "$OUT/probe.txt" 2>/dev/null | head -80; tail -n 3 "$OUT/build.txt"; cat "$OUT/info.txt" | grep core
