#!/usr/bin/env bash
# Torch's GPU cases (both builds through tests/test_gpu_torch.py) and example 18; the pool pair A/B
# against tree 65b77fa (.scratch/old65, carried; run 22's H200 figures); as much of CuPy's suite as
# fits (compiled build, tools/mrkit_cupy_plugin.py counts unraisable exceptions).
set -uo pipefail
export PYTHONUNBUFFERED=1
timeout 60 env MRKIT_BUILD_INPLACE=1 python3 setup.py > "$OUT/build.txt" 2>&1; echo "build rc=$?" >> "$OUT/build.txt"
(cd .scratch/old65 && timeout 60 python3 setup.py build_ext --inplace > /tmp/old_build.txt 2>&1); echo "old build rc=$?" >> "$OUT/build.txt"
MRKIT_TEST_BACKEND=cuda MRKIT_REQUIRE_GPU=1 PYTHONPATH=$PWD timeout ${TORCH_TIME:-170} python3 -X faulthandler -m pytest -q -p no:cacheprovider -rfExs \
  tests/test_gpu_torch.py tests/test_torch_hooks.py "tests/test_examples.py::test_example_runs[18_torch_under_a_limit.py]" > "$OUT/torch.txt" 2>&1; echo "rc=$?" >> "$OUT/torch.txt"
for k in 1 2 3; do
  PYTHONPATH=.scratch/old65 timeout 40 python3 tools/pair_ab.py >> "$OUT/pair_ab.txt" 2>&1
  PYTHONPATH=$PWD timeout 40 python3 tools/pair_ab.py >> "$OUT/pair_ab.txt" 2>&1
done
PYTHONPATH=$PWD BUILDS=compiled CUPY_TIME=${CUPY_TIME:-150} bash tools/gpu_cupy_broad.sh > /dev/null 2>&1
tail -n 8 "$OUT/torch.txt"; cat "$OUT/pair_ab.txt"; for f in "$OUT"/cupy_*.txt; do echo "== $f"; grep -E "passed|failed|mrkit-cupy|^rc=" $f | tail -n 3; done; cat "$OUT/build.txt"
