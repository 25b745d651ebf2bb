"""The driver layer: the only code in mrkit that calls CUDA.

:class:`Driver` is the interface; :class:`~mrkit.driver.cuda.CudaDriver` (real GPUs) and
:class:`~mrkit.driver.sim.SimDriver` (the simulator) implement it. The process-wide driver is
chosen by injection, never by patching modules:

* ``MRKIT_BACKEND=cuda`` (the default) or ``MRKIT_BACKEND=sim`` in the environment;
* :func:`set_backend` / :func:`use_backend` in code;
* a ``driver=`` argument on every resource and on :class:`~mrkit.Stream`.
"""
from __future__ import annotations

import os
import threading
from contextlib import contextmanager

from ._base import ACCESS_FLAGS, DEVICE_CAPABILITIES, MANAGED_ADVICE, POOL_ATTRIBUTES, VMM_HANDLE_TYPES, Driver
from .cuda import CudaDriver
from .sim import SimDeviceSpec, SimDriver

__all__ = [
    "Driver", "CudaDriver", "SimDriver", "SimDeviceSpec",
    "get_driver", "set_backend", "use_backend", "reset_backend",
    "ACCESS_FLAGS", "DEVICE_CAPABILITIES", "MANAGED_ADVICE", "POOL_ATTRIBUTES", "VMM_HANDLE_TYPES",
]

_lock = threading.Lock()
_active: Driver | None = None


def _make(backend) -> Driver:
    if isinstance(backend, Driver):
        return backend
    if backend == "cuda":
        return CudaDriver()
    if backend == "sim":
        return SimDriver()
    raise ValueError(f"unsupported backend: {backend!r} (expected 'cuda', 'sim' or a Driver instance)")


def get_driver() -> Driver:
    """The process's driver: the one set by :func:`set_backend`, else ``MRKIT_BACKEND`` (default ``cuda``)."""
    global _active
    d = _active
    if d is None:
        with _lock:
            if _active is None:
                _active = _make(os.environ.get("MRKIT_BACKEND", "cuda").strip().lower() or "cuda")
            d = _active
    return d


def set_backend(backend) -> Driver | None:
    """Make ``backend`` (``"cuda"``, ``"sim"`` or a :class:`Driver`) the process's driver; returns the
    previous one (``None`` if none had been chosen yet). Resources already built keep their driver."""
    global _active
    new = _make(backend)
    with _lock:
        old, _active = _active, new
    return old


@contextmanager
def use_backend(backend):
    """``with use_backend(SimDriver(devices=2)) as drv:`` — the process's driver inside the block."""
    global _active
    new = _make(backend)
    with _lock:
        old, _active = _active, new
    try:
        yield new
    finally:
        with _lock:
            _active = old


def reset_backend() -> None:
    """Forget the chosen driver (the next :func:`get_driver` reads ``MRKIT_BACKEND`` again)."""
    global _active
    with _lock:
        _active = None
