#!/usr/bin/env bash
# One GPU call: gpu_session12.sh (the compiled and Python suites, SUITE_TIME each), then the tests of
# sessions 15-18 (release under threads, copy/pickle/drop, dropped resources, with blocks, closed
# streams) in both builds.
set -uo pipefail
AB_ROUNDS=${AB_ROUNDS:-0} AB_TIME=${AB_TIME:-20} SUITE_TIME=${SUITE_TIME:-220} bash tools/gpu_session12.sh
t=(tests/test_threads.py::test_eight_threads_with_release_every_millisecond_on_the_gpu
   "tests/test_examples.py::test_example_runs[21_copy_pickle_drop.py]" tests/test_copy.py tests/test_dropped.py
   "tests/test_examples.py::test_example_runs[08_threads_and_release.py]" tests/test_closing.py tests/test_closed_streams.py)
for nx in 0 1; do
  env MRKIT_NO_EXTENSIONS=$([ $nx = 1 ] && echo 1 || echo) MRKIT_TEST_BACKEND=cuda MRKIT_REQUIRE_GPU=1 PYTHONPATH=$PWD \
    timeout 90 python3 -X faulthandler -m pytest -q -p no:cacheprovider -rfE "${t[@]}" > "$OUT/targeted_nx$nx.txt" 2>&1
  echo "targeted NO_EXTENSIONS=$nx rc=$?: $(grep -E 'passed|failed' $OUT/targeted_nx$nx.txt | tail -n 1)"
done
