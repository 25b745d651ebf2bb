#!/usr/bin/env bash
# One GPU call: the whole suite on the cuda backend, the benchmarks, mrkit info/demo. Logs under $OUT.
set -uo pipefail
if ls .whl/*.whl >/dev/null 2>&1; then  # RMM wheels from tools/fetch_rmm_wheels.sh, for the peer columns
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 MRKIT_TEST_BACKEND=cuda MRKIT_REQUIRE_GPU=1 HYPOTHESIS_PROFILE=${HYPOTHESIS_PROFILE:-dev}
python3 -m mrkit info > "$OUT/info.txt" 2>&1
timeout 60 python3 -m mrkit demo >> "$OUT/info.txt" 2>&1
timeout ${TEST_BUDGET:-300} python3 -X faulthandler -m pytest -q -p no:cacheprovider --timeout=90 -rxs tests/ > "$OUT/pytest.txt" 2>&1
tail -25 "$OUT/pytest.txt"
timeout ${BENCH_BUDGET:-200} python3 benchmarks/bench_pool.py ${BENCH_ARGS:-} --json "$OUT/bench.json" > "$OUT/bench.txt" 2>&1
tail -20 "$OUT/bench.txt"
timeout ${CUPY_BUDGET:-90} python3 benchmarks/bench_cupy.py > "$OUT/bench_cupy.txt" 2>&1
tail -8 "$OUT/bench_cupy.txt"
if [ -n "${PROBE:-}" ]; then timeout 90 python3 tools/probe_cupy.py > "$OUT/probe_cupy.txt" 2>&1; head -12 "$OUT/probe_cupy.txt"; fi
timeout ${VMM_BUDGET:-150} python3 benchmarks/bench_vmm.py > "$OUT/bench_vmm.txt" 2>&1
tail -22 "$OUT/bench_vmm.txt"
