"""PyTorch with mrkit on the GPU: each case of tests/gpu_torch_cases.py in its own process."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu
CASES = Path(__file__).with_name("gpu_torch_cases.py")


def _case(name: str, timeout: int = 150) -> str:
    pytest.importorskip("torch")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]))
    try:
        r = subprocess.run([sys.executable, str(CASES), name], capture_output=True, text=True, env=env,
                           timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{name}: no answer in {timeout} s (a deadlock?)")
    assert r.returncode == 0 and r.stdout.startswith("ok"), r.stdout[-2000:] + r.stderr[-4000:]
    return r.stdout


@pytest.mark.parametrize("name", ["training_same_loss_in_a_pool", "two_threads_pool", "two_threads_installed",
                                  "oom_is_typed", "install_after_pytorch_allocated",
                                  "install_refusal_is_typed_never_null", "cupy_and_torch_share_one_pool",
                                  "pool_under_limit_gives_cached_segments_back",
                                  "pool_under_limit_without_release_keeps_the_old_failure",
                                  "pool_under_limit_with_a_thread_freeing_beside_it"])
def test_torch_case(gpu, name):
    _case(name)


def test_the_python_builds_callbacks_outlive_the_interpreters_exit(gpu):
    """A pytest process that used pool() through ctypes callbacks crashed at exit (segmentation fault
    while collecting garbage): the callbacks were freed before PyTorch's last call."""
    pytest.importorskip("torch")
    env = dict(os.environ, MRKIT_NO_EXTENSIONS="1",
               PYTHONPATH=os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-X", "faulthandler", str(CASES), "python_build_pool_exits_silently"],
                       capture_output=True, text=True, env=env, timeout=150)
    assert r.returncode == 0 and r.stdout.startswith("ok") and not r.stderr.strip(), r.stdout + r.stderr[-3000:]


def test_training_with_mrkit_installed_gives_pytorchs_losses(gpu):
    want = _case("training_reference").split()[1]
    got = _case("training_same_loss_installed").split()[1]
    assert got == want
