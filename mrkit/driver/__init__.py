"""The driver layer: the only code in mrkit that calls CUDA.

:class:`Driver` is the interface; :class:`~mrkit.driver.cuda.CudaDriver` (real GPUs) and
:class:`~mrkit.driver.sim.SimDriver` (the simulator) implement it. The process-wide driver is
chosen by injection, never by patching modules:

* ``MRKIT_BACKEND=cuda`` or ``MRKIT_BACKEND=sim`` in the environment; unset, the GPU when a CUDA
  driver reports a device, else the simulator (with one :class:`~mrkit.SimulatorFallbackWarning`,
  exactly where the ``mrkit`` command falls back too);
* :func:`set_backend` / :func:`use_backend` in code;
* a ``driver=`` argument on every resource and on :class:`~mrkit.Stream`.
"""
from __future__ import annotations

import os
import threading
import warnings
from contextlib import contextmanager

from .._errors import CUDAUnavailableError, SimulatorFallbackWarning

from ._base import ACCESS_FLAGS, DEVICE_CAPABILITIES, MANAGED_ADVICE, POOL_ATTRIBUTES, VMM_HANDLE_TYPES, Driver
from .cuda import CudaDriver
from .sim import SimDeviceSpec, SimDriver

__all__ = [
    "Driver", "CudaDriver", "SimDriver", "SimDeviceSpec",
    "get_driver", "set_backend", "use_backend", "reset_backend", "env_backend", "auto_backend",
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


def env_backend() -> str | None:
    """``MRKIT_BACKEND`` as ``"cuda"`` or ``"sim"``; ``None`` when unset or empty. Any other value
    raises ``ValueError`` naming the variable and the choices."""
    raw = os.environ.get("MRKIT_BACKEND")
    if raw is None or not raw.strip():
        return None
    value = raw.strip().lower()
    if value not in ("cuda", "sim"):
        raise ValueError(f"MRKIT_BACKEND={raw!r} is not a backend: expected 'cuda' or 'sim' "
                         "(or unset: the GPU if there is one, else the simulator)")
    return value


def auto_backend() -> tuple[Driver, str | None]:
    """The driver ``MRKIT_BACKEND`` asks for (unset: the GPU if a CUDA driver reports a device, else
    the simulator) and, for a fallback, why (``None`` otherwise). ``MRKIT_BACKEND=cuda`` never falls
    back: without a GPU its errors come at first use."""
    env = env_backend()
    if env == "sim":
        return SimDriver(), None
    cuda = CudaDriver()
    if env == "cuda":
        return cuda, None
    try:
        n = cuda.device_count()
    except CUDAUnavailableError as exc:
        why = (exc.explanation or exc.name).split(" (")[0].split(". ")[0]  # its first clause
        return SimDriver(), why
    if n == 0:
        return SimDriver(), "the CUDA driver reports no device"
    return cuda, None


_warned = False


def get_driver() -> Driver:
    """The process's driver: the one set by :func:`set_backend`, else ``MRKIT_BACKEND`` (``cuda``,
    ``sim``; unset: the GPU if there is one, else the simulator with one
    :class:`~mrkit.SimulatorFallbackWarning`)."""
    global _active, _warned
    d = _active
    if d is None:
        why = None
        with _lock:
            if _active is None:
                _active, why = auto_backend()
            d = _active
        if why is not None and not _warned:
            _warned = True
            warnings.warn(f"mrkit: no usable GPU ({why}); running on the simulated CUDA device. Set "
                          "MRKIT_BACKEND=sim to choose it without this warning, or MRKIT_BACKEND=cuda to "
                          "refuse instead", SimulatorFallbackWarning, stacklevel=2)
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
    """Forget the chosen driver (the next :func:`get_driver` reads ``MRKIT_BACKEND`` again, and may
    warn again about falling back to the simulator)."""
    global _active, _warned
    with _lock:
        _active = None
        _warned = False
