#!/usr/bin/env bash
# The whole suite on the GPU (cuda backend, compiled core) in two pytest processes at once, the test
# files dealt alternately (a GPU machine whose host is slow runs the suite in half the time); each
# process's summary line lands in $OUT/suite_{0,1}.txt. SUITE_TIME: seconds for each.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
timeout 60 env MRKIT_BUILD_INPLACE=1 python3 setup.py > "$OUT/build.txt" 2>&1; echo "build rc=$?" >> "$OUT/build.txt"
g0=$(bash tools/suite_group.sh 0); g1=$(bash tools/suite_group.sh 1)
run() {
  MRKIT_TEST_BACKEND=cuda MRKIT_REQUIRE_GPU=1 HYPOTHESIS_PROFILE=dev timeout ${SUITE_TIME:-300} python3 -X faulthandler -m pytest \
    -q -p no:cacheprovider -rfEs --durations=5 \
    --deselect tests/test_threads.py::test_eight_threads_with_release_every_millisecond_on_the_gpu "$@" > "$OUT/suite_$k.txt" 2>&1
  echo "pytest rc=$?" >> "$OUT/suite_$k.txt"
}
k=0 run $g0 "tests/test_examples.py::test_example_runs[18_torch_under_a_limit.py]" & k=1 run $g1 & wait
for k in 0 1; do grep -E "passed|failed|rc=" "$OUT/suite_$k.txt" | tail -n 2; done
