#!/usr/bin/env bash
# The test files of one half of the GPU suite (argument 0 or 1), dealt alternately from the sorted list
# (the test files but the mutation suite, the Dask GPU tests and the examples), one per line: the halves
# tools/gpu_split_suite.sh runs in two processes at once.
ls tests/test_*.py | grep -v -e test_mutations.py -e test_gpu_dask.py -e test_examples.py \
  | awk -v r=$(( ${1:?group 0 or 1} == 0 ? 1 : 0 )) 'NR % 2 == r'
