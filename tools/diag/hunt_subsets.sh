#!/usr/bin/env bash
# Catch and bisect a crash that comes now and then: each subset of test files in SUBSETS (';' between
# subsets; unset, the half GROUP (default 1) of the GPU suite, tools/suite_group.sh) runs COPIES times,
# all at once, on the cuda backend with a C backtrace on a crash (segv_backtrace.c preloaded).
# VERBOSE=1 names each module Python clears at exit (the last one before a crash at exit is being
# cleared). PLUGIN_COPIES=N: the first N copies of each subset also run the pytest plugin
# tools/diag/foreign_at_exit.py. $OUT/sub_<i>_<k>.txt; a table of return codes at the end.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
timeout 60 env MRKIT_BUILD_INPLACE=1 python3 setup.py > "$OUT/build.txt" 2>&1; echo "build rc=$?" >> "$OUT/build.txt"
gcc -shared -fPIC -O1 -o "$OUT/libsegv.so" tools/diag/segv_backtrace.c || exit 1
export MRKIT_TEST_BACKEND=cuda MRKIT_REQUIRE_GPU=1 HYPOTHESIS_PROFILE=dev
IFS=';' read -ra subsets <<< "${SUBSETS:-$(bash tools/suite_group.sh ${GROUP:-1} | tr '\n' ' ')}"
for i in "${!subsets[@]}"; do
  for k in $(seq ${COPIES:-2}); do
    extra=""; [ "${VERBOSE:-0}" = 1 ] && extra="PYTHONVERBOSE=1"
    plug=""; [ $k -le ${PLUGIN_COPIES:-0} ] && plug="-p foreign_at_exit"
    ( env $extra PYTHONPATH=$PYTHONPATH:$PWD/tools/diag LD_PRELOAD=$OUT/libsegv.so timeout ${HUNT_TIME:-200} python3 -X faulthandler -m pytest -q $plug \
        -p no:cacheprovider --deselect tests/test_threads.py::test_eight_threads_with_release_every_millisecond_on_the_gpu \
        ${subsets[$i]} > "$OUT/sub_${i}_$k.txt" 2>&1; echo "rc=$?" >> "$OUT/sub_${i}_$k.txt" ) &
  done
done
wait
for i in "${!subsets[@]}"; do
  echo "[$i] ${subsets[$i]}: $(for k in $(seq ${COPIES:-2}); do tail -n 1 "$OUT/sub_${i}_$k.txt"; done | tr '\n' ' ')"
done
for f in $(grep -l "Fatal Python error" "$OUT"/sub_*.txt); do
  echo "== $f: $(grep "cleanup\[3\] wiping" "$f" | tail -n 1)"
done
