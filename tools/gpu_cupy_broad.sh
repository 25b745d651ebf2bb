#!/usr/bin/env bash
# CuPy's own tests, as much of them as a call holds, with mrkit as CuPy's allocator on each build
# (tools/mrkit_cupy_plugin.py counts what a block lost to the garbage collector prints: "mrkit-cupy:
# N unraisable"). CUPY_DIRS: the test folders/files (under tests/cupy_tests); CUPY_TIME: seconds a build.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
timeout 60 env MRKIT_BUILD_INPLACE=1 python3 setup.py >> "$OUT/build.txt" 2>&1; echo "build rc=$?" >> "$OUT/build.txt"
CT=.scratch/cupy_tests/tests/cupy_tests
printf '[pytest]\naddopts = -p no:randomly\n' > .scratch/cupy_tests/tests/pytest.ini
for build in ${BUILDS:-compiled python}; do
  [ $build = python ] && export MRKIT_NO_EXTENSIONS=1
  timeout -s INT ${CUPY_TIME:-250} python3 -m pytest -q -p no:cacheprovider -p tools.mrkit_cupy_plugin \
    -c .scratch/cupy_tests/tests/pytest.ini --rootdir=.scratch/cupy_tests/tests \
    $(for t in ${CUPY_DIRS:-core_tests creation_tests manipulation_tests indexing_tests}; do echo $CT/$t; done) \
    > "$OUT/cupy_$build.txt" 2>&1
  echo "rc=$?" >> "$OUT/cupy_$build.txt"
done
for f in "$OUT"/cupy_*.txt; do echo "== $f"; grep -E "passed|failed|mrkit-cupy|^rc=" $f | tail -n 3; done
tail -n 1 "$OUT/build.txt"
