#!/usr/bin/env bash
# The second GPU call of the eighteenth session: the pool-destroy probe, the half of the GPU suite that
# crashed (tools/suite_group.sh 1) on the compiled core (a test running past HANG_S seconds dumps every
# thread's stack; the 15 slowest are listed), then test_closing, test_dropped and test_closed_streams on
# both builds. Run 96 (SUITE_TIME=200, a fresh H100): that half reached about 78 % and ran out of time.
set -uo pipefail
export PYTHONUNBUFFERED=1
timeout 60 env MRKIT_BUILD_INPLACE=1 python3 setup.py > "$OUT/build.txt" 2>&1; echo "build rc=$?"
timeout 100 python3 tools/probe_pool_destroy.py 2>&1 | tee "$OUT/probe.txt"
export MRKIT_TEST_BACKEND=cuda MRKIT_REQUIRE_GPU=1 HYPOTHESIS_PROFILE=dev
PYTHONPATH=$PWD timeout ${SUITE_TIME:-200} python3 -X faulthandler -m pytest -q -p no:cacheprovider -rfE \
  -o faulthandler_timeout=${HANG_S:-60} --durations=15 \
  --deselect tests/test_threads.py::test_eight_threads_with_release_every_millisecond_on_the_gpu \
  $(bash tools/suite_group.sh 1) > "$OUT/g1.txt" 2>&1; echo "g1 rc=$?: $(grep -E 'passed|failed' $OUT/g1.txt | tail -n 1)"
for nx in 0 1; do
  env MRKIT_NO_EXTENSIONS=$([ $nx = 1 ] && echo 1 || echo) PYTHONPATH=$PWD timeout 60 python3 -X faulthandler -m pytest \
    -q -p no:cacheprovider -rfE tests/test_closing.py tests/test_dropped.py tests/test_closed_streams.py > "$OUT/t_nx$nx.txt" 2>&1
  echo "closing+dropped+closed_streams NO_EXTENSIONS=$nx rc=$?: $(grep -E 'passed|failed' $OUT/t_nx$nx.txt | tail -n 1)"
done
