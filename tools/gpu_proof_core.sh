#!/usr/bin/env bash
# One GPU call after an engine change, for a session whose device time is short: the whole suite on the
# cuda backend, compiled (tools/gpu_split_suite.sh), the Python build's engine and GPU tests
# (tools/gpu_python_suite.sh), then bench_core.py --quick for an earlier tree (OLD, a git archive
# carried under .scratch) and this one in turn (compiled, CORE_ROUNDS each; this one alone without
# OLD), and this tree's Python build once; last, tools/probe_py_batch.py (the Python build's cupy.empty batch round by round, with
# misses and collections counted). Summaries in $OUT/*.txt.
set -uo pipefail
export PYTHONUNBUFFERED=1 OPENBLAS_NUM_THREADS=1
SUITE_TIME=${SUITE_TIME:-230} bash tools/gpu_split_suite.sh
PYTHONPATH=$PWD PY_TIME=${PY_TIME:-80} bash tools/gpu_python_suite.sh > "$OUT/py.txt" 2>&1
tail -n 1 "$OUT/py.txt"
core() {  # label, tree, extra env
  echo "== $1" >> "$OUT/core.txt"
  env PYTHONPATH=$2 ${3:-} timeout ${CORE_TIME:-50} python3 $PWD/benchmarks/bench_core.py --quick --rounds 3 2>&1 \
    | grep -E "^core:|x$" >> "$OUT/core.txt"
}
if [ -n "${OLD:-}" ]; then
  (cd "$OLD" && timeout 90 python3 setup.py build_ext --inplace > /tmp/old_build.txt 2>&1); echo "old build rc=$?" >> "$OUT/build.txt"
  for k in $(seq ${CORE_ROUNDS:-1}); do core "old compiled $k" $PWD/$OLD; core "new compiled $k" $PWD; done
else
  core "new compiled" $PWD
fi
core "new python" $PWD MRKIT_NO_EXTENSIONS=1
cat "$OUT/core.txt"
MRKIT_NO_EXTENSIONS=1 PYTHONPATH=$PWD timeout ${PROBE_TIME:-50} python3 tools/probe_py_batch.py > "$OUT/pybatch.txt" 2>&1
head -n 30 "$OUT/pybatch.txt"
