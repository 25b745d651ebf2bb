"""Test set-up: Hypothesis profiles, hermetic global state, GPU gating."""
from __future__ import annotations

import os
import sys

import pytest

import mrkit
from mrkit._current import _reset_current_resources
from mrkit.driver import CudaDriver, SimDriver, reset_backend, set_backend
from mrkit.testing import load_profile

load_profile("ci" if os.environ.get("CI") else "dev")

REQUIRE_GPU = os.environ.get("MRKIT_REQUIRE_GPU") == "1"


def _gpu_reason() -> str | None:
    try:
        n = CudaDriver().device_count()
    except mrkit.CUDAUnavailableError as exc:
        return f"no usable CUDA driver: {exc.name}"
    return None if n > 0 else "the CUDA driver reports no device"


_NO_GPU = _gpu_reason()


def pytest_collection_modifyitems(config, items):
    for item in items:
        # Without MRKIT_REQUIRE_GPU=1 a missing GPU skips with its reason; with it, the `gpu`
        # fixture fails the test instead.
        if "gpu" in item.keywords and _NO_GPU is not None and not REQUIRE_GPU:
            item.add_marker(pytest.mark.skip(reason=f"needs an NVIDIA GPU ({_NO_GPU}); "
                                                    "runs on the GPU machine with MRKIT_REQUIRE_GPU=1"))


@pytest.fixture
def gpu():
    """The CUDA driver, for tests marked ``gpu``; fails (never skips) when a GPU run finds none."""
    if _NO_GPU is not None:
        pytest.fail(f"a GPU was required but none was found: {_NO_GPU}")
    drv = CudaDriver()
    set_backend(drv)
    return drv


@pytest.fixture
def switch_often():
    """Thread switches every microsecond, inside the lock-free steps (the thread tests)."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(old)


@pytest.fixture(autouse=True)
def _hermetic():
    yield
    _reset_current_resources()
    reset_backend()


@pytest.fixture(params=["sim", pytest.param("cuda", marks=pytest.mark.gpu)])
def backend(request):
    """The driver of a test that runs on both backends: a fresh simulator always, and the cuda driver
    where a GPU is present (skipped with its reason without one; failing under MRKIT_REQUIRE_GPU=1)."""
    if request.param == "cuda":
        return request.getfixturevalue("gpu")
    drv = SimDriver()
    set_backend(drv)
    return drv


@pytest.fixture
def sim():
    """A fresh simulated device (manual scheduling), made the process's driver for the test."""
    drv = SimDriver()
    set_backend(drv)
    return drv
