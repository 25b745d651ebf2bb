#!/usr/bin/env bash
# The engine's and the GPU's tests on the Python build (MRKIT_NO_EXTENSIONS=1), on the cuda backend;
# used by tools/gpu_session.sh and tools/gpu_session12.sh. Output on stdout. PY_TIME (default 120 s:
# 41 s on one H100 machine, over 80 s on a freshly started one).
MRKIT_NO_EXTENSIONS=1 MRKIT_TEST_BACKEND=cuda MRKIT_REQUIRE_GPU=1 HYPOTHESIS_PROFILE=dev PYTHONPATH=$PWD timeout ${PY_TIME:-120} \
  python3 -m pytest -q -p no:cacheprovider tests/test_engine_parts.py tests/test_finalizers.py tests/test_core.py \
  tests/test_pool.py tests/test_vmm.py tests/test_gpu.py tests/test_threads.py tests/test_gpu_integrations.py \
  tests/test_footprint_bound.py --deselect tests/test_threads.py::test_eight_threads_with_release_every_millisecond_on_the_gpu
