#!/usr/bin/env bash
# One GPU call of a session: torch probes, then the suite on the cuda backend, then the GPU files.
set -uo pipefail
export PYTHONUNBUFFERED=1 MRKIT_TEST_BACKEND=cuda MRKIT_REQUIRE_GPU=1 PYTHONPATH=$PWD
{ nvidia-smi -L; python3 --version; } > "$OUT/probe.txt" 2>&1
for c in ${PROBES:-names install_now routed limit_retry}; do
  echo "== $c" >> "$OUT/probe.txt"; timeout 60 python3 tools/probe_torch.py $c >> "$OUT/probe.txt" 2>&1; echo "rc=$?" >> "$OUT/probe.txt"
done
[ "${SUITE:-1}" = 1 ] && HYPOTHESIS_PROFILE=dev timeout ${TEST_BUDGET:-300} python3 -X faulthandler -m pytest -q -p no:cacheprovider -rxs \
  --ignore=tests/test_mutations.py --ignore=tests/test_gpu_integrations.py --ignore=tests/test_gpu_torch.py \
  --ignore=tests/test_gpu_dask.py --ignore=tests/test_examples.py \
  --deselect tests/test_threads.py::test_eight_threads_with_release_every_millisecond_on_the_gpu \
  tests/ > "$OUT/pytest.txt" 2>&1 &
for f in ${INTEG:-tests/test_gpu_integrations.py tests/test_gpu_torch.py tests/test_gpu_dask.py tests/test_examples.py}; do
  echo "=== $f" >> "$OUT/integ.txt"
  HYPOTHESIS_PROFILE=dev timeout 200 python3 -X faulthandler -m pytest -q -p no:cacheprovider -rxs --tb=short $f >> "$OUT/integ.txt" 2>&1
done
wait
tail -3 "$OUT/pytest.txt"; grep -E "passed|failed|^=== " "$OUT/integ.txt"; cat "$OUT/probe.txt"
