#!/usr/bin/env bash
# Run one group of the GPU suite (as tools/gpu_split_suite.sh deals them; GROUP=0 or 1) COPIES times at
# once, each with a C backtrace on a crash (segv_backtrace.c preloaded), to catch a crash that comes
# now and then (at exit included). $OUT/hunt_<k>.txt; the rc of each copy at the end. VERBOSE=1 runs
# them under PYTHONVERBOSE (at exit Python names each module as it clears it: the last before a crash
# at exit is the one being cleared); MALLOC_DEBUG=1 copies past the first under PYTHONMALLOC=debug.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
timeout 60 env MRKIT_BUILD_INPLACE=1 python3 setup.py > "$OUT/build.txt" 2>&1; echo "build rc=$?" >> "$OUT/build.txt"
gcc -shared -fPIC -O1 -o "$OUT/libsegv.so" tools/diag/segv_backtrace.c || exit 1
files=$(ls tests/test_*.py | grep -v -e test_mutations.py -e test_gpu_dask.py -e test_examples.py)
g=$(echo "$files" | awk -v r=$(( ${GROUP:-1} == 0 ? 1 : 0 )) 'NR % 2 == r')
echo "$g" > "$OUT/hunt_files.txt"
export MRKIT_TEST_BACKEND=cuda MRKIT_REQUIRE_GPU=1 HYPOTHESIS_PROFILE=dev
for k in $(seq ${COPIES:-3}); do
  extra=""; [ "${VERBOSE:-0}" = 1 ] && extra="PYTHONVERBOSE=1"
  [ "${MALLOC_DEBUG:-0}" = 1 ] && [ $k -gt 1 ] && extra="$extra PYTHONMALLOC=debug"
  ( env $extra LD_PRELOAD=$OUT/libsegv.so timeout ${HUNT_TIME:-200} python3 -X faulthandler -m pytest -q -p no:cacheprovider \
      --deselect tests/test_threads.py::test_eight_threads_with_release_every_millisecond_on_the_gpu $g \
      > "$OUT/hunt_$k.txt" 2>&1; echo "rc=$?" >> "$OUT/hunt_$k.txt" ) &
done
wait
for k in $(seq ${COPIES:-3}); do tail -n 2 "$OUT/hunt_$k.txt" | tr '\n' ' '; echo; done
for f in $(grep -l "Fatal Python error" "$OUT"/hunt_*.txt); do
  echo "== $f"; grep -v "^import \|^# code object\|^# .*matches\|^# trying\|^# extension module\|^# possible namespace\|^# bytecode\|^# wrote\|^# could not" "$f" \
    | grep -B30 -A6 "Fatal Python error" | head -60
done
