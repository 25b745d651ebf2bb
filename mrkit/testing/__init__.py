"""``mrkit.testing``: check your own resources and compositions.

* :func:`run_conformance` — the conformance suite (alignment, zero size, impossible sizes,
  distinct blocks, bad arguments, usable memory, cross-stream frees) as plain functions.
* :func:`conformance_test_class` — the same as a pytest-collectable class.
* :func:`make_state_machine` — a Hypothesis ``RuleBasedStateMachine`` for allocate/free ordering
  over any resource, run on the simulator (with seeded random interleavings and the stream-order
  checker) or on a GPU.
* :func:`register_profiles` / :func:`load_profile` — Hypothesis profiles ``ci`` (built on
  Hypothesis's own ``ci``), ``dev``, ``gpu`` and ``nightly``, chosen with ``HYPOTHESIS_PROFILE``.
* :func:`race_test` — 2–4 threads in interleavings Hypothesis chooses (controlled by a deterministic
  scheduler at every lock-free step and lock acquisition), shrunk to the fewest switches and replayed
  with :func:`replay_race`; :func:`run_controlled` / :class:`Schedule` / :func:`controlled_locks` run
  any threads that way.
* :func:`run_kit` — all of it on named resources (``python -m mrkit.testing [names...]`` from a shell).
* :class:`~mrkit.driver.SimDriver` (re-exported) — the simulated CUDA device.

Factories take the driver the kit chose and return a fresh resource::

    from mrkit.testing import make_state_machine
    TestMyPool = make_state_machine(lambda drv: PoolResource(CudaMemoryResource(driver=drv))).TestCase
"""
from __future__ import annotations

import os

from ..driver import SimDeviceSpec, SimDriver, get_driver, use_backend
from ._conformance import CHECKS, Harness, read_back, walk_stack, write_pattern
from ._conformance import run_conformance as _run_conformance
from ._machine import checker_canary, default_backend, make_state_machine
from ._registry import BUILTIN_FACTORIES
from ._interleave import ControlledLock, InterleavingError, Schedule, controlled_locks, run_controlled
from ._races import race_test, replay_race

__all__ = [
    "race_test", "replay_race", "Schedule", "run_controlled", "controlled_locks", "ControlledLock",
    "InterleavingError",
    "run_conformance", "conformance_test_class", "make_state_machine", "register_profiles",
    "load_profile", "default_backend", "make_driver", "CHECKS", "Harness", "write_pattern",
    "read_back", "walk_stack", "SimDriver", "SimDeviceSpec", "BUILTIN_FACTORIES", "run_kit", "checker_canary",
]


def make_driver(backend: str | None = None):
    """A driver for ``backend`` (``"sim"``: a fresh eager-free :class:`SimDriver`; ``"cuda"``: the
    process's CUDA driver)."""
    backend = backend or default_backend()
    if backend == "sim":
        return SimDriver(policy="random", seed=0)
    if backend == "cuda":
        from ..driver import CudaDriver
        d = get_driver()
        return d if isinstance(d, CudaDriver) else CudaDriver()
    raise ValueError(f"backend must be 'sim' or 'cuda', got {backend!r}")


def run_conformance(factory, *, backend: str | None = None, driver=None, checks=None) -> list[str]:
    """Run the conformance suite on ``factory(driver)``; ``AssertionError`` names the failing check."""
    drv = driver or make_driver(backend)
    with use_backend(drv):
        return _run_conformance(lambda: factory(drv), checks)


def conformance_test_class(factory, *, backend: str | None = None, name: str = "TestConformance") -> type:
    """A class with one ``test_<check>`` method per conformance check (pytest collects it when
    assigned to a ``Test*`` name in a test module)."""
    def make(check):
        def test(self):
            run_conformance(factory, backend=backend, checks=[check])
        test.__name__ = f"test_{check}"
        return test
    return type(name, (), {f"test_{c}": make(c) for c in CHECKS})


def register_profiles() -> None:
    """Register ``ci`` (Hypothesis's ``ci`` with more steps), ``dev`` (quick), ``gpu`` and
    ``nightly`` (deeper)."""
    from hypothesis import HealthCheck, settings

    base = settings.get_profile("ci")
    quiet = [HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large]
    settings.register_profile("ci", parent=base, max_examples=60, stateful_step_count=40,
                              suppress_health_check=quiet, deadline=None)
    settings.register_profile("dev", max_examples=25, stateful_step_count=30,
                              suppress_health_check=quiet, deadline=None)
    settings.register_profile("gpu", parent=base, max_examples=120, stateful_step_count=60,
                              suppress_health_check=quiet, deadline=None)
    settings.register_profile("nightly", parent=base, max_examples=2000, stateful_step_count=120,
                              suppress_health_check=quiet, deadline=None)


def load_profile(default: str = "dev") -> str:
    """Register the profiles and load ``HYPOTHESIS_PROFILE`` (else ``default``); returns its name."""
    from hypothesis import settings

    register_profiles()
    name = os.environ.get("HYPOTHESIS_PROFILE", default)
    settings.load_profile(name)
    return name


from ._kit import run_kit  # noqa: E402 - uses the functions above
